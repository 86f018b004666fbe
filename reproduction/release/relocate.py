"""Find where a tree embeds its build prefix, and rewrite those files for a new prefix, repeatably.

Three kinds of occurrence (`PrefixOccurrence.mode`):

- ``text``: a file without NUL bytes (shebangs, pyvenv.cfg, _sysconfigdata*.py, *.pc, Makefile,
  activate scripts): every occurrence is replaced, whatever the lengths. A shebang that would grow
  past 127 bytes (or hold a space) becomes the `#!/bin/sh` + `exec` trampoline pip/distlib use.
- ``binary``: the prefix inside a NUL-terminated C string: replaced in place, the string keeps its
  slot and is NUL-padded after its new end. The slot was sized by the prefix the tree was *built*
  at, so a longer new prefix cannot fit and is refused (RelocationError, exit 9) before any file
  is touched. Two harmless cases are not refused; the string gets its build-time value back (it
  always fits, and a later relocation that fits updates it) and a line goes to `notes`:
  bytes the loader never maps (ELF debug info, .symtab), and, in `FALLBACK_GLOBS` files, a C
  string that is exactly the prefix: CPython's compiled-in PREFIX/EXEC_PREFIX, which getpath only
  uses when it finds no lib/pythonX.Y/os.py above the executable (a relocated tree always has it).
  Only a file whose format is made of C strings is rewritten so: an ELF file, or an `ar` archive of
  them (a static library). Any other file holding a NUL byte (a pickle, a zip, a database) may store
  the prefix's length beside it, which the shift and padding would silently corrupt (audit62 M3): it is
  never rewritten, keeps the prefix it was built with, and its path goes to `skipped` for the caller to
  name.
- ``elf-runpath``: an ELF file whose DT_RUNPATH/DT_RPATH names the prefix. The search path becomes
  `$ORIGIN/<relative>` (right wherever the bundle moves as a whole, so later relocations find no
  prefix in it and leave it alone), or the new absolute path when only that fits the string slot.
  Other C strings of the same file are handled as ``binary``.

A prefix matches only as a whole path: `/opt/py` matches `/opt/py`, `/opt/py/lib`, `/opt/py"` and
`file:///opt/py/lib` and `-L/opt/py/lib` (a compiler flag), but not `/opt/python`, `/opt/py-old` or
`/srv/opt/py` (a longer path ending in it).
Files are rewritten atomically (temp file + rename, mode kept, new mtime), each read and renamed
through its folder's fd, every folder opened from the tree's root without following a link: a
folder swapped for a symlink is refused, never written through.
Relocation is repeatable: the caller records one value per layer, where the tree
now lives, and passes it next time as `old_prefix`, with the layer's original `build_prefix`
(which sizes binary slots and finds kept strings). Files that no longer hold `old_prefix` (already
relocated, or turned into `$ORIGIN`) are left as they are, so a relocation cut short by a kill can
simply be run again (unless the new prefix is a path below the old one: then record first).
"""

from __future__ import annotations

import errno
import fnmatch
import mmap
import os
import re
import secrets
import shlex
import stat
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from reproduction.errors import RelocationError, UnsafeArchiveError, os_error
from reproduction.fsio import naming, open_regular
from reproduction.release import elf
from reproduction.release.extract import DirFds, open_below, open_parent
from reproduction.release.manifest import PrefixOccurrence

SHEBANG_MAX = 127
"""Longest shebang line (without the newline) every Linux kernel reads whole (BINPRM_BUF_SIZE was 128)."""
MMAP_OVER = 8 << 20
"""Files larger than this are scanned through mmap instead of being read into memory."""
SKIP_SUFFIXES = (".pyc", ".pyo")
"""Bytecode holds source paths only for tracebacks and is rebuilt by Python: never recorded, never rewritten."""
FALLBACK_GLOBS = ("lib/libpython3*.so*", "bin/python3*")
"""Files where a C string equal to the prefix is CPython's compiled-in fallback (see the module doc)."""
_MODE_RANK = {"text": 0, "binary": 1, "elf-runpath": 2}
_PATH_CHAR = rb"A-Za-z0-9_.+\-"


def strongest_modes(occurrences: Sequence[PrefixOccurrence]) -> dict[str, str]:
    """Path -> the mode relocation rewrites it in: of a path listed several times, the strongest (elf-runpath over
    binary over text)."""
    modes: dict[str, str] = {}
    for occ in occurrences:
        if _MODE_RANK[occ.mode] >= _MODE_RANK.get(modes.get(occ.path, "text"), 0):
            modes[occ.path] = occ.mode
    return modes


def is_fallback(rel: str, globs: Sequence[str] = FALLBACK_GLOBS) -> bool:
    """Whether `rel` may keep a compiled-in fallback prefix that does not fit (FALLBACK_GLOBS)."""
    return any(fnmatch.fnmatchcase(rel, g) for g in globs)


def normalize_prefix(prefix: str, *, what: str = "prefix") -> str:
    """`prefix` without trailing slashes; raises RelocationError unless it is an absolute path below /."""
    value = str(prefix).rstrip("/")
    if not str(prefix).startswith("/") or not value or "\0" in value or "\n" in value:
        raise RelocationError(
            f"{what} {prefix!r} must be an absolute path other than '/'",
            hint="pass the folder the tree lives at, e.g. /opt/bundle/runtime/python",
        )
    return value


def prefix_pattern(prefix: str) -> re.Pattern[bytes]:
    """Bytes regex matching `prefix` as a whole path: not followed by another path-name character, and not preceded
    by one either (`/srv/opt/py` is another path that ends with `/opt/py`; audit58 A3), except where that character
    starts a word as the letter of a one-letter compiler or linker flag (`-I/opt/py/include`, `-L`, `-R`, `-F`:
    sysconfigdata's CFLAGS/LDFLAGS, Makefiles, *.pc; review58 R1) or as a `.` (`./opt/py`, as sysconfigdata
    writes some). A `/` before it is allowed, so `file:///opt/py` URLs (pip's direct_url.json) still match."""
    word = rb"(?<![" + _PATH_CHAR + rb"/]"  # + the characters between it and the prefix: `a-L/opt/py` is no flag
    flag = rb"(?<=-[ILRF])" + word + rb"..)"
    dot = rb"(?<=\.)" + word + rb".)"
    before = rb"(?:(?<![" + _PATH_CHAR + rb"])|" + flag + rb"|" + dot + rb")"
    return re.compile(before + re.escape(os.fsencode(prefix)) + rb"(?![" + _PATH_CHAR + rb"])")


# -- scanning ---------------------------------------------------------------------------------------


def _iter_files(root: Path, skip: Callable[[str], bool] | None) -> Iterable[tuple[str, str]]:
    """(relative posix path, absolute path) of every regular file below root; symlinks are not followed.

    `skip(rel)` prunes a folder (and all below it) or a file.
    """
    for dirpath, dirnames, filenames in os.walk(root):
        base = os.path.relpath(dirpath, root).replace(os.sep, "/")
        base = "" if base == "." else base + "/"
        dirnames[:] = sorted(d for d in dirnames if skip is None or not skip(base + d))
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            if name.endswith(SKIP_SUFFIXES) or (skip is not None and skip(base + name)):
                continue
            if stat.S_ISREG(os.lstat(full).st_mode):
                yield base + name, full


AR_MAGIC = b"!<arch>\n"
"""An `ar` archive (a static library `.a`): ELF object files one after the other, each with its size in a header."""


def cstring_format(data: bytes | bytearray | mmap.mmap) -> bool:
    """Whether a file's bytes are a format whose build prefixes live in NUL-terminated C strings that may be
    rewritten in place (slot kept, NUL-padded): ELF, or an `ar` archive (of ELF objects). See the module doc."""
    return elf.is_elf(data[:4]) or data[: len(AR_MAGIC)] == AR_MAGIC


def _classify(data: bytes | mmap.mmap, prefix: str, pattern: re.Pattern[bytes]) -> str | None:
    """The mode for a file's bytes, or None when they do not contain `prefix` as a path."""
    if data.find(os.fsencode(prefix)) < 0 or pattern.search(data) is None:
        return None
    if elf.is_elf(data):
        try:
            paths = elf.search_paths(data)
        except elf.ElfError:
            return "binary"
        if any(pattern.search(os.fsencode(p.value)) for p in paths):
            return "elf-runpath"
        return "binary"
    return "binary" if data.find(b"\0") >= 0 else "text"


def scan_prefixes(
    root: Path, prefixes: Sequence[str], *, skip: Callable[[str], bool] | None = None, workers: int | None = None
) -> dict[str, list[PrefixOccurrence]]:
    """Occurrences of each prefix in the regular files below `root`, reading each file once.

    Returns {prefix: occurrences sorted by path}, prefixes normalised (no trailing slash). Symlinks,
    `*.pyc`/`*.pyo`, special files and whatever `skip(relative path)` is true for (a folder: all
    below it) are skipped, so excluded bulk is never read. Reads in a few threads (I/O bound).
    """
    root = Path(root)
    clean = [normalize_prefix(p) for p in prefixes]
    patterns = [prefix_pattern(p) for p in clean]

    def one(item: tuple[str, str]) -> list[tuple[str, PrefixOccurrence]]:
        rel, full = item
        try:
            with open(full, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                # Big shared libraries are searched through a mapping: no copy, pages read once.
                data = (
                    mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if 0 < size and size > MMAP_OVER else fh.read()
                )
        except OSError as exc:
            raise os_error(
                exc,
                f"{full} to look for the build prefix",
                op="read",
                hint="make it readable, or exclude it from the layer in the spec",
            ) from None
        try:
            return [
                (prefix, PrefixOccurrence(path=rel, mode=mode))
                for prefix, pattern in zip(clean, patterns)
                if (mode := _classify(data, prefix, pattern))
            ]
        finally:
            if isinstance(data, mmap.mmap):
                data.close()

    result: dict[str, list[PrefixOccurrence]] = {p: [] for p in clean}
    workers = workers or min(4, (os.cpu_count() or 1) + 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for found in pool.map(one, _iter_files(root, skip), chunksize=16):
            for prefix, occurrence in found:
                result[prefix].append(occurrence)
    return result


def scan_tree(root: Path, prefix: str, *, skip: Callable[[str], bool] | None = None) -> list[PrefixOccurrence]:
    """Every regular file below `root` that contains `prefix` as a path, with how to rewrite it.

    Modes: 'elf-runpath' (an ELF whose RUNPATH/RPATH names the prefix), 'binary' (any other file
    holding a NUL byte), 'text'. Sorted by path. See `scan_prefixes` for what is skipped.
    """
    return scan_prefixes(Path(root), [prefix], skip=skip)[normalize_prefix(prefix)]


# -- rewriting --------------------------------------------------------------------------------------


def _shebang_fix(data: bytes, new_prefix: str, rel: str) -> bytes:
    """Turn a too-long (or spaced) shebang that names `new_prefix` into the sh + exec trampoline."""
    if not data.startswith(b"#!"):
        return data
    end = data.find(b"\n")
    end = len(data) if end < 0 else end
    line = data[:end]
    if os.fsencode(new_prefix) not in line:
        return data
    # The interpreter path itself may hold spaces only when the prefix does; split the rest as args.
    body = line[2:].strip()
    raw_prefix = os.fsencode(new_prefix)
    cut = body.find(b" ", body.find(raw_prefix) + len(raw_prefix)) if body.startswith(raw_prefix) else body.find(b" ")
    interp, args = (body, b"") if cut < 0 else (body[:cut], body[cut:].strip())
    if len(line) <= SHEBANG_MAX and b" " not in interp:
        return data
    if not os.path.basename(interp).startswith(b"python"):
        raise RelocationError(
            f"{rel}: shebang would be {len(line)} bytes (limit {SHEBANG_MAX}) and its interpreter "
            f"{os.fsdecode(interp)!r} is not Python, so the sh trampoline cannot be used",
            path=rel,
            new_prefix=new_prefix,
            hint="restore the bundle to a shorter path",
        )
    # Split on spaces, but never inside the new prefix: an argument naming it (`-Xpycache_prefix=<prefix>/cache`)
    # stays one word when the bundle's path holds a space (review65 S L1).
    text, hold = os.fsdecode(args), "\0"
    if hold in text:
        split = text.split()
    else:
        split = [a.replace(hold, new_prefix) for a in text.replace(new_prefix, hold).split()]
    words = [shlex.quote(os.fsdecode(interp))] + [shlex.quote(a) for a in split]
    # Valid as sh (exec re-runs the file under Python) and as Python (a string statement); distlib's form.
    tramp = "#!/bin/sh\n'''exec' " + " ".join(words) + ' "$0" "$@"\n' + "' '''"
    return tramp.encode() + data[end:]


_TRAMP_HEAD = b"#!/bin/sh\n'''exec' "
_TRAMP_TAIL = b' "$0" "$@"'
_TRAMP_END = b"\n' '''"


def _untrampoline(data: bytes, pattern: re.Pattern[bytes]) -> bytes:
    """`data` with the sh + exec trampoline `_shebang_fix` wrote turned back into the plain shebang it stands for
    (`#!<interpreter> <args>`), when its interpreter or one of its arguments names the prefix `pattern` matches (an
    interpreter outside the bundle given an argument inside it: review65 S L1); else `data` unchanged.

    The trampoline holds the interpreter shell-quoted (`shlex.quote`): a path with a `'` is stored as `'"'"'`, which
    the raw prefix never matches, and a new path written raw inside the old quotes is broken shell (review65 M1).
    Rewritten as a plain line, the prefix is replaced like any other, and `_shebang_fix` quotes the new path again
    (or leaves the plain shebang, when it now fits)."""
    if not data.startswith(_TRAMP_HEAD):
        return data
    end = data.find(_TRAMP_END, len(_TRAMP_HEAD))
    if end < 0 or end != data.find(b"\n", len(_TRAMP_HEAD)) or not data[:end].endswith(_TRAMP_TAIL):
        return data
    words = os.fsdecode(data[len(_TRAMP_HEAD) : end - len(_TRAMP_TAIL)])
    try:
        parts = shlex.split(words)
    except ValueError:
        return data
    if not parts or " ".join(shlex.quote(w) for w in parts) != words:  # not one `_shebang_fix` wrote
        return data
    interp = os.fsencode(parts[0])
    if not any(pattern.search(os.fsencode(w)) for w in parts):  # an argument naming it too (review65 S L1)
        return data
    return b"#!" + b" ".join([interp, *map(os.fsencode, parts[1:])]) + data[end + len(_TRAMP_END) :]


@dataclass(kw_only=True, slots=True)
class _FileCtx:
    """What rewriting one file's C strings needs to know besides its bytes."""

    rel: str
    old: str
    new: str
    build: str
    skip: Sequence[tuple[int, int]] = ()
    """Byte ranges handled elsewhere (RUNPATH slots)."""
    soft: Sequence[tuple[int, int]] = ()
    """Byte ranges never mapped at run time (ELF debug info, symbol tables): kept when too short."""
    fallback: bool = False
    """The file matches FALLBACK_GLOBS: a string equal to the prefix is kept when too short."""


def _rewrite_cstrings(
    data: bytearray, pattern: re.Pattern[bytes], ctx: _FileCtx, problems: list[str], notes: list[str]
) -> None:
    """Replace `old` with `new` inside each C string of `data`, in place, keeping every string's slot.

    A slot is the string plus the NUL padding earlier relocations left after it: the string was
    built with `build`, so each occurrence may hold up to len(build) bytes. A string that does
    not fit goes to `problems`, unless it is harmless (ctx.soft, ctx.fallback): then it gets its
    build-time value back (which always fits, and is the one stale value a later relocation looks
    for) and a line goes to `notes`.
    """
    old, new, build, rel = ctx.old, ctx.new, ctx.build, ctx.rel
    new_b, grow = os.fsencode(new), len(build) - len(old)
    pos = 0
    while True:
        m = pattern.search(data, pos)
        if m is None:
            return
        start = m.start()
        if any(a <= start < b for a, b in ctx.skip):
            pos = start + 1
            continue
        nul = data.find(b"\0", start)
        nul = len(data) if nul < 0 else nul
        segment = bytes(data[start:nul])
        count = len(pattern.findall(segment))
        # The padding an earlier relocation left: count*grow NULs after the terminator, or, for a string that
        # ran to the end of the file (no terminator), count*grow NULs up to the end (audit56 A3).
        tail = data[nul : nul + count * grow + 1]
        pad = count * grow if grow > 0 and len(tail) >= count * grow and tail.count(0) == len(tail) else 0
        replaced = pattern.sub(lambda _m: new_b, segment)
        room = len(segment) + pad
        harmless = ""
        if len(replaced) > room and any(a <= start < b for a, b in ctx.soft):
            harmless = "in a section the loader never maps (debug info)"
        elif (
            len(replaced) > room
            and ctx.fallback
            and segment == os.fsencode(old)
            and (start == 0 or data[start - 1] == 0)
        ):
            harmless = (
                "as CPython's compiled-in PREFIX fallback (the interpreter finds its own lib/ and never reads it)"
            )
        if harmless:
            replaced = pattern.sub(lambda _m: os.fsencode(build), segment)
            notes.append(f"{rel}: left the build prefix {build!r} at offset {start} {harmless}: {new!r} is longer")
        if len(replaced) > room:
            problems.append(
                f"{rel}: a {len(segment)}-byte C string at offset {start} needs {len(replaced)} bytes "
                f"for {new!r} (room {room}: {count} x the {len(os.fsencode(build))}-byte build prefix {build!r})"
            )
            pos = nul + 1
            continue
        end = min(len(data), start + room + 1)
        data[start:end] = (replaced + b"\0" * (room + 1 - len(replaced)))[: end - start]
        pos = end


def _origin_form(entry_abs: str, root: Path, rel: str) -> str:
    """`$ORIGIN/...` naming `entry_abs` from the folder of `root/rel` (real paths, as ld.so sees them)."""
    here = os.path.realpath(os.path.join(root, os.path.dirname(rel)))
    relative = os.path.relpath(os.path.realpath(entry_abs), here)
    return "$ORIGIN" if relative == "." else "$ORIGIN/" + relative


def _rewrite_runpaths(
    data: bytearray, pattern: re.Pattern[bytes], old: str, new: str, root: Path, rel: str, problems: list[str]
) -> list[tuple[int, int]]:
    """Rewrite each search path naming `old`; returns the byte ranges of all search-path slots."""
    try:
        entries = elf.search_paths(data)
    except elf.ElfError as exc:
        problems.append(f"{rel}: cannot read its ELF dynamic section ({exc})")
        return []
    for sp in entries:
        parts = sp.value.split(":")
        hits = [bool(pattern.match(os.fsencode(p))) for p in parts]
        if not any(hits) and not pattern.search(os.fsencode(sp.value)):
            continue
        mapped = [
            new + p[len(old) :]
            if hit
            else pattern.sub(lambda _m: os.fsencode(new), os.fsencode(p)).decode("utf-8", "surrogateescape")
            for p, hit in zip(parts, hits)
        ]
        relative = ":".join(_origin_form(m, root, rel) if hit else m for m, hit in zip(mapped, hits))
        for candidate in (relative, ":".join(mapped)):
            if len(os.fsencode(candidate)) <= sp.capacity:
                elf.set_search_path(data, sp, candidate)
                break
        else:
            why = (
                "it shares bytes with another name, or the file has no section headers to rule that out"
                if sp.capacity < 0
                else f"the slot holds {sp.capacity} bytes"
            )
            problems.append(
                f"{rel}: RUNPATH {sp.value!r} cannot be rewritten as {relative!r} nor {':'.join(mapped)!r} ({why})"
            )
    return [(sp.offset, sp.offset + max(sp.capacity, len(sp.value)) + 1) for sp in entries]


def rewrite_bytes(
    data: bytes,
    mode: str,
    *,
    rel: str,
    root: Path,
    old: str,
    new: str,
    build: str,
    problems: list[str],
    notes: list[str],
    fallback: bool = False,
    skipped: list[str] | None = None,
) -> bytes:
    """The relocated bytes of one file (unchanged bytes when it no longer holds `old`).

    Appends a message to `problems` for each part that cannot be rewritten, and to `notes` for each
    part kept as it is because it is harmless (see `_rewrite_cstrings`); a binary file whose format is
    not made of C strings (`cstring_format`) is returned unchanged, `rel` appended to `skipped`. Pure
    otherwise.
    """
    pattern = prefix_pattern(old)
    if mode == "text":
        data = _untrampoline(data, pattern)
    # Strings kept at an earlier relocation (fallback, debug info) still name the build prefix.
    stale = mode != "text" and build != old and prefix_pattern(build).search(data) is not None
    if pattern.search(data) is None and not stale:
        return data
    if mode == "text":
        out = pattern.sub(lambda _m: os.fsencode(new), data)
        try:
            return _shebang_fix(out, new, rel)
        except RelocationError as exc:
            problems.append(str(exc))
            return data
    if not cstring_format(data):  # a pickle, a zip: rewriting would shift length-prefixed data (audit62 M3)
        if skipped is not None:
            skipped.append(rel)
        return data
    buf = bytearray(data)
    ctx = _FileCtx(rel=rel, old=old, new=new, build=build, fallback=fallback)
    if elf.is_elf(buf):
        try:
            ctx.soft = elf.unmapped_ranges(buf)
        except elf.ElfError:
            pass
    if mode == "elf-runpath":
        ctx.skip = _rewrite_runpaths(buf, pattern, old, new, root, rel, problems)
    _rewrite_cstrings(buf, pattern, ctx, problems, notes)
    if stale:
        # Those kept strings get the new prefix as soon as it fits their (build-sized) slot.
        ctx.old = build
        _rewrite_cstrings(buf, prefix_pattern(build), ctx, problems, notes)
    return bytes(buf)


_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _linked_folder(root: Path, rel: str) -> UnsafeArchiveError:
    """The refusal for a file of the tree reached through a folder that is a symlink (or not a folder)."""
    here, where = Path(root), ""
    for part in rel.split("/")[:-1]:
        here, where = here / part, f"{where}/{part}" if where else part
        try:
            if not stat.S_ISDIR(os.lstat(here).st_mode):
                break
        except OSError:
            break
    return UnsafeArchiveError(
        f"cannot relocate {root}: its folder {where or '.'} (above {rel}) is a symlink or not a folder; "
        f"relocation never writes through it, nothing was changed",
        member=rel,
        path=str(here),
        hint=f"remove {here} and run `portable restore` again (the layer is extracted afresh)",
    )


def _parent_fd(dirs: DirFds, root: Path, rel: str) -> tuple[int, str] | None:
    """(fd of the folder holding `rel`, its last component), every folder opened without following a link.

    None when a folder is missing; UnsafeArchiveError (6) when one is a symlink or a file (audit45 F1).
    """
    try:
        return dirs.parent(rel)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _linked_folder(root, rel) from None
        return None


def _read_regular(dir_fd: int, base: str) -> tuple[bytes, os.stat_result] | None:
    """The bytes and stat of the regular file `base` in `dir_fd`; None for a link, a FIFO or another kind."""
    fh = open_regular(base, dir_fd=dir_fd)
    if fh is None:
        return None
    with fh:
        st = os.fstat(fh.fileno())
        return fh.read(), st


def _write_keeping_mode(
    dir_fd: int,
    base: str,
    shown: Path,
    data: bytes,
    st: os.stat_result,
    fsync: bool,
    tmp_dir: Path | None,
    tmp_fd: int | None = None,
) -> None:
    """Replace `base` in the folder `dir_fd` atomically with `data`, keeping its permission bits; the temp
    file is made in the folder fd `tmp_fd`, else in `tmp_dir` (same filesystem, outside the tree) when given, else
    beside the file. The rename names the folders by fd, so it never goes through a link put in a folder's place."""
    src_fd: int | None = None
    # A fixed-length temp name, not derived from `base`: any name the filesystem allows (up to NAME_MAX) gets its
    # temp, where `.{base}.<12 hex>.reloc` failed for names over NAME_MAX - 20 bytes (review65 L1).
    tmp = f".{secrets.token_hex(8)}.reloc"
    done = made = False
    try:
        # An *at call's error names the bare temp name (".<hex>.reloc"): named as the file rewritten, so the message
        # says where and gets its filesystem's free-space note (review65 S M2).
        with naming(shown):
            if tmp_fd is not None:
                src_fd = tmp_fd
                fd = os.open(tmp, _TMP_FLAGS, 0o600, dir_fd=tmp_fd)
            elif tmp_dir is not None:
                Path(tmp_dir).mkdir(parents=True, exist_ok=True)
                tmp = os.path.join(tmp_dir, tmp)
                fd = os.open(tmp, _TMP_FLAGS, 0o600)
            else:
                src_fd = dir_fd
                fd = os.open(tmp, _TMP_FLAGS, 0o600, dir_fd=dir_fd)
            made = True  # only a temp made here is removed below (never another's of the same name: O_EXCL)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                os.fchmod(fh.fileno(), stat.S_IMODE(st.st_mode))
                if fsync:
                    fh.flush()
                    os.fsync(fh.fileno())
            os.replace(tmp, base, src_dir_fd=src_fd, dst_dir_fd=dir_fd)
            done = True
    except OSError as exc:
        raise os_error(
            exc,
            f"{shown} for the new prefix",
            hint="free space or fix permissions, then run restore again (it resumes)",
        ) from None
    finally:
        if made and not done:
            try:
                os.unlink(tmp, dir_fd=src_fd)
            except OSError:
                pass


def _open_root(root: Path, base: Path | None) -> DirFds:
    """The folder fds of the tree at `root`, its own fd opened from `base` (a folder above it) without following a link
    when given: a symlink planted in a folder between them is refused (`swap.through_link`, exit 6), never followed."""
    try:
        if base is None:
            return DirFds(str(root))
        return DirFds(str(root), root_fd=open_below(base, root.relative_to(base).as_posix()))
    except OSError as exc:
        linked = exc.errno in (errno.ELOOP, errno.ENOTDIR)
        if base is not None and linked and exc.filename not in (str(base), str(root)):  # a folder above `root`
            from reproduction.release.swap import through_link

            raise through_link(base, root.relative_to(base).as_posix(), "layer target") from None
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeArchiveError(
                f"cannot relocate {root}: it is a symlink or not a folder; relocation never writes through it",
                path=str(root),
                hint=f"remove {root} and run `portable restore` again (the layer is extracted afresh)",
            ) from None
        raise RelocationError(
            f"cannot relocate {root}: {exc.strerror or exc}, nothing was changed",
            path=str(root),
            hint="the tree no longer matches the bundle: run `portable restore --deep` to re-extract it",
        ) from None


def _open_tmp(base: Path, tmp_dir: Path, parent_fd: int | None = None) -> int:
    """An O_PATH fd of `tmp_dir` (made if missing), reached from `base` without following a link (or, with `parent_fd`,
    by its name in that folder fd: restore's state folder, opened once): a symlink planted there (or above it) is
    UnsafeArchiveError (6), never a temp file written outside the bundle (audit65)."""
    rel = tmp_dir.relative_to(base).as_posix()
    try:
        parent, name = (os.dup(parent_fd), tmp_dir.name) if parent_fd is not None else open_parent(base, rel)
        try:
            with naming(tmp_dir):  # an *at call's error names the bare name: named in full (review65 S M2)
                try:
                    os.mkdir(name, dir_fd=parent)
                except FileExistsError:
                    pass
                return os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        finally:
            os.close(parent)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise os_error(
                exc, f"relocation's temp folder {tmp_dir}", hint="free space or fix permissions, then run restore again"
            ) from None
        above = exc.filename is not None and os.path.isabs(os.fsdecode(exc.filename))  # open_parent names a folder
        if above and os.fsdecode(exc.filename) not in (str(base), str(tmp_dir)):  # above it (`.portable`): named
            from reproduction.release.swap import through_link

            raise through_link(base, rel, "relocation's temp folder") from None
        raise UnsafeArchiveError(
            f"relocation's temp folder {rel} is a symlink or not a folder, which appeared while restore ran: refusing "
            "to restore through it",
            member=rel,
            path=str(tmp_dir),
            hint=f"remove {tmp_dir} (restore's own temporary state) and restore again; nothing outside the bundle was "
            "changed",
        ) from None


def relocate_tree(
    root: Path,
    occurrences: Sequence[PrefixOccurrence],
    old_prefix: str,
    new_prefix: str,
    *,
    build_prefix: str | None = None,
    fsync: bool = True,
    fallback_globs: Sequence[str] = FALLBACK_GLOBS,
    notes: list[str] | None = None,
    tmp_dir: Path | None = None,
    skipped: list[str] | None = None,
    base: Path | None = None,
    tmp_parent_fd: int | None = None,
) -> list[str]:
    """Rewrite the listed files below `root` from `old_prefix` to `new_prefix`; returns the paths changed.

    `root` must be where the tree now lives for good ($ORIGIN paths are computed from it).
    `old_prefix` is the prefix the tree was last relocated to (its build prefix the first time);
    `build_prefix` (default `old_prefix`) is the one it was packed at, which sizes binary slots.
    Every file is rewritten in memory first; if any cannot be (a binary string or RUNPATH that does
    not fit, a missing file, a long non-Python shebang) RelocationError lists them all and no file
    was modified; a folder on the way to a listed file that is a symlink or a file (or `root` itself)
    is UnsafeArchiveError (6) naming it, also before any file is touched (audit45 F1). Then each
    changed file is replaced atomically, mode kept. Same prefix: no-op.
    Files matching `fallback_globs` may keep a compiled-in fallback prefix that does not fit; each
    such case is appended to `notes` (when given) for the caller to show. `tmp_dir` (same filesystem as
    `root`, outside it) holds the temp files, so a kill mid-rewrite leaves no stray file in the tree.
    A listed binary file that is not ELF nor an `ar` archive is left as it is, still holding its prefix,
    and its path appended to `skipped` (when given) for the caller to name: its strings cannot be
    rewritten in place without corrupting it (audit62 M3).
    `base` (a folder above `root` and `tmp_dir`: restore's bundle) is where `root` and `tmp_dir` are reached from,
    one folder at a time without following a link, so a symlink planted in a folder between them after the swap is
    UnsafeArchiveError (6), never written through (audit65); without it they are opened by path. `tmp_parent_fd` (with
    `base`): the fd of `tmp_dir`'s folder (restore's `.portable`, opened once), `tmp_dir` made and opened in it.
    """
    root = Path(root)
    old, new = normalize_prefix(old_prefix, what="old prefix"), normalize_prefix(new_prefix, what="new prefix")
    build = normalize_prefix(build_prefix, what="build prefix") if build_prefix else old
    if old == new:
        return []
    modes = strongest_modes(occurrences)
    problems: list[str] = []
    kept: list[str] = []
    planned: list[tuple[str, bytes, os.stat_result]] = []
    dirs = _open_root(root, base)
    try:
        for rel, mode in sorted(modes.items()):
            found = _parent_fd(dirs, root, rel)
            try:
                read = None if found is None else _read_regular(*found)
            except OSError:
                read = None
            if read is None:
                problems.append(
                    f"{rel}: recorded as holding the prefix but missing (or not a regular file) under {root}"
                )
                continue
            data, st = read
            fallback = is_fallback(rel, fallback_globs)
            new_data = rewrite_bytes(
                data,
                mode,
                rel=rel,
                root=root,
                old=old,
                new=new,
                build=build,
                problems=problems,
                notes=kept,
                fallback=fallback,
                skipped=skipped,
            )
            if new_data != data:
                planned.append((rel, new_data, st))
    finally:
        dirs.close()
    if problems:
        shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
        hint = (
            # the room is in bytes: a non-ASCII prefix or path counted in characters misstated it (audit60 A3)
            f"restore to a folder whose layer path is at most {len(os.fsencode(build))} bytes long (UTF-8) "
            f"(the build prefix {build!r}), or pack from a tree built at a longer prefix"
        )
        if any("recorded as holding the prefix but missing" in p for p in problems):
            hint = "the tree no longer matches the bundle: run `portable restore --deep` to re-extract it"
        raise RelocationError(
            f"cannot relocate {root} from {old!r} to {new!r}: {len(problems)} problem(s), nothing was changed: {shown}",
            path=str(root),
            old_prefix=old,
            new_prefix=new,
            problems=problems,
            hint=hint,
        )
    dirs = _open_root(root, base)  # afresh: every folder is walked again, without following a link, as it is written
    tmp_fd = None
    try:
        if base is not None and tmp_dir is not None and planned:
            tmp_fd = _open_tmp(base, Path(tmp_dir), tmp_parent_fd)
        for rel, new_data, st in planned:
            found = _parent_fd(dirs, root, rel)
            if found is None:  # it was there a moment ago: something else is changing the tree
                raise RelocationError(
                    f"cannot relocate {root}: the folder of {rel} vanished while relocating",
                    path=str(root / rel),
                    hint="run `portable restore` again (it finishes the job)",
                )
            _write_keeping_mode(*found, root / rel, new_data, st, fsync, tmp_dir, tmp_fd)
    finally:
        dirs.close()
        if tmp_fd is not None:
            os.close(tmp_fd)
    if notes is not None:
        notes.extend(dict.fromkeys(kept))  # a string may be noted by both passes
    return [rel for rel, _, _ in planned]
