"""Read tar members (ustar, pax, GNU long names) from a decompressing stream, fast and strictly.

Python's `tarfile` costs ~10x `tar -x` per member and its extraction filters differ between patch
releases (3.10.12 / 3.11.4 / 3.12 changed them), so restore parses headers itself and decides what
is safe in reproduction/release/safety.py. Unknown member types are reported, never skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

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


def _number(field: bytes, where: str) -> int:
    if field[:1] in (b"\x80", b"\xff"):  # GNU base-256 (sizes over 8 GiB)
        value = int.from_bytes(field[1:], "big")
        return -value if field[:1] == b"\xff" else value
    text = field.split(b"\0", 1)[0].strip(b" \0")
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise UnsafeArchiveError(
            f"corrupt tar header field {where}: {field!r}", hint="the archive is damaged"
        ) from None


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _parse_pax(data: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos : pos + 1] not in (b"\0", b""):
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        record = data[space + 1 : pos + length - 1]  # drop the trailing newline
        key, _, value = record.partition(b"=")
        out[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


def normalise(name: str) -> str:
    """'./a//b/' -> 'a/b'; '.' -> ''. Leading '/' and '..' are kept for safety.py to refuse."""
    if not name or name in (".", "./"):
        return ""
    lead = "/" if name.startswith("/") else ""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    return lead + "/".join(parts)


class StreamSource:
    """Members of a tar read from a stream through one reusable window (no per-member allocation).

    `read_data` returns memoryviews into the window: use each before asking for more.
    """

    def __init__(self, stream: IO[bytes], window: int = 4 << 20) -> None:
        self.stream = stream
        self.buf = bytearray(window)
        self.view = memoryview(self.buf)
        self.start = self.end = 0
        self.left = 0  # bytes of the current member's data not yet consumed
        self.pad = 0  # padding after it

    def _fill(self, need: int) -> int:
        """Make at least `need` bytes available (fewer only at EOF); returns how many are."""
        avail = self.end - self.start
        if avail >= need:
            return avail
        if self.start:
            self.buf[:avail] = self.buf[self.start : self.end]
            self.start, self.end = 0, avail
        while self.end < need:
            n = self.stream.readinto(self.view[self.end :])
            if not n:
                break
            self.end += n
        return self.end - self.start

    def _take(self, n: int) -> bytes:
        if self._fill(n) < n:
            raise UnsafeArchiveError("tar archive is truncated", hint="the archive is damaged")
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
            raise UnsafeArchiveError("tar archive is truncated", hint="the archive is damaged")
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
                raise UnsafeArchiveError("tar archive is truncated", hint="the archive is damaged")
            take = min(avail, total)
            self.start += take
            total -= take

    def drain(self) -> None:
        """Read the stream to its end (so a hash of the compressed bytes is complete)."""
        self.start = self.end = 0
        while self.stream.readinto(self.view):
            pass


def iter_members(source: StreamSource, *, archive: str = "") -> Iterator[Member]:
    """Yield every member in order. Raises UnsafeArchiveError for corrupt or unsupported headers."""
    pax_global: dict[str, str] = {}
    pending: dict[str, str] = {}
    while True:
        block = source.header()
        if block is None or block == bytes(BLOCK):
            return
        stored, unsigned = _number(block[148:156], "chksum"), sum(block[:148]) + 256 + sum(block[156:])
        if stored != unsigned and stored != unsigned - 256 * sum(1 for b in block[:148] + block[156:] if b > 127):
            raise UnsafeArchiveError(
                f"{archive}: corrupt tar header (checksum mismatch)",
                archive=archive,
                hint="the archive is damaged; fetch the bundle again",
            )
        typeflag = block[156:157]
        size = _number(block[124:136], "size")
        if typeflag in (b"x", b"g", b"L", b"K"):
            payload = source.data(size)
            if typeflag == b"x":
                pending.update(_parse_pax(payload))
            elif typeflag == b"g":
                pax_global.update(_parse_pax(payload))
            else:
                pending["path" if typeflag == b"L" else "linkpath"] = payload.split(b"\0", 1)[0].decode(
                    "utf-8", "surrogateescape"
                )
            continue
        fields = {**pax_global, **pending}
        pending = {}
        name = _text(block[0:100])
        if block[257:262] == b"ustar" and block[345:346] != b"\0":
            name = _text(block[345:500]) + "/" + name
        name = fields.get("path", name)
        size = int(fields.get("size", size))
        kind = KINDS.get(typeflag)
        if kind is None:
            raise UnsafeArchiveError(
                f"{archive}: member {name!r} has unsupported tar type {typeflag!r}",
                archive=archive,
                member=name,
                hint="layers may hold only files, folders and symlinks",
            )
        member = Member(
            name=normalise(name),
            raw_name=name,
            kind=kind,
            mode=_number(block[100:108], "mode") & 0o7777,
            size=size if kind == "file" else 0,
            mtime=int(float(fields.get("mtime", _number(block[136:148], "mtime")))),
            linkname=fields.get("linkpath", _text(block[157:257])),
        )
        source.skip(member.size)
        yield member
