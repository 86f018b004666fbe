"""Put a staged layer target into place atomically, undo it, and check beforehand that it can be done.

A target is built in `<bundle>/.portable/staging/<i>` and swapped in with one rename (renameat2
RENAME_EXCHANGE where the kernel has it, else two renames that undo themselves on failure); the old
tree goes to `.portable/trash/<i>`, so `swap_back` can put it back until restore has finished.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from reproduction.errors import UnsafeArchiveError, os_error
from reproduction.fsio import fsync_dir
from reproduction.release.manifest import STATE_DIR


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (renameat2 RENAME_EXCHANGE); False where the kernel or libc lacks it."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # fall back to two renames
        return False
    raise OSError(err, os.strerror(err), str(b))


def swap_into_place(staging: Path, final: Path, trash: Path) -> None:
    """Put `staging` at `final`; an existing `final` goes to `trash`. Readers see old or new, whole.

    On failure `final` holds what it held before (the two-rename fallback puts it back).
    """
    if not os.path.lexists(final):
        os.rename(staging, final)
    elif exchange(staging, final):
        os.rename(staging, trash)  # staging now holds the old tree
    else:
        os.rename(final, trash)
        try:
            os.rename(staging, final)
        except OSError:
            os.rename(trash, final)
            raise
    fsync_dir(final.parent)


def swap_back(final: Path, trash: Path, spare: Path) -> bool:
    """Undo `swap_into_place`: the old tree from `trash` back at `final`, or no `final`. False if it failed."""
    try:
        if os.path.lexists(trash):
            if not exchange(trash, final):
                os.rename(final, spare)
                os.rename(trash, final)
        elif os.path.lexists(final):
            os.rename(final, spare)
    except OSError:
        return False
    return True


def check_target_path(bundle: Path, target: str) -> None:
    """Refuse a layer target that is, or lies below, a symlink (lstat of every component, the target too).

    Relocation rewrites files in a kept target in place and a swap renames over it, so a target that
    is a link (or under one) would have restore write outside the bundle (audit F3). Raises
    UnsafeArchiveError (6) naming the link; a missing component ends the walk (nothing to follow).
    """
    here = bundle
    for part in Path(target).parts:
        here = here / part
        try:
            st = os.lstat(here)
        except (FileNotFoundError, NotADirectoryError):
            return
        if stat.S_ISLNK(st.st_mode):
            where = here.relative_to(bundle)
            what = "is a symlink" if str(where) == target else f"lies under the symlink {where}"
            raise UnsafeArchiveError(
                f"layer target {target} {what}: refusing to restore through it",
                member=str(where),
                hint=f"remove the symlink {here} (a bundle holds no symlinked folders) and restore again",
            )


def preflight(bundle: Path, targets: list[str]) -> None:
    """Before anything is swapped: every target's parent exists, is reached without a symlink, is
    writable and on the state folder's filesystem (else a rename half-way through would fail with
    EACCES or EXDEV). Raises WriteFailedError (8) or UnsafeArchiveError (6); changes nothing else."""
    state_dev = os.stat(bundle / STATE_DIR).st_dev
    for target in targets:
        final = bundle / target
        check_target_path(bundle, target)
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            for folder in (final.parent, final) if os.path.isdir(final) else (final.parent,):
                if os.stat(folder).st_dev != state_dev:
                    raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), str(folder))
                if not os.access(folder, os.W_OK | os.X_OK):
                    raise OSError(errno.EACCES, os.strerror(errno.EACCES), str(folder))
        except OSError as exc:
            raise os_error(
                exc,
                f"the layer target {final}",
                hint="make the target's folder writable and on the bundle's filesystem, then run "
                "`portable restore` again; nothing was changed",
            ) from None
