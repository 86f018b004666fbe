"""`portable run` over RECAP stages 1-3 on a tiny dataset: outputs, run.json, resume, changed inputs named."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from value_synth import CAMERA, write_value_dataset

REPO = Path(__file__).resolve().parent.parent
CONFIG = """\
datasets:
  - {path: "${BUNDLE}/data/rollouts", type: rollout}
returns: {failure_reward: -30}
value:
  model: {cameras: {base_0_rgb: "CAMERA"}, folds: 2, eval_micro_batch: 16, augment: false}
  train: {max_steps: 4, global_batch: 8, micro_batch: 8, save_interval: 2, lr: 0.001}
advantages: {lookahead: 3}
""".replace("CAMERA", CAMERA)


STAGES = ("--stages", "returns,value,advantages")  # the dataset has no state/action for a policy


def portable(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "reproduction.portable", *args, *STAGES],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )


@pytest.fixture(scope="module")
def done_run(tmp_path_factory):
    """A bundle-like folder (data/, config/run.yaml) and one finished run of stages 1-3."""
    root = tmp_path_factory.mktemp("recap_run")
    bundle = root / "bundle"
    write_value_dataset(bundle / "data" / "rollouts", episodes=8, seed=0, runs=root / "scratch")
    (bundle / "config").mkdir()
    (bundle / "config" / "run.yaml").write_text(CONFIG)
    proc = portable("run", str(bundle), "--output", str(root / "run"), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return bundle, root / "run", json.loads(proc.stdout)


@pytest.mark.slow
def test_stages_one_to_three_write_their_outputs_and_record_them(done_run):
    bundle, run, report = done_run
    assert [(s["stage"], s["action"]) for s in report["stages"]] == [
        ("returns", "ran"),
        ("value", "ran"),
        ("advantages", "ran"),
    ]
    state = json.loads((run / "run.json").read_text())
    stages = state["stages"]
    assert {n: s["status"] for n, s in stages.items()} == dict.fromkeys(("returns", "value", "advantages"), "complete")
    assert stages["value"]["step"] == 4 and stages["value"]["summary"]["folds"] == 2
    assert "model_0/export/model.safetensors" in stages["value"]["outputs"]
    assert not any("checkpoints" in k for k in stages["value"]["outputs"])  # checkpoints are not outputs
    fp = stages["returns"]["key_parts"]["inputs"]["rollouts"]
    assert stages["advantages"]["key_parts"]["inputs"]["rollouts"] == fp
    adv = pq.read_table(run / "advantages" / "rollouts" / "advantages.parquet")
    values = pq.read_table(run / "advantages" / "values" / "rollouts.parquet")
    assert adv.num_rows == values.num_rows == stages["returns"]["summary"]["rollouts"]["frames"]
    assert adv.column("value_current").to_pylist() == values.column("value").to_pylist()
    assert stages["advantages"]["summary"]["value_head"]["return_range"]["return_max"] == 0.0
    assert state["config"]["datasets"][0]["path"] == str(bundle.resolve() / "data" / "rollouts")


@pytest.mark.slow
def test_resume_of_a_finished_run_is_a_no_op_without_ray_or_torch(done_run):
    bundle, run, _ = done_run
    before = (run / "run.json").read_text()
    code = (
        "import json, sys, time\n"
        "t, c = time.perf_counter(), time.process_time()\n"
        "from reproduction.portable import main\n"
        f"rc = main(['run', {str(bundle)!r}, '--output', {str(run)!r}, '--resume', '--json', *{STAGES!r}])\n"
        "print(json.dumps({'rc': rc, 's': time.perf_counter() - t, 'cpu': time.process_time() - c,"
        " 'ray': 'ray' in sys.modules,"
        " 'torch': 'torch' in sys.modules}))\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    wall = time.perf_counter() - t0
    lines = proc.stdout.strip().splitlines()
    got = json.loads(lines[-1])
    print(f"finished --resume: {got['s']:.2f} s wall ({got['cpu']:.2f} s CPU) in main, {wall:.2f} s with start")
    assert got["rc"] == 0 and not got["ray"] and not got["torch"], proc.stderr
    # The goal is < 2 s of wall time; CPU time is what this process controls on a shared, loaded machine
    # (wall time here has measured 2-5x the CPU time while other jobs ran).
    assert got["cpu"] < 2.0 and got["s"] < 10.0
    table = json.loads("\n".join(lines[:-1]))["stages"]
    assert [s["action"] for s in table] == ["skipped"] * 3
    assert json.loads((run / "run.json").read_text())["stages"] == json.loads(before)["stages"]


@pytest.mark.slow
def test_changed_inputs_after_completion_are_named(done_run, tmp_path):
    bundle, run, _ = done_run
    proc = portable("run", str(bundle), "--output", str(run), "--resume", "advantages.lookahead=4")
    assert proc.returncode == 52
    assert proc.stderr.splitlines()[0] == (
        "error: stage advantages: its inputs changed since it ran: config.advantages.lookahead: 3 -> 4"
    )
    # the dataset edited after stage 1 ran: every stage keyed on it names it
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    runcopy = tmp_path / "run"
    shutil.copytree(run, runcopy)
    shutil.rmtree(copy / "data" / "rollouts")
    write_value_dataset(copy / "data" / "rollouts", episodes=7, seed=1, runs=tmp_path / "scratch")
    proc = portable("run", str(copy), "--output", str(runcopy), "--resume")
    assert proc.returncode == 52, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith("error: stage returns: its inputs changed since it ran: ")
    assert "config.datasets[0].path: " in first and "inputs.rollouts: " in first  # item by item (audit52 T4)
    assert "..." not in first
    assert "--restart-stage returns" in proc.stderr


@pytest.mark.slow
def test_target_step_continues_the_finished_value_stage(done_run, tmp_path):
    bundle, run, _ = done_run
    from reproduction.run.lineage import tree_sha256

    runcopy = tmp_path / "run"
    shutil.copytree(run, runcopy)
    # what each fold's continued trainer loads
    loaded = {f"value/{p.parent.parent.name}": tree_sha256(p) for p in runcopy.glob("value/*/checkpoints/step_4")}
    assert sorted(loaded) == ["value/model_0", "value/model_1"]
    proc = portable("run", str(bundle), "--output", str(runcopy), "--target-step", "6", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = {s["stage"]: s["action"] for s in json.loads(proc.stdout)["stages"]}
    assert table == {"returns": "skipped", "value": "continued", "advantages": "ran"}
    stages = json.loads((runcopy / "run.json").read_text())["stages"]
    assert stages["value"]["step"] == 6 and stages["value"]["resumed_from"] == 4
    # audit53 R7: the value stage's statement names one fold's step_4 (the step it continued from), with the digest
    # that checkpoint had when it was loaded
    build = json.loads((runcopy / "lineage" / "value.intoto.json").read_text())["predicate"]["buildDefinition"]
    deps = [d for d in build["resolvedDependencies"] if d["annotations"].get("role") == "checkpoint"]
    assert len(deps) == 1 and deps[0]["annotations"]["kind"] == "tree", deps
    model, _, rest = deps[0]["name"].rpartition("/checkpoints/")
    assert model in loaded and rest == "step_4", deps[0]["name"]
    assert deps[0]["digest"] == {"sha256": loaded[model]}
    assert build["internalParameters"]["resumed_from"]["digest"] == {"sha256": loaded[model]}
    assert stages["value"]["lineage"]["resumed_from_sha256"] == loaded[model]


def _copy_run(run: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(run, out)
    return out


def _one_line(proc: subprocess.CompletedProcess, start: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith(start) and len(lines) == 2 and lines[1].startswith("hint: "), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr


@pytest.mark.slow
def test_resume_with_a_lowered_value_max_steps_is_exit_52_naming_both_and_keeps_the_record(done_run, tmp_path):
    bundle, run, _ = done_run
    runcopy = _copy_run(run, tmp_path)
    before = (runcopy / "run.json").read_bytes()
    proc = portable("run", str(bundle), "--output", str(runcopy), "--resume", "value.train.max_steps=2")
    assert proc.returncode == 52, proc.stderr[-2000:]
    _one_line(
        proc,
        "error: stage value: value.train.max_steps is now 2, but the stage trained 4 steps "
        "(it ran with value.train.max_steps=4)",
    )
    assert (runcopy / "run.json").read_bytes() == before  # the record still says 4 steps were trained


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["not UTF-8", "a JSON list"])
def test_a_target_step_from_a_damaged_checkpoint_is_exit_50_and_the_stage_stays_complete(done_run, tmp_path, damage):
    """Regression: a flipped byte in a checkpoint's manifest.json ended `--target-step` in "internal error:
    UnicodeDecodeError" (exit 1); a manifest that was JSON but not an object, in an AttributeError."""
    bundle, run, _ = done_run
    runcopy = _copy_run(run, tmp_path)
    before = json.loads((runcopy / "run.json").read_text())["stages"]
    for manifest in (runcopy / "value").glob("model_*/checkpoints/step_4/manifest.json"):
        data = bytearray(manifest.read_bytes())
        data[len(data) // 2] ^= 0xFF
        manifest.write_bytes(bytes(data) if damage == "not UTF-8" else b"[]")
    proc = portable("run", str(bundle), "--output", str(runcopy), "--target-step", "6")
    assert proc.returncode == 50, proc.stderr[-2000:]
    _one_line(proc, "error: ")
    assert "/checkpoints/step_4/manifest.json is not " in proc.stderr.splitlines()[0], proc.stderr
    after = json.loads((runcopy / "run.json").read_text())["stages"]
    assert {k: v for k, v in after.items() if k != "value"} == {k: v for k, v in before.items() if k != "value"}
    # value_setup.json holds the run folder's absolute paths, so in this copy the continuation rewrote that recorded
    # output before it met the damaged checkpoint: the old complete record would now name a file that changed (every
    # --resume: exit 52), so the stage is recorded failed and --resume continues it (in the folder the run was made
    # in, the file is rewritten byte for byte and the complete record stays: test_run_continuation_stop)
    assert after["value"]["status"] == "failed" and after["value"]["error"].startswith("CheckpointError: ")
    assert after["value"]["outputs"] == before["value"]["outputs"] and after["value"]["step"] == before["value"]["step"]


@pytest.mark.slow
def test_a_stage_folder_linked_out_of_the_run_folder_is_exit_55_and_nothing_is_cleared_there(done_run, tmp_path):
    """Regression: with returns/ a link to another folder, `--restart-stage returns` failed with "cannot write a
    file: Cannot call rmtree on a symbolic link" (exit 8); `--resume` read through the link."""
    bundle, run, _ = done_run
    runcopy = _copy_run(run, tmp_path)
    outside = tmp_path / "elsewhere"
    (runcopy / "returns").rename(outside)
    (runcopy / "returns").symlink_to(outside, target_is_directory=True)
    files = sorted(p.relative_to(outside) for p in outside.rglob("*"))
    for how in (["--restart-stage", "returns"], ["--resume"]):
        proc = portable("run", str(bundle), "--output", str(runcopy), *how)
        assert proc.returncode == 55, proc.stderr[-2000:]
        _one_line(proc, f"error: {runcopy / 'returns'} is a symbolic link (to {outside})")
        assert sorted(p.relative_to(outside) for p in outside.rglob("*")) == files
