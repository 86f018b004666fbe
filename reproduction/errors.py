"""The one error tree: every failure the tool reports to a user is a `PortableError`.

Each subclass also inherits the matching builtin (so `except FileNotFoundError` still works),
carries the fields a user needs (path, field, expected, actual), a `hint` with the next thing to
do, and an `exit_code` the CLI returns. The library raises; only `portable.py` renders.

Exit codes (documented in `portable --help`):

    1   a bug (an unexpected exception; rerun with --debug for the traceback), or a recipe's own exception (the hint
        names its file and line), or a bare PortableError (raise a subclass)
    2   usage: bad command-line arguments
    3   input not found or unreadable (bundle, spec, dataset, file; a file where a folder is expected)
    4   invalid input: malformed spec, manifest or config; unknown format version
    5   bundle integrity: verify found missing/extra/size/digest mismatches
    6   unsafe archive: a layer member would escape its target or is forbidden
    7   busy: another process holds the lock (a bundle's, or a run folder's)
    8   out of space or a write failed
    9   relocation impossible (a binary rewrite does not fit)
    10  missing dependency (zstandard / zstd CLI / an extra not installed)
    20-29 `portable check` failure classes (see reproduction.checks)
    30-39 Hub transfer failures
    40-49 data plane: dataset/sidecar problems (45: the simulator)
    50-59 training and run failures (50 checkpoint, 51 worker failed, 52 a stage's inputs changed since it
          completed or its max_steps was lowered below the steps it trained
          or its checkpoint was trained under other CPU kernels, 53 guidance scale, 54 a recipe's
          stage broke the stage protocol, 55 the run folder cannot be used as asked, 56 the preflight found
          several problems (one problem: its own code), 57 the bundle's layers are not restored here, 58 Ray did
          not start or the cluster did not answer)

    60  `portable compare`: a metric differs from the reference beyond its margin (a verdict, not an error)
    61  `portable compare`: inconclusive (no metric differs, not every one is shown equivalent: more episodes)
"""

from __future__ import annotations

import errno
import sys
from pathlib import Path
from typing import Any


class PortableError(Exception):
    """Root of every error the CLI renders as `error: ...` / `hint: ...`."""

    exit_code: int = 1

    def __init__(self, message: str, *, hint: str | None = None, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.fields = fields
        for key, value in fields.items():
            setattr(self, key, value)

    def __str__(self) -> str:
        return self.message


# -- inputs -------------------------------------------------------------------------------------


class UsageError(PortableError, ValueError):
    """The command line asks for something this build cannot do (a command not built yet, an
    option the command does not take); exit 2 like argparse's own usage errors."""

    exit_code = 2


class InputNotFoundError(PortableError, FileNotFoundError):
    """A file or folder the user named (or that a manifest names) does not exist."""

    exit_code = 3

    def __init__(self, message: str, *, path: Path | str | None = None, hint: str | None = None, **fields: Any) -> None:
        super().__init__(message, hint=hint, path=path, **fields)


class ReadFailedError(PortableError, OSError):
    """A file the command must read exists but cannot be read (permission, I/O error); `path` names it."""

    exit_code = 3

    def __init__(self, message: str, *, path: Path | str | None = None, hint: str | None = None, **fields: Any) -> None:
        super().__init__(message, hint=hint, path=path, **fields)


class InvalidInputError(PortableError, ValueError):
    """A spec, manifest or config is malformed; `field` names the offending key."""

    exit_code = 4

    def __init__(
        self,
        message: str,
        *,
        path: Path | str | None = None,
        field: str | None = None,
        hint: str | None = None,
        **fields: Any,
    ) -> None:
        super().__init__(message, hint=hint, path=path, field=field, **fields)


class UnsupportedFormatError(InvalidInputError):
    """A format version this build does not understand (newer major, or unknown)."""


class MissingDependencyError(PortableError, ImportError):
    """An optional dependency the command needs is not installed."""

    exit_code = 10


# -- bundles ------------------------------------------------------------------------------------


class IntegrityError(PortableError):
    """The bytes on disk are not the bytes the manifest pins.

    `problems` is the full list (verify collects, then raises once). The exit code is 5; the
    per-kind codes of `portable verify` are computed from `problems` by the verifier.
    """

    exit_code = 5

    def __init__(
        self, message: str, *, problems: list[Any] | None = None, hint: str | None = None, **fields: Any
    ) -> None:
        super().__init__(message, hint=hint, problems=list(problems or []), **fields)


class UnsafeArchiveError(PortableError, ValueError):
    """A layer member would be written outside its target, or is a forbidden kind of file."""

    exit_code = 6

    def __init__(
        self,
        message: str,
        *,
        archive: str | None = None,
        member: str | None = None,
        hint: str | None = None,
        **fields: Any,
    ) -> None:
        super().__init__(message, hint=hint, archive=archive, member=member, **fields)


class LockHeldError(PortableError, BlockingIOError):
    """Another process is working on the same target."""

    exit_code = 7


class WriteFailedError(PortableError, OSError):
    """A write failed (disk full, file too large, read-only); the previous state is kept."""

    exit_code = 8


class RelocationError(PortableError, ValueError):
    """A file cannot be rewritten for the new prefix (a binary string that does not fit)."""

    exit_code = 9


_WRITE_REASONS = {
    errno.ENOSPC: "the disk is full",
    errno.EFBIG: "a file is larger than allowed (file size limit)",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the filesystem is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EXDEV: "it is on another filesystem than the bundle's state folder (a bind mount?), so it cannot be renamed "
    "into place",
    errno.ENAMETOOLONG: "a name is longer than this filesystem allows",
    errno.ENOTDIR: "a path component is a file, not a folder",
    errno.EISDIR: "a folder is where a file should be",
}


BARE_HINT = (
    "a bare PortableError has no exit code of its own (exit 1 says a bug in recap-portable): raise one of its "
    "subclasses in reproduction.errors, e.g. ConfigError (exit 4) or InputNotFoundError (exit 3) (docs/recipes.md)"
)
"""The hint under a `PortableError` raised as the base class itself, without a hint (audit50 F10): a recipe's."""


def render_error(exc: PortableError, *, raised_at: str | None = None) -> int:
    """Print `exc` as every command-line entry point shows it (`error: ...`, then `hint: ...` when it has one) on
    stderr; returns its exit code for the caller to exit with. The base class raised as itself without a hint (a
    recipe's `raise PortableError(...)`) gets BARE_HINT, after `raised at RAISED_AT` when the caller knows it.

    An error a stage function raised (`raised_in_stage`, set by run.stage_call.call_stage) keeps its first line
    (many are asserted exactly) but is held to the two-line form: its message and hint with newlines folded as
    run.json folds them, its `path` added when the message does not name it, and, without a hint of its own, one
    saying the stage is recorded failed and what reruns it (audit59 B4). A RayUnavailableError keeps its own form."""
    stage = getattr(exc, "raised_in_stage", None)
    if isinstance(exc, RayUnavailableError):
        stage = None
    message, hint = exc.message, exc.hint
    if stage is not None:
        message = " ".join(str(message).split())
        path = exc.fields.get("path")
        shown = " ".join(str(path).split()) if path is not None else ""
        if shown and str(path) not in message and shown not in message:
            message = f"{message} ({shown})"  # folded too: a newline in a path made three lines (review59 T3)
        hint = " ".join(hint.split()) if hint else None
    print(f"error: {message}", file=sys.stderr)
    if hint is None and type(exc) is PortableError and exc.exit_code == PortableError.exit_code:
        hint = f"raised at {raised_at}; {BARE_HINT}" if raised_at else BARE_HINT
    if not hint and stage is not None:
        hint = (
            f"stage {stage} raised it and is recorded failed in run.json (stages already complete are kept); "
            f"fix the cause, then `portable run` with --resume reruns it (or --restart-stage {stage})"
        )
    if hint:
        print(f"hint: {hint}", file=sys.stderr)
    return exc.exit_code


def os_error(exc: OSError, what: str, *, op: str = "write", hint: str | None = None) -> PortableError:
    """THE mapping from an OSError to a one-line PortableError (every package goes through here).

    `op` is 'write' (creating or replacing `what`: WriteFailedError, exit 8), 'read' (reading the
    named source file: InputNotFoundError when absent, ReadFailedError otherwise, exit 3) or 'access' (which of the
    two is not known: an OSError that reached the CLI unwrapped): decided by the errno, a full disk, a quota, the
    file size limit, a read-only filesystem or another filesystem a write, a missing file or folder a read, and
    anything else (permission denied, an I/O error) a ReadFailedError (exit 3) that says "cannot access", never
    "write" (audit50 F6). An OSError without an errno (`FileNotFoundError("...")`) takes the one its class stands
    for. The message names the file the OS names (`exc.filename`, else the error's own words) and the reason in
    words. A PortableError is returned unchanged.
    """
    if isinstance(exc, PortableError):
        return exc
    code = errno_of(exc)
    wordy = exc.errno is None and str(exc)  # raised by code, not the OS: its words say what
    where = exc.filename if exc.filename is not None else (str(exc) if wordy else what)
    if op == "access":
        op = "write" if code in WRITE_ONLY_ERRNOS else "read" if code in MISSING_ERRNOS else "access"
    if op in ("read", "access"):
        if code in (errno.ENOENT, errno.ENOTDIR):
            return InputNotFoundError(
                f"cannot read {what}: {where} does not exist (or a parent is not a folder)",
                path=where,
                hint=hint or "check the path and try again",
            )
        reason = _WRITE_REASONS.get(code, exc.strerror or str(exc)) if op == "access" else exc.strerror or str(exc)
        verb = "read" if op == "read" else "access"
        return ReadFailedError(
            f"cannot {verb} {what}: {where}"
            if wordy and exc.filename is None
            else f"cannot {verb} {what}: {reason} ({where})",
            path=where,
            hint=hint
            or (
                "make the file readable (permissions, a healthy disk) and try again"
                if op == "read"
                else "fix the permissions of the file and its folder (or the disk), then try again"
            ),
        )
    if code in DISK_FULL_ERRNOS and code != errno.EFBIG and exc.filename is not None:
        from reproduction.fsio import free_bytes, out_of_inodes

        free, inodes = None, False
        if Path(str(where)).is_absolute():  # a bare name (a write by dir_fd) is no path: the cwd's disk is not its
            try:  # (audit63 A L6: "55.7 GiB were free" of the wrong disk)
                free, inodes = free_bytes(Path(str(where))), out_of_inodes(Path(str(where)))
            except OSError:
                pass
        return disk_full_error(
            what, where, need=getattr(exc, "need_bytes", None), free=free, hint=hint, out_of_inodes=inodes
        )
    reason = _WRITE_REASONS.get(code, exc.strerror or str(exc))
    return WriteFailedError(
        f"cannot write {what}: {reason} ({where})",
        path=where,
        errno=code,
        hint=hint or "free some space or fix the permissions, then try again",
    )


def errno_of(exc: OSError) -> int | None:
    """`exc.errno`, or for an OSError raised without one (`FileNotFoundError("weights missing")`) the errno its
    class stands for (FileNotFoundError: ENOENT, PermissionError: EACCES, ...); None for a bare OSError("...")."""
    if exc.errno is not None:
        return exc.errno
    for cls, code in _CLASS_ERRNOS:
        if isinstance(exc, cls):
            return code
    return None


_CLASS_ERRNOS = (
    (FileNotFoundError, errno.ENOENT),
    (NotADirectoryError, errno.ENOTDIR),
    (IsADirectoryError, errno.EISDIR),
    (PermissionError, errno.EACCES),
)
MISSING_ERRNOS = (errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.ELOOP, errno.ENAMETOOLONG)
"""Errnos that say a path names nothing usable (absent, a file for a folder, a loop): a read's failure, exit 3."""


RESUME_HINT = (
    "then `portable run ... --resume` continues from the last complete checkpoint (nothing half-written is kept)"
)
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
WRITE_ONLY_ERRNOS = (*DISK_FULL_ERRNOS, errno.EROFS, errno.EXDEV)
"""Errnos only a write (or a rename) gets: an OSError of one of these is a failed write, exit 8."""
_DISK_FULL_WORDS = ("no space left on device", "os error 28", "disk quota exceeded", "file too large")


def is_disk_full(exc: BaseException) -> bool:
    """True when `exc` (or what it wraps: DCP's CheckpointException keeps each rank's error, safetensors
    words the errno) says the disk, a quota or the file size limit ran out."""
    seen: list[BaseException] = [exc]
    for failure in (getattr(exc, "failures", None) or {}).values():  # torch DCP: {rank: (exc, frames)}
        seen.append(failure[0] if isinstance(failure, tuple) else failure)
    for item in seen:
        while item is not None:
            if isinstance(item, OSError) and item.errno in DISK_FULL_ERRNOS:
                return True
            if any(w in str(item).lower() for w in _DISK_FULL_WORDS):
                return True
            item = item.__cause__ or item.__context__
    return False


def disk_full_error(
    what: str,
    path: Path | str,
    *,
    need: int | None = None,
    free: int | None = None,
    hint: str | None = None,
    out_of_inodes: bool = False,
) -> WriteFailedError:
    """The one-line WriteFailedError (exit 8) for `what` at `path` not fitting: names the path, the
    space it needs (`need` bytes, when known) and what was free (or that no file slot was: `out_of_inodes`), and
    what to do."""
    from reproduction.ui import human_bytes

    sizes = []
    if need is not None:
        sizes.append(f"it needs about {human_bytes(need)}")
    if out_of_inodes:
        sizes.append("no free inodes: the filesystem holds as many files as it can")
    if free is not None:
        sizes.append(f"{human_bytes(free)} were free")
    detail = f" ({', '.join(sizes)})" if sizes else ""
    more = f"free at least {human_bytes(need)} there" if need else "free some space there"
    if out_of_inodes:
        more = "remove files there (or use a filesystem with more inodes)"
    return WriteFailedError(
        f"cannot write {what}: the disk is full at {path}{detail}",
        path=str(path),
        need=need,
        free=free,
        errno=errno.ENOSPC,
        hint=hint
        or f"{more} (or use a folder on a bigger disk), then run the command again: nothing half-written was kept",
    )


# -- hub ----------------------------------------------------------------------------------------


class HubError(PortableError, ConnectionError):
    """The Hub refused or failed a request; `status` and the server's message are kept."""

    exit_code = 30


class HubAuthError(HubError, PermissionError):
    """401/403: no token, a token the Hub rejects, or no permission on the repo or namespace."""

    exit_code = 31


class HubNotFoundError(HubError, FileNotFoundError):
    """The repo, revision or a file in it does not exist (or is private and the token cannot see it)."""

    exit_code = 32


class HubTransferError(HubError):
    """A transfer kept failing (timeouts, stalls, 429/5xx) after the bounded retries."""

    exit_code = 33


class HubIntegrityError(HubError):
    """Downloaded bytes kept disagreeing with the sha256 the remote bundle.json pins (or the bundle.json served is not
    the one the resolved commit holds)."""

    exit_code = 34


class HubConflictError(HubError):
    """The branch moved during a publish, or a tag already names another commit."""

    exit_code = 35


# -- data plane ---------------------------------------------------------------------------------


class DatasetError(PortableError, ValueError):
    """A dataset is unreadable or lacks what a stage needs."""

    exit_code = 40


class FingerprintMismatchError(DatasetError):
    """A sidecar was computed from another version of the dataset (or another tag)."""

    exit_code = 41


class SimError(PortableError, ValueError):
    """The simulator was asked for something it cannot do: an unknown task, an action or observation
    of the wrong shape, a policy that returned the wrong batch."""

    exit_code = 45


class RenderUnavailableError(SimError):
    """The simulator was asked for camera images and cannot render here (no headless OpenGL backend
    that works under the chosen `MUJOCO_GL`)."""

    exit_code = 46


# -- training and runs --------------------------------------------------------------------------


class ConfigError(InvalidInputError):
    """A run or training config violates a rule (names the field and the rule)."""


class CheckpointError(PortableError, RuntimeError):
    """A checkpoint is incomplete, corrupt, or does not match the model or config."""

    exit_code = 50


class ResumeRefusedError(CheckpointError):
    """A resume refused before it loaded, trained or removed anything: no complete checkpoint at or below the steps
    asked for is left (keep_last kept only newer ones). `portable run` then puts run.json back as it was, so a
    refused `--target-step M` is not stored for a later plain `--resume` to inherit and fail on again (audit56 K1)."""


class CheckpointKernelsChangedError(CheckpointError):
    """A resume under other CPU kernels than the checkpoint's steps were computed with (its manifest's
    `versions.cpu_kernels`): refused like a stage whose inputs changed since it ran (exit 52), since continuing
    would mix two kernels' arithmetic in one stage under one lineage record."""

    exit_code = 52


class WorkerFailedError(PortableError, RuntimeError):
    """A distributed worker died or raised; carries its traceback text."""

    exit_code = 51


def killed_worker_hint(workers_key: str | None = None, *, resume: bool = True, first: str | None = None) -> str:
    """The hint under a worker process that was killed (exit 51): what continues the work, and, when workers keep
    dying, the caller's own key (`eval.workers`, `value.infer.workers`, `rl.rollout_workers`) for one worker.
    `resume`: the work is a `portable run` stage (recorded failed, which `--resume` redoes). `first`: what to do
    before the rerun (delete a set the command wrote, which its rerun would refuse)."""
    again = "rerun the same `portable run` with --resume to continue this stage" if resume else "rerun the same command"
    if first:
        again = f"{first}, then {again}"
    text = f"a worker process was killed (out of memory? kill -9?): {again}"
    if workers_key:
        more = f"{workers_key}=1 --resume" if resume else f"{workers_key}=1"
        text += f"; if workers keep dying, add {more} (one process, where a failure shows)"
    return text


class GuidanceScaleError(InvalidInputError):
    """A policy's guidance scale (or sampling setting) is invalid: w < 0, or w != 1 for a policy
    trained without advantage conditioning."""

    exit_code = 53


class StageProtocolError(PortableError, RuntimeError):
    """A recipe's function broke the recipe protocol (reproduction/recipe.py): a stage returned something other
    than a StageOutput, a summary that is not JSON, a file outside its folder, or called sys.exit (`stage` names it;
    recorded `failed`); open_inputs returned no dict, preflight no list; evaluate cannot be called as (args, run_dir,
    state, ui) or returned no exit code."""

    exit_code = 54


class StageKeyChangedError(PortableError, RuntimeError):
    """`run --resume` found a stage whose inputs (or outputs) changed since it completed; `changes` names them."""

    exit_code = 52


class RunStateError(PortableError, RuntimeError):
    """The run folder cannot be used as asked: it is a file, holds another run (no --resume), its run.json
    is not of the schema its format_version names (the field is named), a stage folder or evidence/ is a
    symbolic link, it lies inside the bundle, or it lacks a stage the requested ones need."""

    exit_code = 55


class NotRestoredError(PortableError, RuntimeError):
    """`run` on a bundle whose layers (runtimes, sources) were never restored, or were restored elsewhere."""

    exit_code = 57


class RayUnavailableError(PortableError, ConnectionError):
    """A local Ray did not start, or the cluster at `address` did not answer within the bound."""

    exit_code = 58


class PreflightError(PortableError, ValueError):
    """The preflight found problems before any worker started; `problems` lists every one of them."""

    exit_code = 56

    def __init__(self, message: str, *, problems: list[str] | None = None, hint: str | None = None, **fields: Any):
        super().__init__(message, hint=hint, problems=list(problems or []), **fields)
