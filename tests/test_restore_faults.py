"""Faults during restore: corrupt/truncated/missing/extra files, kill -9, a full disk, two restores at once."""

from __future__ import annotations

import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import time

import pytest
from bundlekit import QUIET, SCRIPT, flip_bit, run_cli, small_bundle, tree_snapshot, write_tree

from reproduction.release.lock import bundle_lock
from reproduction.release.pack import pack_bundle
from reproduction.release.receipt import load_receipt
from reproduction.release.restore import restore_bundle

TARGETS = ("source/project", "runtime/rt")


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return small_bundle(tmp_path_factory.mktemp("faults"))


@pytest.fixture
def bundle(packed, tmp_path):
    out = tmp_path / "b"
    shutil.copytree(packed, out, symlinks=True)
    return out


def _targets(bundle):
    return {t: tree_snapshot(bundle / t) if (bundle / t).exists() else None for t in TARGETS}


@pytest.mark.parametrize(
    "damage, shown",
    [
        (lambda b: flip_bit(b / "runtime" / "rt.tar.zst", 40, 5), "digest   runtime/rt.tar.zst"),
        (lambda b: flip_bit(b / "weights" / "model.safetensors", 777, 0), "digest   weights/model.safetensors"),
        (lambda b: os.truncate(b / "source" / "project.tar.zst", 100), "size     source/project.tar.zst"),
        (lambda b: (b / "data" / "episodes.parquet").unlink(), "missing  data/episodes.parquet"),
    ],
)
def test_bad_bytes_are_named_and_nothing_is_extracted(bundle, damage, shown):
    damage(bundle)
    done = run_cli("restore", bundle)
    assert done.returncode == 5, done.stderr
    assert shown in done.stderr and done.stderr.splitlines()[-1].startswith("hint: fetch the bundle again")
    assert _targets(bundle) == {t: None for t in TARGETS}
    assert not (bundle / ".portable" / "receipt.json").exists()
    assert not (bundle / ".portable" / "staging").exists()


def test_corruption_after_a_restore_leaves_the_restored_tree_untouched(bundle):
    restore_bundle(bundle, ui=QUIET)
    before, receipt = _targets(bundle), (bundle / ".portable" / "receipt.json").read_bytes()
    (bundle / "runtime" / "rt" / "share" / "data.txt").unlink()  # would be re-extracted...
    before = _targets(bundle)
    flip_bit(bundle / "runtime" / "rt.tar.zst", -5, 1)  # ...but its archive is now corrupt
    done = run_cli("restore", bundle)
    assert done.returncode == 5 and "digest   runtime/rt.tar.zst" in done.stderr
    assert _targets(bundle) == before
    assert (bundle / ".portable" / "receipt.json").read_bytes() == receipt


# -- kill -9 --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def killable(tmp_path_factory):
    """A bundle whose restore takes long enough to be interrupted: 1,500 small files in a runtime layer."""
    root = tmp_path_factory.mktemp("killable")
    rng = random.Random(7)
    files = {f"lib/p{i % 30}/m{i}.py": rng.randbytes(rng.randrange(200, 3000)) for i in range(1500)}
    write_tree(root / "src" / "rt", files)
    write_tree(root / "src" / "app", {"main.py": b"print('hi')\n", "pkg/util.py": b"x = 1\n"})
    (root / "k.toml").write_text(
        'name = "k"\nroot = "src"\n[[layer]]\nsource = "rt"\nkind = "runtime"\n'
        '[[layer]]\nsource = "app"\nkind = "source"\n'
    )
    pack_bundle(root / "k.toml", root / "bundle", ui=QUIET)
    reference = root / "reference"
    shutil.copytree(root / "bundle", reference, symlinks=True)
    restore_bundle(reference, ui=QUIET)
    return root / "bundle", {t: tree_snapshot(reference / t) for t in ("runtime/rt", "source/app")}


@pytest.mark.slow
def test_kill_9_at_random_moments_never_exposes_a_partial_layer(killable, tmp_path):
    packed, reference = killable
    bundle = tmp_path / "b"
    shutil.copytree(packed, bundle, symlinks=True)
    start = time.perf_counter()
    assert run_cli("restore", bundle).returncode == 0
    full = time.perf_counter() - start
    rng = random.Random(20261129)
    outcomes = {"killed": 0, "finished": 0}
    for trial in range(24):
        if trial % 3 == 0:  # from nothing
            for t in reference:
                shutil.rmtree(bundle / t, ignore_errors=True)
            shutil.rmtree(bundle / ".portable", ignore_errors=True)
        else:  # over an existing tree that must be replaced (a damaged runtime file forces re-extraction)
            (bundle / "runtime" / "rt" / "lib" / "p3" / "m3.py").write_bytes(b"damaged")
        old = {t: tree_snapshot(bundle / t) if (bundle / t).exists() else None for t in reference}
        proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), "restore", str(bundle)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PORTABLE_NO_PROGRESS": "1"},
        )
        time.sleep(rng.uniform(0.0, full * 1.1))
        proc.send_signal(signal.SIGKILL)
        outcomes["finished" if proc.wait(timeout=60) == 0 else "killed"] += 1
        for t, want in reference.items():  # each target is the old tree or the complete new one, never a mix
            now = tree_snapshot(bundle / t) if (bundle / t).exists() else None
            assert now in (old[t], want), f"trial {trial}: {t} is neither the old nor the new tree"
        done = run_cli("restore", bundle)
        assert done.returncode == 0, f"trial {trial}: {done.stderr}"
        assert {t: tree_snapshot(bundle / t) for t in reference} == reference
        assert run_cli("verify", bundle).returncode == 0
    assert outcomes["killed"] >= 10, outcomes  # most kills really landed mid-restore (timing varies on busy machines)


# -- a full disk ------------------------------------------------------------------------------------


def _limited(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_file_size_limit_fails_cleanly_and_keeps_the_previous_state(bundle):
    first = subprocess.run(
        [sys.executable, str(SCRIPT), "restore", str(bundle)],
        capture_output=True,
        text=True,
        preexec_fn=_limited(8192),
        timeout=120,
        env={**os.environ, "PORTABLE_NO_PROGRESS": "1"},
    )
    assert first.returncode == 8, first.stderr
    lines = first.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: cannot write ") and "file size limit" in lines[0]
    assert (
        lines[1]
        == "hint: free some space (or raise the limit, or fix the permissions) and run `portable restore` again; "
        "the previous state is kept"
    )
    assert _targets(bundle) == {t: None for t in TARGETS}
    assert not (bundle / ".portable" / "staging").exists()

    restore_bundle(bundle, ui=QUIET)
    (bundle / "runtime" / "rt" / "share" / "data.txt").unlink()  # forces the runtime layer to be extracted again
    before, receipt = _targets(bundle), (bundle / ".portable" / "receipt.json").read_bytes()
    again = subprocess.run(
        [sys.executable, str(SCRIPT), "restore", str(bundle)],
        capture_output=True,
        text=True,
        preexec_fn=_limited(8192),
        timeout=120,
        env={**os.environ, "PORTABLE_NO_PROGRESS": "1"},
    )
    assert again.returncode == 8, again.stderr
    assert _targets(bundle) == before
    assert (bundle / ".portable" / "receipt.json").read_bytes() == receipt
    assert sorted(os.listdir(bundle / ".portable")) == ["lock", "receipt.json"]
    assert restore_bundle(bundle, ui=QUIET).extracted == ["runtime/rt"]


def test_not_enough_free_space_is_refused_up_front(bundle, monkeypatch):
    import collections

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 100, 100))
    from reproduction.errors import WriteFailedError

    with pytest.raises(WriteFailedError, match="the layers need .* 100 B is free"):
        restore_bundle(bundle, ui=QUIET)
    assert _targets(bundle) == {t: None for t in TARGETS}


# -- two restores at once ----------------------------------------------------------------------------


def test_a_second_restore_exits_7_while_the_lock_is_held(bundle):
    with bundle_lock(bundle, what="test holding the lock"):
        done = run_cli("restore", bundle)
    assert done.returncode == 7
    assert done.stderr.splitlines()[0] == (
        f"error: {bundle}: another portable process (pid {os.getpid()}: test holding the lock) "
        "is working on this bundle; refusing to restore at the same time"
    )
    assert _targets(bundle) == {t: None for t in TARGETS}
    assert run_cli("restore", bundle).returncode == 0  # released with the holder


def test_two_concurrent_restores_never_interleave(killable, tmp_path):
    packed, reference = killable
    for attempt in range(3):
        bundle = tmp_path / f"b{attempt}"
        shutil.copytree(packed, bundle, symlinks=True)
        procs = [
            subprocess.Popen(
                [sys.executable, str(SCRIPT), "restore", str(bundle)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, "PORTABLE_NO_PROGRESS": "1"},
            )
            for _ in range(2)
        ]
        results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
        for p in procs:
            p.stdout.close()
            p.stderr.close()
        codes = sorted(code for code, _ in results)
        assert codes in ([0, 0], [0, 7]), results  # the second waits its turn (then finds nothing to do) or is refused
        for code, err in results:
            if code == 7:
                assert "another portable process" in err and "refusing to restore at the same time" in err
        assert {t: tree_snapshot(bundle / t) for t in reference} == reference
        assert load_receipt(bundle).layers.keys() == {"runtime/rt.tar.zst", "source/app.tar.zst"}
