"""Fault injection for `portable publish` / `portable fetch`: the real huggingface_hub client (in a
`portable` subprocess) against the local Hub-compatible server in tests/hubserver.py, started by each
test on 127.0.0.1 (a stand-in for huggingface.co), answering 429/403, corrupting or stalling
transfers, and an interrupted publish; plus a scan of every output and file for the token."""

from __future__ import annotations

import random
import subprocess
import time
from pathlib import Path

import pytest
from hubserver import Fault, HubServer, make_bundle, portable_cmd, portable_env

from reproduction.release.verify import verify_bundle

TOKEN = "hf_portableFaultsSecret_7c41d2"


@pytest.fixture
def hub(tmp_path: Path):
    server = HubServer(tmp_path / "hub", tokens={TOKEN: ("alice", "write")}).start()
    yield server
    server.stop()


def run(hub: HubServer, tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        portable_cmd(*args),
        env=portable_env(hub, tmp_path / "hfhome", token=TOKEN, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def lfs_files(n: int, size: int, seed: int = 0) -> dict[str, bytes]:
    rnd = random.Random(seed)
    return {f"weights/shard-{i}.bin": rnd.randbytes(size) for i in range(n)}


def published(hub: HubServer, tmp_path: Path, files: dict[str, bytes], repo: str = "alice/r") -> Path:
    bundle = make_bundle(tmp_path / "bundle", files)
    result = run(hub, tmp_path, "publish", str(bundle), "--repo", repo)
    assert result.returncode == 0, result.stderr
    return bundle


def test_interrupted_publish_resumes_and_uploads_only_the_rest(hub: HubServer, tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "bundle", lfs_files(6, 40_000))
    # the 4th upload hangs; the publish is killed while it waits (3 files are on the server by then)
    hub.add_fault(Fault(method="PUT", path=r"^/_lfs/upload/", kind="stall_upload", after=3, seconds=60))
    env = portable_env(hub, tmp_path / "hfhome", token=TOKEN, PORTABLE_HUB_BATCH_FILES="2")
    proc = subprocess.Popen(
        portable_cmd("publish", str(bundle), "--repo", "alice/r"),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert hub.stalled.wait(60), "the publish never reached the stalled upload"
        # Uploads run in parallel: the 3rd may still be in flight when the 4th stalls. Kill only once
        # it has landed, so the server holds exactly 3 blobs (bounded wait).
        deadline = time.monotonic() + 30
        while hub.uploads < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    assert hub.uploads == 3
    assert "bundle.json" not in hub.files_at("model/alice/r"), "an interrupted publish leaves no manifest"
    hub.faults.clear()

    commits = len(hub.requests("POST", r"/commit/"))
    assert commits == 1, "the first batch of 2 files was committed before the kill"
    resumed = run(hub, tmp_path, "publish", str(bundle), "--repo", "alice/r", PORTABLE_HUB_BATCH_FILES="2")
    assert resumed.returncode == 0, resumed.stderr
    assert len(hub.requests("POST", r"/commit/")) - commits == 3, "2 batches of 2 files, then bundle.json"
    assert hub.uploads == 6, "the rerun uploads only the 3 files the server lacks"
    assert "4 of 6 files to send" in resumed.stderr  # 2 were committed before the kill; 1 more was uploaded
    out = tmp_path / "fetched"
    assert run(hub, tmp_path, "fetch", "alice/r", str(out)).returncode == 0
    assert verify_bundle(out).ok


def test_corrupted_download_of_the_same_size_is_caught_and_retried(hub: HubServer, tmp_path: Path) -> None:
    files = lfs_files(3, 200_000)
    published(hub, tmp_path, files)
    fault = hub.add_fault(Fault(method="GET", path=r"/resolve/[0-9a-f]{40}/weights/shard-1\.bin$", kind="corrupt"))
    out = tmp_path / "fetched"
    got = run(hub, tmp_path, "fetch", "alice/r", str(out))
    assert got.returncode == 0, got.stderr
    assert fault.hits == 1 and len(hub.requests("GET", r"/weights/shard-1\.bin$")) == 2
    assert "retry 1/3: download weights/shard-1.bin (DigestMismatch)" in got.stderr
    assert (out / "weights/shard-1.bin").read_bytes() == files["weights/shard-1.bin"]
    assert verify_bundle(out).ok


def test_download_corrupted_every_time_fails_with_integrity_code(hub: HubServer, tmp_path: Path) -> None:
    published(hub, tmp_path, lfs_files(2, 100_000))
    hub.add_fault(Fault(method="GET", path=r"/weights/shard-0\.bin$", kind="corrupt", times=100))
    out = tmp_path / "fetched"
    got = run(hub, tmp_path, "fetch", "alice/r", str(out), PORTABLE_HUB_RETRIES="2")
    assert got.returncode == 34, got.stderr
    assert "weights/shard-0.bin: downloaded bytes do not match bundle.json (expected sha256" in got.stderr
    assert len(hub.requests("GET", r"/weights/shard-0\.bin$")) == 3
    assert not (out / "bundle.json").exists() and not (out / "weights/shard-0.bin").exists()
    assert (out / "weights/shard-1.bin").exists(), "the good file is kept for the next run"


def test_rate_limited_requests_are_retried(hub: HubServer, tmp_path: Path) -> None:
    hub.add_fault(
        Fault(method="POST", path=r"/api/models/alice/r/commit/", status=429, message="slow down", retry_after="0")
    )
    published(hub, tmp_path, lfs_files(2, 50_000))
    assert len(hub.requests("POST", r"/commit/")) == 3  # 429, then the batch, then bundle.json

    hub.add_fault(Fault(method="GET", path=r"/api/models/alice/r/revision/main$", status=429, times=2, retry_after="0"))
    before = len(hub.requests("GET", r"/revision/main$"))
    out = tmp_path / "fetched"
    got = run(hub, tmp_path, "fetch", "alice/r", str(out))
    assert got.returncode == 0, got.stderr
    assert len(hub.requests("GET", r"/revision/main$")) - before == 3
    assert "retry 2/3: resolve alice/r@main (429)" in got.stderr
    assert verify_bundle(out).ok


def test_rate_limit_that_never_ends_gives_up_after_the_bounded_retries(hub: HubServer, tmp_path: Path) -> None:
    hub.add_fault(Fault(method="GET", path=r"/revision/", status=503, message="down for maintenance", times=100))
    got = run(hub, tmp_path, "fetch", "alice/r", str(tmp_path / "out"), PORTABLE_HUB_RETRIES="2")
    assert got.returncode == 33 and "down for maintenance" in got.stderr
    assert len(hub.requests("GET", r"/revision/")) == 3


def test_forbidden_stops_at_once_with_the_server_message(hub: HubServer, tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "bundle", lfs_files(2, 30_000))
    other = run(hub, tmp_path, "publish", str(bundle), "--repo", "bob/r")
    assert other.returncode == 31, other.stderr
    assert 'You don\'t have the rights to create a model under the namespace "bob"' in other.stderr
    assert "hint: log in with `hf auth login` or set HF_TOKEN to a token that may read" in other.stderr
    assert len(hub.requests("POST", r"/api/repos/create")) == 1 and not hub.requests("POST", r"/preupload/")

    hub.add_fault(Fault(method="POST", path=r"/commit/", status=403, message="this branch is protected", times=100))
    protected = run(hub, tmp_path, "publish", str(bundle), "--repo", "alice/r")
    assert protected.returncode == 31 and "this branch is protected" in protected.stderr
    assert len(hub.requests("POST", r"/commit/")) == 1, "a 403 is never retried"


def test_stalled_download_is_aborted_and_resumed_with_range(hub: HubServer, tmp_path: Path) -> None:
    files = lfs_files(1, 2_000_000)
    published(hub, tmp_path, files)
    hub.add_fault(Fault(method="GET", path=r"/weights/shard-0\.bin$", kind="stall", after_bytes=1_200_000, seconds=60))
    out = tmp_path / "fetched"
    got = run(hub, tmp_path, "fetch", "alice/r", str(out), PORTABLE_HUB_STALL_TIMEOUT_S="1")
    assert got.returncode == 0, got.stderr
    gets = hub.requests("GET", r"/weights/shard-0\.bin$")
    assert len(gets) == 2 and gets[1]["headers"].get("Range") == "bytes=1200000-"
    key = [k for k in hub.served_bytes if k.endswith("weights/shard-0.bin")][0]
    assert hub.served_bytes[key] == 2_000_000, "the retry continued where the stall stopped"
    assert "retry 1/3: download weights/shard-0.bin (ReadTimeout)" in got.stderr
    assert (out / "weights/shard-0.bin").read_bytes() == files["weights/shard-0.bin"]


def test_token_never_appears_in_output_logs_or_files(hub: HubServer, tmp_path: Path) -> None:
    files = {**lfs_files(2, 60_000), "config/a.yaml": b"a: 1\n"}
    outputs = []
    bundle = make_bundle(tmp_path / "bundle", files)
    outputs.append(run(hub, tmp_path, "publish", str(bundle), "--repo", "alice/r", "--tag", "v1"))
    hub.add_fault(Fault(method="GET", path=r"/weights/shard-0\.bin$", kind="corrupt"))
    hub.add_fault(Fault(method="GET", path=r"/revision/", status=429))
    outputs.append(run(hub, tmp_path, "fetch", "alice/r", str(tmp_path / "out"), "--debug"))
    outputs.append(run(hub, tmp_path, "publish", str(bundle), "--repo", "bob/r", "--debug"))
    outputs.append(run(hub, tmp_path, "fetch", "alice/missing", str(tmp_path / "out2")))
    assert [r.returncode for r in outputs[:2]] == [0, 0] and outputs[2].returncode != 0
    assert all(r["authenticated"] for r in hub.requests("POST", r"/commit/")), "the token was used"
    for result in outputs:
        assert TOKEN not in result.stdout and TOKEN not in result.stderr
    scanned = 0
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), f"token written to {path}"
            scanned += 1
    assert scanned > 10 and (hub.root / "requests.jsonl").stat().st_size > 0


def test_failed_fetch_keeps_its_partial_file_and_the_rerun_resumes_it(hub: HubServer, tmp_path: Path) -> None:
    files = lfs_files(2, 1_500_000)
    published(hub, tmp_path, files)
    hub.add_fault(Fault(method="GET", path=r"/weights/shard-1\.bin$", kind="stall", after_bytes=1_000_000, seconds=60))
    out = tmp_path / "fetched"
    first = run(hub, tmp_path, "fetch", "alice/r", str(out), PORTABLE_HUB_STALL_TIMEOUT_S="1", PORTABLE_HUB_RETRIES="0")
    assert first.returncode == 33 and "download weights/shard-1.bin: transfer stalled (no data)" in first.stderr
    assert "hint: check the network; rerunning resumes where this stopped" in first.stderr
    assert not (out / "bundle.json").exists() and (out / "weights/shard-0.bin").exists()
    partials = list((out / ".portable/partial").glob("*.part"))  # and fetch.json, the fetch's own marker
    assert len(partials) == 1 and partials[0].stat().st_size == 1_000_000

    second = run(hub, tmp_path, "fetch", "alice/r", str(out))
    assert second.returncode == 0, second.stderr
    gets = hub.requests("GET", r"/weights/shard-1\.bin$")
    assert [g["headers"].get("Range") for g in gets] == [None, "bytes=1000000-"]
    assert len(hub.requests("GET", r"/weights/shard-0\.bin$")) == 1, "the finished file is not fetched again"
    assert (out / "weights/shard-1.bin").read_bytes() == files["weights/shard-1.bin"]
    assert verify_bundle(out).ok


def test_a_refetch_never_writes_through_a_symlinked_folder(hub: HubServer, tmp_path: Path) -> None:
    """Audit (fetch case B): an earlier fetch folder whose weights/ was replaced by a link elsewhere."""
    import os
    import shutil

    published(hub, tmp_path, lfs_files(1, 1000))
    out = tmp_path / "fetched"
    assert run(hub, tmp_path, "fetch", "alice/r", str(out)).returncode == 0
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.rmtree(out / "weights")
    os.symlink(outside, out / "weights")
    again = run(hub, tmp_path, "fetch", "alice/r", str(out))
    assert again.returncode == 6, again.stderr
    assert "the folder weights is a symlink; refusing to write weights/shard-0.bin through it" in again.stderr
    assert os.listdir(outside) == []


def test_fetch_never_uses_a_symlinked_state_folder(hub: HubServer, tmp_path: Path) -> None:
    """Audit F1: fetch's lock, receipt and partial files must not land where a link points."""
    import os

    published(hub, tmp_path, lfs_files(1, 1000))
    out, outside = tmp_path / "fetched", tmp_path / "outside"
    out.mkdir()
    outside.mkdir()
    os.symlink(outside, out / ".portable")
    done = run(hub, tmp_path, "fetch", "alice/r", str(out))
    assert done.returncode == 6 and f"{out}/.portable is a symlink" in done.stderr, done.stderr
    assert os.listdir(outside) == []
