"""Newcomer mistakes met by the CLI (audit51_I): a new --output/--out under a folder the user cannot write is exit 8
naming the folder and the parent to make writable in run, demo and pack (I1); `portable run --output DIR` with no
BUNDLE and no --config runs the bundle it stands in, or is refused up front (I2); demo's help offers no --json (I3);
a resumed quick GRPO run's refusal names the quick config layer (I4); a BUNDLE that does not exist says so (I5).
In-process through `portable.main`; the unwritable folder is a patched mkdir (chmod does not stop root); fast."""

from __future__ import annotations

import errno
import pathlib
from pathlib import Path

import pytest

from reproduction import portable

TOY = "recipe: tests.test_cli_audit50:RECIPE\n"


@pytest.fixture
def unwritable(monkeypatch, tmp_path):
    """A folder `ro` under tmp_path in which no folder can be made: mkdir raises `error` (an errno) there."""
    ro = tmp_path / "ro"
    ro.mkdir()
    real = pathlib.Path.mkdir
    raised: list[int] = []

    def mkdir(self, *args, **kwargs):
        if Path(self).absolute().parent == ro:
            code = raised[0] if raised else errno.EACCES
            raise OSError(code, "refused by the test", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "mkdir", mkdir)
    return ro, raised


def _err(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


def _expected(ro: Path, name: str, command: str, flag: str, reason: str) -> list[str]:
    return [
        f"error: cannot write the {flag} folder: {reason} ({ro / name})",
        f"hint: {command} needs write access to {ro}; choose a writable {flag} (or make {ro} writable)",
    ]


@pytest.mark.parametrize(
    ("code", "reason"), [(errno.EACCES, "permission denied"), (errno.EROFS, "the filesystem is read-only")]
)
def test_run_into_an_unwritable_parent_is_exit_8_naming_the_parent(tmp_path, capsys, unwritable, code, reason):
    ro, raised = unwritable
    raised.append(code)
    config = tmp_path / "toy.yaml"
    config.write_text(TOY)
    capsys.readouterr()
    assert portable.main(["run", "--config", str(config), "--output", str(ro / "run"), "--no-progress"]) == 8
    assert _err(capsys) == _expected(ro, "run", "run", "--output", reason)
    assert list(ro.iterdir()) == []


@pytest.mark.parametrize("recipe", ["recap", "grpo"])
def test_demo_into_an_unwritable_parent_is_exit_8_naming_the_parent(capsys, unwritable, recipe):
    ro, _ = unwritable
    capsys.readouterr()
    argv = ["demo", "--recipe", recipe, "--output", str(ro / "d")] + (["--quick"] if recipe == "grpo" else [])
    assert portable.main(argv) == 8
    assert _err(capsys) == _expected(ro, "d", "demo", "--output", "permission denied")
    assert list(ro.iterdir()) == []


def test_pack_into_an_unwritable_parent_is_exit_8_naming_the_out_folder(tmp_path, capsys, unwritable):
    from bundlekit import SMALL_SPEC, small_sources

    ro, _ = unwritable
    small_sources(tmp_path)
    (tmp_path / "small.toml").write_text(SMALL_SPEC)
    capsys.readouterr()
    assert portable.main(["pack", str(tmp_path / "small.toml"), "--out", str(ro / "b")]) == 8
    assert _err(capsys) == _expected(ro, "b", "pack", "--out", "permission denied")
    assert list(ro.iterdir()) == []


def test_a_full_disk_keeps_the_disk_full_hint_not_the_permission_one(tmp_path):
    from reproduction.errors import WriteFailedError
    from reproduction.fsio import make_output_folder

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pathlib.Path, "mkdir", full)
        with pytest.raises(WriteFailedError) as info:
            make_output_folder(tmp_path / "x", command="run")
    assert info.value.exit_code == 8 and "write access" not in (info.value.hint or "")


# -- I2: no BUNDLE, no --config ---------------------------------------------------------------------------------------


def test_run_with_no_bundle_and_no_config_is_refused_up_front(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert portable.main(["run", "--output", str(tmp_path / "x")]) == 2
    assert _err(capsys) == [
        "error: no BUNDLE and no --config: a new run has nothing to run",
        f"hint: pass the restored bundle folder (`portable run . --output {tmp_path / 'x'}` from inside it) or "
        "--config FILE",
    ]
    assert not (tmp_path / "x").exists()


def test_run_with_no_bundle_inside_a_bundle_runs_that_bundle(tmp_path, capsys, monkeypatch):
    bundle = tmp_path / "b"
    (bundle / "config").mkdir(parents=True)
    (bundle / "bundle.json").write_text("{}")
    (bundle / "config" / "run.yaml").write_text("BUNDLE: ''\ndata: ${BUNDLE}/d\n")
    monkeypatch.chdir(bundle)
    capsys.readouterr()
    out = tmp_path / "x"
    assert (
        portable.main(["run", "--output", str(out), "--print-config", "recipe=tests.test_cli_audit50:WITH_BUNDLE"]) == 0
    )
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"note: no BUNDLE given: running the bundle in the current folder ({bundle})"]
    assert f"data: {bundle}/d" in captured.out.splitlines()


def test_run_with_overrides_or_config_and_no_bundle_works_as_before(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "x"
    assert portable.main(["run", "--output", str(out), "--print-config", "eval.seed=7"]) == 0
    config = tmp_path / "toy.yaml"
    config.write_text(TOY)
    assert portable.main(["run", "--config", str(config), "--output", str(out), "--no-progress"]) == 0
    assert (out / "run.json").is_file()


# -- I5 --------------------------------------------------------------------------------------------------------------


def test_a_bundle_that_does_not_exist_says_so_and_a_file_is_not_a_folder(tmp_path, capsys):
    (tmp_path / "f").write_text("")
    capsys.readouterr()
    assert portable.main(["run", str(tmp_path / "nope"), "--output", str(tmp_path / "x")]) == 3
    assert _err(capsys)[0] == f"error: bundle {tmp_path / 'nope'} does not exist"
    assert portable.main(["run", str(tmp_path / "f"), "--output", str(tmp_path / "x")]) == 3
    assert _err(capsys)[0] == f"error: bundle {tmp_path / 'f'} is not a folder"


# -- I3, I4 ----------------------------------------------------------------------------------------------------------


def test_demo_help_offers_no_json_and_json_is_still_refused_as_usage(tmp_path, capsys):
    with pytest.raises(SystemExit):
        portable.main(["demo", "--help"])
    assert "--json" not in capsys.readouterr().out
    with pytest.raises(SystemExit):
        portable.main(["run", "--help"])
    assert "--json" in capsys.readouterr().out  # other commands' help unchanged
    assert portable.main(["demo", "--json", "--output", str(tmp_path / "d")]) == 2
    assert _err(capsys) == ["error: `portable demo` has no JSON output", "hint: drop --json"]
    assert not (tmp_path / "d").exists()


def test_grpo_docs_resume_a_quick_demo_with_its_quick_config_layer():
    """The documented "train on" of a --quick demo without config/quick.yaml is refused asking for 400 sft steps."""
    lines = (Path(portable.__file__).parents[1] / "docs" / "grpo.md").read_text().splitlines()
    quick = [line for line in lines if line.startswith("portable run $Q ")]
    assert quick and "--config $Q/config/run.yaml --config $Q/config/quick.yaml" in quick[0], quick
