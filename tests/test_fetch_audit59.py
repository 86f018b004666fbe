"""`portable fetch` of another revision into an earlier fetch (audit59 F1, F6): a user's file at a path the new
revision lists is refused like any file no fetch wrote (exit 4, named, before the Hub is asked, bytes kept), a
fetched file the user edited is named when it is replaced, and the folders a revision switch emptied go."""

from __future__ import annotations

from pathlib import Path

import pytest
from hubserver import HubServer, make_bundle
from test_hub_hostile import TOKEN, files, published, run, snapshot


@pytest.fixture
def hub(tmp_path: Path):
    server = HubServer(tmp_path / "hub", tokens={TOKEN: ("alice", "write")}).start()
    yield server
    server.stop()


def publish(hub: HubServer, tmp_path: Path, name: str, content: dict[str, bytes]) -> None:
    got = run(hub, tmp_path, "publish", str(make_bundle(tmp_path / name, content)), "--repo", "alice/r")
    assert got.returncode == 0, got.stderr


def test_a_users_file_at_a_path_the_new_revision_lists_is_refused_and_kept(hub: HubServer, tmp_path: Path) -> None:
    published(hub, tmp_path)
    dest = tmp_path / "dest"
    assert run(hub, tmp_path, "fetch", "alice/r", str(dest)).returncode == 0
    publish(hub, tmp_path, "v2", {**files(), "weights/new.bin": b"N" * 5000})
    (dest / "weights/new.bin").write_bytes(b"user's own file\n")
    before, requests = snapshot(dest), len(hub.log)
    got = run(hub, tmp_path, "fetch", "alice/r", str(dest), timeout=60)
    assert got.returncode == 4, got.stderr
    assert f"error: {dest} holds 1 file(s) that no fetch wrote: weights/new.bin;" in got.stderr, got.stderr
    assert (dest / "weights/new.bin").read_bytes() == b"user's own file\n"
    assert snapshot(dest) == before, "nothing changed"
    assert len(hub.log) == requests, "refused before the Hub is asked anything"
    (dest / "weights/new.bin").unlink()
    again = run(hub, tmp_path, "fetch", "alice/r", str(dest), timeout=60)
    assert again.returncode == 0, again.stderr
    assert (dest / "weights/new.bin").read_bytes() == b"N" * 5000


def test_a_refetch_names_the_fetched_file_it_replaces_after_an_edit(hub: HubServer, tmp_path: Path) -> None:
    published(hub, tmp_path)
    dest = tmp_path / "dest"
    assert run(hub, tmp_path, "fetch", "alice/r", str(dest)).returncode == 0
    (dest / "configs/run.yaml").write_bytes(b"seed: 999  # my edit\n")
    got = run(hub, tmp_path, "fetch", "alice/r", str(dest), timeout=60)
    assert got.returncode == 0, got.stderr
    assert "replacing 1 file(s) changed since fetch wrote them: configs/run.yaml\n" in got.stderr, got.stderr
    assert (dest / "configs/run.yaml").read_bytes() == b"seed: 0\n"
    quiet = run(hub, tmp_path, "-q", "fetch", "alice/r", str(dest), timeout=60)
    assert quiet.returncode == 0 and "replacing" not in quiet.stderr, quiet.stderr
    untouched = run(hub, tmp_path, "fetch", "alice/r", str(dest), timeout=60)
    assert untouched.returncode == 0 and "replacing" not in untouched.stderr, untouched.stderr


def test_a_revision_switch_removes_the_folders_it_emptied_and_no_other(hub: HubServer, tmp_path: Path) -> None:
    publish(hub, tmp_path, "v1", {**files(), "data/deep/only_v1.txt": b"v1\n", "keep/only_v1.txt": b"v1\n"})
    dest = tmp_path / "dest"
    assert run(hub, tmp_path, "fetch", "alice/r", str(dest)).returncode == 0
    (dest / "mine").mkdir()  # an empty folder of the user's: fetch did not empty it
    (dest / "runs").mkdir()
    publish(hub, tmp_path, "v2", {**files(), "keep/other.txt": b"v2\n"})
    got = run(hub, tmp_path, "fetch", "alice/r", str(dest), timeout=60)
    assert got.returncode == 0, got.stderr
    assert not (dest / "data").exists(), "data/deep/ and data/ held only v1's file"
    assert sorted(p.name for p in (dest / "keep").iterdir()) == ["other.txt"]
    assert (dest / "mine").is_dir() and (dest / "runs").is_dir()


def test_the_bundles_own_bytecode_is_no_users_file(hub: HubServer, tmp_path: Path) -> None:
    """review59 R1: running the fetched bundle's own reproduction/ copy leaves __pycache__ there, which verify has
    always ignored; the new foreign-file walk counted it, so every later fetch (the same revision too) was exit 4."""
    publish(hub, tmp_path, "v1", {**files(), "reproduction/mod.py": b"X = 1\n"})
    dest = tmp_path / "dest"
    assert run(hub, tmp_path, "fetch", "alice/r", str(dest)).returncode == 0
    (dest / "reproduction/__pycache__").mkdir()
    (dest / "reproduction/__pycache__/mod.cpython-311.pyc").write_bytes(b"\x00bytecode")
    again = run(hub, tmp_path, "fetch", "alice/r", str(dest), timeout=60)
    assert again.returncode == 0, again.stderr
    publish(hub, tmp_path, "v2", {**files(1), "reproduction/mod.py": b"X = 2\n"})
    got = run(hub, tmp_path, "fetch", "alice/r", str(dest), timeout=60)
    assert got.returncode == 0, got.stderr
    assert (dest / "reproduction/mod.py").read_bytes() == b"X = 2\n"


def test_a_linked_folder_of_the_users_is_refused_before_anything_changes(hub: HubServer, tmp_path: Path) -> None:
    """review59 R2: a user's symlinked folder was skipped by the new walk, so fetch of a new revision dropped the old
    files and bundle.json, downloaded, then failed its own verify (exit 5, "1 extra") and left no bundle.json. It is
    refused up front again (exit 4, named), as before audit59 F1's change, with nothing changed."""
    published(hub, tmp_path)
    dest = tmp_path / "dest"
    assert run(hub, tmp_path, "fetch", "alice/r", str(dest)).returncode == 0
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere/big.bin").write_bytes(b"x")
    (dest / "scratch").symlink_to(tmp_path / "elsewhere")
    publish(hub, tmp_path, "v2", files(1))
    before, requests = snapshot(dest), len(hub.log)
    got = run(hub, tmp_path, "fetch", "alice/r", str(dest), timeout=60)
    assert got.returncode == 4, got.stderr
    assert f"error: {dest} holds 1 file(s) that no fetch wrote: scratch;" in got.stderr, got.stderr
    assert snapshot(dest) == before and (dest / "bundle.json").is_file()
    assert len(hub.log) == requests, "refused before the Hub is asked anything"


def test_a_users_folder_where_the_new_revision_lists_a_file_is_refused_up_front(hub: HubServer, tmp_path: Path) -> None:
    """audit59 A3: an empty folder of the user's at a path the new revision lists as a file was not counted (only
    files were): fetch replaced v1's files, dropped bundle.json, then failed writing there (exit 8, "free some
    space"), every time. It is refused like a file no fetch wrote: exit 4, named, nothing changed (once the new
    revision's file list is read: an empty folder is no file, so the check before the Hub is asked passes it)."""
    published(hub, tmp_path)
    dest = tmp_path / "dest"
    assert run(hub, tmp_path, "fetch", "alice/r", str(dest)).returncode == 0
    (dest / "notes").mkdir()
    publish(hub, tmp_path, "v2", {**files(1), "notes": b"v2 notes\n"})
    before = snapshot(dest)
    got = run(hub, tmp_path, "fetch", "alice/r", str(dest), timeout=60)
    assert got.returncode == 4, got.stderr
    assert f"error: {dest} holds 1 file(s) that no fetch wrote: notes;" in got.stderr, got.stderr
    assert snapshot(dest) == before and (dest / "bundle.json").is_file() and (dest / "notes").is_dir()
    (dest / "notes").rmdir()
    again = run(hub, tmp_path, "fetch", "alice/r", str(dest), timeout=60)
    assert again.returncode == 0, again.stderr
    assert (dest / "notes").read_bytes() == b"v2 notes\n"


def test_a_fetched_folder_the_new_revision_lists_as_a_file_is_replaced(hub: HubServer, tmp_path: Path) -> None:
    """review59 T1: after audit59 A3's rule (a folder at a listed path is refused), a folder an earlier fetch filled
    (v1's notes/a.txt) that v2 lists as a file was refused as one "no fetch wrote". Dropping v1's file empties it, so
    the switch goes through as before."""
    publish(hub, tmp_path, "v1", {**files(), "notes/a.txt": b"v1 a\n"})
    dest = tmp_path / "dest"
    assert run(hub, tmp_path, "fetch", "alice/r", str(dest)).returncode == 0
    publish(hub, tmp_path, "v2", {**files(1), "notes": b"v2 notes\n"})
    got = run(hub, tmp_path, "fetch", "alice/r", str(dest), timeout=60)
    assert got.returncode == 0, got.stderr
    assert (dest / "notes").read_bytes() == b"v2 notes\n"
