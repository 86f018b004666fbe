"""Findings of audit47's CLI pass fixed at stop 48a: a run.json that is a folder (exit 3, named); a refused count
says the values allowed; an interpolation to no key names its --config file; build_evidence's non-count arguments
(seeds, margins, tolerances, alpha) are exit 4 naming the argument; a write into a read-only evidence/ names the
evidence file (not its temp) and the folder to fix. BUNDLE= checked for its bundle.json:
tests/test_run_bundle_inputs.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from reproduction.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent


def _cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "reproduction.portable", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


def _one_error(proc: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith("error: "), proc.stderr
    return first


def test_a_run_json_that_is_a_folder_is_exit_3_naming_it(tmp_path):
    run = tmp_path / "run"
    (run / "run.json").mkdir(parents=True)
    proc = _cli("run", "--output", str(run), "--resume", "--stages", "returns")
    assert proc.returncode == 3, proc.stderr
    first = _one_error(proc)
    assert str(run / "run.json") in first and "is a folder, not a file" in first
    assert (run / "run.json").is_dir() and sorted(p.name for p in run.iterdir()) == ["run.json"]


def test_a_negative_step_count_is_refused_with_the_values_allowed():
    proc = _cli("run", "--output", "/nonexistent/run", "--print-config", "value.train.max_steps=-5")
    assert proc.returncode == 4, proc.stderr
    assert _one_error(proc) == "error: command line: value.train.max_steps=-5 must be >= 1"  # audit58 D6
    assert (
        proc.stderr.splitlines()[1] == "hint: set value.train.max_steps to a whole number of 1 or more (docs/config.md)"
    )


@pytest.mark.parametrize(
    "override",
    ["policy.train.warmup_steps=-1", "policy.model.chunk=0", "value.model.folds=0", "advantages.lookahead=0"],
)
def test_each_impossible_count_says_what_values_are_allowed(override):
    from reproduction.recipes.recap.config import load_config

    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    key = override.partition("=")[0]
    assert err.value.field == key and err.value.hint and err.value.hint.startswith(f"set {key} to a whole number of ")


def test_an_interpolation_to_no_key_names_its_config_file_and_key(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("eval:\n  seed: ${nosuch.key}\n")
    other = tmp_path / "d.yaml"
    other.write_text("eval:\n  workers: 2\n")
    proc = _cli(
        "run", "--config", str(config), "--config", str(other), "--output", str(tmp_path / "r"), "--print-config"
    )
    assert proc.returncode == 4, proc.stderr
    assert _one_error(proc) == f"error: {config}: config key `eval.seed`: Interpolation key 'nosuch.key' not found"
    assert proc.stderr.splitlines()[1].startswith("hint: ") and not (tmp_path / "r").exists()
    proc = _cli("run", "--output", str(tmp_path / "r"), "--print-config", "eval.seed=${nosuch.key}")
    assert proc.returncode == 4 and _one_error(proc).startswith("error: command line: config key `eval.seed`: ")


@pytest.mark.parametrize(
    "kwargs,words",
    [
        ({"seeds": {"eval": "abc"}}, "seeds['eval'] is 'abc', not a whole number"),
        ({"seeds": {"eval": None}}, "seeds['eval'] is None, not a whole number"),
        ({"seeds": [1, 2]}, "seeds is [1, 2], not a mapping"),
        ({"margins": {"success_once": "wide"}}, "margins['success_once'] is 'wide', not a finite number"),
        ({"margins": {"success_once": float("nan")}}, "margins['success_once'] is nan"),
        ({"tolerances": {"success_once": [0.1]}}, "tolerances['success_once'] is [0.1]"),
        ({"alpha": "0.05x"}, "alpha is '0.05x', not a finite number"),
        ({"alpha": True}, "alpha is True"),
    ],
)
def test_a_non_number_given_to_build_evidence_is_exit_4_naming_the_argument(kwargs, words):
    from evidence_fixtures import eval_result

    from reproduction.errors import InvalidInputError
    from reproduction.run.evidence import EvalRecord, build_evidence

    record = EvalRecord(result=eval_result({"t0": (3, 10)}), label="pol", mode="bc")
    args = {"name": "e", "run_id": "r", "seeds": {"eval": 1}, "settings": {}} | kwargs
    with pytest.raises(InvalidInputError) as err:
        build_evidence(record, **args)
    assert words in str(err.value) and err.value.hint and err.value.exit_code == 4


def _refuse_temp_files(monkeypatch):
    """mkstemp as in a read-only (chattr +i) folder: EPERM naming the temp name it tried."""
    import errno
    import tempfile

    def refused(prefix="", suffix="", dir=None):
        raise PermissionError(errno.EPERM, "Operation not permitted", os.path.join(dir, f"{prefix}abcdefgh{suffix}"))

    monkeypatch.setattr(tempfile, "mkstemp", refused)


def test_a_write_into_a_read_only_folder_names_the_file_not_its_temp(tmp_path, monkeypatch):
    from reproduction.fsio import atomic_write_text

    _refuse_temp_files(monkeypatch)
    target = tmp_path / "evidence" / "x.json"
    with pytest.raises(PermissionError) as err:
        atomic_write_text(target, "{}")
    assert err.value.filename == str(target) and "portable-tmp" not in str(err.value)


def test_evidence_into_a_read_only_evidence_folder_names_it_and_the_fix(tmp_path, monkeypatch):
    from reproduction.errors import WriteFailedError
    from reproduction.run.evidence import write_evidence

    _refuse_temp_files(monkeypatch)
    target = tmp_path / "evidence" / "eval_checkpoint_1000.json"
    with pytest.raises(WriteFailedError) as err:
        write_evidence(target, {"metrics": {}})
    assert str(err.value) == f"cannot write an evidence file: operation not permitted ({target})"
    assert err.value.exit_code == 8 and err.value.hint.startswith(f"make {target.parent} writable")
    assert list((tmp_path / "evidence").iterdir()) == []
