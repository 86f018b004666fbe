"""Hub transfer audit56 I1-I7: no token in any message built from a server's answer, a URL or a repo argument;
HF_* variables huggingface_hub cannot use are exit 4 before any request; HF_HUB_OFFLINE=1 reuses a complete fetch
(else exit 33); PORTABLE_HUB_BACKOFF_S above PORTABLE_HUB_BACKOFF_MAX_S is refused. The local Hub of
tests/hubserver.py and the real CLI in a subprocess."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from hubserver import HubServer, make_bundle, portable_cmd, portable_env
from test_hub_hostile import TOKEN, files, on, published, reply, run

from reproduction.errors import InvalidInputError
from reproduction.release.hub_transfer import HubSettings


@pytest.fixture
def hub(tmp_path: Path):
    server = HubServer(tmp_path / "hub", tokens={TOKEN: ("alice", "write")}).start()
    server.release = threading.Event()  # type: ignore[attr-defined]
    yield server
    server.release.set()  # type: ignore[attr-defined]
    server.stop()


def echo_token(handler: Any) -> None:
    """A proxy or a misconfigured Hub that repeats the Authorization header in its error message."""
    body = b'{"error": "forbidden"}'
    handler.send_response(403)
    handler.send_header("X-Error-Message", "bad token " + handler.headers.get("Authorization", ""))
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def shown(got: subprocess.CompletedProcess) -> str:
    return got.stdout + got.stderr


# -- I1, I2: the server's message and a redirect URL --------------------------------------------------------


@pytest.mark.parametrize("command", ["fetch", "publish", "fetch-json"])
def test_a_server_message_repeating_the_token_is_shown_redacted(hub: HubServer, tmp_path: Path, command: str) -> None:
    bundle = make_bundle(tmp_path / "bundle", files())
    on(hub, "GET" if command != "publish" else "POST", r"^/api/", echo_token)
    args = {
        "fetch": ("fetch", "alice/r", str(tmp_path / "out")),
        "fetch-json": ("--json", "fetch", "alice/r", str(tmp_path / "out")),
        "publish": ("publish", str(bundle), "--repo", "alice/r"),
    }[command]
    got = run(hub, tmp_path, *args)
    assert got.returncode == 31, got.stderr
    assert TOKEN not in shown(got)
    assert "(HTTP 403: bad token Bearer <redacted>" in got.stderr


def test_a_token_in_the_endpoint_query_repeated_by_a_404_is_shown_redacted(hub: HubServer, tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "bundle", files())
    env = portable_env(hub, tmp_path / "hfhome", token=None)
    env["HF_ENDPOINT"] = f"{hub.url}/?t={TOKEN}"  # the token is in no credential-named variable here
    got = subprocess.run(
        portable_cmd("publish", str(bundle), "--repo", "alice/r"), env=env, capture_output=True, text=True, timeout=120
    )
    assert got.returncode == 30, got.stderr
    assert TOKEN not in shown(got)
    assert "no route for POST /?t=<redacted>/api/repos/create" in got.stderr


def test_an_unusable_redirect_url_is_shown_without_token_or_query(hub: HubServer, tmp_path: Path) -> None:
    published(hub, tmp_path)
    location = f"file:///etc/{TOKEN}?X-Amz-Signature=cdnSignature0123456789"
    on(hub, "GET", r"/resolve/[0-9a-f]{40}/weights/shard-0\.bin$", reply(302, b"", {"Location": location}))
    got = run(hub, tmp_path, "fetch", "alice/r", str(tmp_path / "out"))
    assert got.returncode == 30, got.stderr
    assert TOKEN not in shown(got) and "cdnSignature0123456789" not in shown(got)
    assert "the Hub's answer is unusable (file://127.0.0.1/etc/<redacted>?<redacted>)" in got.stderr


# -- I3: a repo argument with credentials ---------------------------------------------------------------------


@pytest.mark.parametrize("command", ["fetch", "publish"])
def test_a_repo_url_with_credentials_is_shown_redacted(hub: HubServer, tmp_path: Path, command: str) -> None:
    secret = "hf_SECRETabc123"  # too short to look like a token, and in no variable: only the URL shape tells
    repo = f"https://u:{secret}@huggingface.co/alice/r"
    args = ("fetch", repo, str(tmp_path / "out")) if command == "fetch" else ("publish", str(tmp_path), "--repo", repo)
    got = run(hub, tmp_path, *args)
    assert got.returncode == 2, got.stderr
    assert secret not in shown(got)
    assert "'https://<redacted>@huggingface.co/alice/r' is not OWNER/NAME" in got.stderr
    from reproduction.release.hub_transfer import redact_shown

    assert redact_shown(f"see ray://{secret}@head:10001 and {repo}") == (
        "see ray://<redacted>@head:10001 and https://<redacted>@huggingface.co/alice/r"
    )


# -- I4, I5: HF_* variables huggingface_hub cannot use ---------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("HF_HUB_ETAG_TIMEOUT", "abc", "HF_HUB_ETAG_TIMEOUT='abc' is not a whole number of seconds"),
        ("HF_HUB_DOWNLOAD_TIMEOUT", "1.5", "HF_HUB_DOWNLOAD_TIMEOUT='1.5' is not a whole number of seconds"),
        ("HF_ENDPOINT", "huggingface.co", "HF_ENDPOINT='huggingface.co' is not an http:// or https:// URL"),
        ("HF_ENDPOINT", "", "HF_ENDPOINT='' is not an http:// or https:// URL"),
        ("HF_ENDPOINT", "not a url", "HF_ENDPOINT='not a url' is not an http:// or https:// URL"),
    ],
)
@pytest.mark.parametrize("command", ["fetch", "publish"])
def test_a_bad_hf_variable_is_exit_4_naming_it_before_any_request(
    hub: HubServer, tmp_path: Path, command: str, name: str, value: str, message: str
) -> None:
    bundle = make_bundle(tmp_path / "bundle", files())
    args = (
        ("fetch", "alice/r", str(tmp_path / "out")) if command == "fetch" else ("publish", str(bundle), "--repo", "r/x")
    )
    got = run(hub, tmp_path, *args, **{name: value})
    assert got.returncode == 4, got.stderr
    assert got.stderr.startswith(f"error: {message}")
    assert f"hint: unset {name}" in got.stderr and "internal error" not in got.stderr
    assert hub.log == []  # nothing was asked


# -- I6: HF_HUB_OFFLINE=1 ---------------------------------------------------------------------------------------


def test_offline_refetch_of_a_complete_fetch_succeeds_and_anything_else_is_exit_33(
    hub: HubServer, tmp_path: Path
) -> None:
    bundle = published(hub, tmp_path)
    out = tmp_path / "out"
    assert run(hub, tmp_path, "fetch", "alice/r", str(out)).returncode == 0
    commit = json.loads((out / ".portable" / "receipt.json").read_text())["fetch"]["commit"]
    asked = len(hub.log)
    for extra in ((), ("--revision", "main"), ("--revision", commit)):
        got = run(hub, tmp_path, "fetch", "alice/r", str(out), *extra, HF_HUB_OFFLINE="1")
        assert got.returncode == 0, got.stderr
        assert f"offline: already complete: alice/r@{commit[:12]}" in got.stderr
    assert len(hub.log) == asked  # the Hub was not asked

    got = run(hub, tmp_path, "fetch", "alice/r", str(tmp_path / "new"), HF_HUB_OFFLINE="1")
    assert got.returncode == 33, got.stderr
    assert (
        f"error: HF_HUB_OFFLINE=1 is set and {tmp_path / 'new'} holds no complete fetch of alice/r@main" in got.stderr
    )
    assert not (tmp_path / "new").exists()
    got = run(hub, tmp_path, "fetch", "alice/r", str(out), "--revision", "v2", HF_HUB_OFFLINE="1")
    assert got.returncode == 33, got.stderr
    assert f"holds no complete fetch of alice/r@v2 (it holds alice/r@main, commit {commit})" in got.stderr
    assert "--revision main" in got.stderr
    got = run(hub, tmp_path, "publish", str(bundle), "--repo", "alice/r", HF_HUB_OFFLINE="1")
    assert got.returncode == 33, got.stderr
    assert "HF_HUB_OFFLINE is set, so the Hub is not asked" in got.stderr

    (out / "configs" / "run.yaml").write_bytes(b"seed: 9\n")  # no longer verifies: not "already complete"
    got = run(hub, tmp_path, "fetch", "alice/r", str(out), HF_HUB_OFFLINE="1")
    assert got.returncode not in (0, 30, 33), got.stderr
    assert "offline: already complete" not in got.stderr


# -- I7: a first backoff above its cap ---------------------------------------------------------------------------


def test_backoff_above_its_cap_is_refused_naming_both() -> None:
    with pytest.raises(InvalidInputError) as caught:
        HubSettings.from_env({"PORTABLE_HUB_BACKOFF_S": "10", "PORTABLE_HUB_BACKOFF_MAX_S": "0.1"})
    assert str(caught.value) == (
        "PORTABLE_HUB_BACKOFF_S=10 is more than PORTABLE_HUB_BACKOFF_MAX_S=0.1, which caps every retry delay"
    )
    assert HubSettings.from_env({"PORTABLE_HUB_BACKOFF_S": "2", "PORTABLE_HUB_BACKOFF_MAX_S": "2"}).backoff_s == 2
