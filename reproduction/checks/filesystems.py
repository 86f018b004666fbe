"""Filesystem probe: warn when the Triton cache or the home cache lives on a network filesystem, or when it (or a set
TMPDIR) cannot be created or written.

Triton writes and renames many small files per kernel and every rank reads the cache at start; on
NFS/Lustre/CIFS that hung whole jobs. The type comes from the mount table (/proc/mounts): the mount
whose mount point is the longest prefix of the path with its symbolic links resolved.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from reproduction.checks.context import CheckContext
from reproduction.checks.probe import ProbeResult, ok, warn

NETWORK_FS = frozenset(
    {
        "nfs",
        "nfs4",
        "lustre",
        "cifs",
        "smb3",
        "smbfs",
        "ceph",
        "glusterfs",
        "fuse.glusterfs",
        "gpfs",
        "beegfs",
        "fuse.sshfs",
        "afs",
        "9p",
        "fuse.s3fs",
        "fuse.gcsfuse",
        "fuse.juicefs",
        "wekafs",
    }
)


@dataclass(kw_only=True, slots=True, frozen=True)
class Mount:
    """One line of /proc/mounts."""

    source: str
    mountpoint: str
    fstype: str


def _unescape(field: str) -> str:
    # The kernel writes space, tab, newline and backslash in mount fields as octal escapes (\040 ...).
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mounts(text: str) -> list[Mount]:
    """Parse /proc/mounts text (source mountpoint fstype options dump pass)."""
    mounts = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            mounts.append(Mount(source=_unescape(parts[0]), mountpoint=_unescape(parts[1]), fstype=parts[2]))
    return mounts


def mount_for(path: Path, mounts: list[Mount]) -> Mount | None:
    """The mount holding `path` (links resolved); the longest mount point wins, the last of equal ones."""
    real = os.path.realpath(path)  # resolves the links that exist, keeps the not-yet-created rest
    best: Mount | None = None
    for mount in mounts:
        point = mount.mountpoint.rstrip("/") or "/"
        inside = real == point or real.startswith(point + "/") or point == "/"
        if inside and (best is None or len(point) >= len(best.mountpoint.rstrip("/") or "/")):
            best = mount
    return best


def cache_paths(ctx: CheckContext) -> list[tuple[str, str, Path]]:
    """(probe name, what, path) for the caches a run writes: Triton's and the home cache."""
    env = ctx.env
    triton = Path(env["TRITON_CACHE_DIR"]) if env.get("TRITON_CACHE_DIR") else ctx.home / ".triton" / "cache"
    what = "TRITON_CACHE_DIR" if env.get("TRITON_CACHE_DIR") else "Triton cache (~/.triton/cache)"
    home_cache = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else ctx.home / ".cache"
    return [
        ("fs.triton_cache", what, triton),
        ("fs.home_cache", "home cache (~/.cache: HF, torch, inductor)", home_cache),
    ]


def unusable(path: Path) -> str | None:
    """Why `path` cannot be used as a cache folder (it, or the nearest existing folder it would be created in, is not
    a folder or not writable), or None. Nothing is created: the nearest existing ancestor is looked at."""
    here = path
    while not os.path.lexists(here) and here.parent != here:
        here = here.parent
    if here == path:
        if not path.is_dir():
            return f"{path} is not a folder"
        return None if os.access(path, os.W_OK | os.X_OK) else f"{path} is not writable"
    if not here.is_dir():
        return f"cannot create {path}: {here} is not a folder"
    return None if os.access(here, os.W_OK | os.X_OK) else f"cannot create {path}: {here} is not writable"


_CACHE_FIX = {
    "fs.triton_cache": "export TRITON_CACHE_DIR=/tmp/triton-$USER (a writable node-local folder) before the run",
    "fs.home_cache": "export XDG_CACHE_HOME=/tmp/cache-$USER (a writable node-local folder) before the run",
    "fs.tmpdir": "export TMPDIR=/tmp (or another writable folder) before the run",
}


def probe_filesystems(ctx: CheckContext) -> list[ProbeResult]:
    """One row per cache path: warn when it cannot be created or written (audit51 F2: such a cache was reported ok
    and failed later in Triton/inductor/HF), else ok on a local filesystem and warn on a network one; an `fs.tmpdir`
    row when TMPDIR is set."""
    try:
        mounts = parse_mounts(ctx.mounts_file.read_text(encoding="utf-8", errors="replace"))
    except OSError as exc:
        return [
            warn(
                "fs.triton_cache",
                f"cannot read {ctx.mounts_file}: {exc.strerror}",
                "check the cache filesystems by hand",
            )
        ]
    results = []
    paths = cache_paths(ctx)
    if ctx.env.get("TMPDIR"):
        paths.append(("fs.tmpdir", "TMPDIR", Path(ctx.env["TMPDIR"])))
    for name, what, path in paths:
        mount = mount_for(path, mounts)
        fstype = mount.fstype if mount else "unknown"
        details = {"path": str(path), "fstype": fstype, "mountpoint": mount.mountpoint if mount else None}
        why = None if fstype in NETWORK_FS and name != "fs.tmpdir" else unusable(path)
        if why is None and name == "fs.tmpdir" and not os.path.lexists(path):  # nothing creates TMPDIR
            why = f"{path} does not exist (tempfile quietly uses /tmp instead; mktemp fails)"
        if why is not None:
            results.append(warn(name, f"{what} is unusable: {why}", _CACHE_FIX[name], **details))
        elif fstype in NETWORK_FS and name != "fs.tmpdir":
            fix = (
                "export TRITON_CACHE_DIR=/tmp/triton-$USER (a node-local disk) before the run"
                if name == "fs.triton_cache"
                else "export XDG_CACHE_HOME=/tmp/cache-$USER (and TRITON_CACHE_DIR, HF_HOME) to node-local disk"
            )
            results.append(
                warn(
                    name,
                    f"{what} {path} is on {fstype} ({mount.mountpoint}): compile caches on network "
                    "filesystems have hung all ranks",
                    fix,
                    **details,
                )
            )
        else:
            results.append(ok(name, f"{what} {path} is on {fstype} (local)", **details))
    return results
