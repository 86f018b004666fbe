"""Extract one validated layer in a child process, so several layers extract without sharing the GIL.

Per member, extraction holds the GIL for ~20-40 us of header parsing and bookkeeping (the bytes
themselves are decompressed, hashed and written with the GIL released). Threads extracting two
large layers at once therefore take turns, and on a many-core server the largest layers' Python
work runs one after the other. A child per large layer runs the very same `extract_layer` (one
way to extract) in its own interpreter; the parent sends it the validated member list (never the
index file again, which could have changed since it was validated) and relays its progress.

Protocol: the parent writes one JSON job to the child's stdin; the child writes `p <bytes>` lines
(progress), then exactly one `r <json>` (what it wrote, for the receipt) or `e <json>` (the error,
rebuilt as the same exception type in the parent). The child asks the kernel to kill it when its
parent dies (PR_SET_PDEATHSIG), so a `kill -9` of restore leaves no writer behind in staging.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reproduction import errors
from reproduction.release.extract import Written
from reproduction.release.layers import DigestMismatch, LoadedLayer, extract_layer, members_from_rows
from reproduction.release.manifest import LayerEntry

MIN_MEMBERS = 2000
"""Layers with fewer members extract in a thread: starting a child (an interpreter and these
imports, ~50-130 ms of CPU) costs more than the GIL turns it would save."""

_ROOT = str(Path(__file__).resolve().parent.parent.parent)  # holds `reproduction`: the child runs this code
_BOOT = "import sys; sys.path.insert(0, sys.argv[1]); from reproduction.release.extract_child import main; main()"
_PROGRESS_S = 0.1


def extract_layer_in_child(
    bundle: Path,
    layer: LoadedLayer,
    dest: Path,
    *,
    digests: bool = False,
    on_bytes: Callable[[int], None] | None = None,
    dest_fd: int | None = None,
) -> Written:
    """`extract_layer` run in a child process: the same result, the same exceptions (`dest_fd` passed down to it,
    the child inheriting that fd).

    Raises what `extract_layer` raises (DigestMismatch, UnsafeArchiveError, WriteFailedError, ...),
    rebuilt from the child's report; WriteFailedError (exit 8) if the child ends without a report
    (killed, out of memory); RuntimeError with the child's traceback for a bug. The child is killed
    if this thread is interrupted.
    """
    job = {
        "parent": os.getpid(),
        "bundle": str(bundle),
        "entry": layer.entry.to_dict(),
        "digest": layer.digest,
        "members": [[m.name, m.kind, m.mode, m.size, m.linkname] for m in layer.members],
        "dest": str(dest),
        "dest_fd": dest_fd,
        "digests": digests,
        "sys_path": sys.path,  # zstandard may be where only the parent looks (PYTHONPATH set in code, a vendored dir)
    }
    report: tuple[bytes, Any] | None = None
    with tempfile.TemporaryFile() as stderr:  # a file, not a pipe: a chatty child can never block on it
        proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, _ROOT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            pass_fds=() if dest_fd is None else (dest_fd,),
        )
        try:
            try:
                proc.stdin.write(json.dumps(job, separators=(",", ":")).encode())
                proc.stdin.close()
            except BrokenPipeError:
                pass  # the child died at start; its stderr says why
            for line in proc.stdout:  # ends when the child exits (its stdout closes)
                tag, _, body = line.rstrip(b"\n").partition(b" ")
                if tag == b"p":
                    if on_bytes is not None:
                        on_bytes(int(body))
                elif tag in (b"r", b"e"):
                    report = (tag, json.loads(body))
            code = proc.wait(timeout=60)
        except BaseException:
            proc.kill()
            proc.wait(timeout=60)
            raise
        finally:
            proc.stdout.close()
        if report is None:
            stderr.seek(0)
            said = stderr.read().decode("utf-8", "replace").strip().splitlines()
            how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
            raise errors.WriteFailedError(
                f"cannot extract {layer.entry.archive}: its extracting process {how} before it finished"
                + (f" ({said[-1][:200]})" if said else ""),
                path=str(dest),
                hint="run `portable restore` again (the previous state is kept); if memory is short, free some first",
            )
    tag, body = report
    if tag == b"e":
        raise _error_from(body)
    return Written(files=body["files"], links=body["links"], digests=body["digests"])


def _error_to(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, DigestMismatch):
        return {"digest": [exc.archive, exc.actual]}
    if isinstance(exc, errors.PortableError):
        return {"class": type(exc).__name__, "message": exc.message, "hint": exc.hint, "fields": exc.fields}
    return {"bug": "".join(traceback.format_exception(exc))}


def _error_from(data: dict[str, Any]) -> BaseException:
    """The exception the child reported, as its own type (a PortableError keeps its exit code)."""
    if "digest" in data:
        return DigestMismatch(*data["digest"])
    cls = getattr(errors, data.get("class", ""), None)
    if isinstance(cls, type) and issubclass(cls, errors.PortableError):
        exc = cls.__new__(cls)
        errors.PortableError.__init__(exc, data["message"], hint=data["hint"], **data["fields"])
        return exc
    return RuntimeError("a layer's extracting process failed:\n" + data.get("bug", repr(data)))


def _die_with_parent(parent: int) -> None:
    """Be killed when the parent dies (Linux); exit now if it already has."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the parent still kills the child on every error path it sees
    if os.getppid() != parent:
        os._exit(1)


def main() -> None:
    """The child: read the job, extract, report (see the module docstring)."""
    job = json.loads(sys.stdin.buffer.read())
    _die_with_parent(job["parent"])
    sys.path += [p for p in job["sys_path"] if p not in sys.path]
    out = sys.stdout.buffer
    pending, last = 0, time.monotonic()

    def progress(n: int) -> None:
        nonlocal pending, last
        pending += n
        if time.monotonic() - last >= _PROGRESS_S:
            out.write(b"p %d\n" % pending)
            out.flush()
            pending, last = 0, time.monotonic()

    try:
        entry = LayerEntry.from_dict(job["entry"])
        layer = LoadedLayer(
            entry=entry, digest=job["digest"], members=members_from_rows(job["members"], rel=entry.archive)
        )
        written = extract_layer(
            Path(job["bundle"]),
            layer,
            Path(job["dest"]),
            digests=job["digests"],
            on_bytes=progress,
            dest_fd=job.get("dest_fd"),
        )
        tag, body = b"r", {"files": written.files, "links": written.links, "digests": written.digests}
    except KeyboardInterrupt:
        os._exit(130)  # interrupted with the parent (same process group): it reports, not us
    except BaseException as exc:
        tag, body = b"e", _error_to(exc)
    if pending:
        out.write(b"p %d\n" % pending)
    out.write(tag + b" " + json.dumps(body, separators=(",", ":"), default=str).encode() + b"\n")
    out.flush()
