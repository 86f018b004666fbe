"""`portable publish` / `portable fetch` end to end: the real huggingface_hub client (in a `portable`
subprocess) against the local Hub-compatible server in tests/hubserver.py, started by each test on
127.0.0.1 (a stand-in for huggingface.co, which this machine cannot reach)."""

from __future__ import annotations

import filecmp
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from hubserver import HubServer, make_bundle, portable_cmd, portable_env

from reproduction.release.manifest import load_manifest
from reproduction.release.verify import verify_bundle

TOKEN = "hf_portableRoundTripSecret_3b9e"


def bundle_files(seed: int = 0) -> dict[str, bytes]:
    rnd = __import__("random").Random(seed)
    return {
        "config/run.yaml": b"stages: [returns, value, advantages, policy]\nseed: 7\n",
        "weights/value.safetensors": rnd.randbytes(300_000),
        "weights/policy/shard-0.bin": rnd.randbytes(120_000),
        "data/episodes.parquet": rnd.randbytes(50_000),
        "evidence/eval_policy_1000.json": json.dumps(
            {"metrics": {"success_rate": 0.772, "successes": "386/500"}}
        ).encode(),
        "LICENSES/Apache-2.0.txt": b"Apache License 2.0\n",
        "reproduction/__init__.py": b"",
        "notes/empty.txt": b"",
    }


@pytest.fixture
def hub(tmp_path: Path):
    server = HubServer(tmp_path / "hub", tokens={TOKEN: ("alice", "write")}, tree_page_size=3).start()
    yield server
    server.stop()


def run(
    hub: HubServer, tmp_path: Path, *args: str, token: str | None = TOKEN, **env: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        portable_cmd(*args),
        env=portable_env(hub, tmp_path / "hfhome", token=token, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_publish_then_fetch_is_byte_identical_and_verifies(hub: HubServer, tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "bundle", bundle_files())
    pub = run(hub, tmp_path, "publish", str(bundle), "--repo", "alice/recap-demo")
    assert pub.returncode == 0, pub.stderr
    head = hub.head("model/alice/recap-demo")
    assert pub.stdout.strip() == head and re.fullmatch(r"[0-9a-f]{40}", head)
    assert f"{hub.url}/alice/recap-demo" in pub.stderr
    assert "Warning" not in pub.stderr and "Traceback" not in pub.stderr, pub.stderr

    # bundle.json arrives last, in a commit of its own: the commit before it has every file but no manifest.
    repo = hub.repos["model/alice/recap-demo"]
    at_head = hub.files_at("model/alice/recap-demo")
    before = repo.commits[repo.commits[head]["parent"]]["files"]
    manifest = load_manifest(bundle)
    assert {e.path for e in manifest.files} <= set(before) and "bundle.json" not in before
    assert set(at_head) - set(before) == {"bundle.json", "README.md"}
    card = hub.blob_path(at_head["README.md"]).read_text()
    assert (
        "portable fetch alice/recap-demo" in card
        and "success_rate = 0.772" in card
        and "LICENSES/Apache-2.0.txt" in card
    )
    assert "license: apache-2.0" in card

    out = tmp_path / "fetched"
    got = run(hub, tmp_path, "fetch", "alice/recap-demo", str(out))
    assert got.returncode == 0, got.stderr
    rels = [e.path for e in manifest.files] + ["bundle.json"]
    match, mismatch, errors = filecmp.cmpfiles(bundle, out, rels, shallow=False)
    assert (sorted(match), mismatch, errors) == (sorted(rels), [], [])
    report = verify_bundle(out)
    assert report.ok and report.files == len(manifest.files), report.summary()
    receipt = json.loads((out / ".portable" / "receipt.json").read_text())
    assert receipt["fetch"]["repo"] == "alice/recap-demo" and receipt["fetch"]["commit"] == head
    assert receipt["fetch"]["revision"] == "main" and receipt["fetch"]["repo_type"] == "model"
    assert not (out / ".portable" / "partial").exists()
    # exactly the manifest's files were downloaded, each once, pinned to the commit SHA (empty ones need no GET)
    gets = hub.requests("GET", r"/resolve/")
    non_empty = [e.path for e in manifest.files if e.size] + ["bundle.json"]
    assert sorted(r["path"].split(f"/resolve/{head}/", 1)[1] for r in gets) == sorted(non_empty)


def test_republish_sends_only_what_changed_and_refetch_downloads_only_that(hub: HubServer, tmp_path: Path) -> None:
    files = bundle_files()
    bundle = make_bundle(tmp_path / "bundle", files)
    assert run(hub, tmp_path, "publish", str(bundle), "--repo", "alice/r").returncode == 0
    out = tmp_path / "fetched"
    assert run(hub, tmp_path, "fetch", "alice/r", str(out)).returncode == 0
    head, puts, commits = hub.head("model/alice/r"), hub.uploads, len(hub.requests("POST", r"/commit/"))

    again = run(hub, tmp_path, "publish", str(bundle), "--repo", "alice/r")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == head and hub.uploads == puts
    assert len(hub.requests("POST", r"/commit/")) == commits and "0 of 8 files to send" in again.stderr

    files["weights/value.safetensors"] = files["weights/value.safetensors"][::-1]  # LFS: same size, new sha256
    files["config/run.yaml"] = b"stages: [returns, value, advantages, policy]\nseed: 8\n"  # regular: same size
    make_bundle(bundle, files)
    third = run(hub, tmp_path, "publish", str(bundle), "--repo", "alice/r")
    assert third.returncode == 0, third.stderr
    assert hub.uploads == puts + 1, "only the changed LFS file is uploaded"
    new_commits = hub.requests("POST", r"/commit/")[commits:]
    assert len(new_commits) == 2
    batch = [json.loads(line) for line in new_commits[0]["body"].splitlines()][1:]
    assert sorted((x["key"], x["value"]["path"]) for x in batch) == [
        ("deletedFile", "bundle.json"),
        ("file", "config/run.yaml"),
        ("lfsFile", "weights/value.safetensors"),
    ]

    gets_before = len(hub.requests("GET", r"/resolve/"))
    refetch = run(hub, tmp_path, "fetch", "alice/r", str(out))
    assert refetch.returncode == 0, refetch.stderr
    fetched = sorted(r["path"].rsplit("/", 2)[-2:][-1] for r in hub.requests("GET", r"/resolve/")[gets_before:])
    assert fetched == ["bundle.json", "run.yaml", "value.safetensors"]
    assert (out / "weights/value.safetensors").read_bytes() == files["weights/value.safetensors"]
    assert verify_bundle(out).ok


@pytest.mark.slow
def test_dataset_repo_branch_and_tag(hub: HubServer, tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "bundle", bundle_files(1))
    pub = run(
        hub,
        tmp_path,
        "publish",
        str(bundle),
        "--repo",
        "alice/ds",
        "--repo-type",
        "dataset",
        "--revision",
        "release",
        "--tag",
        "v1.0",
        "--private",
    )
    assert pub.returncode == 0, pub.stderr
    repo = hub.repos["dataset/alice/ds"]
    assert repo.private and repo.tags["v1.0"] == repo.branches["release"] == pub.stdout.strip()
    assert "bundle.json" not in hub.files_at("dataset/alice/ds", "main")
    assert f"{hub.url}/datasets/alice/ds/tree/release" in pub.stderr

    out = tmp_path / "fetched"
    got = run(hub, tmp_path, "fetch", "alice/ds", str(out), "--repo-type", "dataset", "--revision", "v1.0")
    assert got.returncode == 0, got.stderr
    assert json.loads((out / ".portable/receipt.json").read_text())["fetch"]["revision"] == "v1.0"
    assert verify_bundle(out).ok

    # a private repo is invisible without a token, exactly like the Hub (404, not 403)
    anon = run(hub, tmp_path, "fetch", "alice/ds", str(tmp_path / "anon"), "--repo-type", "dataset", token=None)
    assert anon.returncode == 32 and "repository not found" in anon.stderr

    # the token from `hf auth login`'s store works as well as HF_TOKEN
    (tmp_path / "hfhome").mkdir(exist_ok=True)
    (tmp_path / "hfhome" / "token").write_text(TOKEN)
    stored = run(
        hub,
        tmp_path,
        "fetch",
        "alice/ds",
        str(tmp_path / "stored"),
        "--repo-type",
        "dataset",
        "--revision",
        "release",
        token=None,
    )
    assert stored.returncode == 0, stored.stderr

    # a tag is immutable: publishing other content under the same tag is a conflict (exit 35)
    changed = bundle_files(2)
    make_bundle(bundle, changed)
    clash = run(
        hub,
        tmp_path,
        "publish",
        str(bundle),
        "--repo",
        "alice/ds",
        "--repo-type",
        "dataset",
        "--revision",
        "release",
        "--tag",
        "v1.0",
    )
    assert clash.returncode == 35 and "tag 'v1.0'" in clash.stderr and "already names commit" in clash.stderr


def test_publish_refuses_a_bundle_that_does_not_verify(hub: HubServer, tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "bundle", bundle_files())
    data = bytearray((bundle / "weights/value.safetensors").read_bytes())
    data[1000] ^= 1
    (bundle / "weights/value.safetensors").write_bytes(data)
    pub = run(hub, tmp_path, "publish", str(bundle), "--repo", "alice/r")
    assert pub.returncode == 5 and "weights/value.safetensors" in pub.stderr
    assert hub.log == [] or all(r["method"] == "GET" for r in hub.log), "nothing is sent before verify passes"


@pytest.mark.slow
def test_unknown_repo_revision_or_missing_manifest_are_clear_errors(hub: HubServer, tmp_path: Path) -> None:
    missing = run(hub, tmp_path, "fetch", "alice/nothing-here", str(tmp_path / "a"))
    assert missing.returncode == 32
    assert "error: resolve alice/nothing-here@main: repository not found (HTTP 404" in missing.stderr
    assert "hint: check OWNER/NAME" in missing.stderr and "Traceback" not in missing.stderr

    bundle = make_bundle(tmp_path / "bundle", {"a.txt": b"a\n"})
    assert run(hub, tmp_path, "publish", str(bundle), "--repo", "alice/r").returncode == 0
    norev = run(hub, tmp_path, "fetch", "alice/r", str(tmp_path / "b"), "--revision", "no-such-branch")
    assert norev.returncode == 32 and "revision not found" in norev.stderr and "--revision" in norev.stderr

    import urllib.request

    req = urllib.request.Request(
        f"{hub.url}/api/repos/create",
        data=json.dumps({"name": "empty"}).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=10).read()
    empty = run(hub, tmp_path, "fetch", "alice/empty", str(tmp_path / "c"))
    assert empty.returncode == 32 and "has no bundle.json: it is not a published bundle" in empty.stderr

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "mine.txt").write_text("keep me")
    refused = run(hub, tmp_path, "fetch", "alice/r", str(busy))
    assert refused.returncode == 4 and "is not empty and holds no bundle" in refused.stderr
    assert (busy / "mine.txt").read_text() == "keep me" and sorted(os.listdir(busy)) == ["mine.txt"]

    bad = run(hub, tmp_path, "fetch", "not-a-repo-id", str(tmp_path / "d"))
    assert bad.returncode == 2 and "is not OWNER/NAME" in bad.stderr  # a command-line value: usage

    # a manifest may not claim the bundle's bookkeeping (receipt, lock): refused before any download
    hostile = make_bundle(tmp_path / "hostile", {".portable/receipt.json": b"{}", "a.txt": b"a\n"})
    hub.seed_repo("model/alice/hostile", hostile, owner="alice")
    refused = run(hub, tmp_path, "fetch", "alice/hostile", str(tmp_path / "e"))
    assert refused.returncode == 4 and "lists '.portable/receipt.json', which is reserved" in refused.stderr
    assert not hub.requests("GET", r"/hostile/resolve/[0-9a-f]+/a\.txt")
