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
