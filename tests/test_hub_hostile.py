"""`portable fetch` / `publish` against a hostile or broken Hub (audit46 hub): the local Hub-compatible server
of tests/hubserver.py, started by each test on 127.0.0.1 and stopped by it, with a `hook` answering chosen
requests in its place (stalling, lying, looping), and the real huggingface_hub client in a `portable`
subprocess bounded by a timeout."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import random
import re
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hubserver import HubServer, make_bundle, portable_cmd, portable_env

TOKEN = "hf_portableHostileSecret_5d21c9"


@pytest.fixture
def hub(tmp_path: Path):
    server = HubServer(tmp_path / "hub", tokens={TOKEN: ("alice", "write")}).start()
    server.release = threading.Event()  # type: ignore[attr-defined]
    yield server
    server.release.set()  # type: ignore[attr-defined]
    server.stop()


def run(hub: HubServer, tmp_path: Path, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        portable_cmd(*args),
        env=portable_env(hub, tmp_path / "hfhome", token=TOKEN, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def files(seed: int = 0) -> dict[str, bytes]:
    rnd = random.Random(seed)
    return {
        "weights/shard-0.bin": rnd.randbytes(120_000),
        "weights/shard-1.bin": rnd.randbytes(80_000),
        "configs/run.yaml": b"seed: %d\n" % seed,
    }


def published(hub: HubServer, tmp_path: Path, repo: str = "alice/r", seed: int = 0, name: str = "bundle") -> Path:
    bundle = make_bundle(tmp_path / name, files(seed))
    got = run(hub, tmp_path, "publish", str(bundle), "--repo", repo)
    assert got.returncode == 0, got.stderr
    return bundle


def on(hub: HubServer, method: str, pattern: str, answer: Callable[[Any], None]) -> None:
    """Have `hub` answer requests of `method` whose path matches `pattern` with `answer(handler)`."""

    def hook(handler: Any, parts: list[str], query: dict[str, str], body: bytes) -> bool:
        if handler.command != method or not re.search(pattern, handler.path.split("?")[0]):
            return False
        answer(handler)
        return True

    hub.hook = hook


def hang(hub: HubServer) -> Callable[[Any], None]:
    """Accept the request and never answer (until the test ends)."""

    def answer(handler: Any) -> None:
        hub.release.wait(60)  # type: ignore[attr-defined]
        handler.close_connection = True

    return answer


def reply(status: int, body: bytes, headers: dict[str, str] | None = None) -> Callable[[Any], None]:
    def answer(handler: Any) -> None:
        handler.send_response(status)
        for key, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(body)

    return answer


# -- F1: every Hub call is bounded by the stall timeout and PORTABLE_HUB_RETRIES ------------------------

STALLS = {
    "fetch-resolve": ("fetch", "GET", r"^/api/models/alice/r/revision/"),
    "publish-resolve": ("publish", "GET", r"^/api/models/alice/r2/revision/"),
    "publish-tree": ("publish", "GET", r"^/api/models/alice/r2/tree/"),
    "publish-preupload": ("publish", "POST", r"^/api/models/alice/r2/preupload/"),
    "publish-lfs-batch": ("publish", "POST", r"/info/lfs/objects/batch$"),
    "pin-resolve": ("pin", "GET", r"^/api/models/alice/r/revision/"),
}


@pytest.mark.parametrize("case", sorted(STALLS))
def test_a_hub_that_never_answers_ends_in_exit_33_within_the_stall_timeout(
    hub: HubServer, tmp_path: Path, case: str
) -> None:
    bundle = published(hub, tmp_path)
    command, method, pattern = STALLS[case]
    on(hub, method, pattern, hang(hub))
    args = {
        "fetch": ("fetch", "alice/r", str(tmp_path / "out")),
        "publish": ("publish", str(bundle), "--repo", "alice/r2"),
        "pin": ("weights", "pin", "alice/r", "--files", "*.yaml", "--license", "apache-2.0"),
    }[command]
    before, start = len(hub.log), time.monotonic()
    got = run(
        hub,
        tmp_path,
        *args,
        timeout=60,
        PORTABLE_HUB_STALL_TIMEOUT_S="1",
        PORTABLE_HUB_CONNECT_TIMEOUT_S="1",
        PORTABLE_HUB_RETRIES="1",
    )
    elapsed = time.monotonic() - start
    assert got.returncode == 33, got.stderr
    assert "transfer stalled (no data)" in got.stderr, got.stderr
    assert elapsed < 20, f"{case} took {elapsed:.1f} s with a 1 s stall timeout"
    hits = [r for r in hub.log[before:] if r["method"] == method and re.search(pattern, r["path"].split("?")[0])]
    assert len(hits) == 2, f"one try and PORTABLE_HUB_RETRIES=1 retry, not huggingface_hub's own: {len(hits)}"


# -- F2 / F3: fetch touches DIR only when it is new, empty or its own earlier fetch of that repo ----------


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and ".portable" not in p.relative_to(folder).parts
    }


def packed(folder: Path) -> Path:
    return make_bundle(
        folder,
        {"weights/model.safetensors": b"mine" * 1000, "weights/shard-0.bin": b"my shard", "README.md": b"# mine\n"},
    )


def unrelated_manifest(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "bundle.json").write_text('{"name": "my-webpack-config"}')
    (folder / "weights").mkdir()
    (folder / "weights/shard-0.bin").write_bytes(b"user bytes")
    (folder / "notes.txt").write_text("mine")
    return folder


def empty_partial(folder: Path) -> Path:
    (folder / ".portable/partial").mkdir(parents=True)
    (folder / "weights").mkdir()
    (folder / "weights/shard-1.bin").write_bytes(b"user bytes")
    return folder


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (packed, "holds a bundle.json that portable fetch did not write"),
        (unrelated_manifest, "holds a bundle.json that portable fetch did not write"),
        (empty_partial, "is not empty and holds no bundle"),
    ],
    ids=["packed-bundle", "unrelated-bundle-json", "empty-partial-folder"],
)
def test_fetch_refuses_a_folder_it_did_not_fetch_before_asking_the_hub(
    hub: HubServer, tmp_path: Path, make: Callable[[Path], Path], says: str
) -> None:
    published(hub, tmp_path)
    dest = make(tmp_path / "dest")
    before, requests = snapshot(dest), len(hub.log)
    got = run(hub, tmp_path, "fetch", "alice/r", str(dest), timeout=60)
    assert got.returncode == 4, got.stderr
    assert f"error: {dest} {says}" in got.stderr, got.stderr
    assert snapshot(dest) == before, "nothing of the user's is deleted or overwritten"
    assert len(hub.log) == requests, "refused before the Hub is asked anything"


def test_fetch_refuses_a_fetch_of_another_repo(hub: HubServer, tmp_path: Path) -> None:
    published(hub, tmp_path)
    published(hub, tmp_path, repo="alice/other", seed=1, name="other")
    dest = tmp_path / "dest"
    assert run(hub, tmp_path, "fetch", "alice/r", str(dest)).returncode == 0
    before = snapshot(dest)
    got = run(hub, tmp_path, "fetch", "alice/other", str(dest), timeout=60)
    assert got.returncode == 4, got.stderr
    assert f"error: {dest} holds a fetch of model:alice/r, not model:alice/other" in got.stderr
    assert snapshot(dest) == before


def test_refetch_with_a_users_file_in_the_folder_refuses_and_leaves_the_bundle_whole(
    hub: HubServer, tmp_path: Path
) -> None:
    from reproduction.release.verify import verify_bundle

    published(hub, tmp_path)
    dest = tmp_path / "dest"
    assert run(hub, tmp_path, "fetch", "alice/r", str(dest)).returncode == 0
    (dest / "notes.txt").write_text("mine")
    before = snapshot(dest)
    got = run(hub, tmp_path, "fetch", "alice/r", str(dest), timeout=60)
    assert got.returncode == 4, got.stderr
    assert f"error: {dest} holds 1 file(s) that no fetch wrote: notes.txt" in got.stderr, got.stderr
    assert snapshot(dest) == before, "bundle.json and every file kept"
    (dest / "notes.txt").unlink()
    assert verify_bundle(dest).ok
    again = run(hub, tmp_path, "fetch", "alice/r", str(dest), timeout=60)
    assert again.returncode == 0, again.stderr


def test_an_interrupted_fetch_is_resumed_and_a_new_revision_drops_only_fetched_files(
    hub: HubServer, tmp_path: Path
) -> None:
    from hubserver import Fault

    from reproduction.release.verify import verify_bundle

    published(hub, tmp_path)
    dest = tmp_path / "dest"
    hub.add_fault(Fault(method="GET", path=r"/weights/shard-1\.bin$", kind="corrupt", times=10))
    broken = run(hub, tmp_path, "fetch", "alice/r", str(dest), PORTABLE_HUB_RETRIES="0")
    assert broken.returncode == 34, broken.stderr
    assert (dest / "weights/shard-0.bin").exists() and not (dest / "bundle.json").exists()
    hub.faults.clear()
    assert run(hub, tmp_path, "fetch", "alice/r", str(dest)).returncode == 0, "an interrupted fetch is resumed"
    (dest / "runs").mkdir()
    (dest / "runs/out.txt").write_text("a run's output: runs/ is the user's")
    # a new revision without shard-1: the file the earlier fetch wrote goes, the run output stays
    bundle = make_bundle(tmp_path / "v2", {k: v for k, v in files().items() if "shard-1" not in k})
    assert run(hub, tmp_path, "publish", str(bundle), "--repo", "alice/r").returncode == 0
    got = run(hub, tmp_path, "fetch", "alice/r", str(dest))
    assert got.returncode == 0, got.stderr
    assert not (dest / "weights/shard-1.bin").exists() and (dest / "runs/out.txt").exists()
    assert verify_bundle(dest).ok
    receipt = json.loads((dest / ".portable/receipt.json").read_text())["fetch"]
    assert receipt["manifest_sha256"] == hashlib.sha256((dest / "bundle.json").read_bytes()).hexdigest()
    assert not (dest / ".portable/partial").exists()


# -- F5 / F6: unusable or lying answers are Hub errors (exit 30) naming the request, not internal errors ---


def redirect_to_itself(handler: Any) -> None:
    reply(302, b"", {"Location": handler.path})(handler)


def revision_answer(sha: Any) -> Callable[[Any], None]:
    body = {"id": "alice/r", "private": False, "siblings": []}
    if sha is not None:
        body["sha"] = sha
    return reply(200, json.dumps(body).encode(), {"Content-Type": "application/json"})


BAD_ANSWERS = {
    "bundle-json-gzip-garbage": (
        r"/resolve/[0-9a-f]{40}/bundle\.json$",
        reply(200, b"this is not gzip", {"Content-Encoding": "gzip"}),
        r"download alice/r@[0-9a-f]{12}/bundle\.json: the Hub's answer is unusable \(http://127\.0\.0\.1:\d+/alice/r/"
        r"resolve/[0-9a-f]{40}/bundle\.json\): DecodingError",
    ),
    "bundle-json-redirect-loop": (
        r"/resolve/[0-9a-f]{40}/bundle\.json$",
        redirect_to_itself,
        r"download alice/r@[0-9a-f]{12}/bundle\.json: the Hub's answer is unusable .*TooManyRedirects",
    ),
    "revision-without-sha": (
        r"^/api/models/alice/r/revision/main$",
        revision_answer(None),
        r"resolve alice/r@main: the Hub answered no sha at all where a commit id \(40 hex digits\) belongs",
    ),
    "revision-sha-is-a-branch": (
        r"^/api/models/alice/r/revision/main$",
        revision_answer("main"),
        r"resolve alice/r@main: the Hub answered 'main' where a commit id \(40 hex digits\) belongs",
    ),
    "revision-sha-is-a-path": (
        r"^/api/models/alice/r/revision/main$",
        revision_answer("../../../alice/r/resolve/main"),
        r"resolve alice/r@main: the Hub answered '\.\./\.\./\.\./alice/r/resolve/main' where a commit id",
    ),
    "revision-not-json": (
        r"^/api/models/alice/r/revision/main$",
        reply(200, b"<html>proxy login</html>", {"Content-Type": "application/json"}),
        r"resolve alice/r@main: the Hub's answer is not JSON",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_ANSWERS))
def test_unusable_hub_answers_are_exit_30_naming_the_request(hub: HubServer, tmp_path: Path, case: str) -> None:
    published(hub, tmp_path)
    pattern, answer, says = BAD_ANSWERS[case]
    on(hub, "GET", pattern, answer)
    dest = tmp_path / "out"
    got = run(hub, tmp_path, "fetch", "alice/r", str(dest), timeout=60)
    assert got.returncode == 30, got.stderr
    assert re.search(r"^error: " + says, got.stderr, re.M), got.stderr
    assert "internal error" not in got.stderr
    assert not dest.exists(), "nothing written: no receipt claims a commit"


# -- F7: a small file read whole is streamed under its size limit and must keep up a minimum rate ---------


def endless(hub: HubServer, sent: list[int]) -> Callable[[Any], None]:
    """A 1 GiB body in 1 MiB writes, counting what went out, until the client hangs up."""

    def answer(handler: Any) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(1 << 30))
        handler.end_headers()
        block = b"x" * (1 << 20)
        try:
            while sent[0] < 1 << 30 and not hub.stopping.is_set():
                handler.wfile.write(block)
                sent[0] += len(block)
        except OSError:
            pass
        handler.close_connection = True

    return answer


def drip(hub: HubServer) -> Callable[[Any], None]:
    """A 1000-byte body sent a byte every 0.2 s: never silent for a stall timeout."""

    def answer(handler: Any) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", "1000")
        handler.end_headers()
        try:
            for _ in range(1000):
                if hub.release.wait(0.2):  # type: ignore[attr-defined]
                    break
                handler.wfile.write(b"x")
                handler.wfile.flush()
        except OSError:
            pass
        handler.close_connection = True

    return answer


def test_a_small_file_larger_than_its_limit_is_cut_off_while_reading(hub: HubServer, monkeypatch) -> None:
    from huggingface_hub import constants

    from reproduction.errors import HubError

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # the test session is offline; this server is local
    from reproduction.release.hub_transfer import HubSettings, fetch_small

    sent = [0]
    on(hub, "GET", r"^/big$", endless(hub, sent))
    with pytest.raises(HubError) as err:
        fetch_small(f"{hub.url}/big", what="read big", settings=HubSettings(retries=0), limit=4 << 20)
    assert err.value.exit_code == 30
    assert str(err.value) == f"read big: more than {4 << 20} bytes, larger than this file may be; stopped reading"
    time.sleep(0.5)
    assert sent[0] < 64 << 20, f"the client stopped reading at the limit; the server got {sent[0]} bytes out"


def test_a_drip_fed_small_file_is_aborted_as_too_slow(hub: HubServer, tmp_path: Path) -> None:
    published(hub, tmp_path)
    on(hub, "GET", r"/resolve/[0-9a-f]{40}/bundle\.json$", drip(hub))
    start = time.monotonic()
    got = run(
        hub,
        tmp_path,
        "fetch",
        "alice/r",
        str(tmp_path / "out"),
        timeout=60,
        PORTABLE_HUB_STALL_TIMEOUT_S="1",
        PORTABLE_HUB_RETRIES="1",
    )
    elapsed = time.monotonic() - start
    assert got.returncode == 33, got.stderr
    assert re.search(
        r"download alice/r@[0-9a-f]{12}/bundle\.json: too slow: \d+ bytes in \d+ s \(a file read whole must arrive "
        r"at 32\.0 KiB/s or more after its first 1 s\)",
        got.stderr,
    ), got.stderr
    assert elapsed < 15, f"took {elapsed:.1f} s"


def test_a_drip_fed_download_is_aborted_as_too_slow_and_keeps_its_bytes(hub: HubServer, tmp_path: Path) -> None:
    """A large file's bytes arriving a byte every 0.2 s never stall, and held fetch for as long as the server liked
    (1000 bytes: 200 s; a real file: days). Each stall-timeout window must bring 1 KiB/s; the bytes that came stay in
    the partial for the next attempt."""
    published(hub, tmp_path)
    on(hub, "GET", r"/resolve/[0-9a-f]{40}/weights/shard-0\.bin$", drip(hub))
    start = time.monotonic()
    got = run(
        hub,
        tmp_path,
        "fetch",
        "alice/r",
        str(tmp_path / "out"),
        timeout=60,
        PORTABLE_HUB_STALL_TIMEOUT_S="1",
        PORTABLE_HUB_RETRIES="0",
    )
    elapsed = time.monotonic() - start
    assert got.returncode == 33, got.stderr
    assert re.search(
        r"weights/shard-0\.bin: too slow: \d+ bytes in the last 1 s \(a download must bring 1\.0 KiB/s or more over "
        r"each 1 s\)",
        got.stderr,
    ), got.stderr
    assert elapsed < 15, f"took {elapsed:.1f} s"
    kept = sorted(p.stat().st_size for p in (tmp_path / "out" / ".portable" / "partial").glob("*.part"))
    assert len(kept) == 1 and 0 < kept[0] < 1000, kept  # shard-0's dripped bytes; the other files arrived whole
    assert not (tmp_path / "out" / "weights" / "shard-0.bin").exists()


# -- F8: a disk too small is exit 8 naming the path, the space needed and what was free -------------------


@contextlib.contextmanager
def tmpfs(root: Path, size_kb: int):
    where = root / "small-disk"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(where)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}); needs root")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_fetch_onto_a_disk_without_room_is_exit_8_before_any_download(hub: HubServer, tmp_path: Path) -> None:
    published(hub, tmp_path)
    with tmpfs(tmp_path, 128) as disk:
        dest = disk / "out"
        got = run(hub, tmp_path, "fetch", "alice/r", str(dest), timeout=60)
        assert got.returncode == 8, got.stderr
        assert re.search(
            rf"^error: cannot fetch alice/r into {re.escape(str(dest))}: its 3 file\(s\) still to download need "
            r"195\.3 KiB and only 1\d\d\.\d KiB are free there$",
            got.stderr,
            re.M,
        ), got.stderr
        assert not hub.requests("GET", r"/resolve/[0-9a-f]{40}/(weights|configs)/"), "nothing downloaded"


def test_a_disk_that_fills_during_a_download_names_the_file_the_need_and_the_free_space(
    hub: HubServer, tmp_path: Path, monkeypatch
) -> None:
    from huggingface_hub import constants, hf_hub_url

    from reproduction.errors import WriteFailedError
    from reproduction.release.hub_transfer import Download, HubSettings, download

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # the test session is offline; this server is local
    published(hub, tmp_path)
    data = files()["weights/shard-0.bin"]
    url = hf_hub_url("alice/r", "weights/shard-0.bin", revision=hub.head("model/alice/r"), endpoint=hub.url)
    with tmpfs(tmp_path, 64) as disk:
        partial = disk / ".portable/partial/x.part"
        job = Download(
            rel="weights/shard-0.bin",
            url=url,
            dest=disk / "weights/shard-0.bin",
            partial=partial,
            size=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
        )
        with pytest.raises(WriteFailedError) as err:
            download(job, settings=HubSettings(retries=0), headers={}, on_bytes=lambda n: None)
        assert err.value.exit_code == 8
        assert re.fullmatch(
            rf"cannot write weights/shard-0\.bin: the disk is full at {re.escape(str(partial))} "
            r"\(it needs about \d+\.\d KiB, \d+ B were free\)",
            str(err.value),
        ), str(err.value)
        assert not job.dest.exists()


# -- F10: an LFS pointer served in place of the file; a partial file damaged on this disk ----------------


def test_an_lfs_pointer_served_instead_of_the_file_is_named_as_such_and_not_kept(
    hub: HubServer, tmp_path: Path
) -> None:
    published(hub, tmp_path)
    data = files()["weights/shard-1.bin"]
    pointer = b"version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n" % (
        hashlib.sha256(data).hexdigest().encode(),
        len(data),
    )
    on(hub, "GET", r"/resolve/[0-9a-f]{40}/weights/shard-1\.bin$", reply(200, pointer))
    dest = tmp_path / "out"
    got = run(hub, tmp_path, "fetch", "alice/r", str(dest), timeout=60, PORTABLE_HUB_RETRIES="1")
    assert got.returncode == 34, got.stderr
    assert (
        f"weights/shard-1.bin: downloaded bytes do not match bundle.json (expected sha256 "
        f"{hashlib.sha256(data).hexdigest()[:16]}..., got a Git LFS pointer of {len(pointer)} bytes, not the file's "
        "content)" in got.stderr
    ), got.stderr
    assert "hint: the Hub serves the LFS pointer, not the file it points to" in got.stderr
    assert "connection closed" not in got.stderr
    assert not list((dest / ".portable/partial").glob("*.part")), "the pointer's bytes are not kept to resume after"
    hub.hook = None
    assert run(hub, tmp_path, "fetch", "alice/r", str(dest)).returncode == 0


def test_a_partial_file_damaged_on_disk_is_named_as_possibly_local_and_dropped(hub: HubServer, tmp_path: Path) -> None:
    from hubserver import Fault

    published(hub, tmp_path)
    dest = tmp_path / "out"
    hub.add_fault(
        Fault(method="GET", path=r"/weights/shard-0\.bin$", kind="stall", after_bytes=50_000, seconds=30, times=5)
    )
    cut = run(
        hub,
        tmp_path,
        "fetch",
        "alice/r",
        str(dest),
        timeout=60,
        PORTABLE_HUB_RETRIES="0",
        PORTABLE_HUB_STALL_TIMEOUT_S="1",
    )
    assert cut.returncode == 33, cut.stderr
    hub.faults.clear()
    (part,) = (dest / ".portable/partial").glob("*.part")
    damaged = bytearray(part.read_bytes())
    damaged[100] ^= 0xFF
    part.write_bytes(bytes(damaged))
    got = run(hub, tmp_path, "fetch", "alice/r", str(dest), timeout=60, PORTABLE_HUB_RETRIES="0")
    assert got.returncode == 34, got.stderr
    assert (
        f"it was resumed after {len(damaged)} bytes kept on disk by an earlier run, which may be the damaged part "
        "(dropped)" in got.stderr
    ), got.stderr
    assert "hint: the bytes were damaged on the way (the server, a proxy) or on this disk" in got.stderr
    assert not part.exists(), "the damaged partial file is dropped"
    assert run(hub, tmp_path, "fetch", "alice/r", str(dest), PORTABLE_HUB_RETRIES="0").returncode == 0


# -- F9: a commit that landed but whose reply was lost -----------------------------------------------------


def test_a_commit_whose_reply_was_lost_is_recognised_and_publish_finishes(hub: HubServer, tmp_path: Path) -> None:
    seen: set[bytes] = set()

    def lose_first_reply(handler: Any, parts: list[str], query: dict[str, str], body: bytes) -> bool:
        if handler.command != "POST" or "/commit/" not in handler.path or body in seen:
            return False
        seen.add(body)
        real, handler.wfile = handler.wfile, io.BytesIO()
        try:
            handler._route(parts, query, body, None)  # the commit lands ...
        finally:
            handler.wfile = real
        handler.close_connection = True  # ... and its reply is lost
        return True

    hub.hook = lose_first_reply
    bundle = make_bundle(tmp_path / "bundle", files())
    got = run(hub, tmp_path, "publish", str(bundle), "--repo", "alice/r", "--tag", "v1", timeout=60)
    assert got.returncode == 0, got.stderr
    head = hub.head("model/alice/r")
    assert got.stdout.split()[0] == head, got.stdout
    assert hub.repos["model/alice/r"].tags["v1"] == head
    assert len(seen) == 2, "one batch and bundle.json, each landed once"
    assert "bundle.json" in hub.files_at("model/alice/r")


def test_a_lost_reply_whose_commit_did_not_land_is_still_a_conflict(hub: HubServer, tmp_path: Path) -> None:
    done = []

    def someone_else_commits(handler: Any, parts: list[str], query: dict[str, str], body: bytes) -> bool:
        if handler.command != "POST" or "/commit/" not in handler.path or done:
            return False
        done.append(1)
        with hub.lock:
            repo = hub.repos["model/alice/r"]
            files_now = dict(repo.commits[repo.branches["main"]]["files"])
            files_now["other.txt"] = hub.store_blob(b"someone else\n", lfs=False).sha256
            repo.branches["main"] = hub.new_commit(repo, repo.branches["main"], files_now, "someone else")
        handler.close_connection = True
        return True

    bundle = make_bundle(tmp_path / "bundle", files())
    assert (
        run(
            hub, tmp_path, "publish", str(make_bundle(tmp_path / "b0", {"a.txt": b"a"})), "--repo", "alice/r"
        ).returncode
        == 0
    )
    hub.hook = someone_else_commits
    got = run(hub, tmp_path, "publish", str(bundle), "--repo", "alice/r", timeout=60)
    assert got.returncode == 35, got.stderr
    assert "did not land as sent" in got.stderr
