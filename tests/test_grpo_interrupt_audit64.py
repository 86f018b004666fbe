"""audit64 k2: Ctrl-C (SIGINT to the whole process group) during a GRPO `portable run` with rl.rollout_workers=2 printed
the rollout workers' KeyboardInterrupt tracebacks (a worker still importing: 'Fatal Python error: init_import_site';
one waiting for its next command: a traceback in `conn.recv()`) beside the driver's one-line `error: interrupted`.
The rollout workers (envs.EnvWorkers, spawn processes outside run_units) now start with SIGINT blocked, as run_units'
pool workers do, and the driver ends them itself: exit 130, the one line and its hint, the rl stage `interrupted`,
no process left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from interruptkit import (
    REPO,
    child_env,
    in_session,
    kill_all,
    marked,
    own_session,
    own_session_script,
    poll_until,
    run_python,
)

CONFIG = REPO / "bundle" / "grpo" / "config.yaml"
pytest.importorskip("reproduction.sim.generate")
pytest.importorskip("reproduction.recipes.grpo.task")
pytestmark = [
    pytest.mark.skipif(not Path("/proc/self/environ").is_file(), reason="finds the workers in /proc"),
    pytest.mark.usefixtures("terminal_sigint"),  # the Ctrl-C it sends must not be ignored (conftest)
]

TINY = [
    "sft.train.max_steps=2",
    "sft.train.global_batch=64",
    "sft.train.micro_batch=64",
    "rl.steps=40",
    "rl.init_states=2",
    "rl.micro_init_states=1",
    "rl.group_size=2",
    "rl.updates_per_rollout=1",
    "rl.eval_every=40",
    "rl.save_every=40",
    "rl.eval_episodes=1",
    "rl.rollout_workers=2",
    "eval.episodes_per_task=1",
]


def _train_records(run: Path) -> int:
    path = run / "rl" / "metrics.jsonl"
    return sum('"train"' in line for line in path.read_text().splitlines()) if path.is_file() else 0


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    from reproduction.sim.generate import GenConfig, generate_dataset

    root = tmp_path_factory.mktemp("grpo_int") / "bundle"
    generate_dataset(
        GenConfig(kind="sft", tasks=("FetchPush-v4",), episodes_per_task=2, cameras=()), root / "data" / "sft"
    )
    return root


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("moment", ["starting", "running"])
def test_ctrl_c_while_the_rollout_workers_start_or_run_is_one_line(bundle, tmp_path, moment):
    mark = uuid.uuid4().hex
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "reproduction.portable", "-q", "run", str(bundle), "--config", str(CONFIG)]
    cmd += ["--output", str(run), "--stages", "sft,rl", *TINY]
    env = child_env(K2_AUDIT64=mark)
    with own_session(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        deadline = time.monotonic() + 240
        if moment == "starting":  # a rollout worker's interpreter is starting (spawn_main importing)
            while not any("spawn_main" in c for _, c in marked(mark)) and time.monotonic() < deadline:
                assert proc.poll() is None, proc.communicate()[1]
                time.sleep(0.005)
            time.sleep(0.05)
        else:  # two rl steps done: the workers wait for their next command or step their envs
            while _train_records(run) < 2 and time.monotonic() < deadline:
                assert proc.poll() is None, proc.communicate()[1]
                time.sleep(0.02)
        assert proc.poll() is None, "the run ended before the interrupt"
        os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C: to every process of the group, the rollout workers too
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    lines = err.strip().splitlines()
    assert lines[0] == "error: interrupted" and len(lines) == 2 and lines[1].startswith("hint: "), err
    assert json.loads((run / "run.json").read_text())["stages"]["rl"]["status"] == "interrupted"
    poll_until(lambda: not marked(mark), 10, every_s=0.1)  # the resource tracker ends once the driver is gone
    left = marked(mark)
    kill_all(left)
    assert left == []


MASKS = """
import signal
from reproduction.recipes.grpo.envs import EnvWorkers
group = EnvWorkers("FetchPush-v4", 2, 2)
group.reset([0, 2])
status = [open(f"/proc/{p.pid}/status").read() for p in group.procs]
print(*[[l for l in s.splitlines() if l.startswith("SigBlk:")][0].split()[1] for s in status])
print(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, set()))
group.close()
"""


def test_rollout_workers_start_with_sigint_blocked_in_a_fresh_interpreter():
    """Both workers, the first too: it starts multiprocessing's resource tracker, whose start unblocks SIGINT (it does
    not restore the mask), so the tracker is started before the block. The driver's own mask is as before."""
    out = run_python(MASKS)
    assert out.returncode == 0, out.stderr
    masks, driver = out.stdout.splitlines()
    assert [bool(int(m, 16) & (1 << (signal.SIGINT - 1))) for m in masks.split()] == [True, True], masks
    assert driver == "False"


STARTS = """
import multiprocessing.util, time
from interruptkit import one_line_interrupt, sigint_taking_thread, slowed
from reproduction.recipes.grpo.envs import EnvWorkers

sigint_taking_thread()  # as rich's refresh thread: SIGINT unblocked
# a worker forked, its preparation data not yet written (as under load)
multiprocessing.util.spawnv_passfds = slowed(multiprocessing.util.spawnv_passfds)
with one_line_interrupt():
    EnvWorkers("FetchPush-v4", 2, 2)
    time.sleep(60)
"""


def test_ctrl_c_another_thread_takes_while_the_rollout_workers_start_is_one_line():
    """review64 K M1: the rollout workers' SIGINT block held only in the starting thread; rich's refresh thread took
    the group's Ctrl-C and Python raised it in the main thread between a worker's fork and the write of its
    preparation data: that worker (SIGINT blocked) lived on and printed an EOFError traceback. The interrupt now
    waits for the starts, and the driver ends the workers."""
    with own_session_script(STARTS, stderr=subprocess.PIPE) as proc:
        poll_until(lambda: len(in_session(proc.pid)) >= 3, 60)  # the driver, the tracker, a worker
        time.sleep(0.1)  # inside the slowed start
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip() == "error: interrupted", err
    poll_until(lambda: not in_session(proc.pid), 15, every_s=0.1)
    assert in_session(proc.pid) == []
