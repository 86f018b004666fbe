"""kill -9 `portable run` of the GRPO recipe during its `rl` stage, then `--resume`: the same evidence and weights.

One run of 8 rl steps (checkpoints every 2, a live evaluation every 2) is killed three times, each followed by
`portable run --resume`:
1. inside the rl stage's second checkpoint save (shards written, no manifest), planted through the seam in
   tests/kill_points.py (GRPO_POINTS["rl_dcp_save"]);
2. and 3. at random moments of the resumed rl stage: after a seeded random step k short of the last (the moment the
   resumed process logs step k's train record in rl/metrics.jsonl) plus a seeded fraction of its own last step's
   time, so the kill lands in step k + 1's rollouts or update, or in step k's live evaluation or checkpoint save, and
   always before the run ends whatever the machine's load (a delay drawn from the uninterrupted run's time came
   after the end when the load fell). The seed is printed and named in every assertion; KILL_SEED=N replays one.
The last `--resume` runs to the end. Compared with an uninterrupted run of the same config: the eval stage's
evidence (evidence/eval_grpo_8.json), the live evaluations (rl/evidence/eval_rl_*.json), both without their run
id (the run's uuid, or its folder's name: the only field naming the run), and every file of rl/export (the final
weights) byte for byte.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
CONFIG = REPO / "bundle" / "grpo" / "config.yaml"
pytest.importorskip("reproduction.sim.generate")
pytest.importorskip("reproduction.recipes.grpo.task")

STEPS = 8
TINY = [
    "sft.train.max_steps=20",
    "sft.train.global_batch=64",
    "sft.train.micro_batch=64",
    f"rl.steps={STEPS}",
    "rl.init_states=2",
    "rl.micro_init_states=1",
    "rl.group_size=2",
    "rl.updates_per_rollout=1",
    "rl.eval_every=2",
    "rl.save_every=2",
    "rl.eval_episodes=1",
    "rl.rollout_workers=1",
    "eval.episodes_per_task=3",
]
"""20 BC steps, then 8 GRPO steps of 2 init states x 2 rollouts with a checkpoint and a live evaluation every 2."""


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{HERE}"}


def _cmd(bundle: Path, run: Path, *extra: str, point: str | None = None) -> list[str]:
    args = ["-q", "run", str(bundle), "--config", str(CONFIG), "--output", str(run), *extra, *TINY]
    if point is None:
        return [sys.executable, "-m", "reproduction.portable", *args]
    return [sys.executable, str(HERE / "kill_points.py"), point, "--", *args]


def _state(run: Path) -> dict:
    return json.loads((run / "run.json").read_text()) if (run / "run.json").is_file() else {"stages": {}}


def evidence_of(run: Path) -> dict[str, object]:
    """What must not depend on a kill: the evaluation evidence (without its run id) and the rl export's bytes."""
    out: dict[str, object] = {}
    for path in sorted([*(run / "evidence").glob("eval_grpo_*.json"), *(run / "rl" / "evidence").glob("*.json")]):
        doc = json.loads(path.read_text())
        doc.pop("run_id")
        out[str(path.relative_to(run))] = doc
    for path in sorted(p for p in (run / "rl" / "export").rglob("*") if p.is_file()):
        out[str(path.relative_to(run))] = path.read_bytes()
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The demonstrations and an uninterrupted run; returns (bundle, clean run, the clean rl stage's seconds)."""
    from reproduction.sim.generate import GenConfig, generate_dataset

    root = tmp_path_factory.mktemp("grpo_kill")
    bundle = root / "bundle"
    generate_dataset(
        GenConfig(kind="sft", tasks=("FetchPush-v4",), episodes_per_task=3, cameras=()), bundle / "data" / "sft"
    )
    clean = root / "clean"
    proc = subprocess.run(_cmd(bundle, clean), env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rl = _state(clean)["stages"]["rl"]
    times = _train_times(clean)
    step_s = (times[STEPS] - times[1]) / (STEPS - 1)
    return bundle, clean, rl["ended"] - rl["started"], step_s


def _newest_checkpoint(run: Path) -> int:
    from reproduction.train.checkpoint import complete_steps

    steps = complete_steps(run / "rl" / "checkpoints")
    return steps[-1] if steps else 0


def _train_times(run: Path, since: float = 0.0) -> dict[int, float]:
    """{step: time} of rl/metrics.jsonl's train records written at or after `since` (a line being written is
    skipped)."""
    out: dict[int, float] = {}
    path = run / "rl" / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("split") == "train" and rec.get("time", 0) >= since:
            out[int(rec["step"])] = float(rec["time"])
    return out


def _kill_in_rl(cmd: list[str], run: Path, step: int, fraction: float, clean_step_s: float, log: Path) -> str:
    """Start `cmd`, wait until it logs rl step `step`, then kill -9 its process group `fraction` of its last step's
    time later (the uninterrupted run's step time when it logged only this one). Returns "killed", or "finished
    first" when it ended before."""
    launched = time.time()
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, env=_env(), stdout=out, stderr=out, start_new_session=True)
    deadline = time.monotonic() + 600
    times: dict[int, float] = {}
    while proc.poll() is None and time.monotonic() < deadline and step not in times:
        time.sleep(0.02)
        times = _train_times(run, since=launched)
    step_s = times[step] - times[step - 1] if step - 1 in times and step in times else clean_step_s
    try:
        proc.wait(timeout=fraction * step_s)
        return "finished first"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the run and any worker it started
        proc.wait(timeout=60)
        return "killed"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_kill_nine_during_rl_then_resume_gives_the_same_evidence_and_weights(world, tmp_path):
    bundle, clean, rl_seconds, step_s = world
    seed = int(os.environ.get("KILL_SEED", random.SystemRandom().randrange(2**31)))
    rng = random.Random(seed)
    run, log = tmp_path / "run", tmp_path / "portable.log"
    history: list[str] = []

    def where() -> str:
        return f"seed {seed} (KILL_SEED={seed} replays it), uninterrupted rl {rl_seconds:.1f} s; " + "; ".join(history)

    # 1. inside the second rl checkpoint save: the shards of step 4 are written, its manifest is not
    planted = subprocess.run(
        _cmd(bundle, run, point="rl_dcp_save"),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
        start_new_session=True,
    )
    assert planted.returncode == -signal.SIGKILL, f"the save was never reached: {planted.stderr[-3000:]}"
    assert _newest_checkpoint(run) == 2 and (run / "rl" / "checkpoints" / "step_4.partial").is_dir(), where()
    history.append("killed inside the step-4 checkpoint save")

    # 2. and 3. at random moments of what is left of the rl stage: after step k (at < k < STEPS) and a fraction
    for kill in range(2):
        at = _newest_checkpoint(run)
        # The first leaves room for the second: a kill planned late in step k can land after checkpoint k + 1 (CI
        # drew step 7 of 8, the kill came after checkpoint 8, and the second had no step left: randint(9, 7)).
        last = STEPS - 3 if kill == 0 else STEPS - 1
        if at + 1 > last:
            history.append(f"resumed from step {at}: no step left for another kill")
            break
        step, fraction = rng.randint(at + 1, last), round(rng.uniform(0.05, 0.95), 3)
        outcome = _kill_in_rl(_cmd(bundle, run, "--resume"), run, step, fraction, step_s, log)
        history.append(
            f"resumed from step {at}, {outcome} {fraction} of a step after step {step} "
            f"(then at checkpoint {_newest_checkpoint(run)})"
        )
        print(history[-1])
        assert outcome == "killed", f"the run ended before the kill: {where()}"

    done = subprocess.run(_cmd(bundle, run, "--resume"), env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{where()}\n{done.stderr[-3000:]}"
    state = _state(run)
    assert [state["stages"][n]["status"] for n in ("sft", "rl", "eval", "compare")] == ["complete"] * 4, where()
    assert state["stages"]["rl"]["step"] == STEPS, where()

    got, want = evidence_of(run), evidence_of(clean)
    assert sorted(got) == sorted(want), where()
    assert sorted(p for p in want if p.startswith("rl/evidence/")) == [
        f"rl/evidence/eval_rl_{s}.json" for s in (2, 4, 6, 8)
    ]
    for name in want:
        assert got[name] == want[name], f"{name} differs after the kills: {where()}"
    sft = (clean / "sft" / "export" / "model.safetensors").read_bytes()
    assert want["rl/export/model.safetensors"] != sft  # rl changed the weights: the comparison means something
    print(where())


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_plain_resume_after_a_killed_target_step_drops_the_killed_attempts_live_evaluation(world, tmp_path):
    """audit50 F5: `--target-step 10 --stages rl` killed in its step-10 checkpoint save (step 10's live evaluation
    written, its checkpoint not), then `--resume --target-step 8` (a plain --resume continues to 10 since audit54
    A6): rl ends at step 8 and records neither as output nor in lineage the killed attempt's evaluation of step-10
    weights the run never kept; everything else is the uninterrupted run's."""
    bundle, clean, _, _ = world
    run = tmp_path / "run"
    # The starting point, a complete run of this config: the module's uninterrupted one, copied (a second identical
    # run of sft and 8 rl steps proved nothing the first test's kills and resume do not; this test is about what the
    # killed --target-step attempt leaves and what the resume drops). The copy runs on: rl resumes from step_8.
    shutil.copytree(clean, run)
    killed = subprocess.run(
        _cmd(bundle, run, "--target-step", "10", "--stages", "rl", point="rl_first_dcp_save"),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
        start_new_session=True,
    )
    assert killed.returncode == -signal.SIGKILL, f"the step-10 save was never reached: {killed.stderr[-3000:]}"
    stray = run / "rl" / "evidence" / f"eval_rl_{STEPS + 2}.json"
    assert stray.is_file() and _newest_checkpoint(run) == STEPS  # what the kill left: an evaluation of step 10

    done = subprocess.run(
        _cmd(bundle, run, "--resume", "--target-step", str(STEPS)),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rl = _state(run)["stages"]["rl"]
    assert rl["status"] == "complete" and rl["step"] == STEPS
    assert "target_step" not in _state(run)  # the killed invocation's target, superseded and cleared
    assert not stray.exists()
    assert sorted(p for p in rl["outputs"] if p.startswith("evidence/")) == [
        f"evidence/eval_rl_{s}.json" for s in (2, 4, 6, 8)
    ]
    assert stray.name not in (run / "lineage" / "rl.intoto.json").read_text()
    got, want = evidence_of(run), evidence_of(clean)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], name


def _refused(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_resume_refuses_a_changed_live_evaluation_setting(world, tmp_path):
    """audit62 K M1: rl.eval_every / rl.eval_episodes decide the rl stage's live evaluations
    (rl/evidence/eval_rl_*.json, outputs of the stage), so they key it: a `--resume` of a complete rl stage or of
    one killed mid-continuation that changes one is refused (exit 52, one line naming the field and both values),
    where before it was accepted and the run ended with eval_rl files of two settings, its lineage naming only the
    new one."""
    bundle, clean, _, _ = world
    run = tmp_path / "run"
    shutil.copytree(clean, run)
    outputs = sorted((run / "rl" / "evidence").glob("*.json"))
    # complete: the changed field names the stage as any output-changing field does (--restart-stage redoes it)
    proc = _refused([*_cmd(bundle, run, "--resume"), "rl.eval_every=1"])
    assert proc.returncode == 52, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "stage rl" in errors[0] and "config.rl.eval_every: 2 -> 1" in errors[0], errors
    assert "--restart-stage rl" in proc.stderr
    # killed inside a continuation's checkpoint save (its step-10 live evaluation written, the checkpoint not)
    killed = subprocess.run(
        _cmd(bundle, run, "--target-step", "10", "--stages", "rl", point="rl_first_dcp_save"),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
        start_new_session=True,
    )
    assert killed.returncode == -signal.SIGKILL, f"the step-10 save was never reached: {killed.stderr[-3000:]}"
    assert _state(run)["stages"]["rl"]["status"] != "complete"
    before = {p: p.read_bytes() for p in (run / "rl" / "evidence").glob("*.json")}
    proc = _refused([*_cmd(bundle, run, "--resume"), "rl.eval_episodes=2"])
    assert proc.returncode == 52, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "config.rl.eval_episodes: 1 -> 2" in errors[0], errors
    assert {p: p.read_bytes() for p in (run / "rl" / "evidence").glob("*.json")} == before  # nothing rewritten
    assert sorted(before) == sorted([*outputs, run / "rl" / "evidence" / "eval_rl_10.json"])


FREE = [
    "rl.rollout_workers=2",
    "rl.save_every=4",
    "eval.workers=2",
    "sft.train.log_interval=5",
    "sft.train.keep_last=3",
    "sft.train.eval_interval=10",
]
"""Fields declared same_outputs() (rl, eval and the sft trainer's), each away from the world's run's value."""


def _outputs(run: Path) -> dict[str, bytes]:
    """Every file run.json records as a stage's output, its text with the run folder's path put as RUN and an
    evidence file's run id (the folder's name) left out."""
    out: dict[str, bytes] = {}
    for name, rec in _state(run)["stages"].items():
        for rel in rec["outputs"]:
            path = (run / name / rel).resolve()
            data = path.read_bytes()
            if path.suffix == ".json":
                doc = json.loads(data.decode().replace(str(run), "RUN"))
                if isinstance(doc, dict) and "run_id" in doc:
                    doc.pop("run_id")
                data = json.dumps(doc, sort_keys=True).encode()
            out[str(path.relative_to(run.resolve()))] = data
    return out


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fields_declared_free_change_no_output_byte(world, tmp_path):
    """audit62 K (fixer): a field declared same_outputs() is out of its stages' keys, so two runs that differ only in
    such fields must record the same outputs. They did not: grpo_setup.json held rl.rollout_workers and the whole
    eval section (eval.workers), the exports' train_config.json and policy_setup.json the trainers' intervals, and
    the evaluation evidence the digests of those exports."""
    bundle, clean, _, _ = world
    run = tmp_path / "run"
    proc = subprocess.run([*_cmd(bundle, run), *FREE], env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got, want = _outputs(run), _outputs(clean)
    assert sorted(got) == sorted(want)
    assert [name for name in want if got[name] != want[name]] == []
    setup = json.loads((run / "rl" / "grpo_setup.json").read_text())
    assert "rollout_workers" not in setup["rl"] and list(setup["eval"]) == ["seed"]
