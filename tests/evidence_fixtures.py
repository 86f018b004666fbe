"""Synthetic runs for the evidence, lineage and report tests: fake stage outputs, a fake bundle, real statements."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from reproduction.digests import sha256_file
from reproduction.run.evidence import EvalRecord, build_evidence
from reproduction.run.lineage import Artifact, StageRun, bundle_inputs, write_stage_statement

VERSIONS = {
    "python": "3.11.7",
    "platform": "Linux",
    "recap-portable": "0.1.0",
    "torch": "2.13.0",
    "torch_npu": None,
    "numpy": "2.2.6",
    "cuda": None,
    "cann": None,
    "driver": None,
}
ROOT = Path(__file__).resolve().parent.parent


def control_plane_cli(*args: str) -> subprocess.CompletedProcess:
    """`python3 reproduction/portable.py ARGS` as a bare server runs it: the repository alone on the path, no venv's
    PATH (compare and eval --plan are control-plane commands)."""
    return subprocess.run(
        [sys.executable, str(ROOT / "reproduction/portable.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
    )


def write_json(path: Path, doc: dict) -> str:
    """`doc` written to `path` as JSON; returns the path as the command line takes it."""
    path.write_text(json.dumps(doc))
    return str(path)


PICK = "pick up the cube and place it at the target"
PUSH = "push the cube to the target"


@dataclass
class FakeRun:
    bundle: Path
    run: Path
    datasets: dict[str, Path]
    policy_ckpt: Path
    evidence: Path


def _write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def make_bundle(root: Path) -> tuple[Path, dict[str, Path]]:
    """A bundle folder with two datasets, a runtime layer and a source layer, and a bundle.json pinning them."""
    files = {
        "data/sft/meta/info.json": '{"codebase_version": "v3.0", "fps": 25}',
        "data/sft/data/chunk-000/file-000.parquet": b"PAR1" + bytes(range(256)) * 4,
        "data/rollouts/meta/info.json": '{"codebase_version": "v3.0", "fps": 25, "rollouts": true}',
        "data/rollouts/data/chunk-000/file-000.parquet": b"PAR1" + bytes(range(255, -1, -1)) * 4,
        "runtime/python.tar.zst": b"\x28\xb5\x2f\xfd runtime layer bytes",
        "source/recap-demo.tar.zst": b"\x28\xb5\x2f\xfd source layer bytes",
        "config/demo.yaml": "value:\n  steps: 4\n",
    }
    for rel, data in files.items():
        _write(root / rel, data)
    manifest = {
        "format": "recap-portable-bundle",
        "format_version": "1.0",
        "name": "recap-demo",
        "layers": [
            {"archive": "source/recap-demo.tar.zst", "target": "source/recap-demo", "kind": "source", "order": 1},
            {"archive": "runtime/python.tar.zst", "target": "runtime/python", "kind": "runtime", "order": 0},
        ],
        "files": [
            {"path": rel, "size": (root / rel).stat().st_size, "sha256": sha256_file(root / rel)}
            for rel in sorted(files)
        ],
    }
    _write(root / "bundle.json", json.dumps(manifest, indent=1))
    return root, {"sft": root / "data/sft", "rollouts": root / "data/rollouts"}


def _add_weights(bundle: Path) -> dict[str, list[Artifact]]:
    """Starting weights in the bundle (weights_manifest/<model>_tiny.json and the file it pins, as the demo's
    bundle holds them), bundle.json re-pinned; per model: the lineage inputs a stage that loads them records."""
    out = {}
    for model in ("value", "policy"):
        data = _write(bundle / f"weights/{model}-tiny/model.safetensors", f"pretrained {model}".encode() * 16)
        entry = {"path": f"{model}-tiny/model.safetensors", "kind": "weights", "sha256": sha256_file(data)}
        manifest = _write(
            bundle / f"weights_manifest/{model}_tiny.json",
            json.dumps({"name": f"{model}-tiny", "components": [{"role": f"{model}-model", "files": [entry]}]}),
        )
        out[model] = [Artifact(path=manifest, role="weights"), Artifact(path=data, role="weights")]
    doc = json.loads((bundle / "bundle.json").read_text())
    doc["files"] = sorted(
        [f for f in doc["files"] if not f["path"].startswith("weights")]
        + [
            {"path": p.relative_to(bundle).as_posix(), "size": p.stat().st_size, "sha256": sha256_file(p)}
            for p in sorted((bundle / "weights").rglob("*.safetensors"))
            + sorted((bundle / "weights_manifest").glob("*"))
        ],
        key=lambda f: f["path"],
    )
    _write(bundle / "bundle.json", json.dumps(doc, indent=1))
    return out


def eval_result(once: dict[str, tuple[int, int]], at_end: dict[str, int] | None = None) -> dict:
    """An EvalResult.to_dict()-shaped dict: {task: (successes, episodes)}."""
    return {
        "tasks": {
            task: {"episodes": n, "success_once": k, "success_at_end": (at_end or {}).get(task, k)}
            for task, (k, n) in once.items()
        }
    }


def make_evidence(name: str = "eval_policy_4", *, recap=(38, 40), bc=(20, 40), sha: str | None = None) -> dict:
    primary = EvalRecord(
        result=eval_result({PICK: (recap[0] // 2, recap[1] // 2), PUSH: (recap[0] - recap[0] // 2, recap[1] // 2)}),
        label="recap",
        mode="recap",
        guidance_scale=1.5,
        checkpoint="policy/checkpoints/step_4",
        checkpoint_sha256=sha or "ab" * 32,
        step=4,
    )
    baseline = EvalRecord(
        result=eval_result({PICK: (bc[0] // 2, bc[1] // 2), PUSH: (bc[0] - bc[0] // 2, bc[1] // 2)}),
        label="bc",
        mode="bc",
        checkpoint="policy_bc/checkpoints/step_4",
        checkpoint_sha256="cd" * 32,
        step=4,
    )
    return build_evidence(
        primary,
        name=name,
        run_id="run-test",
        seeds={"eval": 1000, "train": 0},
        settings={"episodes_per_task": recap[1] // 2, "execute_steps": 5},
        baselines=[baseline],
    )


def make_run(tmp: Path, *, argv: tuple[str, ...] = ("portable", "run", "--output", "runs/x"), environ=None) -> FakeRun:
    """A run folder with the four stages' fake outputs, an eval, and one lineage statement per stage."""
    bundle, datasets = make_bundle(tmp / "bundle")
    weights = _add_weights(bundle)
    run = tmp / "run"
    returns = _write(run / "returns/meta/returns_sft.parquet", b"returns" * 50)
    value_ckpt = run / "value/checkpoints/step_4"
    _write(value_ckpt / "model.safetensors", b"value weights" * 20)
    _write(value_ckpt / "manifest.json", '{"step": 4}')
    value_export = _write(run / "value/export/value.safetensors", b"exported value" * 20)
    advantages = _write(run / "advantages/meta/advantages_sft.parquet", b"advantages" * 40)
    policy_ckpt = run / "policy/checkpoints/step_4"
    _write(policy_ckpt / "model.safetensors", b"policy weights" * 30)
    _write(policy_ckpt / "manifest.json", '{"step": 4}')
    policy_resume = run / "policy/checkpoints/step_2"
    _write(policy_resume / "model.safetensors", b"policy weights at step 2" * 30)
    # Each mode the policy stage trains has its own export (policy/<mode>/export), as a real run's do.
    exports = []
    for mode in ("recap", "bc", "filtered_bc"):
        exports.append(_write(run / f"policy/{mode}/export/model.safetensors", f"{mode} weights".encode() * 20))
        exports.append(_write(run / f"policy/{mode}/export/policy.json", json.dumps({"mode": mode})))
    common = dict(run_id="run-test", run_dir=run, world_size=2, device="cpu", versions=VERSIONS, bundle_dir=bundle)
    base_inputs = bundle_inputs(bundle)
    config = {"value": {"steps": 4}, "hub": {"token": "hf_" + "x" * 34}, "seed": 0}
    t = 1_780_000_000.0
    stages = [
        ("returns", [returns], [Artifact(path=datasets["sft"], role="dataset")], None),
        (
            "value",
            [value_ckpt, value_export],
            [*weights["value"], Artifact(path=datasets["sft"], role="dataset"), Artifact(path=returns)],
            None,
        ),
        (
            "advantages",
            [advantages],
            [Artifact(path=datasets["sft"], role="dataset"), Artifact(path=value_export)],
            None,
        ),
        (
            "policy",
            [policy_ckpt, *exports],
            [*weights["policy"], Artifact(path=datasets["rollouts"], role="dataset"), Artifact(path=advantages)],
            Artifact(path=policy_resume, role="checkpoint"),
        ),
    ]
    for i, (stage, outputs, inputs, resumed) in enumerate(stages):
        write_stage_statement(
            StageRun(
                stage=stage,
                outputs=outputs,
                inputs=[*base_inputs, *inputs],
                argv=list(argv),
                config=config,
                started_on=t + 10 * i,
                finished_on=t + 10 * i + 5,
                resumed_from=resumed,
                environ=environ if environ is not None else {},
                **common,
            )
        )
    from reproduction.run.lineage import path_sha256

    evidence_doc = make_evidence(sha=path_sha256(policy_ckpt)[0])
    evidence = _write(run / "evidence/eval_policy_4.json", json.dumps(evidence_doc, indent=1))
    write_stage_statement(
        StageRun(
            stage="eval",
            outputs=[evidence],
            inputs=[Artifact(path=p, role="upstream_output") for p in (policy_ckpt, *exports)],
            argv=list(argv),
            config=config,
            started_on=t + 50,
            finished_on=t + 60,
            environ=environ if environ is not None else {},
            **common,
        )
    )
    # The stage records `lineage --verify` checks the statements against (a run without run.json is partial: G13).
    stages = {name: {"status": "complete"} for name in ("returns", "value", "advantages", "policy", "eval")}
    (run / "run.json").write_text(json.dumps({"format_version": 1, "run_id": "run-test", "stages": stages}))
    return FakeRun(bundle=bundle, run=run, datasets=datasets, policy_ckpt=policy_ckpt, evidence=evidence)


# -- schemas ------------------------------------------------------------------------------------

SCHEMAS = Path(__file__).resolve().parent.parent / "evidence"


def validator(name: str):
    """A jsonschema validator for evidence/<name>.schema.json (draft 2020-12, formats checked)."""
    import jsonschema

    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def schema_errors(name: str, document: dict) -> list[str]:
    """Every schema violation of `document`, as "path: message" lines ([] when valid)."""
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator(name).iter_errors(document)
    ]


def validate_run_folder(run_dir: Path) -> dict[str, int]:
    """Validate every lineage statement and evidence file a run wrote against evidence/*.schema.json.

    Raises AssertionError listing every violation; returns how many files of each kind were checked.
    For the demo's end-to-end test: `validate_run_folder(run)` after `portable demo`.
    """
    run_dir = Path(run_dir)
    kinds = {
        "lineage": sorted((run_dir / "lineage").glob("*.intoto.json")),
        "evaluation": sorted((run_dir / "evidence").glob("eval_*.json")),
        "comparison": sorted((run_dir / "evidence").glob("comparison*.json")),
    }
    problems = []
    for name, files in kinds.items():
        for path in files:
            problems += [f"{path}: {e}" for e in schema_errors(name, json.loads(path.read_text()))]
    assert not problems, "schema violations:\n" + "\n".join(problems)
    return {name: len(files) for name, files in kinds.items()}
