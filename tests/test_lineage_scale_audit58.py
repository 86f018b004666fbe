"""audit58 B1: the lineage chain (report.html, `portable lineage`) is linear in a stage's output-file count.

A stage writing 8000 files read by the next one cost 32M edge_key calls (99 s per report.html, 246 s of
`portable lineage` at 20000 files): each dependency scanned its producer's subjects for its own key."""

from __future__ import annotations

from pathlib import Path

import pytest
from evidence_fixtures import VERSIONS

from reproduction.run import lineage_check
from reproduction.run.lineage import Artifact, StageRun, path_sha256, write_stage_statement


def _shards_run(run: Path, n: int) -> list[Path]:
    """shards writes n files, train reads every one (the first twice), eval reads train's weights."""
    shards = []
    for i in range(n):
        path = run / f"shards/part/s{i:05d}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'{{"i": {i}}}')
        shards.append(path)
    weights = run / "train/weights.json"
    evidence = run / "evidence/eval_1.json"
    for path, text in ((weights, '{"w": 1}'), (evidence, '{"ok": true}')):
        path.parent.mkdir(parents=True)
        path.write_text(text)
    common = dict(run_id="r", run_dir=run, argv=[], config={}, world_size=1, device="cpu", versions=VERSIONS)

    def stage(name, outputs, inputs, t):
        write_stage_statement(
            StageRun(stage=name, outputs=outputs, inputs=inputs, started_on=t, finished_on=t + 1, environ={}, **common)
        )

    stage("shards", shards, [], 0.0)
    stage("train", [weights], [Artifact(path=p) for p in [shards[0], *shards]], 2.0)
    stage("eval", [evidence], [Artifact(path=weights)], 4.0)
    return shards


@pytest.mark.parametrize("n", [100, 1000])
def test_edge_key_calls_grow_linearly_with_the_output_count(tmp_path, monkeypatch, n):
    """Before the fix: about n*n/2 calls (500,500 for n = 1000); now a few per subject and dependency."""
    _shards_run(tmp_path / "run", n)
    calls = 0
    real = lineage_check.edge_key

    def counting(descriptor):
        nonlocal calls
        calls += 1
        return real(descriptor)

    monkeypatch.setattr(lineage_check, "edge_key", counting)
    chain = lineage_check.lineage_chain(tmp_path / "run")
    assert f"+{n - 1} more files" in chain.render()
    assert calls <= 6 * n + 50, calls


def test_the_chain_reads_as_before_each_upstream_file_once(tmp_path):
    """The output the quadratic scan gave: one shards node counting its files once (s00000 was read twice)."""
    run = tmp_path / "run"
    shards = _shards_run(run, 3)
    sha = {p.name: path_sha256(p)[0][:12] for p in [*shards, run / "train/weights.json", run / "evidence/eval_1.json"]}
    assert lineage_check.lineage_chain(run).render().splitlines() == [
        f"eval: evidence/eval_1.json  sha256:{sha['eval_1.json']}  (succeeded, run r, 1.0 s)",
        f"<- train: train/weights.json  sha256:{sha['weights.json']}  (succeeded, run r, 1.0 s)",
        f"  <- shards: shards/part/s00000.json  sha256:{sha['s00000.json']}  (+2 more files, succeeded, run r, 1.0 s)",
    ]
    node = lineage_check.lineage_chain(run).roots[0].children[0].children[0]
    assert (node.label, node.name, node.children) == ("shards", "shards/part/s00000.json", [])
