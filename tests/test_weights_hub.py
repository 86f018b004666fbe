"""`portable weights pin / fetch / verify` end to end: the real huggingface_hub client (in a `portable`
subprocess) against the local Hub-compatible server in tests/hubserver.py, which each test starts on
127.0.0.1 (a stand-in for huggingface.co, which this machine cannot reach) and stops."""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import time
from pathlib import Path

import pytest
from hubserver import Fault, HubServer, portable_cmd, portable_env

from reproduction.release.weights_manifest import UNPINNED, load_weights_manifest

REPO_KEY = "model/alice/upstream"
LFS_MIN = 50_000  # files this large are LFS on the test Hub; the configs stay regular git files


def upstream_files(seed: int = 0) -> dict[str, bytes]:
    rnd = random.Random(seed)
    return {
        "model.safetensors": rnd.randbytes(300_000),
        "config.json": json.dumps({"hidden_size": 64, "seed": seed}).encode(),
        "tokenizer.json": b'{"model": {"type": "BPE"}}',
        "README.md": b"---\nlicense: apache-2.0\n---\n# upstream\n",
    }


@pytest.fixture
def hub(tmp_path: Path):
    server = HubServer(tmp_path / "hub").start()
    folder = tmp_path / "seed"
    for name, data in upstream_files().items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    server.seed_repo(REPO_KEY, folder, owner="alice", lfs_min_size=LFS_MIN)
    yield server
    server.stop()


def run(hub: HubServer, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        portable_cmd("weights", *args),
        env=portable_env(hub, tmp_path / "hfhome", token=None),
        capture_output=True,
        text=True,
        timeout=120,
    )


def unpinned_manifest(tmp_path: Path, *, license_id: str = "apache-2.0") -> Path:
    """The shape of the shipped real manifests: everything the Hub knows still reads "to-be-pinned"."""
    files = [("model.safetensors", "weights"), ("config.json", "config"), ("tokenizer.json", "tokenizer")]
    data = {
        "$schema": "./schema.json",
        "format": "recap-portable-weights",
        "format_version": 2,
        "name": "upstream-test",
        "model": "value",
        "presets": ["test"],
        "components": [
            {
                "role": "language",
                "source": {
                    "kind": "hub",
                    "repo": "alice/upstream",
                    "repo_type": "model",
                    "revision": "main",
                    "commit": UNPINNED,
                },
                "license": {"id": license_id, "file": "LICENSES/Apache-2.0.txt"},
                "model_config": {"path": "upstream/config.json", "sha256": UNPINNED},
                "files": [
                    {"path": f"upstream/{n}", "repo_path": n, "kind": k, "size": UNPINNED, "sha256": UNPINNED}
                    for n, k in files
                ],
                "key_mapping": {"source_prefix": "model.", "target_prefix": "language."},
                "presets": ["test"],
            }
        ],
        "fresh_prefixes": [],
    }
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(data, indent=2))
    return path


def move_main(hub: HubServer, files: dict[str, bytes]) -> str:
    """Commit new bytes for `files` on main (what an upstream push does); returns the new head."""
    with hub.lock:
        repo = hub.repos[REPO_KEY]
        head = repo.branches["main"]
        tree = dict(repo.commits[head]["files"])
        for name, data in files.items():
            tree[name] = hub.store_blob(data, lfs=len(data) >= LFS_MIN).sha256
        repo.branches["main"] = hub.new_commit(repo, head, tree, "upstream moved")
        hub._save()
        return repo.branches["main"]


def test_pin_fetch_verify_round_trip_without_downloading_lfs_files_to_pin(hub: HubServer, tmp_path: Path) -> None:
    manifest = unpinned_manifest(tmp_path)
    proc = run(hub, tmp_path, "verify", str(manifest), str(tmp_path / "nothing"))
    assert proc.returncode == 5 and "unpinned" in proc.stdout and "source.commit" in proc.stdout
    proc = run(hub, tmp_path, "fetch", str(manifest), str(tmp_path / "early"))
    assert proc.returncode == 4 and "still 'to-be-pinned'" in proc.stderr and "portable weights pin" in proc.stderr

    proc = run(hub, tmp_path, "pin", str(manifest))
    assert proc.returncode == 0, proc.stderr
    pinned = load_weights_manifest(manifest)
    comp = pinned.components[0]
    assert comp.source["commit"] == hub.head(REPO_KEY) and pinned.unpinned() == []
    want = upstream_files()
    assert {f.repo_path: (f.size, f.sha256) for f in comp.files} == {
        n: (len(want[n]), hashlib.sha256(want[n]).hexdigest())
        for n in ("model.safetensors", "config.json", "tokenizer.json")
    }
    assert comp.model_config == {
        "path": "upstream/config.json",
        "sha256": hashlib.sha256(want["config.json"]).hexdigest(),
    }
    assert comp.key_mapping == {"source_prefix": "model.", "target_prefix": "language."}  # kept from the manifest
    first = manifest.read_bytes()
    assert run(hub, tmp_path, "pin", str(manifest)).returncode == 0
    assert manifest.read_bytes() == first  # the same commit pins to the same manifest, byte for byte
    # the LFS file's sha256 came from the tree metadata: pinning never downloaded it
    assert hub.requests("GET", r"/resolve/.*/model\.safetensors") == []
    assert hub.requests("GET", r"/resolve/.*/config\.json")  # small git files are read (and checked by sha1)

    proc = run(hub, tmp_path, "fetch", str(manifest), str(tmp_path / "w"))
    assert proc.returncode == 0, proc.stderr
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert (tmp_path / "w" / "upstream" / name).read_bytes() == want[name]
    assert not (tmp_path / "w" / "upstream" / "README.md").exists()  # exactly the manifest's files
    proc = run(hub, tmp_path, "verify", str(manifest), str(tmp_path / "w"))
    assert proc.returncode == 0 and "3 of 3 files verified" in proc.stdout
    before = len(hub.requests("GET", r"/resolve/"))
    assert run(hub, tmp_path, "fetch", str(manifest), str(tmp_path / "w")).returncode == 0
    assert len(hub.requests("GET", r"/resolve/")) == before  # present and verified: nothing downloaded again


def test_pin_a_repo_prints_a_component_and_updates_a_manifest(hub: HubServer, tmp_path: Path) -> None:
    proc = run(hub, tmp_path, "pin", "alice/upstream", "--files", "*.json", "--license", "apache-2.0")
    assert proc.returncode == 0, proc.stderr
    comp = json.loads(proc.stdout)
    assert [f["repo_path"] for f in comp["files"]] == ["config.json", "tokenizer.json"]
    assert comp["source"]["commit"] == hub.head(REPO_KEY) and comp["license"]["source"] == "--license"
    # no --license: the card's `license:` is read (apache-2.0 here)
    card = json.loads(run(hub, tmp_path, "pin", "alice/upstream", "--files", "config.json").stdout)
    assert card["license"]["id"] == "apache-2.0" and card["license"]["file"] == "LICENSES/Apache-2.0.txt"

    manifest = unpinned_manifest(tmp_path)
    proc = run(hub, tmp_path, "pin", "alice/upstream", "--manifest", str(manifest))
    assert proc.returncode == 0, proc.stderr
    assert load_weights_manifest(manifest).unpinned() == []
    proc = run(hub, tmp_path, "pin", "alice/upstream", "--files", "*.onnx", "--license", "apache-2.0")
    assert proc.returncode == 4 and "no file matches '*.onnx'" in proc.stderr
    proc = run(hub, tmp_path, "pin", "alice/nothere", "--license", "apache-2.0")
    assert proc.returncode == 32, proc.stderr


def test_an_unknown_license_id_is_an_error(hub: HubServer, tmp_path: Path) -> None:
    proc = run(hub, tmp_path, "pin", "alice/upstream", "--license", "wtfpl-9")
    assert proc.returncode == 4
    assert "unknown license id 'wtfpl-9' (known: apache-2.0, gemma, mit)" in proc.stderr
    manifest = unpinned_manifest(tmp_path, license_id="cc-by-nc-4.0")
    proc = run(hub, tmp_path, "pin", str(manifest))
    assert proc.returncode == 4 and "unknown license id 'cc-by-nc-4.0'" in proc.stderr


def test_a_revision_that_moves_after_pinning_does_not_change_what_is_fetched(hub: HubServer, tmp_path: Path) -> None:
    manifest = unpinned_manifest(tmp_path)
    assert run(hub, tmp_path, "pin", str(manifest)).returncode == 0
    pinned_commit = load_weights_manifest(manifest).components[0].source["commit"]
    moved = move_main(hub, {"model.safetensors": random.Random(9).randbytes(300_000), "config.json": b"{}"})
    assert moved != pinned_commit
    proc = run(hub, tmp_path, "fetch", str(manifest), str(tmp_path / "w"))
    assert proc.returncode == 0, proc.stderr
    want = upstream_files()
    assert (tmp_path / "w" / "upstream" / "model.safetensors").read_bytes() == want["model.safetensors"]
    assert (tmp_path / "w" / "upstream" / "config.json").read_bytes() == want["config.json"]
    assert all(pinned_commit in r["path"] for r in hub.requests("GET", r"/resolve/"))
    assert not hub.requests("GET", r"/resolve/main/")


def test_a_file_whose_bytes_differ_from_the_pin_is_refused(hub: HubServer, tmp_path: Path) -> None:
    manifest = unpinned_manifest(tmp_path)
    assert run(hub, tmp_path, "pin", str(manifest)).returncode == 0
    hub.add_fault(Fault(method="GET", path=r"/resolve/.*/model\.safetensors", kind="corrupt", times=100))
    proc = run(hub, tmp_path, "fetch", str(manifest), str(tmp_path / "w"))
    assert proc.returncode == 34, proc.stderr
    assert "upstream/model.safetensors: downloaded bytes do not match" in proc.stderr
    assert not (tmp_path / "w" / "upstream" / "model.safetensors").exists()  # never renamed into place

    # the same when the bytes on disk change after a good fetch: verify names the file
    hub.faults.clear()
    assert run(hub, tmp_path, "fetch", str(manifest), str(tmp_path / "w")).returncode == 0
    target = tmp_path / "w" / "upstream" / "tokenizer.json"
    target.write_bytes(target.read_bytes().replace(b"BPE", b"BPX"))
    proc = run(hub, tmp_path, "verify", str(manifest), str(tmp_path / "w"))
    assert proc.returncode == 5 and "digest   upstream/tokenizer.json: sha256" in proc.stdout
    # and a manifest edited to pin other bytes is refused by fetch, naming the file
    data = json.loads(manifest.read_text())
    data["components"][0]["files"][1]["sha256"] = "0" * 64
    data["components"][0]["model_config"]["sha256"] = "0" * 64
    manifest.write_text(json.dumps(data))
    proc = run(hub, tmp_path, "fetch", str(manifest), str(tmp_path / "w3"))
    assert proc.returncode == 34 and "upstream/config.json" in proc.stderr


def test_a_gated_repo_names_what_the_user_must_accept(hub: HubServer, tmp_path: Path) -> None:
    manifest = unpinned_manifest(tmp_path)
    assert run(hub, tmp_path, "pin", str(manifest)).returncode == 0
    data = json.loads(manifest.read_text())
    data["components"][0]["license"] = {"id": "gemma", "file": "LICENSES/Gemma-Terms-of-Use.md", "gated": True}
    manifest.write_text(json.dumps(data))
    hub.add_fault(Fault(method="GET", path=r"/resolve/", kind="status", status=403, message="gated", times=100))
    proc = run(hub, tmp_path, "fetch", str(manifest), str(tmp_path / "w"))
    assert proc.returncode == 31, proc.stderr
    assert "gated: alice/upstream (gemma)" in proc.stderr and "accept the Gemma Terms of Use" in proc.stderr


def _wait_for(condition, what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_second_fetch_into_the_same_folder_is_busy_and_the_first_verifies(hub: HubServer, tmp_path: Path) -> None:
    """audit46 hub F4: two fetches shared one partial file; the first reported success while the second
    kept appending to the file it had put in place. Now the folder's lock makes the second exit 7."""
    manifest = unpinned_manifest(tmp_path)
    assert run(hub, tmp_path, "pin", str(manifest)).returncode == 0
    dest = tmp_path / "w"
    # the first fetch hangs mid-file (it holds the lock meanwhile) until the test lets the server drop it
    hub.add_fault(Fault(method="GET", path=r"/resolve/.*/model\.safetensors", kind="stall", after_bytes=100_000))
    first = subprocess.Popen(
        portable_cmd("weights", "fetch", str(manifest), str(dest)),
        env=portable_env(hub, tmp_path / "hfhome", token=None),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(hub.stalled.is_set, "the first fetch to stall")
        second = run(hub, tmp_path, "fetch", str(manifest), str(dest))
        assert second.returncode == 7, second.stderr
        assert (
            f"{dest}: another portable process (pid {first.pid}: fetch weights) is working on this weights folder; "
            "refusing to fetch weights at the same time" in second.stderr
        )
        assert len(hub.requests("GET", r"/resolve/.*/model\.safetensors")) == 1  # the second asked nothing
        hub.stopping.set()  # ends the stall: the server drops the connection and the first fetch resumes
        _wait_for(lambda: len(hub.requests("GET", r"/resolve/.*/model\.safetensors")) > 1, "the resumed request")
        hub.stopping.clear()
        out, err = first.communicate(timeout=60)
    finally:
        first.kill()
        first.wait()
    assert first.returncode == 0, err
    assert "3 of 3 files verified" in err
    want = upstream_files()["model.safetensors"]
    assert (dest / "upstream" / "model.safetensors").read_bytes() == want
    proc = run(hub, tmp_path, "verify", str(manifest), str(dest))
    assert proc.returncode == 0 and "3 of 3 files verified" in proc.stdout


@pytest.mark.parametrize(
    "path, what",
    [
        (r"/api/models/alice/upstream/revision/main", "resolve alice/upstream@main"),
        (r"/api/models/alice/upstream/tree/", "list alice/upstream@"),
    ],
    ids=["resolve", "list"],
)
def test_pin_against_a_hub_that_never_answers_ends_within_the_stall_timeout(
    hub: HubServer, tmp_path: Path, path: str, what: str
) -> None:
    """audit46 hub F1: huggingface_hub's repo_info and list_repo_tree pass timeout=None (no timeout at all),
    so a Hub that accepted the request and never answered hung `weights pin` forever."""
    hub.add_fault(Fault(method="GET", path=path, kind="stall_upload", seconds=60, times=10))
    env = portable_env(
        hub,
        tmp_path / "hfhome",
        token=None,
        PORTABLE_HUB_STALL_TIMEOUT_S="1",
        PORTABLE_HUB_CONNECT_TIMEOUT_S="1",
        PORTABLE_HUB_RETRIES="1",
    )
    start = time.monotonic()
    proc = subprocess.run(
        portable_cmd("weights", "pin", "alice/upstream", "--license", "apache-2.0"),
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 33, proc.stderr
    assert what in proc.stderr and "transfer stalled (no data)" in proc.stderr
    assert time.monotonic() - start < 20
    assert len(hub.requests("GET", path)) == 2  # the first try and the one retry PORTABLE_HUB_RETRIES allows


def test_pin_reads_every_page_of_the_tree(hub: HubServer, tmp_path: Path) -> None:
    hub.tree_page_size = 2  # the tree (4 files) comes in pages linked by the Link header
    proc = run(hub, tmp_path, "pin", "alice/upstream", "--license", "apache-2.0")
    assert proc.returncode == 0, proc.stderr
    assert sorted(f["repo_path"] for f in json.loads(proc.stdout)["files"]) == [
        "README.md",
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    assert len(hub.requests("GET", r"/api/models/alice/upstream/tree/")) == 2


def _lie_in_tree(monkeypatch: pytest.MonkeyPatch, edit) -> None:
    """The test Hub's tree listing describes model.safetensors as `edit` rewrites its entry."""
    import hubserver

    real = hubserver.Blob.tree_entry

    def tree_entry(self, path: str) -> dict:
        entry = real(self, path)
        if path == "model.safetensors":
            edit(entry)
        return entry

    monkeypatch.setattr(hubserver.Blob, "tree_entry", tree_entry)


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda e: e.update(path="../../escape.safetensors"),
            "entry '../../escape.safetensors'.repo_path: path '../../escape.safetensors' is not a clean relative path",
        ),
        (
            lambda e: e.update(path=".portable/partial/x.part"),
            "entry '.portable/partial/x.part'.repo_path: '.portable/partial/x.part' is under .portable/, "
            "which is reserved for bookkeeping",
        ),
        (lambda e: e.update(path="m\x1b]0;pwned\x07.safetensors"), "holds a control character"),
        (lambda e: e.update(size=-5), "entry 'model.safetensors'.size: -5 is neither a valid value"),
        (lambda e: e.update(size="to-be-pinned"), "entry 'model.safetensors'.size: is 'to-be-pinned'"),
        (
            lambda e: e["lfs"].update(oid="not-a-sha256"),
            "entry 'model.safetensors'.sha256: 'not-a-sha256' is neither a valid value",
        ),
        (lambda e: e.pop("oid"), "entry 'model.safetensors': malformed (KeyError: 'oid')"),
    ],
    ids=["dotdot", "state-folder", "control-chars", "negative-size", "unpinned-size", "bad-lfs-oid", "no-oid"],
)
def test_pin_refuses_a_tree_entry_a_manifest_could_not_hold(
    hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit, message: str
) -> None:
    """audit46 hub F11: pin printed, with exit 0, a component built from whatever the Hub's tree claimed."""
    _lie_in_tree(monkeypatch, edit)
    proc = run(hub, tmp_path, "pin", "alice/upstream", "--license", "apache-2.0")
    assert proc.returncode == 4, proc.stderr
    assert proc.stdout == ""  # no component printed
    error = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and error[0].startswith(
        f"error: the Hub's answer for alice/upstream@{hub.head(REPO_KEY)[:12]}: "
    )
    assert message in error[0]
    assert "\x1b" not in proc.stderr and "\x07" not in proc.stderr
    assert hub.requests("GET", r"/resolve/") == []  # refused before any file was read


def test_pin_into_a_manifest_refuses_a_tree_entry_and_leaves_the_manifest_as_it_was(
    hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = unpinned_manifest(tmp_path)
    before = manifest.read_bytes()
    _lie_in_tree(monkeypatch, lambda e: e.update(size=-5))
    for args in (["alice/upstream", "--manifest", str(manifest)], [str(manifest)]):
        proc = run(hub, tmp_path, "pin", *args)
        assert proc.returncode == 4, proc.stderr
        assert "entry 'model.safetensors'.size: -5 is neither a valid value" in proc.stderr
        assert manifest.read_bytes() == before


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda f: f.update(path="upstream/../../escape.safetensors"), "components[0].files[0].path"),
        (lambda f: f.update(size=-5), "components[0].files[0].size"),
        (lambda f: f.update(sha256="not-a-sha256"), "components[0].files[0].sha256"),
        (lambda f: f.update(path=".portable/partial/x.part"), "components[0].files[0].path"),
    ],
    ids=["dotdot", "negative-size", "bad-sha256", "state-folder"],
)
def test_writing_a_component_into_a_manifest_checks_it_as_loading_does(tmp_path: Path, edit, field: str) -> None:
    """What `pin REPO --manifest` writes goes through the manifest loader's checks (audit46 hub F11 asked)."""
    from reproduction.errors import InvalidInputError
    from reproduction.release.weights_hub import pin_into
    from reproduction.release.weights_manifest import Component, WeightFile

    manifest = unpinned_manifest(tmp_path)
    before = manifest.read_bytes()
    data = json.loads(before)["components"][0]
    data["source"]["commit"] = "a" * 40
    for f in data["files"]:
        f.update(size=1, sha256="b" * 64)
    data["model_config"]["sha256"] = "b" * 64
    edit(data["files"][0])
    comp = Component(
        role=data["role"],
        source=data["source"],
        license=data["license"],
        model_config=data["model_config"],
        files=[WeightFile(**f) for f in data["files"]],
        key_mapping=data["key_mapping"],
        presets=tuple(data["presets"]),
    )
    with pytest.raises(InvalidInputError) as caught:
        pin_into(manifest, comp)
    assert caught.value.field == field, caught.value.message
    assert manifest.read_bytes() == before


def test_pin_refuses_a_resolved_revision_that_is_not_a_commit_id(
    hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handler = hub.httpd.RequestHandlerClass
    real = handler._send

    def send(self, status: int, payload=None, **kw) -> None:
        if isinstance(payload, dict) and "siblings" in payload:  # the repo info answer
            payload = {**payload, "sha": "main"}
        real(self, status, payload, **kw)

    monkeypatch.setattr(handler, "_send", send)
    proc = run(hub, tmp_path, "pin", "alice/upstream", "--license", "apache-2.0")
    assert proc.returncode == 4 and proc.stdout == "", proc.stderr
    assert "error: the Hub's answer for alice/upstream@main: sha: 'main' is not a commit id (40 hex digits)" in (
        proc.stderr
    )
    assert hub.requests("GET", r"/tree/") == []
