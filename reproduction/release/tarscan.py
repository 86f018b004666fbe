"""Read tar members (ustar, pax, GNU long names) from a decompressing stream, fast and strictly.

Python's `tarfile` costs ~10x `tar -x` per member and its extraction filters differ between patch
releases (3.10.12 / 3.11.4 / 3.12 changed them), so restore parses headers itself and decides what
is safe in reproduction/release/safety.py. Unknown member types are reported, never skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO
from zlib import adler32

from reproduction.errors import UnsafeArchiveError

BLOCK = 512
KINDS = {
    b"0": "file",
    b"\0": "file",
    b"7": "file",
    b"1": "hardlink",
    b"2": "symlink",
    b"3": "chardev",
    b"4": "blockdev",
    b"5": "dir",
    b"6": "fifo",
}


@dataclass(kw_only=True, slots=True)
class Member:
    """One archive member as restore needs it."""

    name: str
    """Normalised relative path ('' for the archive root '.'); validated later by safety.py."""
    raw_name: str
    """The name exactly as stored (for error messages)."""
    kind: str
    """'file', 'dir', 'symlink', 'hardlink', 'chardev', 'blockdev' or 'fifo'."""
    mode: int
    """Permission and special bits (st_mode & 0o7777)."""
    size: int
    """Data size in bytes (files only)."""
    mtime: int
    """Modification time, seconds since the epoch."""
    linkname: str = ""
    """Link text for symlinks and hard links."""

    def key(self) -> tuple:
        return (self.name, self.kind, self.mode, self.size, self.linkname)


def _corrupt(what: str, archive: str = "") -> UnsafeArchiveError:
    return UnsafeArchiveError(
        f"{archive + ': ' if archive else ''}corrupt tar header: {what}",
        archive=archive or None,
        hint="the archive is damaged or hostile; fetch the bundle again, or ask its publisher to re-pack it",
    )


def _number(field: bytes, where: str, archive: str = "") -> int:
    """A numeric header field (octal, or GNU base-256); a negative or unparsable value is corrupt."""
    if field[:1] in (b"\x80", b"\xff"):  # GNU base-256 (sizes over 8 GiB); 0xff marks a negative value
        if field[:1] == b"\xff":
            raise _corrupt(f"field {where} is negative", archive)
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip(b" \0")
    if text.strip(b"01234567"):  # int(..., 8) would also take '-', '+', '_' and inner spaces
        raise _corrupt(f"field {where} is {field!r}", archive)
    return int(text, 8) if text else 0


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


MAX_META = 1 << 20
"""Largest pax header or GNU long name accepted (real ones are a few hundred bytes)."""
RECORD = 10240
"""The record size tarfile and GNU tar pad an archive to (the bytes after its end-of-archive block)."""
MAX_TRAILER = 1 << 20
"""Most decompressed bytes accepted after the end-of-archive block: 100 records, room for any blocking factor."""
MEMBER_META = 16 << 10
"""Stream bytes one member may take besides its data where no tar_size bounds the stream: its header, a pax
header of path and linkpath (4095 bytes each) and a few more records, or GNU long names, and its data's padding."""
WINDOW = 4 << 20
"""StreamSource's read-ahead window."""
MAX_MTIME = (1 << 62) // 1_000_000_000
"""Largest |mtime| in seconds whose nanoseconds fit the int64 that utime takes."""


PAX_KEYS = frozenset((b"path", b"linkpath", b"size", b"mtime"))
"""The pax keys iter_members reads; the others (uid, uname, atime, xattrs, ...) are checked for form, then dropped."""
SPARSE = "GNU.sparse"
"""The key _parse_pax sets for a member carrying any `GNU.sparse.*` record (its value: GNU.sparse.name, else '')."""


def _parse_pax(data: bytes, archive: str = "") -> dict[str, str]:
    """Records `LEN key=value\\n`; every record must advance (LEN covers at least its own text).

    Only PAX_KEYS and SPARSE are kept, so a header's dict holds at most five keys whatever it carries: 'g'
    headers accumulate across the archive and are merged into every member's fields, and keeping
    every distinct key made that unbounded memory and quadratic time (audit45 F2).
    """
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        space = data.find(b" ", pos, pos + 20)
        digits = data[pos:space] if space > pos else b""
        if not digits or not digits.isdigit():
            raise _corrupt(f"pax record at offset {pos} has no length", archive)
        length = int(digits)
        end = pos + length
        if length <= len(digits) + 1 or end > len(data) or data[end - 1 : end] != b"\n":
            raise _corrupt(f"pax record at offset {pos} has a bad length {length}", archive)
        key, eq, value = data[space + 1 : end - 1].partition(b"=")
        if not eq or not key:
            raise _corrupt(f"pax record at offset {pos} is not key=value", archive)
        if key in PAX_KEYS:
            out[key.decode("ascii")] = value.decode("utf-8", "surrogateescape")
        elif key.startswith(b"GNU.sparse.") and (key == b"GNU.sparse.name" or SPARSE not in out):
            # GNU tar's pax sparse formats (0.x, 1.0): the data holds a sparse map, and format 1.0 stores the member
            # under GNUSparseFile.<pid>/, so dropping the keys restored the wrong file, exit 0 (audit63 A M3). One
            # key, SPARSE (the real name, if given), marks the member for iter_members to refuse.
            out[SPARSE] = value.decode("utf-8", "surrogateescape") if key == b"GNU.sparse.name" else ""
        pos = end
    return out


def _pax_size(value: str, archive: str) -> int:
    if not value.isdigit() or not value.isascii():
        raise _corrupt(f"pax size {value[:40]!r} is not a non-negative integer", archive)
    return int(value)


def _pax_mtime(value: str, archive: str) -> int:
    try:
        seconds = float(value)
    except ValueError:
        raise _corrupt(f"pax mtime {value[:40]!r} is not a number", archive) from None
    if not (abs(seconds) <= MAX_MTIME):  # also refuses nan and inf
        raise _corrupt(f"pax mtime {value[:40]!r} is out of range", archive)
    return int(seconds)


def stream_bound(files: int, members: int) -> int:
    """The most decompressed bytes a tar of `members` members whose files add up to `files` bytes needs.

    For a layer that declares no tar_size (audit45 F3: an archive of headers only was unbounded, since
    file sizes count no header): the files, MEMBER_META a member, the end-of-archive blocks and
    MAX_TRAILER, plus one WINDOW of read-ahead so that the checks made at each header (unpacked_size,
    free space, member count) refuse a stream first, with their own message.
    """
    return files + members * MEMBER_META + 2 * BLOCK + MAX_TRAILER + WINDOW


def normalise(name: str) -> str:
    """'./a//b/' -> 'a/b'; '.' -> ''. Leading '/' and '..' are kept for safety.py to refuse."""
    if name and name[0] not in "./" and name[-1] not in "/." and "//" not in name and "/." not in name:
        return name  # the common case, already normal (a plain relative path)
    if not name or name in (".", "./"):
        return ""
    lead = "/" if name.startswith("/") else ""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    return lead + "/".join(parts)


class StreamSource:
    """Members of a tar read from a stream through one reusable window (no per-member allocation).

    `read_data` returns memoryviews into the window: use each before asking for more.
    """

    def __init__(
        self, stream: IO[bytes], window: int = WINDOW, *, archive: str = "", limit: int = 0, bound: str = ""
    ) -> None:
        self.stream = stream
        self.buf = bytearray(window)
        self.view = memoryview(self.buf)
        self.start = self.end = 0
        self.left = 0  # bytes of the current member's data not yet consumed
        self.pad = 0  # padding after it
        self.archive = archive
        self.limit = limit  # the tar_size bundle.json declares, or stream_bound's (0: no bound but MAX_TRAILER's)
        self.bound = bound  # what `limit` is, when not the declared tar_size (for the message)
        self.total = 0  # decompressed bytes read from the stream so far

    def _read(self, view: memoryview) -> int:
        """One read from the stream into `view`, counted: past the declared tar_size is UnsafeArchiveError.

        Checked on every read (at most one window past the bound), so a stream longer than declared
        is refused while it streams, not after decompressing all of it. A stream SHORTER than
        tar_size is not refused: the size is an upper bound on work, and a short stream ends in a
        truncated-member error or a clean end-of-archive whose members the digest already pins.
        """
        n = self.stream.readinto(view) or 0
        self.total += n
        if self.limit and self.total > self.limit:
            raise UnsafeArchiveError(
                f"{self.archive}: decompresses to more than the {self.limit} bytes "
                f"{self.bound or 'bundle.json declares as its tar_size'}; nothing was changed",
                archive=self.archive,
                hint="do not use this bundle; ask its publisher to re-pack it with `portable pack`",
            )
        return n

    def _truncated(self) -> UnsafeArchiveError:
        return UnsafeArchiveError(
            f"{self.archive + ': ' if self.archive else ''}tar archive is truncated",
            archive=self.archive or None,
            hint="the archive is damaged",
        )

    def _fill(self, need: int) -> int:
        """Make at least `need` bytes available (fewer only at EOF); returns how many are."""
        avail = self.end - self.start
        if avail >= need:
            return avail
        if self.start:
            self.buf[:avail] = self.buf[self.start : self.end]
            self.start, self.end = 0, avail
        while self.end < need:
            n = self._read(self.view[self.end :])
            if not n:
                break
            self.end += n
        return self.end - self.start

    def _take(self, n: int) -> bytes:
        if self._fill(n) < n:
            raise self._truncated()
        out = bytes(self.view[self.start : self.start + n])
        self.start += n
        return out

    def header(self) -> bytes | None:
        self.discard()
        if self._fill(BLOCK) < BLOCK:
            return None
        return self._take(BLOCK)

    def data(self, size: int) -> bytes:
        out = b"".join(self._take(min(size - done, len(self.buf) // 2)) for done in range(0, size, len(self.buf) // 2))
        self.left, self.pad = 0, -size % BLOCK
        self.discard()
        return out

    def skip(self, size: int) -> int:
        self.left, self.pad = size, -size % BLOCK
        return -1

    def read_data(self, n: int) -> memoryview:
        """Up to `n` bytes of the current member's data (empty at its end)."""
        if not self.left:
            return self.view[0:0]
        avail = self._fill(1)
        if not avail:
            raise self._truncated()
        take = min(avail, self.left, n)
        out = self.view[self.start : self.start + take]
        self.start += take
        self.left -= take
        return out

    def discard(self) -> None:
        total, self.left, self.pad = self.left + self.pad, 0, 0
        while total:
            avail = self._fill(1)
            if not avail:
                raise self._truncated()
            take = min(avail, total)
            self.start += take
            total -= take

    def drain(self) -> None:
        """Read the stream to its end (so a hash of the compressed bytes is complete), after the end-of-archive.

        At most MAX_TRAILER decompressed bytes may follow what the parser consumed: more is
        UnsafeArchiveError (a bomb hidden past the end would otherwise be decompressed whole). On
        that error the stream is left unread; callers hash the file itself (sha256_file) to tell a
        damaged archive from a hostile one.
        """
        consumed = self.total - (self.end - self.start)
        self.start = self.end = 0
        while True:  # checked before each read too: what the window already holds counts (audit45 F6)
            if self.total - consumed > MAX_TRAILER:
                raise UnsafeArchiveError(
                    f"{self.archive}: more than {MAX_TRAILER} bytes follow the tar's end-of-archive block "
                    f"(tar pads to {RECORD} bytes); nothing was changed",
                    archive=self.archive,
                    hint="do not use this bundle; ask its publisher to re-pack it with `portable pack`",
                )
            if not self._read(self.view[: MAX_TRAILER + 1]):
                return


def _checksum_ok(block: bytes, stored: int) -> bool:
    """The header checksum (the chksum field counted as spaces), unsigned or signed (old tars).

    adler32's low half is 1 + the byte sum mod 65521; over 256 bytes the sum (<= 65280) never
    wraps, so two halves give the exact sum in C speed (a Python sum() over 512 bytes cost ~8 us).
    """
    total = (adler32(block[:256]) & 0xFFFF) + (adler32(block[256:]) & 0xFFFF) - 2
    unsigned = total - sum(block[148:156]) + 256
    if stored == unsigned:
        return True
    return stored == unsigned - 256 * sum(1 for b in block[:148] + block[156:] if b > 127)


def iter_members(source: StreamSource, *, archive: str = "") -> Iterator[Member]:
    """Yield every member in order. Raises UnsafeArchiveError for corrupt or unsupported headers."""
    pax_global: dict[str, str] = {}
    pending: dict[str, str] = {}
    numbers: dict[bytes, int] = {}  # mode and mtime fields repeat: parse each distinct field once
    zero = bytes(BLOCK)
    while True:
        block = source.header()
        if block is None or block == zero:
            return
        if not _checksum_ok(block, _number(block[148:156], "chksum", archive)):
            raise UnsafeArchiveError(
                f"{archive}: corrupt tar header (checksum mismatch)",
                archive=archive,
                hint="the archive is damaged; fetch the bundle again",
            )
        typeflag = block[156:157]
        size = _number(block[124:136], "size", archive)
        if typeflag in (b"x", b"g", b"L", b"K"):
            if size > MAX_META:
                raise _corrupt(f"a {typeflag.decode('latin-1')!r} header of {size} bytes", archive)
            payload = source.data(size)
            if typeflag == b"x":
                pending.update(_parse_pax(payload, archive))
            elif typeflag == b"g":
                pax_global.update(_parse_pax(payload, archive))
            else:
                pending["path" if typeflag == b"L" else "linkpath"] = payload.split(b"\0", 1)[0].decode(
                    "utf-8", "surrogateescape"
                )
            continue
        fields = {**pax_global, **pending} if pax_global or pending else pending
        pending = {}
        name = _text(block[0:100])
        if block[257:262] == b"ustar" and block[345:346] != b"\0":
            name = _text(block[345:500]) + "/" + name
        name = fields.get("path", name)
        size = _pax_size(fields["size"], archive) if "size" in fields else size
        kind = KINDS.get(typeflag)
        if typeflag == b"S" or SPARSE in fields:  # old GNU sparse type, or GNU tar's pax sparse records
            name = fields.get(SPARSE) or name
            raise UnsafeArchiveError(
                f"{archive}: member {name!r} is a sparse file (GNU tar --sparse), an unsupported tar type",
                archive=archive,
                member=name,
                hint="layers may hold only files, folders and symlinks",
            )
        if kind is None:
            raise UnsafeArchiveError(
                f"{archive}: member {name!r} has unsupported tar type {typeflag!r}",
                archive=archive,
                member=name,
                hint="layers may hold only files, folders and symlinks",
            )
        raw_mode, raw_mtime = block[100:108], block[136:148]
        mode = numbers.get(raw_mode)
        if mode is None:
            mode = numbers[raw_mode] = _number(raw_mode, "mode", archive) & 0o7777
        if "mtime" in fields:
            mtime = _pax_mtime(fields["mtime"], archive)
        else:
            mtime = numbers.get(raw_mtime)
            if mtime is None:
                mtime = numbers[raw_mtime] = _pax_mtime(str(_number(raw_mtime, "mtime", archive)), archive)
        member = Member(
            name=normalise(name),
            raw_name=name,
            kind=kind,
            mode=mode,
            size=size if kind == "file" else 0,
            mtime=mtime,
            linkname=fields["linkpath"] if "linkpath" in fields else _text(block[157:257]),
        )
        source.skip(member.size)
        yield member
