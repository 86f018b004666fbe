"""`portable run --print-config` needs no --output (audit63 misc 1): --help names it as the way to list the config
keys, yet argparse refused it ("the following arguments are required: --output"). A run without --output is still
refused with argparse's one-line error (exit 2). In-process through `portable.main`; fast."""

from __future__ import annotations

import json

import pytest
import yaml

from reproduction import portable


def _out_err(capsys) -> tuple[str, list[str]]:
    captured = capsys.readouterr()
    return captured.out, captured.err.strip().splitlines()


def test_print_config_without_output_lists_the_keys(capsys):
    assert portable.main(["run", "--print-config"]) == 0
    out, _ = _out_err(capsys)
    config = yaml.safe_load(out)
    assert config["recipe"] == "recap" and config["RUN"] == "" and "value" in config


def test_print_config_without_output_takes_a_config_file_and_overrides(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("value:\n  train:\n    max_steps: 11\n")
    argv = ["run", "--config", str(config), "--print-config", "--json", "returns.gamma=0.5"]
    assert portable.main(argv) == 0
    out, _ = _out_err(capsys)
    loaded = json.loads(out)
    assert loaded["value"]["train"]["max_steps"] == 11 and loaded["returns"]["gamma"] == 0.5


def test_print_config_of_a_bundle_without_output(tmp_path, capsys):
    bundle = tmp_path / "bundle"
    (bundle / "config").mkdir(parents=True)
    (bundle / "config" / "run.yaml").write_text("value:\n  train:\n    max_steps: 13\n")
    assert portable.main(["run", str(bundle), "--print-config"]) == 0
    out, _ = _out_err(capsys)
    loaded = yaml.safe_load(out)
    assert loaded["BUNDLE"] == str(bundle.resolve()) and loaded["value"]["train"]["max_steps"] == 13


def test_print_config_with_output_still_fills_run(tmp_path, capsys):
    out_dir = tmp_path / "run"
    assert portable.main(["run", "--output", str(out_dir), "--print-config"]) == 0
    out, _ = _out_err(capsys)
    assert yaml.safe_load(out)["RUN"] == str(out_dir.resolve())
    assert not out_dir.exists()


def test_print_config_without_output_refuses_a_key_using_run(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("eval:\n  reference: ${RUN}/ref.json\n")
    assert portable.main(["run", "--config", str(config), "--print-config"]) == 4
    _, err = _out_err(capsys)
    assert err[0].startswith(f"error: {config}: config key `eval.reference` uses ${{RUN}}, which is empty")
    assert "--output DIR" in err[1]


@pytest.mark.parametrize(
    "argv",
    [
        ["run"],
        ["run", "--stages", "value"],
        ["run", "key.path=1"],
        ["run", "--resume", "--bogus"],  # the missing --output is said first, as argparse did
    ],
)
def test_a_run_without_output_is_still_refused_exit_2(tmp_path, capsys, argv):
    with pytest.raises(SystemExit) as exited:  # argparse's usage error: exit 2 through SystemExit, as before
        portable.main(argv)
    assert exited.value.code == 2
    out, err = _out_err(capsys)
    assert out == ""
    assert err == ["error: the following arguments are required: --output", "hint: see `portable run --help`"]
