"""Audit62 M2: `portable fetch` reads the Hub's bundle.json as strictly as verify and restore read it.

A bundle.json with a repeated key, a UTF-8 BOM or in UTF-16 was fetched (exit 0, "fetched ...") into a folder
that `verify` and `restore` then refused (exit 4), and a refetch could not repair it. fetch now refuses it
with restore's one-line error, before anything is written."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from hubserver import HubServer
from test_hub_hostile import TOKEN, on, published, reply, run


@pytest.fixture
def hub(tmp_path: Path):
    server = HubServer(tmp_path / "hub", tokens={TOKEN: ("alice", "write")}).start()
    yield server
    server.stop()


def _repeated_name(text: str) -> bytes:
    return (text.rstrip()[:-1] + ', "name": "other"}').encode()


CASES = {
    "repeated-key": (
        _repeated_name,
        "the key 'name' occurs 2 times in the top level; a manifest that JSON readers would read differently is "
        "damaged or hostile",
    ),
    "utf8-bom": (lambda text: b"\xef\xbb\xbf" + text.encode(), "not valid JSON (line 1, column 1: Unexpected UTF-8"),
    "utf16": (lambda text: text.encode("utf-16"), "not UTF-8 text"),
}


def _commit_manifest(hub: HubServer, data: bytes) -> None:
    """Make the published commit hold `data` as its bundle.json (bytes, size and git blob id alike), as a publish
    of that manifest would: fetch checks the bytes served against the commit's file list (audit62 L10)."""
    blob = hub.blobs[hub.files_at("model/alice/r")["bundle.json"]]
    hub.blob_path(blob.sha256).write_bytes(data)
    blob.size, blob.sha1 = len(data), hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@pytest.mark.parametrize("case", sorted(CASES))
def test_fetch_refuses_a_manifest_that_verify_and_restore_refuse(hub: HubServer, tmp_path: Path, case: str) -> None:
    published(hub, tmp_path)
    text = hub.blob_path(hub.files_at("model/alice/r")["bundle.json"]).read_text(encoding="utf-8")
    damage, message = CASES[case]
    _commit_manifest(hub, damage(text))
    dest = tmp_path / "out"
    got = run(hub, tmp_path, "fetch", "alice/r", str(dest), timeout=60)
    lines = got.stderr.strip().splitlines()
    assert got.returncode == 4, got.stderr  # was 0: "fetched alice/r@... -> out"
    assert lines[-2].startswith("error: alice/r@") and f"/bundle.json: {message}" in lines[-2], got.stderr
    assert lines[-1].startswith("hint: ") and "publish the bundle again" in lines[-1], got.stderr
    assert "Traceback" not in got.stderr and "fetched" not in got.stderr
    assert not dest.exists(), "refused before anything is written"


# -- L10: fetch checks the bundle.json served against the commit it resolved ----------------------------------


@pytest.mark.parametrize("how", ["server", "proxy"])
def test_fetch_refuses_a_manifest_that_is_not_the_commits(hub: HubServer, tmp_path: Path, how: str) -> None:
    """A bundle.json changed on the server under the same commit (or served by a cache in between) was accepted,
    exit 0, the receipt naming the commit: the commit's file list pins its git blob id and size."""
    published(hub, tmp_path)
    sha = hub.files_at("model/alice/r")["bundle.json"]
    data = json.loads(hub.blob_path(sha).read_text(encoding="utf-8"))
    data["name"] = "EVIL"
    evil = json.dumps(data, indent=1).encode()
    if how == "server":  # the blob's bytes change, the commit's file list keeps the published blob id
        hub.blob_path(sha).write_bytes(evil)
        hub.blobs[sha].size = len(evil)
    else:
        on(hub, "GET", r"/resolve/[0-9a-f]{40}/bundle\.json$", reply(200, evil))
    dest = tmp_path / "out"
    got = run(hub, tmp_path, "fetch", "alice/r", str(dest), timeout=60)
    lines = got.stderr.strip().splitlines()
    assert got.returncode == 34, got.stderr  # was 0: "fetched alice/r@... -> out", name EVIL
    git = hashlib.sha1(b"blob %d\0" % len(evil) + evil).hexdigest()
    assert lines[-2].startswith("error: alice/r@") and "/bundle.json: the bytes served (" in lines[-2], got.stderr
    assert f"({len(evil)} bytes, git blob {git}) are not the file commit " in lines[-2], got.stderr
    listed = f"holds ({hub.blobs[sha].size} bytes, git blob {hub.blobs[sha].sha1})"  # the commit's file list
    assert listed in lines[-2] and hub.blobs[sha].sha1 != git, got.stderr
    assert lines[-1].startswith("hint: a proxy or cache between you and the Hub") and "nothing was written" in lines[-1]
    assert "Traceback" not in got.stderr and "fetched" not in got.stderr
    assert not dest.exists(), "refused before anything is written"
