"""Secrets never reach what a run records: redaction of command lines, configs and environments; the leak scan."""

from __future__ import annotations

import pytest

from reproduction.redaction import (
    REDACTED,
    find_secret,
    is_secret_name,
    redact,
    redact_argv,
    redact_environ,
    secret_values,
)

TOKEN = "hf_" + "AbCdEfGh12" * 4


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "hub.token",
        "--api-key",
        "AWS_SECRET_ACCESS_KEY",
        "db_password",
        "Authorization",
    ],
)
def test_credential_names_are_recognised(name):
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "seed",
        "HOME",
        "value.steps",
        "--output",
        "tokenizer",
        "max_tokens",
        "author",
        "PATH",
        "key_frames",
        "max_token_len",
        "pad_token_id",
        "token_budget",
    ],
)
def test_ordinary_names_are_not(name):
    assert not is_secret_name(name)


def test_config_values_under_credential_keys_and_token_shaped_strings_are_redacted():
    config = {
        "hub": {"token": "plain-but-secret", "repo": "me/x", "auth": None},
        "seed": 3,
        "notes": [f"pushed with {TOKEN}", "fine"],
        "tokens_per_batch": "",
    }
    out = redact(config, environ={})
    assert out["hub"] == {"token": REDACTED, "repo": "me/x", "auth": None}
    assert out["notes"] == [f"pushed with {REDACTED}", "fine"]
    assert out["seed"] == 3 and out["tokens_per_batch"] == ""
    assert config["hub"]["token"] == "plain-but-secret"  # the input is not mutated
    nested = {"credentials": {"user": "me", "keys": ["k1", "k2"], "enabled": True, "note": None}}
    assert redact(nested, environ={}) == {
        "credentials": {"user": REDACTED, "keys": [REDACTED, REDACTED], "enabled": True, "note": None}
    }


def test_environment_secret_values_are_removed_wherever_they_appear():
    env = {"MY_SERVICE_TOKEN": "zq-very-private-value", "HOME": "/root", "SHORT_TOKEN": "abc"}
    assert secret_values(env) == ("zq-very-private-value",)  # too short a value is not hunted inside strings
    assert redact({"url": "https://x:zq-very-private-value@host"}, environ=env) == {"url": f"https://x:{REDACTED}@host"}
    assert redact_environ(env) == {"MY_SERVICE_TOKEN": REDACTED, "HOME": "/root", "SHORT_TOKEN": REDACTED}


def test_command_lines_keep_their_shape():
    argv = ["portable", "run", "--token", "abc", "--hf-token=xyz", "hub.token=q", "--output", "runs/a", f"note={TOKEN}"]
    assert redact_argv(argv, environ={}) == [
        "portable",
        "run",
        "--token",
        REDACTED,
        f"--hf-token={REDACTED}",
        f"hub.token={REDACTED}",
        "--output",
        "runs/a",
        f"note={REDACTED}",
    ]


def test_find_secret_sees_plain_and_utf16_copies_and_nothing_else(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a/log.txt").write_text(f"line\ntoken {TOKEN}\n")
    (tmp_path / "a/wide.bin").write_bytes(b"\x00" + TOKEN.encode("utf-16-le"))
    (tmp_path / "clean.json").write_text('{"token": "<redacted>"}')
    (tmp_path / "empty.bin").write_bytes(b"")
    found = find_secret(tmp_path, TOKEN)
    assert sorted(f.path.name for f in found) == ["log.txt", "wide.bin"]
    assert found[0].offsets == (11,) and "log.txt" in str(found[0])
    assert find_secret(tmp_path, TOKEN, skip=["a/log.txt", "a/wide.bin"]) == []
    assert find_secret(tmp_path / "clean.json", TOKEN) == []
    with pytest.raises(ValueError):
        find_secret(tmp_path, "short")


def test_log_records_are_redacted_before_they_are_written(tmp_path):
    import logging

    from reproduction.redaction import RedactingFilter

    log_file = tmp_path / "run.log"
    handler = logging.FileHandler(log_file)
    handler.addFilter(RedactingFilter(environ={"HF_TOKEN": "private-value-xyz"}))
    logger = logging.getLogger("test_evidence_secrets.redaction")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        logger.warning("connecting with %s and %s", "private-value-xyz", TOKEN)
    finally:
        logger.removeHandler(handler)
        handler.close()
    assert log_file.read_text() == f"connecting with {REDACTED} and {REDACTED}\n"
    assert find_secret(tmp_path, TOKEN) == [] and find_secret(tmp_path, "private-value-xyz") == []
