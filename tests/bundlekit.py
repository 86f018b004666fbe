"""Test helpers for bundles: small real bundles packed by `pack_bundle`, hand-forged hostile ones, the CLI."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import zstandard

from reproduction.release.manifest import FileEntry, LayerEntry, Manifest, write_manifest
from reproduction.release.pack import pack_bundle
from reproduction.ui import UiOptions

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "reproduction" / "portable.py"
QUIET = UiOptions(quiet=True, progress=False)

SOURCE_FILES = {
    "recap/__init__.py": b"VERSION = '1.0'\n",
    "recap/stages/returns.py": b"def returns(r, gamma):\n    return sum(r)\n",
    "recap/stages/value.py": b"# value stage\n" * 50,
    "README.md": b"# the project\n",
}
RUNTIME_FILES = {
    "bin/tool": b"#!/bin/sh\necho tool\n",
    "lib/libthing.so": bytes(range(256)) * 64,
    "lib/python/site.py": b"import os\n" * 100,
    "share/data.txt": b"x" * 5000,
}


def write_tree(
    root: Path, files: dict[str, bytes], links: dict[str, str] | None = None, modes: dict[str, int] | None = None
) -> Path:
    """Create `files` (and symlinks `links`) under `root`."""
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.chmod(path, (modes or {}).get(rel, 0o644))
    for rel, target in (links or {}).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, path)
    return root


def small_sources(root: Path, *, weights_kb: int = 64) -> Path:
    """Sources of a small bundle: a source layer, a runtime layer, two weights, a data file, a config."""
    write_tree(root / "src" / "project", SOURCE_FILES, links={"recap/latest.py": "stages/returns.py"})
    write_tree(root / "src" / "runtime", RUNTIME_FILES, links={"bin/tool-link": "tool"}, modes={"bin/tool": 0o755})
    (root / "src" / "project" / "recap" / "__pycache__").mkdir()
    (root / "src" / "project" / "recap" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"junk")
    weights = root / "src" / "weights"
    weights.mkdir(parents=True)
    (weights / "model.safetensors").write_bytes(hashlib.sha256(b"w").digest() * (weights_kb * 32))
    (weights / "tokenizer.json").write_text('{"vocab": {"a": 1}}\n')
    data = root / "src" / "data"
    data.mkdir()
    (data / "episodes.parquet").write_bytes(b"PAR1" + b"\x01" * 4000 + b"PAR1")
    cfg = root / "src" / "configs"
    cfg.mkdir()
    (cfg / "run.json").write_text(
        f'{{"weights": "{weights}/model.safetensors", "data": "{data}", "elsewhere": "/usr/share/dict"}}\n',
        encoding="utf-8",
    )
    return root


SMALL_SPEC = """\
name = "small"
description = "a small test bundle"
root = "src"
entry_config = "config/run.json"

[[layer]]
source = "project"
kind = "source"
name = "project"
exclude = ["__pycache__", "*.pyc"]

[[layer]]
source = "runtime"
kind = "runtime"
name = "rt"

[[file]]
source = "weights"
dest = "weights"

[[file]]
source = "data"
dest = "data"

[[config]]
source = "configs/run.json"
dest = "config/run.json"
"""


def small_bundle(root: Path, *, name: str = "bundle", weights_kb: int = 64) -> Path:
    """Pack the small bundle at `root/<name>` (sources under `root/src`) and return its path."""
    if not (root / "src").exists():
        small_sources(root, weights_kb=weights_kb)
        (root / "small.toml").write_text(SMALL_SPEC, encoding="utf-8")
    out = root / name
    pack_bundle(root / "small.toml", out, ui=QUIET)
    return out


def run_cli(
    *args: str | Path,
    python: str = sys.executable,
    script: Path = SCRIPT,
    env: dict | None = None,
    timeout: float = 120,
    **kwargs,
) -> subprocess.CompletedProcess:
    """Run `python script ARGS` (the `portable` CLI) and capture text output."""
    full_env = {**os.environ, "PORTABLE_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(
        [python, str(script), *map(str, args)], capture_output=True, text=True, env=full_env, timeout=timeout, **kwargs
    )


def tree_snapshot(root: Path) -> dict[str, object]:
    """{relative path: bytes | ('link', text) | 'dir'} of everything under `root` (for equality checks)."""
    out: dict[str, object] = {}
    for dirpath, dirs, names in os.walk(root):
        for name in dirs + names:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            if os.path.islink(full):
                out[rel] = ("link", os.readlink(full))
            elif os.path.isdir(full):
                out[rel] = "dir"
            else:
                out[rel] = Path(full).read_bytes()
    return out


# -- forged archives (hostile or not), built with tarfile directly -------------------------------


def member(
    name: str, kind: str = "file", data: bytes = b"", *, mode: int = 0o644, linkname: str = "", devmajor: int = 0
) -> tuple:
    return (name, kind, data, mode, linkname, devmajor)


def tar_zst(members: list[tuple]) -> bytes:
    """A .tar.zst holding `members` exactly as given (no checks: this is how attacks are built)."""
    kinds = {
        "file": tarfile.REGTYPE,
        "dir": tarfile.DIRTYPE,
        "symlink": tarfile.SYMTYPE,
        "hardlink": tarfile.LNKTYPE,
        "chardev": tarfile.CHRTYPE,
        "blockdev": tarfile.BLKTYPE,
        "fifo": tarfile.FIFOTYPE,
    }
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, data, mode, linkname, devmajor in members:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.linkname, info.mtime = kinds[kind], mode, linkname, 1577836800
            info.devmajor = devmajor
            if kind == "file":
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return zstandard.ZstdCompressor(level=3).compress(raw.getvalue())


def forge_bundle(
    root: Path, layers: list[tuple[str, str, str, list[tuple]]], plain: dict[str, bytes] | None = None
) -> Path:
    """A bundle whose manifest pins the given archives: layers = [(archive, target, kind, members)]."""
    root.mkdir(parents=True, exist_ok=True)
    entries, layer_entries = [], []
    for order, (archive, target, kind, members) in enumerate(layers):
        blob = tar_zst(members)
        (root / archive).parent.mkdir(parents=True, exist_ok=True)
        (root / archive).write_bytes(blob)
        entries.append(FileEntry(path=archive, size=len(blob), sha256=hashlib.sha256(blob).hexdigest()))
        layer_entries.append(LayerEntry(archive=archive, target=target, kind=kind, order=order, members=len(members)))
    for rel, data in (plain or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        entries.append(FileEntry(path=rel, size=len(data), sha256=hashlib.sha256(data).hexdigest()))
    write_manifest(root, Manifest(name="forged", files=entries, layers=layer_entries))
    return root


def flip_bit(path: Path, offset: int, bit: int = 0) -> None:
    """Flip one bit of `path` in place (offset may be negative, from the end)."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))


# -- raw tar bytes, for header-level attacks ---------------------------------------------------


def pax_record(key: str, value: str) -> bytes:
    """One well-formed pax record `LEN key=value\\n`."""
    body = f" {key}={value}\n".encode()
    n = len(body) + 1
    while len(str(n)) + len(body) != n:
        n += 1
    return str(n).encode() + body


def raw_member(
    name: str,
    data: bytes = b"",
    *,
    pax: bytes | None = None,
    kind: bytes = tarfile.REGTYPE,
    fmt: int = tarfile.USTAR_FORMAT,
) -> bytes:
    """Tar bytes of one member, preceded by a pax header holding exactly `pax` (no checks)."""
    out = b""
    if pax is not None:
        head = tarfile.TarInfo("././@PaxHeader")
        head.type, head.size = tarfile.XHDTYPE, len(pax)
        out += head.tobuf(tarfile.USTAR_FORMAT) + pax + b"\0" * (-len(pax) % 512)
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode, info.mtime = kind, len(data), 0o644, 1577836800
    out += info.tobuf(fmt, "utf-8", "surrogateescape") + data + b"\0" * (-len(data) % 512)
    return out


def raw_bundle(root: Path, tar: bytes, *, target: str = "source/app", index: list | None = None) -> Path:
    """A one-layer bundle whose archive is `tar` (zstd-compressed as is); `index` rows give it a member index."""
    root.mkdir(parents=True, exist_ok=True)
    blob = zstandard.ZstdCompressor(level=3).compress(tar + b"\0" * 1024)
    archive = f"{target}.tar.zst"
    (root / archive).parent.mkdir(parents=True, exist_ok=True)
    (root / archive).write_bytes(blob)
    entries = [FileEntry(path=archive, size=len(blob), sha256=hashlib.sha256(blob).hexdigest())]
    members_index = None
    if index is not None:
        import json

        members_index = f"{target}.members.json"
        text = json.dumps({"format": "recap-portable-members", "format_version": "1.0", "members": index}).encode()
        (root / members_index).write_bytes(text)
        entries.append(FileEntry(path=members_index, size=len(text), sha256=hashlib.sha256(text).hexdigest()))
    layer = LayerEntry(  # tar_size as `portable pack` records it: exact (restore refuses a listed layer without it)
        archive=archive, target=target, kind="source", order=0, members_index=members_index, tar_size=len(tar) + 1024
    )
    write_manifest(root, Manifest(name="raw", files=entries, layers=[layer]))
    return root


def repin(bundle: Path, rel: str) -> None:
    """Recompute `rel`'s size and sha256 in bundle.json as an attacker would (the JSON edited as text)."""
    import json

    data = json.loads((bundle / "bundle.json").read_text())
    blob = (bundle / rel).read_bytes()
    for entry in data["files"]:
        if entry["path"] == rel:
            entry["size"], entry["sha256"] = len(blob), hashlib.sha256(blob).hexdigest()
    (bundle / "bundle.json").write_text(json.dumps(data, indent=1))


def hub_manifest(files: dict[str, bytes], *, license_id: str = "apache-2.0", license_file: str = "Apache-2.0.txt"):
    """A manifest with one Hub component whose files are pinned to `files` (paths under `up/`)."""
    return {
        "$schema": "./schema.json",
        "format": "recap-portable-weights",
        "format_version": 2,
        "name": "test-upstream",
        "model": "value",
        "presets": ["test"],
        "components": [
            {
                "role": "backbone",
                "source": {
                    "kind": "hub",
                    "repo": "alice/upstream",
                    "repo_type": "model",
                    "revision": "main",
                    "commit": "0" * 40,
                },
                "license": {"id": license_id, "file": f"LICENSES/{license_file}"},
                "model_config": {"path": "up/config.json", "sha256": hashlib.sha256(files["config.json"]).hexdigest()},
                "files": [
                    {
                        "path": f"up/{name}",
                        "repo_path": name,
                        "size": len(data),
                        "sha256": hashlib.sha256(data).hexdigest(),
                    }
                    for name, data in files.items()
                ],
                "key_mapping": {"source_prefix": "model.", "target_prefix": "language."},
                "presets": ["test"],
            }
        ],
        "fresh_prefixes": [],
    }
