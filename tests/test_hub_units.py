"""The pure parts of release/hub*.py and release/model_card.py, in process (no server, no network)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hubserver import make_bundle

from reproduction.errors import HubIntegrityError, HubTransferError, InvalidInputError
from reproduction.release.hub import check_repo_id, git_blob_sha1, plan_batches, repo_web_url
from reproduction.release.hub_transfer import DigestMismatch, HubSettings, backoff_delay, with_retries
from reproduction.release.manifest import FileEntry, load_manifest
from reproduction.release.model_card import render_model_card


def entries(*sizes: int) -> list[FileEntry]:
    return [FileEntry(path=f"f{i}", size=s, sha256="0" * 64) for i, s in enumerate(sizes)]


def test_batches_respect_file_and_byte_limits_and_keep_order() -> None:
    batches = plan_batches(entries(5, 5, 5, 5, 5), max_files=2, max_bytes=100)
    assert [[e.path for e in b] for b in batches] == [["f0", "f1"], ["f2", "f3"], ["f4"]]
    batches = plan_batches(entries(40, 40, 40, 500, 10), max_files=100, max_bytes=100)
    assert [[e.path for e in b] for b in batches] == [["f0", "f1"], ["f2"], ["f3"], ["f4"]]  # 500 alone
    assert plan_batches([], max_files=2, max_bytes=10) == []


def test_git_blob_sha1_matches_git(tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    (tmp_path / "hello").write_bytes(b"hello\n")
    assert git_blob_sha1(tmp_path / "empty") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"  # `git hash-object`
    assert git_blob_sha1(tmp_path / "hello") == "ce013625030ba8dba906f756967f9e9ca394464a"


def test_settings_from_env_and_their_errors() -> None:
    s = HubSettings.from_env(
        {"PORTABLE_HUB_JOBS": "3", "PORTABLE_HUB_STALL_TIMEOUT_S": "0.5", "PORTABLE_HUB_BATCH_BYTES": "1000"}
    )
    assert (s.jobs, s.stall_timeout_s, s.batch_bytes, s.retries) == (3, 0.5, 1000, 5)
    with pytest.raises(InvalidInputError, match=r"PORTABLE_HUB_RETRIES='many' is not a valid int"):
        HubSettings.from_env({"PORTABLE_HUB_RETRIES": "many"})
    with pytest.raises(InvalidInputError, match=r"PORTABLE_HUB_BATCH_FILES=0 must be a whole number, 1 or more"):
        HubSettings.from_env({"PORTABLE_HUB_BATCH_FILES": "0"})
    with pytest.raises(
        InvalidInputError, match=r"PORTABLE_HUB_STALL_TIMEOUT_S=0 must be a number of seconds above 0, at most 86400$"
    ):
        HubSettings(stall_timeout_s=0.0)


def test_backoff_grows_is_jittered_capped_and_honours_retry_after() -> None:
    random.seed(1)
    s = HubSettings(backoff_s=1.0, backoff_max_s=8.0)
    for attempt, (lo, hi) in enumerate([(0.5, 1.0), (1.0, 2.0), (2.0, 4.0), (4.0, 8.0), (4.0, 8.0), (4.0, 8.0)]):
        delays = {backoff_delay(attempt, s) for _ in range(20)}
        assert all(lo <= d <= hi for d in delays) and len(delays) > 1
    assert backoff_delay(0, s, retry_after=5.0) == 5.0
    assert backoff_delay(0, s, retry_after=600.0) == 8.0  # a server's Retry-After is capped too


def test_with_retries_is_bounded_and_maps_errors() -> None:
    calls = []

    def corrupt() -> None:
        calls.append(1)
        raise DigestMismatch("weights/a.bin", "a" * 64, "b" * 64)

    s = HubSettings(retries=2, backoff_s=0.0)
    with pytest.raises(HubIntegrityError, match=r"weights/a.bin: downloaded bytes do not match bundle.json") as info:
        with_retries(corrupt, what="download weights/a.bin", settings=s)
    assert len(calls) == 3 and info.value.exit_code == 34

    import httpx

    outcomes = iter([httpx.ReadTimeout("stalled"), httpx.ConnectError("refused"), "done"])

    def flaky() -> str:
        item = next(outcomes)
        if isinstance(item, Exception):
            raise item
        return item

    assert with_retries(flaky, what="x", settings=s) == "done"
    with pytest.raises(HubTransferError, match=r"x: transfer stalled \(no data\)"):
        with_retries(lambda: (_ for _ in ()).throw(httpx.ReadTimeout("stalled")), what="x", settings=s)
    with pytest.raises(ZeroDivisionError):  # a bug is not a transfer error: no retry, no translation
        with_retries(lambda: 1 / 0, what="x", settings=s)


def test_repo_ids_and_urls() -> None:
    assert check_repo_id("my-lab/recap_libero.10") == "my-lab/recap_libero.10"
    for bad in ("recap", "a/b/c", "/a", "a/", "a/../b", "a/b.git", ""):
        with pytest.raises(InvalidInputError, match="is not OWNER/NAME"):
            check_repo_id(bad)
    assert repo_web_url("https://hf.co", "a/b", "model") == "https://hf.co/a/b"
    assert repo_web_url("https://hf.co", "a/b", "dataset", "dev") == "https://hf.co/datasets/a/b/tree/dev"


def test_model_card_describes_contents_evidence_and_licenses(tmp_path: Path) -> None:
    bundle = make_bundle(
        tmp_path / "b",
        {
            "weights/policy.safetensors": b"w" * 3000,
            "weights/value.safetensors": b"v" * 1000,
            "evidence/eval_policy.json": json.dumps(
                {"metrics": {"success_rate": 0.772, "episodes": 500, "curve": [1, 2]}}
            ).encode(),
            "evidence/broken.json": b"{not json",
            "LICENSES/Gemma.txt": b"terms\n",
            "config/run.yaml": b"a: 1\n",
        },
    )
    card = render_model_card(load_manifest(bundle), bundle, repo_id="lab/recap", repo_type="dataset")
    assert card.startswith("---\nlicense: apache-2.0\n")
    assert "| `weights/` | 2 | 3.9 KiB |" in card and "6 files" in card
    assert "portable fetch lab/recap BUNDLE --repo-type dataset --revision <commit>" in card
    assert "- `evidence/eval_policy.json`: success_rate = 0.772, episodes = 500" in card and "curve" not in card
    assert "- `evidence/broken.json` (not readable as JSON)" in card
    assert "- `LICENSES/Gemma.txt`" in card


def test_fetch_into_a_folder_holding_something_else_is_refused_before_the_hub_is_asked(tmp_path, monkeypatch, capsys):
    """audit46 newcomer F22: exit 4 for a non-empty folder holding no bundle came only after the Hub answered (with an
    unreachable Hub: 5 retries, ~19 s, then exit 33). Now it is decided on the spot."""
    from reproduction import portable
    from reproduction.release import hub

    def asked(*args, **kwargs):
        raise AssertionError("the Hub was asked")

    monkeypatch.setattr(hub, "_client", asked)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "mine.txt").write_text("keep me")
    assert portable.main(["fetch", "alice/r", str(busy)]) == 4
    assert capsys.readouterr().err.splitlines() == [
        f"error: {busy} is not empty and holds no bundle (1 entries, e.g. 'mine.txt')",
        "hint: fetch into a new or empty folder",
    ]
    assert sorted(p.name for p in busy.iterdir()) == ["mine.txt"]
