"""Read and rewrite an ELF file's DT_RUNPATH / DT_RPATH in place, with the stdlib `struct` only.

The search path is a NUL-terminated string in the dynamic string table (`.dynstr`). Rewriting
never moves anything: the new value must fit in the old string's slot, which is the string itself
plus the NUL bytes after it that no other dynamic entry, dynamic symbol or version record points
at (linkers merge string tails, so a byte of the slot may be the start of another name).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

ELF_MAGIC = b"\x7fELF"
PT_LOAD, PT_DYNAMIC = 1, 2
SHT_NULL, SHT_NOBITS, SHT_DYNSYM = 0, 8, 11
SHF_ALLOC = 2
DT_NULL, DT_NEEDED, DT_STRTAB, DT_SYMTAB, DT_STRSZ, DT_SONAME, DT_RPATH, DT_RUNPATH = 0, 1, 5, 6, 10, 14, 15, 29
DT_VERDEF, DT_VERDEFNUM, DT_VERNEED, DT_VERNEEDNUM = 0x6FFFFFFC, 0x6FFFFFFD, 0x6FFFFFFE, 0x6FFFFFFF
# Dynamic tags whose value is an offset into the dynamic string table.
_STRING_TAGS = {DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH, 0x7FFFFFFD, 0x7FFFFFFF, 0x6FFFFEFA, 0x6FFFFEFB, 0x6FFFFEFC}


class ElfError(ValueError):
    """The bytes are not an ELF file this module can edit (the message says why)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class SearchPath:
    """One DT_RUNPATH or DT_RPATH entry of a file."""

    tag: int
    """DT_RUNPATH (29) or DT_RPATH (15)."""
    value: str
    """The colon-separated search path."""
    offset: int
    """File offset of the string's first byte."""
    capacity: int
    """Longest value (in bytes, without its NUL) that can be written in place; -1: never rewrite
    (another name shares its bytes, or the file lacks the section headers to tell)."""


def is_elf(head: bytes) -> bool:
    """True when `head` (the first bytes of a file) starts with the ELF magic."""
    return head[:4] == ELF_MAGIC


class _Reader:
    """Field access for one ELF image: class (32/64 bit) and byte order taken from e_ident."""

    def __init__(self, data: bytes | bytearray) -> None:
        if len(data) < 52 or not is_elf(data):
            raise ElfError("not an ELF file")
        if data[4] not in (1, 2) or data[5] not in (1, 2):
            raise ElfError(f"unknown ELF class {data[4]} or byte order {data[5]}")
        self.data = data
        self.is64 = data[4] == 2
        self.end = "<" if data[5] == 1 else ">"
        self.word = "Q" if self.is64 else "I"

    def unpack(self, fmt: str, offset: int) -> tuple[int, ...]:
        fmt = self.end + fmt.replace("W", self.word)
        if offset < 0 or offset + struct.calcsize(fmt) > len(self.data):
            raise ElfError(f"truncated ELF file (field at offset {offset} past the end)")
        return struct.unpack_from(fmt, self.data, offset)

    def header(self) -> dict[str, int]:
        # e_phoff, e_shoff (words); e_phentsize, e_phnum, e_shentsize, e_shnum (halves)
        phoff, shoff = self.unpack("WW", 32 if self.is64 else 28)
        base = 54 if self.is64 else 42
        phentsize, phnum, shentsize, shnum = self.unpack("HHHH", base)
        return {
            "phoff": phoff,
            "shoff": shoff,
            "phentsize": phentsize,
            "phnum": phnum,
            "shentsize": shentsize,
            "shnum": shnum,
        }

    def program_headers(self) -> list[tuple[int, int, int, int]]:
        """(p_type, p_offset, p_vaddr, p_filesz) of every program header."""
        h = self.header()
        out = []
        for i in range(h["phnum"]):
            at = h["phoff"] + i * h["phentsize"]
            if self.is64:
                p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = self.unpack("IIQQQQ", at)
            else:
                p_type, p_offset, p_vaddr, _paddr, p_filesz = self.unpack("IIIII", at)
            out.append((p_type, p_offset, p_vaddr, p_filesz))
        return out

    def to_offset(self, vaddr: int) -> int:
        for p_type, p_offset, p_vaddr, p_filesz in self.program_headers():
            if p_type == PT_LOAD and p_vaddr <= vaddr < p_vaddr + p_filesz:
                return vaddr - p_vaddr + p_offset
        raise ElfError(f"address {vaddr:#x} is in no loadable segment")

    def dynamic(self) -> list[tuple[int, int]]:
        """(d_tag, d_val) of the dynamic section, up to DT_NULL; [] for a static file."""
        for p_type, p_offset, _vaddr, p_filesz in self.program_headers():
            if p_type == PT_DYNAMIC:
                size = 16 if self.is64 else 8
                entries = []
                for at in range(p_offset, p_offset + p_filesz - size + 1, size):
                    tag, val = self.unpack("WW", at)
                    if tag == DT_NULL:
                        break
                    entries.append((tag, val))
                return entries
        return []


def _sections(r: _Reader) -> list[tuple[int, int, int, int, int]]:
    """(sh_type, sh_flags, sh_offset, sh_size, sh_entsize) of every section header (none when stripped of them)."""
    h = r.header()
    out = []
    for i in range(h["shnum"] if h["shoff"] else 0):
        at = h["shoff"] + i * h["shentsize"]
        if r.is64:
            _name, sh_type, flags, _addr, offset, size, _link, _info, _align, entsize = r.unpack("IIQQQQIIQQ", at)
        else:
            _name, sh_type, flags, _addr, offset, size, _link, _info, _align, entsize = r.unpack("IIIIIIIIII", at)
        out.append((sh_type, flags, offset, size, entsize))
    return out


def unmapped_ranges(data: bytes | bytearray) -> list[tuple[int, int]]:
    """File byte ranges of sections the loader never maps (debug info, .symtab/.strtab, .comment)."""
    return [
        (offset, offset + size)
        for sh_type, flags, offset, size, _ in _sections(_Reader(data))
        if sh_type not in (SHT_NULL, SHT_NOBITS) and not flags & SHF_ALLOC
    ]


def _referenced_offsets(r: _Reader, dyn: list[tuple[int, int]], strsz: int) -> set[int] | None:
    """Offsets into .dynstr used by anything but the search paths themselves.

    None when the file has dynamic symbols but no section header saying where they are (sstrip):
    then nobody can tell which bytes other names share.
    """
    refs = {val for tag, val in dyn if tag in _STRING_TAGS and tag not in (DT_RPATH, DT_RUNPATH)}
    symtabs = [s for s in _sections(r) if s[0] == SHT_DYNSYM]
    if not symtabs and any(tag == DT_SYMTAB for tag, _ in dyn):
        return None
    for _type, _flags, sh_offset, sh_size, sh_entsize in symtabs:
        if sh_entsize < 16 or sh_offset + sh_size > len(r.data):
            raise ElfError(f"dynamic symbol table at {sh_offset} (size {sh_size}, entry {sh_entsize}) is malformed")
        for sym in range(sh_offset, sh_offset + sh_size - sh_entsize + 1, sh_entsize):
            refs.add(r.unpack("I", sym)[0])  # st_name is the first field in both classes
    tags = dict(dyn)
    if DT_VERNEED in tags:
        at = r.to_offset(tags[DT_VERNEED])
        for _ in range(tags.get(DT_VERNEEDNUM, 0)):
            _ver, cnt, vn_file, vn_aux, vn_next = r.unpack("HHIII", at)
            refs.add(vn_file)
            aux = at + vn_aux
            for _ in range(cnt):
                _hash, _flags, _other, vna_name, vna_next = r.unpack("IHHII", aux)
                refs.add(vna_name)
                aux += vna_next
            if not vn_next:
                break
            at += vn_next
    if DT_VERDEF in tags:
        at = r.to_offset(tags[DT_VERDEF])
        for _ in range(tags.get(DT_VERDEFNUM, 0)):
            _ver, _flags, _ndx, cnt, _hash, vd_aux, vd_next = r.unpack("HHHHIII", at)
            aux = at + vd_aux
            for _ in range(cnt):
                vda_name, vda_next = r.unpack("II", aux)
                refs.add(vda_name)
                aux += vda_next
            if not vd_next:
                break
            at += vd_next
    return {ref for ref in refs if 0 <= ref < strsz}


def search_paths(data: bytes | bytearray) -> list[SearchPath]:
    """The DT_RUNPATH/DT_RPATH entries of an ELF image, with the room each has for a rewrite.

    Raises ElfError for a file that is not ELF or whose tables point outside it.
    """
    r = _Reader(data)
    dyn = r.dynamic()
    tags = dict(dyn)
    if DT_STRTAB not in tags or not any(tag in (DT_RPATH, DT_RUNPATH) for tag, _ in dyn):
        return []
    strtab = r.to_offset(tags[DT_STRTAB])
    strsz = tags.get(DT_STRSZ, len(data) - strtab)
    if strtab + strsz > len(data):
        raise ElfError("dynamic string table runs past the end of the file")
    refs = _referenced_offsets(r, dyn, strsz)
    out = []
    for tag, val in dyn:
        if tag not in (DT_RPATH, DT_RUNPATH):
            continue
        start = strtab + val
        nul = data.find(b"\0", start, strtab + strsz) if val < strsz else -1
        if nul < 0:
            raise ElfError("search path string lies outside the string table or is not NUL-terminated")
        if refs is None or any(val < ref <= val + (nul - start) for ref in refs):
            capacity = -1  # another name shares (or may share) this string's tail: never rewrite it
        else:
            end = nul
            while end + 1 < strtab + strsz and data[end + 1] == 0 and (end + 1 - strtab) not in refs:
                end += 1
            capacity = end - start
        out.append(
            SearchPath(
                tag=tag,
                value=bytes(data[start:nul]).decode("utf-8", "surrogateescape"),
                offset=start,
                capacity=capacity,
            )
        )
    return out


def set_search_path(data: bytearray, entry: SearchPath, value: str) -> None:
    """Overwrite `entry`'s string in `data` with `value`, NUL-padding the rest of its slot.

    Raises ElfError (and leaves `data` unchanged) when `value` does not fit the slot.
    """
    raw = value.encode("utf-8", "surrogateescape")
    if entry.capacity < 0:
        raise ElfError("the search path shares bytes with another name in .dynstr")
    if len(raw) > entry.capacity or b"\0" in raw:
        raise ElfError(f"new search path is {len(raw)} bytes, the slot holds {entry.capacity}")
    data[entry.offset : entry.offset + entry.capacity + 1] = raw + b"\0" * (entry.capacity + 1 - len(raw))
