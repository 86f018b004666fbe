"""Findings of audit47's CLI pass fixed at stop 48c (F17): an unwritable output is named before the work, not after
it. `portable eval` into a run whose evidence/ is read-only evaluated every export (minutes of rollouts) and only then
failed with exit 8; `portable fetch OWNER/NAME READONLY_DIR` asked the Hub first (exit 33 after retries against an
unreachable Hub) and never said DIR was unwritable. Both are exit 8 naming the folder now, before any evaluation or
Hub request. A read-only folder is simulated by refusing tempfile.mkstemp (the suite runs as root, where chmod does
not stop writes)."""

from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path

import pytest

from reproduction.portable import main


def _refuse_writes_in(monkeypatch, *folders: Path):
    """mkstemp as in read-only (chattr +i) `folders`: EPERM naming the temp name it tried; elsewhere as usual."""
    real = tempfile.mkstemp
    refused = {str(f) for f in folders}

    def mkstemp(suffix=None, prefix=None, dir=None, text=False):
        if str(dir) in refused:
            tried = os.path.join(dir, f"{prefix}abcdefgh{suffix}")
            raise PermissionError(errno.EPERM, "Operation not permitted", tried)
        return real(suffix=suffix, prefix=prefix, dir=dir, text=text)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


def _spy(monkeypatch, target: str) -> list:
    calls: list = []
    monkeypatch.setattr(target, lambda *a, **k: calls.append((a, k)) or pytest.fail(f"{target} was called"))
    return calls


@pytest.mark.parametrize("recipe", ["recap", "grpo"])
def test_eval_into_a_read_only_evidence_folder_is_exit_8_before_anything_is_evaluated(
    recipe, tmp_path, monkeypatch, capsys
):
    export = tmp_path / "a" / "export"
    export.mkdir(parents=True)
    meta = {"mode": "recap"} if recipe == "recap" else {"algorithm": "grpo", "mode": "bc"}
    (export / "policy.json").write_text(json.dumps(meta | {"format_version": 1}))
    (export / "train_config.json").write_text(json.dumps({"max_steps": 40}))
    run = tmp_path / "run"
    (run / "evidence").mkdir(parents=True)
    seam = "reproduction.recipes.recap.policy" if recipe == "recap" else "reproduction.recipes.grpo.stages"
    calls = _spy(monkeypatch, f"{seam}.evaluate_exports")
    _refuse_writes_in(monkeypatch, run / "evidence")
    capsys.readouterr()
    code = main(["eval", "--checkpoint", str(export), "--output", str(run), f"recipe={recipe}"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 8 and calls == [], lines
    assert lines == [
        f"error: cannot write an evidence file: operation not permitted ({run / 'evidence'})",
        f"hint: make {run / 'evidence'} writable (its permissions, `chattr -i`, a read-write mount), then rerun the "
        "same command",
    ]
    assert list((run / "evidence").iterdir()) == [] and not (run / "eval_checkpoint").exists()


def test_eval_whose_simulator_output_folder_is_read_only_is_exit_8_before_anything_is_evaluated(
    tmp_path, monkeypatch, capsys
):
    export = tmp_path / "a" / "export"
    export.mkdir(parents=True)
    (export / "policy.json").write_text(json.dumps({"mode": "recap", "format_version": 1}))
    run = tmp_path / "run"
    (run / "eval_checkpoint").mkdir(parents=True)  # the output folder inside it is new: its parent is probed
    calls = _spy(monkeypatch, "reproduction.recipes.recap.policy.evaluate_exports")
    _refuse_writes_in(monkeypatch, run / "eval_checkpoint")
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(export), "--output", str(run)]) == 8
    err = capsys.readouterr().err.strip().splitlines()
    assert calls == [] and len(err) == 2, err
    assert err[0].startswith("error: cannot write the evaluation's output: operation not permitted")
    assert str(run / "eval_checkpoint" / "checkpoint_") in err[0]
    assert list((run / "eval_checkpoint").iterdir()) == [] and list(run.iterdir()) == [run / "eval_checkpoint"]


@pytest.mark.parametrize("exists", [True, False])
def test_fetch_into_a_read_only_folder_is_exit_8_naming_it_before_the_hub_is_asked(
    exists, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # a closed port, should anything get through
    calls = _spy(monkeypatch, "reproduction.release.hub._client")
    readonly = tmp_path / "ro"
    readonly.mkdir()
    dest = readonly if exists else readonly / "bundle"  # a new folder: where it would be created is probed
    _refuse_writes_in(monkeypatch, readonly)
    capsys.readouterr()
    code = main(["fetch", "me/x", str(dest)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 8 and calls == [], lines
    assert lines == [
        f"error: cannot write the fetched bundle: operation not permitted ({dest})",
        f"hint: make {dest} writable (its permissions, `chattr -i`, a read-write mount) or fetch into another folder",
    ]
    assert list(readonly.iterdir()) == []


def test_weights_fetch_into_a_read_only_folder_an_earlier_fetch_wrote_is_exit_8_before_the_hub_is_asked(
    tmp_path, monkeypatch, capsys
):
    """A rerun: the folder's .portable/ (and its lock file) exist, so creating them no longer finds the folder
    read-only; the probe does, before any download."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    calls = _spy(monkeypatch, "reproduction.release.weights_hub._fetch_weights_locked")
    manifest = Path(__file__).resolve().parent.parent / "weights_manifest" / "value_tiny.json"
    dest = tmp_path / "weights"
    (dest / ".portable").mkdir(parents=True)
    (dest / ".portable" / "lock").write_text("")
    _refuse_writes_in(monkeypatch, dest)
    capsys.readouterr()
    code = main(["weights", "fetch", str(manifest), str(dest)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 8 and calls == [], lines
    assert lines == [
        f"error: cannot write the weights: operation not permitted ({dest})",
        f"hint: make {dest} writable (its permissions, `chattr -i`, a read-write mount) or fetch into another folder",
    ]
    assert sorted(p.name for p in dest.iterdir()) == [".portable"]
