"""audit56 review3 T4: the pipeline commands check the HF_* variables huggingface_hub parses at import before any
stage imports it through transformers (a tokenizer, pi05): exit 4 naming the variable, nothing made."""

from __future__ import annotations

from reproduction.portable import main


def test_portable_run_refuses_an_unparsable_hf_variable_before_anything_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "abc")
    run = tmp_path / "run"
    assert main(["run", "--output", str(run)]) == 4  # before: exit 2, no BUNDLE and no --config
    err = capsys.readouterr().err
    assert "HF_HUB_ETAG_TIMEOUT='abc' is not a whole number of seconds" in err
    assert "unset HF_HUB_ETAG_TIMEOUT" in err
    assert not run.exists()


def test_portable_run_leaves_hf_endpoint_to_the_commands_that_ask_the_hub(tmp_path, monkeypatch, capsys):
    """The import does not read HF_ENDPOINT, and a run that never asks the Hub needs none: an odd one does not stop
    `portable run` (here it stops at its own usage error, exit 2), while fetch/publish still refuse it (exit 4)."""
    monkeypatch.setenv("HF_ENDPOINT", "ftp://hub.example")
    assert main(["run", "--output", str(tmp_path / "run")]) == 2
    assert "HF_ENDPOINT" not in capsys.readouterr().err
