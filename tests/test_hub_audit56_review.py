"""audit56 review2 S2-S4: every huggingface_hub import checks the HF_* environment first (`compare ... hub:` and
`weights fetch` included); a token in HF_ENDPOINT's userinfo is never printed or written by a publish or fetch;
each grpo config constant keeps its own docstring. The local Hub of tests/hubserver.py, the real CLI in a
subprocess."""

from __future__ import annotations

import ast
import base64
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import hubserver
import pytest
from hubserver import HubServer, make_bundle, portable_cmd, portable_env
from test_hub_hostile import TOKEN, files
from test_weights_hub import LFS_MIN, REPO_KEY, unpinned_manifest, upstream_files

REPO_ROOT = Path(__file__).resolve().parents[1]
DEMO_EVIDENCE = str(REPO_ROOT / "evidence" / "demo" / "eval_policy_1000.json")
SECRET = "hf_secretUserinfo0123456789"

BAD_ENV = {
    "etag": ("HF_HUB_ETAG_TIMEOUT", "abc", "HF_HUB_ETAG_TIMEOUT='abc' is not a whole number of seconds"),
    "endpoint": ("HF_ENDPOINT", "ftp://x", "HF_ENDPOINT='ftp://x' is not an http:// or https:// URL"),
}


@pytest.fixture
def upstream(tmp_path: Path):
    """A Hub holding test_weights_hub's upstream model repo."""
    server = HubServer(tmp_path / "hub", tokens={TOKEN: ("alice", "write")}).start()
    folder = tmp_path / "seed"
    for name, data in upstream_files().items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    server.seed_repo(REPO_KEY, folder, owner="alice", lfs_min_size=LFS_MIN)
    yield server
    server.stop()


def cli(hub: HubServer, tmp_path: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    env = portable_env(hub, tmp_path / "hfhome", token=TOKEN)
    env.update(extra)
    return subprocess.run(portable_cmd(*args), env=env, capture_output=True, text=True, timeout=120)


# -- S2: one import path, checked first ----------------------------------------------------------------------


def test_reproduction_imports_huggingface_hub_only_through_hub_import() -> None:
    direct = re.compile(r"^\s*(from huggingface_hub\b|import huggingface_hub\b)", re.M)
    found = [
        f"{p.relative_to(REPO_ROOT)}:{text[: m.start()].count(chr(10)) + 1}"
        for p in sorted((REPO_ROOT / "reproduction").rglob("*.py"))
        for text in [p.read_text(encoding="utf-8")]
        for m in direct.finditer(text)
    ]
    assert found == []


@pytest.mark.parametrize("bad", sorted(BAD_ENV))
def test_compare_against_a_hub_card_checks_the_hf_environment_first(
    upstream: HubServer, tmp_path: Path, bad: str
) -> None:
    name, value, message = BAD_ENV[bad]
    got = cli(upstream, tmp_path, "compare", "hub:alice/upstream", DEMO_EVIDENCE, **{name: value})
    assert got.returncode == 4, got.stderr
    assert f"error: {message}" in got.stderr
    assert "internal error" not in got.stderr


@pytest.mark.parametrize("bad", sorted(BAD_ENV))
def test_weights_fetch_checks_the_hf_environment_first(upstream: HubServer, tmp_path: Path, bad: str) -> None:
    manifest = unpinned_manifest(tmp_path)
    assert cli(upstream, tmp_path, "weights", "pin", str(manifest)).returncode == 0
    name, value, message = BAD_ENV[bad]
    got = cli(upstream, tmp_path, "weights", "fetch", str(manifest), str(tmp_path / "w"), **{name: value})
    assert got.returncode == 4, got.stderr
    assert f"error: {message}" in got.stderr
    assert "internal error" not in got.stderr
    assert not (tmp_path / "w" / "upstream" / "model.safetensors").exists()


# -- S3: a token in HF_ENDPOINT's userinfo ---------------------------------------------------------------------


def files_holding(root: Path, needle: bytes) -> list[str]:
    return sorted(str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes())


def test_publish_and_fetch_never_show_or_write_a_userinfo_token(
    upstream: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = make_bundle(tmp_path / "bundle", files())
    # httpx sends HF_ENDPOINT's userinfo as Basic auth (in place of the Bearer token): this Hub takes it as alice's
    basic = "Basic " + base64.b64encode(f"user:{SECRET}".encode()).decode()
    bearer = hubserver._HubHandler._user

    def user(handler: Any) -> tuple[str | None, str | None]:
        if handler.headers.get("Authorization", "") == basic:
            return "alice", "write"
        return bearer(handler)

    monkeypatch.setattr(hubserver._HubHandler, "_user", user)
    endpoint = upstream.url.replace("://", f"://user:{SECRET}@", 1)
    assert SECRET in endpoint
    out = tmp_path / "out"
    runs = [
        cli(upstream, tmp_path, "publish", str(bundle), "--repo", "alice/r", HF_ENDPOINT=endpoint),
        cli(upstream, tmp_path, "--json", "publish", str(bundle), "--repo", "alice/r", HF_ENDPOINT=endpoint),
        cli(upstream, tmp_path, "fetch", "alice/r", str(out), HF_ENDPOINT=endpoint),
        cli(upstream, tmp_path, "--json", "fetch", "alice/r", str(tmp_path / "out2"), HF_ENDPOINT=endpoint),
    ]
    for got in runs:
        assert SECRET not in got.stdout + got.stderr, got.args
    assert [got.returncode for got in runs] == [0, 0, 0, 0], [got.stderr for got in runs]
    shown_url = json.loads(runs[1].stdout)["url"]
    assert shown_url == upstream.url.replace("://", "://<redacted>@", 1) + "/alice/r"
    assert runs[0].stderr.splitlines()[-1] == shown_url
    # nothing portable wrote (bundle, fetched copies, HF_HOME) holds it
    for root in (bundle, out, tmp_path / "out2", tmp_path / "hfhome"):
        assert files_holding(root, SECRET.encode()) == []


# -- S4 ------------------------------------------------------------------------------------------------------------


def test_each_grpo_config_constant_has_its_own_docstring() -> None:
    tree = ast.parse((REPO_ROOT / "reproduction" / "recipes" / "grpo" / "config.py").read_text())
    body = tree.body
    docs: dict[str, str] = {}
    for before, node in zip(body, body[1:]):
        is_doc = (
            isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        )
        if not is_doc:
            continue
        assert isinstance(before, ast.Assign), f"a stray string at line {node.lineno}"
        docs[before.targets[0].id] = node.value.value  # type: ignore[attr-defined]
    assert docs["ADVANTAGE_SCALES"] == "What `rl.advantage_scale` may name (objective.group_advantages)."
    assert docs["ROLLOUTS_MAX"].startswith("Bound on rl.init_states x rl.group_size")
