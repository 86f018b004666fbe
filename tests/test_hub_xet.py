"""Publishing when huggingface_hub has hf_xet: publish uploads through Xet only where the Hub hands out Xet
write tokens, else deliberately through LFS; a Xet failure is a Hub error (30-39) with the LFS fix, not a
local write failure (exit 8). Regression: the first `portable publish` to a Hub without Xet endpoints failed
with exit 8 "cannot write a file: Network error ... 404 ... xet-write-token"."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hubserver import HubServer, make_bundle, portable_cmd, portable_env

pytest.importorskip("hf_xet")

TOKEN = "hf_portableXetSecret_71c2"
FILES = {"weights/w.safetensors": bytes(range(256)) * 800, "config/run.yaml": b"seed: 1\n"}


def _publish(hub: HubServer, tmp_path: Path, bundle: Path, repo: str) -> subprocess.CompletedProcess:
    env = portable_env(hub, tmp_path / "hfhome", token=TOKEN)
    env.pop("HF_HUB_DISABLE_XET")  # as a user has it: hf_xet installed and enabled
    return subprocess.run(
        portable_cmd("publish", str(bundle), "--repo", repo), env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    return make_bundle(tmp_path / "b", FILES)


def test_a_hub_without_xet_gets_the_lfs_path_and_the_publish_succeeds(tmp_path, bundle):
    hub = HubServer(tmp_path / "hub", tokens={TOKEN: ("alice", "write")}).start()
    try:
        done = _publish(hub, tmp_path, bundle, "alice/plain")
        assert done.returncode == 0, done.stderr
        assert "upload through LFS (" in done.stderr
        paths = [(r["method"], r["path"].split("?")[0]) for r in hub.log]
        assert ("GET", "/api/models/alice/plain/xet-write-token/main") in paths  # asked, was told 404
        assert any(m == "PUT" and p.startswith("/_lfs/upload/") for m, p in paths)  # the weights went via LFS
        fetched = subprocess.run(
            portable_cmd("fetch", "alice/plain", str(tmp_path / "f")),
            env=portable_env(hub, tmp_path / "hfhome", token=TOKEN),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert fetched.returncode == 0, fetched.stderr
        assert (tmp_path / "f" / "weights" / "w.safetensors").read_bytes() == FILES["weights/w.safetensors"]
    finally:
        hub.stop()


def test_a_hub_with_xet_gets_the_xet_path_and_its_failure_is_a_hub_error(tmp_path, bundle):
    hub = HubServer(tmp_path / "hub", tokens={TOKEN: ("alice", "write")}, xet_tokens=True).start()
    try:
        done = _publish(hub, tmp_path, bundle, "alice/xet")
        lines = done.stderr.strip().splitlines()
        assert "upload through Xet (" in done.stderr
        assert 30 <= done.returncode <= 39, done.stderr  # not 8: nothing local failed
        assert lines[-2].startswith("error: ") and "Xet storage failed" in lines[-2], done.stderr
        assert lines[-1].startswith("hint: publish through LFS instead: set HF_HUB_DISABLE_XET=1"), done.stderr
        assert "Traceback" not in done.stderr
        # the hint works: the same command through LFS publishes
        env = portable_env(hub, tmp_path / "hfhome", token=TOKEN)
        again = subprocess.run(
            portable_cmd("publish", str(bundle), "--repo", "alice/xet"), env=env, capture_output=True, text=True
        )
        assert again.returncode == 0 and "upload through LFS (" in again.stderr, again.stderr
    finally:
        hub.stop()
