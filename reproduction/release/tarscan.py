"""Read tar headers (ustar, pax, GNU long names) from a buffer or a stream, fast and strictly.

Python's `tarfile` costs ~10x `tar -x` per member and its extraction filters differ between patch
releases (3.10.12 / 3.11.4 / 3.12 changed them), so restore parses headers itself and decides what
is safe in reproduction/release/safety.py. Unknown member types are reported, never skipped.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import IO, Iterator

from reproduction.errors import UnsafeArchiveError

BLOCK = 512
KINDS = {b"0": "file", b"\0": "file", b"7": "file", b"1": "hardlink", b"2": "symlink", b"3": "chardev",
         b"4": "blockdev", b"5": "dir", b"6": "fifo"}


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
    offset: int = 0
    """Offset of the data in the decompressed tar (buffer sources)."""

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
        raise UnsafeArchiveError(f"corrupt tar header field {where}: {field!r}", hint="the archive is damaged") from None


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _parse_pax(data: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos:pos + 1] not in (b"\0", b""):
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        record = data[space + 1:pos + length - 1]  # drop the trailing newline
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


class BufferSource:
    """Members of a tar held in memory; data stays in place (`Member.offset`)."""

    def __init__(self, buf: bytes | bytearray | memoryview) -> None:
        self.buf = memoryview(buf)
        self.pos = 0

    def header(self) -> bytes | None:
        block = bytes(self.buf[self.pos:self.pos + BLOCK])
        self.pos += BLOCK
        return block if len(block) == BLOCK else None

    def data(self, size: int) -> bytes:
        out = bytes(self.buf[self.pos:self.pos + size])
        self.pos += -(-size // BLOCK) * BLOCK
        return out

    def skip(self, size: int) -> int:
        start = self.pos
        self.pos += -(-size // BLOCK) * BLOCK
        if self.pos > len(self.buf) + BLOCK:  # allow a missing final padding block
            raise UnsafeArchiveError("tar archive is truncated (member data runs past the end)", hint="the archive is damaged")
        return start


class StreamSource:
    """Members of a tar read from a stream; the caller consumes each file's data (or it is skipped)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.left = 0  # bytes of the current member's data not yet consumed
        self.pad = 0  # padding after it

    def _read(self, n: int) -> bytes:
        chunks, left = [], n
        while left:
            chunk = self.stream.read(left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def header(self) -> bytes | None:
        self.discard()
        block = self._read(BLOCK)
        return block if len(block) == BLOCK else None

    def data(self, size: int) -> bytes:
        out = self._read(size)
        if len(out) != size:
            raise UnsafeArchiveError("tar archive is truncated", hint="the archive is damaged")
        self._read(-size % BLOCK)
        return out

    def skip(self, size: int) -> int:
        self.left, self.pad = size, -size % BLOCK
        return -1

    def read_data(self, n: int) -> bytes:
        """Read up to `n` bytes of the current member's data (for extraction)."""
        chunk = self._read(min(n, self.left))
        if not chunk and self.left:
            raise UnsafeArchiveError("tar archive is truncated", hint="the archive is damaged")
        self.left -= len(chunk)
        return chunk

    def discard(self) -> None:
        self.left += self.pad
        self.pad = 0
        while self.left:
            chunk = self._read(min(self.left, 1 << 20))
            if not chunk:
                raise UnsafeArchiveError("tar archive is truncated", hint="the archive is damaged")
            self.left -= len(chunk)


def iter_members(source: BufferSource | StreamSource, *, archive: str = "") -> Iterator[Member]:
    """Yield every member in order. Raises UnsafeArchiveError for corrupt or unsupported headers."""
    pax_global: dict[str, str] = {}
    pending: dict[str, str] = {}
    while True:
        block = source.header()
        if block is None or block == bytes(BLOCK):
            return
        stored, unsigned = _number(block[148:156], "chksum"), sum(block[:148]) + 256 + sum(block[156:])
        if stored != unsigned and stored != unsigned - 256 * sum(1 for b in block[:148] + block[156:] if b > 127):
            raise UnsafeArchiveError(f"{archive}: corrupt tar header (checksum mismatch)", archive=archive,
                                     hint="the archive is damaged; fetch the bundle again")
        typeflag = block[156:157]
        size = _number(block[124:136], "size")
        if typeflag in (b"x", b"g", b"L", b"K"):
            payload = source.data(size)
            if typeflag == b"x":
                pending.update(_parse_pax(payload))
            elif typeflag == b"g":
                pax_global.update(_parse_pax(payload))
            else:
                pending["path" if typeflag == b"L" else "linkpath"] = payload.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
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
            raise UnsafeArchiveError(f"{archive}: member {name!r} has unsupported tar type {typeflag!r}",
                                     archive=archive, member=name, hint="layers may hold only files, folders and symlinks")
        member = Member(name=normalise(name), raw_name=name, kind=kind, mode=_number(block[100:108], "mode") & 0o7777,
                        size=size if kind == "file" else 0, mtime=int(float(fields.get("mtime", _number(block[136:148], "mtime")))),
                        linkname=fields.get("linkpath", _text(block[157:257])))
        member.offset = source.skip(member.size) if member.size else 0
        yield member


def list_members(buf: bytes | bytearray | memoryview, *, archive: str = "") -> list[Member]:
    """All members of an in-memory tar, with data offsets."""
    return list(iter_members(BufferSource(buf), archive=archive))


def member_dirname(name: str) -> str:
    return posixpath.dirname(name)
