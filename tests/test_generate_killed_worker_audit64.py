"""audit64 kev: a data generator's pool worker killed (out of memory, kill -9) got the generic hint, "rerun the same
command", where the runner's killed-worker hint (errors.killed_worker_hint) also names the flag for one process:
`python -m reproduction.sim generate` (Fetch and LIBERO tasks) and `python -m reproduction.sim.libero.generate` now
give it with `--workers=1`. The pool is real (spawn); its units are swapped for ones that SIGKILL their worker."""

from __future__ import annotations

import signal

import pytest

from reproduction.sim import generate as fetch_gen
from reproduction.sim import workers
from reproduction.sim.libero import generate as libero_gen

HINT = (
    "hint: a worker process was killed (out of memory? kill -9?): rerun the same command; if workers keep dying, add "
    "--workers=1 (one process, where a failure shows)"
)


@pytest.fixture
def killing_pool(monkeypatch):
    """run_units as the generators call it, but each unit SIGKILLs the spawn worker running it."""
    seen = []

    def run_units(fn, payloads, *, workers=1, runner=None, killed_hint=None):
        seen.append(killed_hint)
        return real(signal.raise_signal, [signal.SIGKILL, signal.SIGKILL], workers=2, killed_hint=killed_hint)

    real = workers.run_units
    monkeypatch.setattr(fetch_gen, "run_units", run_units)
    monkeypatch.setattr(libero_gen, "run_units", run_units)
    return seen


def _check(code: int, err: str, tmp_path) -> None:
    lines = err.strip().splitlines()
    assert code == 51, err
    assert lines[-2].startswith("error: simulator worker"), err
    assert lines[-1] == HINT
    assert "Traceback" not in err


def test_fetch_generate_killed_worker_names_workers_flag(killing_pool, tmp_path, capsys):
    from reproduction.sim.__main__ import main

    code = main(["generate", "--out", str(tmp_path / "d"), "--workers", "2", "--no-progress"])
    _check(code, capsys.readouterr().err, tmp_path)
    assert not (tmp_path / "d" / "sft").exists()  # nothing half-written


def test_fetch_mix_killed_in_the_rollout_set_says_to_delete_the_sft_set_first(monkeypatch, tmp_path, capsys):
    """The sft set was written whole when the rollout set's worker died: the same command would be refused (`sft:
    already exists`), so the hint names the set to delete before the rerun."""
    from reproduction.sim.__main__ import main

    calls = []

    def run_units(fn, payloads, *, workers=1, runner=None, killed_hint=None):
        calls.append(killed_hint)
        if len(calls) == 1:  # the sft set: generated in this process
            return real(fn, payloads, workers=1)
        return real(signal.raise_signal, [signal.SIGKILL, signal.SIGKILL], workers=2, killed_hint=killed_hint)

    real = workers.run_units
    monkeypatch.setattr(fetch_gen, "run_units", run_units)
    monkeypatch.setitem(fetch_gen.MIXES, "tiny", fetch_gen.DataMix(sft_episodes=2, rollout_episodes=2))
    args = ["generate", "--out", str(tmp_path / "d"), "--mix", "tiny", "--workers", "2", "--no-progress"]
    code = main(args)
    err = capsys.readouterr().err
    sft = tmp_path / "d" / "sft"
    assert code == 51, err
    assert err.strip().splitlines()[-1] == (
        f"hint: a worker process was killed (out of memory? kill -9?): delete {sft} (written whole before the worker "
        "died; a rerun refuses a set that exists), then rerun the same command; if workers keep dying, add "
        "--workers=1 (one process, where a failure shows)"
    )
    assert sft.is_dir() and not (tmp_path / "d" / "rollout").exists()
    assert main(args) == 4 and f"{sft}: already exists" in capsys.readouterr().err  # why the hint says so


@pytest.fixture
def fake_libero(monkeypatch):
    from tests.test_libero_generate_unit import _FakeExpert, _FakeSim

    monkeypatch.setattr(libero_gen, "_build_sim", lambda config, cache_dir: _FakeSim())
    monkeypatch.setattr(libero_gen, "expert_for", lambda mode, rng, seed: (_FakeExpert(seed), {}))
    yield
    libero_gen.close_envs()


def test_libero_generate_killed_worker_names_workers_flag(killing_pool, fake_libero, tmp_path, capsys):
    from reproduction.sim.__main__ import main

    args = ["--sft", "2", "--rollouts", "0", "--eval", "0", "--max-steps", "4", "--workers", "2", "--no-progress"]
    code = main(["generate", "--tasks", "libero_spatial/0", "--out", str(tmp_path / "d"), *args])
    _check(code, capsys.readouterr().err, tmp_path)
    code = libero_gen.main(["--task", "libero_spatial/0", "--out", str(tmp_path / "e"), *args])
    _check(code, capsys.readouterr().err, tmp_path)
    assert not (tmp_path / "e" / "sft").exists()
    assert killing_pool == [HINT.removeprefix("hint: ")] * 2
