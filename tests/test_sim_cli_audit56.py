"""audit56: the simulator data generators' command lines agree on a bad count, give a way forward when every set
exists, keep a second SIGTERM from leaving a staging folder, and refuse an empty `eval --out` as `portable` does."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def no_generation(monkeypatch):
    import reproduction.sim.libero.generate as gen
    from reproduction.sim import generate

    monkeypatch.setattr("reproduction.sim.libero._runtime.check_render_backend", lambda: None)
    monkeypatch.setattr(gen, "generate_libero_dataset", lambda *a, **k: pytest.fail("generation started"))
    monkeypatch.setattr(generate, "generate_mix", lambda *a, **k: pytest.fail("generation started"))
    return gen


@pytest.mark.parametrize("flag", ["--sft", "--rollouts", "--eval"])
@pytest.mark.parametrize("tasks", [["--tasks", "push"], ["--tasks", "libero_spatial/0"]])
def test_both_generators_refuse_a_negative_count_with_one_exit_code_and_message(
    tmp_path, capsys, no_generation, flag, tasks
):
    from reproduction.sim.__main__ import main as sim_main

    expected = [f"error: {flag} -2 must be >= 0 (0 skips that set)", f"hint: set {flag} 0 or more"]
    assert sim_main(["generate", *tasks, "--out", str(tmp_path / "a"), flag, "-2"]) == 4
    assert capsys.readouterr().err.splitlines() == expected
    assert no_generation.main(["--out", str(tmp_path / "b"), flag, "-2"]) == 4
    assert capsys.readouterr().err.splitlines() == expected
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_rerun_over_every_set_hints_how_to_write_them_again(tmp_path, capsys, no_generation):
    for name in ("sft", "rollouts_train", "rollouts_eval"):
        (tmp_path / name).mkdir()
    argv = ["--out", str(tmp_path), "--task", "libero_spatial/0", "--sft", "1", "--rollouts", "1", "--eval", "1"]
    assert no_generation.main(argv) == 4
    assert capsys.readouterr().err.splitlines() == [
        f"error: {tmp_path / 'sft'}: already exists",
        "hint: every set asked for is already written: choose a new --out, or delete "
        f"{tmp_path / 'sft'} {tmp_path / 'rollouts_train'} {tmp_path / 'rollouts_eval'} to write it again",
    ]


def _episodes(first_sigterm: list[int]):
    from reproduction.data.writer import EpisodeData

    frames = {"observation.state": np.zeros((3, 2), np.float32), "action": np.zeros((3, 2), np.float32)}
    yield EpisodeData(episode_index=0, task="t", frames=frames)
    first_sigterm.append(1)
    os.kill(os.getpid(), signal.SIGTERM)  # the first: a KeyboardInterrupt lands in the writer's loop
    yield EpisodeData(episode_index=1, task="t", frames=frames)


def test_a_second_sigterm_during_cleanup_leaves_no_staging_folder(tmp_path, capsys, monkeypatch):
    """The first SIGTERM starts write_dataset's cleanup; a second one arriving inside its rmtree of the staging
    folder raised a second KeyboardInterrupt there and left the folder (what `timeout`/a scheduler sending TERM
    twice did). Now it is held and the folder is removed whole."""
    from reproduction.data.writer import write_dataset
    from reproduction.sim.workers import sigterm_as_interrupt

    real = shutil.rmtree
    sent: list[int] = []

    def rmtree(path, *args, **kwargs):
        if sent == [1] and ".partial-" in Path(path).name and Path(path).exists():  # the finally's removal
            sent.append(2)
            os.kill(os.getpid(), signal.SIGTERM)  # the second, inside the cleanup
        return real(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", rmtree)
    before = signal.getsignal(signal.SIGTERM)
    feats = {"observation.state": {"dtype": "float32", "shape": [2]}, "action": {"dtype": "float32", "shape": [2]}}
    with pytest.raises(KeyboardInterrupt), sigterm_as_interrupt():
        write_dataset(tmp_path / "sft", _episodes(sent), fps=10, features=feats, version="v2.1", tasks=["t"])
    assert sent == [1, 2]
    assert signal.getsignal(signal.SIGTERM) is before  # put back after
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    assert capsys.readouterr().err.splitlines() == [
        "note: already stopping (removing what this run was writing); interrupt 2 more times to quit at once, "
        "leaving it behind"
    ]


def test_the_third_signal_while_stopping_quits_at_once_with_130() -> None:
    """Bounded: a cleanup that hangs is still ended by the signal after the HELD_SIGNALS held ones."""
    code = (
        "import os, signal, time\n"
        "from reproduction.sim.workers import sigterm_as_interrupt\n"
        "with sigterm_as_interrupt():\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(5)\n"
        "    except KeyboardInterrupt:\n"
        "        for _ in range(3):\n"
        "            os.kill(os.getpid(), signal.SIGTERM)\n"
        "            time.sleep(0.01)\n"
        "        time.sleep(30)\n"  # a hanging cleanup
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 130
    assert proc.stderr.splitlines()[-1] == "error: interrupted again: quitting without finishing the cleanup"


@pytest.mark.parametrize("command", [["eval"], ["generate", "--tasks", "push"]])
def test_an_empty_out_is_the_path_error_of_portable(capsys, command):
    """`sim eval --out ""` is refused as `portable run --output ""` is (UsageError, exit 2, error + hint), not by
    argparse, and nothing runs in the current folder."""
    from reproduction.sim.__main__ import main

    assert main([*command, "--out", ""]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: --out is empty: an empty path would mean the current folder",
        "hint: give --out a path (an unset shell variable expands to nothing; use . for this folder)",
    ]
