"""Keep-last-k pruning killed midway (audit47 kill F2): `shutil.rmtree` on step_N/ deleted the shards before the
manifest, so a SIGKILL between them left a step_N/ with manifest.json and no shard that complete_steps counted as
complete (a resume after the newer step's loss would load it). A pruned step is renamed out of the step_N names
first; clean_stale removes what a killed prune left."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from reproduction.train import checkpoint


class Killed(BaseException):
    pass


def _step(root: Path, step: int, *, partial: bool = False) -> Path:
    folder = root / (f"step_{step}.partial" if partial else f"step_{step}")
    folder.mkdir(parents=True)
    (folder / "__0_0.distcp").write_bytes(b"shard" * 100)
    (folder / ".metadata").write_bytes(b"meta")
    if not partial:
        (folder / checkpoint.MANIFEST).write_text(json.dumps({"step": step}))
    return folder


def test_a_kill_inside_the_prune_leaves_no_step_that_counts_as_complete(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    _step(root, 4)
    partial = _step(root, 8, partial=True)
    real_rmtree = shutil.rmtree

    def killed_midway(path, ignore_errors=False):
        path = Path(path)
        if "step_4" in path.name and path.exists():  # the shard goes first, then the kill
            (path / "__0_0.distcp").unlink()
            raise Killed
        real_rmtree(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed_midway)
    with pytest.raises(Killed):
        checkpoint._commit(partial, root / "step_8", root, step=8, rng=[], keep_last=1, fields={})
    assert checkpoint.complete_steps(root) == [8]
    monkeypatch.setattr(checkpoint.shutil, "rmtree", real_rmtree)
    assert [p.name for p in checkpoint.clean_stale(root)] == ["step_4.pruned"]
    assert sorted(p.name for p in root.iterdir()) == ["LATEST", "step_8"]


def test_pruning_keeps_the_newest_k(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (2, 4):
        _step(root, step)
    checkpoint._commit(_step(root, 6, partial=True), root / "step_6", root, step=6, rng=[], keep_last=2, fields={})
    assert checkpoint.complete_steps(root) == [4, 6]
    assert sorted(p.name for p in root.iterdir()) == ["LATEST", "step_4", "step_6"]


def test_a_resume_repairs_latest_and_prunes_what_a_killed_save_left(tmp_path):
    """audit47 kill2 F2: a kill between step_30's rename and its LATEST write (or its prune) left LATEST at step_20
    and step_10 kept; a resume whose final step already existed saved nothing again, so they stayed for good."""
    root = tmp_path / "checkpoints"
    for step in (10, 20, 30):
        _step(root, step)
    (root / "LATEST").write_text("step_20\n")
    _step(root, 40, partial=True)
    assert checkpoint.tidy(root, keep_last=2) == [20, 30]
    assert (root / "LATEST").read_text() == "step_30\n"
    assert sorted(p.name for p in root.iterdir()) == ["LATEST", "step_20", "step_30"]
    assert checkpoint.tidy(root, keep_last=0) == [20, 30]  # keep_last 0 prunes nothing, as a save's prune
