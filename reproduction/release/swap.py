"""Put a staged layer target into place atomically, undo it, and check beforehand that it can be done.

A target is built in `<bundle>/.portable/staging/<i>` and swapped in with one rename (renameat2
RENAME_EXCHANGE where the kernel has it, else two renames that undo themselves on failure); the old
tree goes to `.portable/trash/<i>`, so `swap_back` can put it back until restore has finished. Every
rename is made in folder fds opened from the bundle root without following links (audit63 A L3).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from reproduction.errors import UnsafeArchiveError, os_error
from reproduction.release.extract import open_parent
from reproduction.release.manifest import STATE_DIR


def exchange(a_fd: int, a: str, b_fd: int, b: str) -> bool:
    """Atomically swap two names, each in its folder's fd (renameat2 RENAME_EXCHANGE); False where the kernel or
    libc lacks it."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    rename_exchange = 2
    if fn(a_fd, os.fsencode(a), b_fd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # fall back to two renames
        return False
    raise OSError(err, os.strerror(err), b)


class _Folders:
    """The folders holding paths below the bundle root, each reached from the root one component at a time with
    O_NOFOLLOW, so a rename never resolves a name through a symlink.

    preflight checks every target's path, but a user who can write into the bundle could swap a target's parent
    folder for a symlink before the swap, which then renamed by path and moved (and, with the trash, deleted) a
    folder outside the bundle (audit63 A L3). `at` refuses such a path: UnsafeArchiveError (6) naming the link.

    Each `at` walks on its own and keeps only the fd it returns (every folder above it is closed as the walk goes
    on), so a swap holds exactly the fds its renames use, however deep the target: a shared, trimmed fd cache closed
    them under a target 63 folders deep (review64 R M1). The fds are O_PATH, which renameat/renameat2 and fstatat
    take as folders and which need only search permission on the way, as a rename by path did: a folder its user
    may write and search but not read (0300) no longer stops a swap (review64 R L1).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.held: list[int] = []

    def at(self, path: Path, label: str) -> tuple[int, str]:
        """(fd of the folder holding `path`, its last component); `label` names `path` in a refusal."""
        rel = path.relative_to(self.root).as_posix()
        try:
            fd, base = open_parent(self.root, rel)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR) and exc.filename != str(self.root):
                raise through_link(self.root, rel, label) from None
            raise
        self.held.append(fd)
        return fd, base

    def close(self) -> None:
        for fd in self.held:
            os.close(fd)
        self.held = []


def _named(exc: OSError, path: Path) -> OSError:
    """`exc` naming the full `path` (an *at call names only the bare name it was given, `t`: review64 R M1)."""
    return OSError(exc.errno, exc.strerror, str(path))


def _rename(src_fd: int, src: str, dst_fd: int, dst: str, where: Path) -> None:
    """Rename `src` (in folder fd `src_fd`) to `dst` (in `dst_fd`); an OSError names `where`, the full path written."""
    try:
        os.rename(src, dst, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
    except OSError as exc:
        raise _named(exc, where) from None


def _exchange(a_fd: int, a: str, b_fd: int, b: str, where: Path) -> bool:
    try:
        return exchange(a_fd, a, b_fd, b)
    except OSError as exc:
        raise _named(exc, where) from None


def _fsync_folder(dir_fd: int) -> None:
    """fsync the folder of O_PATH fd `dir_fd` (reopened for reading: an O_PATH fd cannot be synced); best effort, as
    fsio.fsync_dir: some filesystems refuse a folder's fsync, and a folder without read permission cannot be opened."""
    try:
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def through_link(root: Path, rel: str, label: str) -> UnsafeArchiveError:
    """The refusal of a rename (or, after the swap, a relocation or the receipt's re-stat: audit65) whose folder is not
    reached from the bundle `root` without a link (what lies there now, if it is still there: a symlink or a file
    planted after preflight); `rel` is the path below `root`, `label` names it."""
    here, where, what = root, rel.rpartition("/")[0], "a symlink or a file"
    for part in Path(rel).parts[:-1]:
        here = here / part
        try:
            st = os.lstat(here)
        except OSError:
            break
        if not stat.S_ISDIR(st.st_mode):
            where = str(here.relative_to(root))
            what = "the symlink" if stat.S_ISLNK(st.st_mode) else "the file"
            break
    return UnsafeArchiveError(
        f"{label} {rel} lies under {what} {where}, which appeared while restore ran: refusing to restore through it",
        member=where,
        hint=f"remove {root / where} (a bundle holds no symlinked folders), put its folder back, and restore again; "
        "nothing outside the bundle was changed",
    )


def swap_into_place(staging: Path, final: Path, trash: Path, *, root: Path) -> None:
    """Put `staging` at `final`; an existing `final` goes to `trash` (all three below the bundle `root`, each renamed
    in its folder's fd reached without following a link: `_Folders`). Readers see old or new, whole.

    On failure `final` holds what it held before (the two-rename fallback puts it back); a symlink or file in place
    of a folder on any of the three paths is UnsafeArchiveError (6) before anything is renamed.
    """
    folders = _Folders(root)
    try:
        s_fd, s = folders.at(staging, "the staging folder")
        f_fd, f = folders.at(final, "layer target")
        t_fd, t = folders.at(trash, "the trash folder")
        if not _lexists(f_fd, f, final):
            _rename(s_fd, s, f_fd, f, final)
        elif _exchange(s_fd, s, f_fd, f, final):
            _rename(s_fd, s, t_fd, t, trash)  # staging now holds the old tree
        else:
            _rename(f_fd, f, t_fd, t, trash)
            try:
                _rename(s_fd, s, f_fd, f, final)
            except OSError:
                _rename(t_fd, t, f_fd, f, final)
                raise
        _fsync_folder(f_fd)
    finally:
        folders.close()


def swap_back(final: Path, trash: Path, spare: Path, *, root: Path) -> bool:
    """Undo `swap_into_place`: the old tree from `trash` back at `final`, or no `final` (renamed in folder fds, as
    there). False if it failed (a symlink planted on a path too)."""
    folders = _Folders(root)
    try:
        f_fd, f = folders.at(final, "layer target")
        t_fd, t = folders.at(trash, "the trash folder")
        p_fd, p = folders.at(spare, "the trash folder")
        if _lexists(t_fd, t, trash):
            if not _exchange(t_fd, t, f_fd, f, final):
                _rename(f_fd, f, p_fd, p, spare)
                _rename(t_fd, t, f_fd, f, final)
        elif _lexists(f_fd, f, final):
            _rename(f_fd, f, p_fd, p, spare)
    except (OSError, UnsafeArchiveError):
        return False
    finally:
        folders.close()
    return True


def _lexists(dir_fd: int, name: str, where: Path) -> bool:
    try:
        os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise _named(exc, where) from None
    return True


def check_target_path(bundle: Path, target: str) -> None:
    """Refuse a layer target that is, or lies below, a symlink (lstat of every component, the target too).

    Relocation rewrites files in a kept target in place and a swap renames over it, so a target that
    is a link (or under one) would have restore write outside the bundle (audit F3). Raises
    UnsafeArchiveError (6) naming the link; a missing component ends the walk (nothing to follow). A folder on the way
    this user cannot search (chmod 000) is ReadFailedError (3) naming the folder to fix, as the receipt check's
    (receipt.unreachable: review65 L2).
    """
    here = bundle
    for part in Path(target).parts:
        here = here / part
        try:
            st = os.lstat(here)
        except (FileNotFoundError, NotADirectoryError):
            return
        except PermissionError:
            from reproduction.release.receipt import unreachable

            raise unreachable(bundle, target, purpose="to check the layer target's path") from None
        if stat.S_ISLNK(st.st_mode):
            where = here.relative_to(bundle)
            what = "is a symlink" if str(where) == target else f"lies under the symlink {where}"
            raise UnsafeArchiveError(
                f"layer target {target} {what}: refusing to restore through it",
                member=str(where),
                hint=f"remove the symlink {here} (a bundle holds no symlinked folders) and restore again",
            )


def preflight(bundle: Path, targets: list[str], *, state_dev: int | None = None) -> None:
    """Before anything is swapped: every target's parent exists, is reached without a symlink, is
    writable and on the state folder's filesystem (else a rename half-way through would fail with
    EACCES or EXDEV). Raises WriteFailedError (8) or UnsafeArchiveError (6); changes nothing else.
    `state_dev`: the state folder's device, from the fd restore opened it with (default: stat by path)."""
    if state_dev is None:
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
