"""Lineage statements (in-toto v1 + SLSA provenance v1), the chain by digests, and `portable lineage --verify`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from evidence_fixtures import VERSIONS, make_bundle, make_run, schema_errors, validate_run_folder

from reproduction.errors import InputNotFoundError, InvalidInputError
from reproduction.redaction import find_secret
from reproduction.run.lineage import (
    Artifact,
    StageRun,
    build_statement,
    bundle_inputs,
    manifest_tree_sha256,
    path_sha256,
    runtime_versions,
    tree_sha256,
    write_stage_statement,
)
from reproduction.run.lineage_check import EXIT_DIGEST, EXIT_MISSING, lineage_chain, load_statements, verify_lineage

REPO = Path(__file__).resolve().parent.parent


def test_every_statement_is_a_valid_slsa_provenance(tmp_path):
    fake = make_run(tmp_path)
    counts = validate_run_folder(fake.run)
    assert counts == {"lineage": 5, "evaluation": 1, "comparison": 0}
    statement = json.loads((fake.run / "lineage/policy.intoto.json").read_text())
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    build = statement["predicate"]["buildDefinition"]
    roles = [d["annotations"]["role"] for d in build["resolvedDependencies"]]
    # The starting weights (the weights manifest and the file it pins) are inputs of their own role.
    assert roles == [
        "bundle_manifest",
        "runtime_layer",
        "source",
        "weights",
        "weights",
        "dataset",
        "upstream_output",
        "checkpoint",
    ]
    assert build["internalParameters"]["world_size"] == 2
    assert build["internalParameters"]["resumed_from"]["name"] == "policy/checkpoints/step_2"
    meta = statement["predicate"]["runDetails"]["metadata"]
    assert meta["invocationId"] == "run-test" and meta["startedOn"].endswith("Z")
    # The subject's digest is the checkpoint folder's tree digest, the one the evidence quotes.
    assert statement["subject"][0]["digest"]["sha256"] == path_sha256(fake.policy_ckpt)[0]


def test_schema_rejects_what_is_not_a_statement(tmp_path):
    fake = make_run(tmp_path)
    good = json.loads((fake.run / "lineage/value.intoto.json").read_text())
    assert schema_errors("lineage", good) == []
    for breaks in (
        lambda s: s.update(_type="https://in-toto.io/Statement/v0.1"),
        lambda s: s.update(subject=[]),
        lambda s: s["subject"][0]["digest"].update(sha256="XYZ"),
        lambda s: s["predicate"]["buildDefinition"]["internalParameters"].update(status="maybe"),
        lambda s: s["predicate"]["buildDefinition"]["internalParameters"].pop("world_size"),
        lambda s: s["predicate"]["runDetails"]["metadata"].update(startedOn="yesterday"),
        lambda s: s["predicate"]["buildDefinition"]["resolvedDependencies"][0]["annotations"].pop("role"),
    ):
        broken = json.loads(json.dumps(good))
        breaks(broken)
        assert schema_errors("lineage", broken), broken


def test_chain_walks_from_the_policy_to_the_bundle_manifest_by_digests(tmp_path):
    fake = make_run(tmp_path)
    chain = lineage_chain(fake.run)
    lines = [(depth, node.label, node.name, node.note) for depth, node in chain.lines()]
    labels = [label for _, label, _, _ in lines]
    assert labels[:5] == ["eval", "policy", "advantages", "value", "returns"]
    depth = {label: d for d, label, _, _ in lines}
    assert [depth[s] for s in ("eval", "policy", "advantages", "value", "returns")] == [0, 1, 2, 3, 4]
    # Under returns: the dataset and, last, the bundle manifest; the dataset is pinned by bundle.json's entries.
    under_returns = [(label, name, note) for d, label, name, note in lines if d == 5]
    assert under_returns[-1][:2] == ("bundle_manifest", "bundle.json")
    assert ("dataset", "data/sft", "in bundle.json") in under_returns
    assert ("dataset", "data/rollouts", "in bundle.json") in [(lab, n, note) for _, lab, n, note in lines]
    text = chain.render()
    assert "resumed from policy/checkpoints/step_2" in text
    assert text.count("bundle_manifest: bundle.json") == 1
    # Every mode's export by name, each by its folder's tree digest, not one mode's file as "the policy output".
    policy = next(node for _, node in chain.lines() if node.label == "policy")
    assert policy.name == "3 model exports: recap, bc, filtered_bc" and policy.sha256 == ""
    assert [(o.label, o.name, o.sha256) for o in policy.outputs] == [
        (m, f"policy/{m}/export", path_sha256(fake.run / f"policy/{m}/export")[0])
        for m in ("recap", "bc", "filtered_bc")
    ]
    assert "   = bc: policy/bc/export  sha256:" in text
    # The starting weights each model stage began from, under that stage, pinned by bundle.json.
    weights = [(depth, node.name, node.note) for depth, node in chain.lines() if node.label == "weights"]
    assert [(d, n) for d, n, _ in weights] == [
        (depth["value"] + 1, "weights_manifest/value_tiny.json"),
        (depth["value"] + 1, "weights/value-tiny/model.safetensors"),
        (depth["policy"] + 1, "weights_manifest/policy_tiny.json"),
        (depth["policy"] + 1, "weights/policy-tiny/model.safetensors"),
    ]
    assert all(note == "starting weights, in bundle.json" for _, _, note in weights)
    assert chain.to_dict()["roots"][0]["children"][0]["outputs"][0]["name"] == "policy/recap/export"


def test_an_upstream_stage_read_through_many_files_is_one_node(tmp_path):
    run = tmp_path / "run"
    files = []
    for i in range(3):
        path = run / f"value/model_{i}/export/model.safetensors"
        path.parent.mkdir(parents=True)
        path.write_bytes(b"weights %d" % i)
        files.append(path)
    (run / "advantages").mkdir()
    (run / "advantages/advantages.parquet").write_bytes(b"adv")
    common = dict(
        run_id="r", run_dir=run, argv=[], config={}, world_size=1, device="cpu", versions=VERSIONS, environ={}
    )
    write_stage_statement(StageRun(stage="value", outputs=files, inputs=[], started_on=0.0, finished_on=1.0, **common))
    write_stage_statement(
        StageRun(
            stage="advantages",
            outputs=[run / "advantages/advantages.parquet"],
            inputs=[Artifact(path=f) for f in files],
            started_on=2.0,
            finished_on=3.0,
            **common,
        )
    )
    lines = lineage_chain(run).render().splitlines()
    # One node for value, its three cross-fit exports listed under it by name (not as inputs).
    assert len(lines) == 5
    assert lines[1].startswith("<- value: 3 model exports: model_0, model_1, model_2  (succeeded")
    assert [ln.split("sha256:")[0].strip() for ln in lines[2:]] == [
        f"= model_{i}: value/model_{i}/export" for i in range(3)
    ]


def test_chain_links_by_place_and_digest_not_by_display_name(tmp_path):
    """Rename the advantages subject's display name: the link holds (same run path, same digest)."""
    fake = make_run(tmp_path)
    path = fake.run / "lineage/advantages.intoto.json"
    st = json.loads(path.read_text())
    st["subject"][0]["name"] = "renamed.parquet"
    path.write_text(json.dumps(st))
    labels = [n.label for _, n in lineage_chain(fake.run).lines()]
    assert labels[:4] == ["eval", "policy", "advantages", "value"]
    # A digest that matches no subject ends the chain there: the policy's input becomes a leaf.
    st["subject"][0]["digest"]["sha256"] = "0" * 64
    path.write_text(json.dumps(st))
    nodes = [n for _, n in lineage_chain(fake.run).lines()]
    policy_inputs = [n.label for n in nodes[1].children]
    assert "advantages" not in policy_inputs and "upstream_output" in policy_inputs


def test_identical_bytes_of_two_stages_do_not_cross_link(tmp_path):
    """The value and the policy exports hold the same tokenizer file (one digest): advantages read the value's,
    so its edge goes to value, never to the later policy stage that wrote the same bytes elsewhere."""
    run = tmp_path / "run"
    tok_value = run / "value/model_0/export/tokenizer.json"
    tok_policy = run / "policy/recap/export/tokenizer.json"
    for path in (tok_value, tok_policy):
        path.parent.mkdir(parents=True)
        path.write_text('{"model": "bpe"}')
    weights = tok_value.parent / "model.safetensors"
    weights.write_bytes(b"value weights")
    adv = run / "advantages/advantages.parquet"
    adv.parent.mkdir()
    adv.write_bytes(b"adv")
    common = dict(
        run_id="r", run_dir=run, argv=[], config={}, world_size=1, device="cpu", versions=VERSIONS, environ={}
    )

    def stage(name, outputs, inputs, t):
        write_stage_statement(
            StageRun(stage=name, outputs=outputs, inputs=inputs, started_on=t, finished_on=t + 1, **common)
        )

    stage("value", [weights, tok_value], [], 0.0)
    stage("advantages", [adv], [Artifact(path=weights), Artifact(path=tok_value)], 2.0)
    stage("policy", [tok_policy], [Artifact(path=adv)], 4.0)
    lines = lineage_chain(run).render().splitlines()
    assert len(lines) == 3, lines
    assert lines[0].startswith("policy: policy/recap/export  sha256:")
    assert "advantages: advantages/advantages.parquet" in lines[1]
    assert f"value: value/model_0/export  sha256:{path_sha256(weights.parent)[0][:12]}" in lines[2]
    assert not any("policy/recap" in ln for ln in lines[1:]), lines


def test_bundle_inputs_take_layer_digests_from_the_manifest(tmp_path):
    bundle, _ = make_bundle(tmp_path / "b")
    inputs = bundle_inputs(bundle)
    assert [(a.path.relative_to(bundle).as_posix(), a.role) for a in inputs] == [
        ("bundle.json", "bundle_manifest"),
        ("runtime/python.tar.zst", "runtime_layer"),
        ("source/recap-demo.tar.zst", "source"),
    ]
    assert inputs[0].sha256 is None and inputs[1].sha256 == path_sha256(bundle / "runtime/python.tar.zst")[0]
    assert bundle_inputs(tmp_path / "no-bundle") == []
    (bundle / "bundle.json").write_text("{")
    with pytest.raises(InvalidInputError):
        bundle_inputs(bundle)


def test_tree_digest_from_files_equals_the_one_from_bundle_json(tmp_path):
    bundle, datasets = make_bundle(tmp_path / "b")
    manifest = json.loads((bundle / "bundle.json").read_text())
    for name, folder in datasets.items():
        assert manifest_tree_sha256(manifest, f"data/{name}") == tree_sha256(folder)
    assert manifest_tree_sha256(manifest, "data/nothing") is None


def test_verify_passes_then_names_every_difference(tmp_path):
    fake = make_run(tmp_path)
    report = verify_lineage(fake.run)
    assert report.exit_code == 0 and report.problems == [] and report.checked > 20

    (fake.datasets["sft"] / "meta/info.json").write_text('{"edited": true}')
    report = verify_lineage(fake.run)
    assert report.exit_code == EXIT_DIGEST == 14
    assert {(p.kind, p.path) for p in report.problems} == {("digest", "data/sft")}
    assert {p.statement for p in report.problems} == {
        "returns.intoto.json",
        "value.intoto.json",
        "advantages.intoto.json",
    }
    assert "digest differs: data/sft (dataset of returns.intoto.json)" in report.summary()
    # Which file inside the folder changed comes from bundle.json's entries.
    assert all(p.files == ("changed: meta/info.json",) for p in report.problems)

    (fake.policy_ckpt / "model.safetensors").unlink()
    (fake.run / "value/export/value.safetensors").unlink()
    report = verify_lineage(fake.run)
    assert report.exit_code == EXIT_MISSING == 11  # missing wins over a digest mismatch
    kinds = {(p.kind, p.path) for p in report.problems}
    assert ("missing", "value/export/value.safetensors") in kinds
    # A folder that lost a file is not missing: its tree digest differs.
    assert ("digest", "policy/checkpoints/step_4") in kinds
    # ... and a small run folder lists its files in the statement, so the lost file is named.
    ckpt = next(p for p in report.problems if p.path == "policy/checkpoints/step_4" and p.what == "subject")
    assert ckpt.files == ("missing: model.safetensors",)
    (fake.policy_ckpt / "extra.bin").write_bytes(b"new")
    ckpt = next(p for p in verify_lineage(fake.run).problems if p.path == "policy/checkpoints/step_4")
    assert ckpt.files == ("added: extra.bin", "missing: model.safetensors")
    assert "added: extra.bin, missing: model.safetensors" in str(ckpt)


def test_a_moved_run_folder_still_verifies(tmp_path):
    fake = make_run(tmp_path)
    moved = tmp_path / "elsewhere" / "run"
    moved.parent.mkdir()
    shutil.move(str(fake.run), moved)
    assert verify_lineage(moved).exit_code == 0


def test_missing_or_malformed_lineage_is_refused(tmp_path):
    with pytest.raises(InputNotFoundError) as missing:
        lineage_chain(tmp_path)
    assert missing.value.exit_code == 3
    (tmp_path / "lineage").mkdir()
    with pytest.raises(InputNotFoundError):
        load_statements(tmp_path)
    (tmp_path / "lineage/value.intoto.json").write_text('{"_type": "something else"}')
    with pytest.raises(InvalidInputError) as bad:
        verify_lineage(tmp_path)
    assert bad.value.exit_code == 4 and "value.intoto.json" in str(bad.value)
    (tmp_path / "lineage/value.intoto.json").write_text("{not json")
    with pytest.raises(InvalidInputError):
        lineage_chain(tmp_path)


def test_statement_needs_outputs_a_known_status_and_existing_files(tmp_path):
    out = tmp_path / "run/out.bin"
    out.parent.mkdir()
    out.write_bytes(b"x")
    base = dict(
        stage="returns",
        run_id="r",
        run_dir=tmp_path / "run",
        inputs=[],
        argv=[],
        config={},
        world_size=1,
        device="cpu",
        started_on=0.0,
        finished_on=1.0,
        versions=VERSIONS,
        environ={},
    )
    with pytest.raises(ValueError, match="at least one output"):
        build_statement(StageRun(outputs=[], **base))
    with pytest.raises(ValueError, match="status"):
        build_statement(StageRun(outputs=[out], status="done", **base))
    with pytest.raises(FileNotFoundError):
        build_statement(StageRun(outputs=[tmp_path / "run/absent"], **base))
    with pytest.raises(ValueError, match="role"):
        Artifact(path=out, role="mystery")
    # An input outside the run and the bundle is recorded by its absolute path; a given digest is trusted.
    outside = tmp_path / "shared.bin"
    outside.write_bytes(b"shared")
    st = build_statement(
        StageRun(outputs=[out], **{**base, "inputs": [Artifact(path=outside, role="weights", sha256="e" * 64)]})
    )
    dep = st["predicate"]["buildDefinition"]["resolvedDependencies"][0]
    assert dep["annotations"]["root"] == "file" and dep["name"] == str(outside) and dep["digest"]["sha256"] == "e" * 64
    assert st["predicate"]["buildDefinition"]["externalParameters"]["bundle"] is None
    assert schema_errors("lineage", st) == []


def test_no_secret_reaches_a_statement(tmp_path):
    token = "hf_" + "Q7rT2" * 7
    environ = {"HF_TOKEN": token, "HOME": "/root", "MY_API_KEY": "s3cr3t-value-123"}
    argv = ("portable", "run", "--token", token, f"hub.token={token}", f"--url=https://u:{token}@hub", "seed=3")
    fake = make_run(tmp_path, argv=argv, environ=environ)
    assert find_secret(fake.run, token) == []
    assert find_secret(fake.run, "s3cr3t-value-123") == []
    statement = json.loads((fake.run / "lineage/returns.intoto.json").read_text())
    recorded = statement["predicate"]["buildDefinition"]["externalParameters"]
    assert recorded["argv"] == [
        "portable",
        "run",
        "--token",
        "<redacted>",
        "hub.token=<redacted>",
        "--url=https://u:<redacted>@hub",
        "seed=3",
    ]
    assert recorded["config"]["hub"]["token"] == "<redacted>" and recorded["config"]["seed"] == 0
    # The scan is not blind: it finds a token that was written.
    (fake.run / "value/log.txt").write_text(f"oops {token}\n")
    assert [f.path.name for f in find_secret(fake.run, token)] == ["log.txt"]


def test_write_replaces_the_previous_statement_of_a_stage(tmp_path):
    fake = make_run(tmp_path)
    first = (fake.run / "lineage/returns.intoto.json").read_text()
    write_stage_statement(
        StageRun(
            stage="returns",
            run_id="run-2",
            run_dir=fake.run,
            outputs=[fake.run / "returns/meta/returns_sft.parquet"],
            inputs=[Artifact(path=fake.datasets["sft"], role="dataset")],
            argv=[],
            config={},
            world_size=1,
            device="cpu",
            started_on=2_000_000_000.0,
            finished_on=2_000_000_001.0,
            versions=VERSIONS,
            environ={},
        )
    )
    assert (fake.run / "lineage/returns.intoto.json").read_text() != first
    assert sorted(p.name for p in (fake.run / "lineage").iterdir()) == [
        f"{s}.intoto.json" for s in ("advantages", "eval", "policy", "returns", "value")
    ]


def test_runtime_versions_names_torch_and_accelerator_stacks():
    versions = runtime_versions()
    assert {"python", "torch", "cuda", "cann", "driver", "torch_npu"} <= set(versions)
    assert versions["python"].count(".") == 2
    assert "torch_npu" not in sys.modules
    assert "torch" not in sys.modules or versions["cuda"] == sys.modules["torch"].version.cuda


def test_runtime_versions_record_the_omp_threads_each_invocation_saw(monkeypatch):
    # audit52 T2: a run resumed under another OMP_NUM_THREADS ends with other bytes; its lineage must tell them apart.
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert runtime_versions()["omp_num_threads"] == "3"
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert runtime_versions()["omp_num_threads"] is None


def _portable(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    code = (
        "import sys; from reproduction.portable import main; rc = main(sys.argv[1:]); "
        "heavy = [m for m in ('torch', 'numpy', 'pyarrow', 'ray', 'matplotlib', 'jinja2') if m in sys.modules]; "
        "assert not heavy, heavy; sys.exit(rc)"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_cli_prints_the_chain_and_verify_exits_with_documented_codes(tmp_path):
    fake = make_run(tmp_path)
    done = _portable("lineage", str(fake.run), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("eval: evidence/eval_policy_4.json")
    assert "<- policy: 3 model exports: recap, bc, filtered_bc" in done.stdout
    assert "bundle_manifest: bundle.json" in done.stdout

    done = _portable("lineage", str(fake.run), "--verify", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["verify"]["exit_code"] == 0 and data["chain"]["roots"][0]["label"] == "eval"

    (fake.run / "advantages/meta/advantages_sft.parquet").write_bytes(b"tampered")
    done = _portable("-q", "lineage", str(fake.run), "--verify", cwd=tmp_path)
    assert done.returncode == 14
    assert "digest differs: advantages/meta/advantages_sft.parquet" in done.stderr

    done = _portable("lineage", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert done.returncode == 3 and done.stderr.startswith("error: no lineage in")

    help_text = subprocess.run(
        [sys.executable, str(REPO / "reproduction/portable.py"), "lineage", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "RUN_DIR" in help_text and "lineage --verify: 11" in help_text


def _other_pythons() -> list[str]:
    """Python 3.10 and 3.13 found on PATH or under `pyenv root` (never at an assumed path)."""
    found = []
    root = None
    pyenv = shutil.which("pyenv")
    if pyenv:
        done = subprocess.run([pyenv, "root"], capture_output=True, text=True, timeout=30, check=False)
        root = Path(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip() else None
    for minor in ("3.10", "3.13"):
        exe = None
        if root is not None:
            exe = next((str(p) for p in sorted(root.glob(f"versions/{minor}.*/bin/python3")) if p.is_file()), None)
        if exe is None:
            exe = shutil.which(f"python{minor}")
            exe = None if exe is None or "/shims/" in exe else exe  # a pyenv shim may point at nothing
        if exe:
            found.append(exe)
    return found


def test_bare_pythons_verify_lineage(tmp_path):
    """`portable lineage --verify` is control plane: stdlib only, on a bare 3.10 and 3.13 with no site-packages."""
    pythons = _other_pythons()
    if not pythons:
        pytest.skip("no python3.10 or python3.13 on PATH or under `pyenv root`")
    fake = make_run(tmp_path)
    (fake.run / "returns/meta/returns_sft.parquet").write_bytes(b"edited")
    for exe in pythons:
        done = subprocess.run(
            [exe, "-S", str(REPO / "reproduction/portable.py"), "lineage", str(fake.run), "--verify"],
            capture_output=True,
            text=True,
            timeout=120,
            env={"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)},
            check=False,
        )
        assert done.returncode == 14, (exe, done.stderr)
        assert "<- returns: returns/meta/returns_sft.parquet" in done.stdout
        assert "digest differs: returns/meta/returns_sft.parquet" in done.stderr


def test_value_and_policy_stages_record_the_starting_weights_they_load(tmp_path):
    """StageSpec.weights: the pretrained_manifest a model section names, and each weights file it pins, are
    lineage inputs of role `weights` (the bundle's files, so the chain marks them "in bundle.json")."""
    from reproduction.digests import sha256_file
    from reproduction.recipes.recap.recipe import RECAP
    from reproduction.run.record import make_recorder
    from reproduction.run.runner import StageRecord
    from reproduction.run.stage_keys import weight_files

    bundle = make_run(tmp_path).bundle
    plain = {
        model: {
            "model": {
                "pretrained_manifest": str(bundle / f"weights_manifest/{model}_tiny.json"),
                "weights_dir": str(bundle / "weights"),
            }
        }
        for model in ("value", "policy")
    }
    files = weight_files(RECAP.stage("value"), plain)
    assert files == [
        str(bundle / "weights_manifest/value_tiny.json"),
        str(bundle / "weights/value-tiny/model.safetensors"),
    ]
    assert weight_files(RECAP.stage("advantages"), plain) == []
    assert weight_files(RECAP.stage("value"), {"value": {"model": {"pretrained_manifest": None}}}) == []
    run = tmp_path / "r"
    out = run / "value/value_setup.json"
    out.parent.mkdir(parents=True)
    out.write_text("{}")
    record = make_recorder(bundle)
    record(
        StageRecord(
            run_id="r",
            run_dir=run,
            stage="value",
            status="complete",
            action="ran",
            subjects={"value/value_setup.json": sha256_file(out)},
            materials={},
            config=plain,
            argv=[],
            started=0.0,
            ended=1.0,
            resumed_from=None,
            summary={},
            inputs={},
            upstream_files={},
            weight_files=files,
        )
    )
    deps = json.loads((run / "lineage/value.intoto.json").read_text())["predicate"]["buildDefinition"]
    weights = [d for d in deps["resolvedDependencies"] if d["annotations"]["role"] == "weights"]
    assert [(d["annotations"]["root"], d["annotations"]["path"]) for d in weights] == [
        ("bundle", "weights_manifest/value_tiny.json"),
        ("bundle", "weights/value-tiny/model.safetensors"),
    ]
    assert weights[1]["digest"]["sha256"] == sha256_file(bundle / "weights/value-tiny/model.safetensors")
    (run / "run.json").write_text(json.dumps({"stages": {"value": {"status": "complete"}}}))  # verify needs it
    assert verify_lineage(run).exit_code == 0
