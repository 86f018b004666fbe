"""relocate.py and elf.py: scanning a tree for its build prefix and rewriting it, repeatably."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from reproduction.errors import RelocationError
from reproduction.release import elf
from reproduction.release.manifest import PrefixOccurrence
from reproduction.release.relocate import SHEBANG_MAX, relocate_tree, scan_prefixes, scan_tree

GCC = shutil.which("gcc")
needs_gcc = pytest.mark.skipif(GCC is None, reason="gcc not installed")


def _tree(root: Path, prefix: str) -> None:
    """A small tree built 'at' prefix: text with and without the prefix, a binary C string, bytecode."""
    (root / "bin").mkdir(parents=True)
    (root / "lib").mkdir()
    (root / "bin" / "tool").write_text(f"#!{prefix}/bin/python3\nimport sys\nHOME = '{prefix}'\n")
    (root / "bin" / "tool").chmod(0o755)
    (root / "lib" / "conf.pc").write_text(f"prefix={prefix}\nlibdir={prefix}/lib\nother={prefix}x/lib\n")
    # ELF-like (its magic): only a format made of C strings is rewritten in place (audit62 M3)
    (root / "lib" / "data.bin").write_bytes(b"\x7fELF\0" + f"{prefix}/lib/python3.11\0".encode() + b"\xffTAIL\0")
    (root / "lib" / "plain.txt").write_text("nothing to see\n")
    (root / "lib" / "mod.cpython-311.pyc").write_bytes(b"\x00\x01" + prefix.encode() + b"\0")
    os.symlink("tool", root / "bin" / "tool-link")


def test_scan_finds_each_kind_and_skips_the_rest(tmp_path: Path) -> None:
    prefix = str(tmp_path / "build")
    _tree(tmp_path / "build", prefix)
    found = scan_tree(tmp_path / "build", prefix + "/")
    assert found == [
        PrefixOccurrence(path="bin/tool", mode="text"),
        PrefixOccurrence(path="lib/conf.pc", mode="text"),
        PrefixOccurrence(path="lib/data.bin", mode="binary"),
    ]


def test_prefix_matches_whole_paths_only(tmp_path: Path) -> None:
    root = tmp_path / "t"
    root.mkdir()
    (root / "a.txt").write_text("/opt/python/lib /opt/py-old /opt/pyz\n")
    (root / "b.txt").write_text("x=/opt/py\n")
    assert scan_tree(root, "/opt/py") == [PrefixOccurrence(path="b.txt", mode="text")]


def test_a_longer_path_ending_in_the_prefix_is_left_alone(tmp_path: Path) -> None:
    """audit58 A3: `/srv/opt/py/lib` is another path; it was scanned as the prefix and rewritten, text and binary."""
    prefix = "/opt/" + "p" * 60
    root = tmp_path / "t"
    root.mkdir()
    (root / "only-longer.txt").write_text(f"c=/srv{prefix}/lib\nd=/home/u{prefix}\ne=x{prefix}\n")
    (root / "only-longer.bin").write_bytes(b"\x7fELF\0" + f"/srv{prefix}/lib\0".encode())
    text = f"a={prefix}/lib\nc=/srv{prefix}/lib\nu=file://{prefix}/lib\nq='{prefix}'\np=/a:{prefix}/bin\n"
    text += f"f='-L{prefix}/lib -I{prefix}/include a-L{prefix}'\nw='.{prefix}' x.{prefix}\n"  # review58 R1
    (root / "cfg.txt").write_text(text)
    (root / "b.bin").write_bytes(b"\x7fELF\0" + f"{prefix}/lib\0/srv{prefix}/lib\0".encode())
    found = scan_tree(root, prefix)
    assert found == [PrefixOccurrence(path="b.bin", mode="binary"), PrefixOccurrence(path="cfg.txt", mode="text")]
    new = "/new/place"  # shorter than the build prefix: the binary slot fits it
    assert relocate_tree(root, found, prefix, new, fsync=False) == ["b.bin", "cfg.txt"]
    assert (root / "cfg.txt").read_text() == (
        f"a={new}/lib\nc=/srv{prefix}/lib\nu=file://{new}/lib\nq='{new}'\np=/a:{new}/bin\n"
        f"f='-L{new}/lib -I{new}/include a-L{prefix}'\nw='.{new}' x.{prefix}\n"
    )
    slot = len(f"{prefix}/lib")
    assert (root / "b.bin").read_bytes() == (
        b"\x7fELF\0" + f"{new}/lib".encode().ljust(slot, b"\0") + b"\0" + f"/srv{prefix}/lib\0".encode()
    )
    assert (root / "only-longer.txt").read_text() == f"c=/srv{prefix}/lib\nd=/home/u{prefix}\ne=x{prefix}\n"


def test_text_any_length_keeps_mode_and_other_paths(tmp_path: Path) -> None:
    old = str(tmp_path / "build")
    _tree(tmp_path / "build", old)
    occ = [o for o in scan_tree(tmp_path / "build", old) if o.mode == "text"]
    new = "/srv/a/much/longer/place/than/the/build/prefix/ever/was"
    changed = relocate_tree(tmp_path / "build", occ, old, new, fsync=False)
    assert changed == ["bin/tool", "lib/conf.pc"]
    pc = (tmp_path / "build" / "lib" / "conf.pc").read_text()
    assert pc == f"prefix={new}\nlibdir={new}/lib\nother={old}x/lib\n"
    assert (tmp_path / "build" / "bin" / "tool").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "build" / "bin" / "tool").read_text().startswith(f"#!{new}/bin/python3\n")


def test_binary_shorter_is_nul_padded_and_longer_is_refused_untouched(tmp_path: Path) -> None:
    old = str(tmp_path / "build")
    _tree(tmp_path / "build", old)
    root = tmp_path / "build"
    occ = scan_tree(root, old)
    before = {p: (root / p).read_bytes() for p in ("bin/tool", "lib/conf.pc", "lib/data.bin")}
    too_long = old + "/and/more"
    with pytest.raises(RelocationError) as info:
        relocate_tree(root, occ, old, too_long)
    err = info.value
    assert err.exit_code == 9
    assert "lib/data.bin" in str(err) and repr(old) in str(err) and repr(too_long) in str(err)
    assert "nothing was changed" in str(err)
    assert {p: (root / p).read_bytes() for p in before} == before  # text files were not rewritten either
    short = "/s"
    relocate_tree(root, occ, old, short, fsync=False)
    data = (root / "lib" / "data.bin").read_bytes()
    assert len(data) == len(before["lib/data.bin"])
    pad = len(old) - len(short)
    assert data == b"\x7fELF\0" + b"/s/lib/python3.11" + b"\0" * (pad + 1) + b"\xffTAIL\0"


def test_repeated_relocation_matches_direct_and_uses_the_build_slot(tmp_path: Path) -> None:
    a = str(tmp_path / "aaaaaaaaaaaaaaaaaaaa")
    _tree(tmp_path / "one", a)
    _tree(tmp_path / "two", a)
    occ = scan_tree(tmp_path / "one", a)
    b, c = "/b", a[:-3] + "ccc"  # B much shorter than A, C as long as A: only fits with the build slot
    relocate_tree(tmp_path / "one", occ, a, b, build_prefix=a, fsync=False)
    relocate_tree(tmp_path / "one", occ, b, c, build_prefix=a, fsync=False)
    relocate_tree(tmp_path / "two", occ, a, c, build_prefix=a, fsync=False)
    for rel in ("bin/tool", "lib/conf.pc", "lib/data.bin"):
        assert (tmp_path / "one" / rel).read_bytes() == (tmp_path / "two" / rel).read_bytes(), rel
    # Without the build prefix B's slot is only as long as B: refused, nothing changed.
    with pytest.raises(RelocationError):
        relocate_tree(tmp_path / "one", occ, c, c + "x", build_prefix=a)
    assert relocate_tree(tmp_path / "one", occ, c, c) == []


def test_relocation_cut_short_can_be_run_again(tmp_path: Path) -> None:
    old = str(tmp_path / "build")
    _tree(tmp_path / "build", old)
    _tree(tmp_path / "ref", old)
    occ = scan_tree(tmp_path / "build", old)
    relocate_tree(tmp_path / "build", occ[:1], old, "/new/p", fsync=False)  # as if killed after one file
    relocate_tree(tmp_path / "build", occ, old, "/new/p", fsync=False)
    relocate_tree(tmp_path / "ref", occ, old, "/new/p", fsync=False)
    for o in occ:
        assert (tmp_path / "build" / o.path).read_bytes() == (tmp_path / "ref" / o.path).read_bytes()


def test_missing_recorded_file_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "r"
    root.mkdir()
    (root / "a.txt").write_text("/old/p\n")
    occ = [PrefixOccurrence(path="a.txt", mode="text"), PrefixOccurrence(path="gone.txt", mode="text")]
    with pytest.raises(RelocationError, match="gone.txt") as info:
        relocate_tree(root, occ, "/old/p", "/new/p")
    assert "restore --deep" in info.value.hint
    assert (root / "a.txt").read_text() == "/old/p\n"


def test_long_python_shebang_becomes_sh_trampoline_that_runs(tmp_path: Path) -> None:
    old = "/old/prefix"
    root = tmp_path / "r"
    (root / "bin").mkdir(parents=True)
    script = root / "bin" / "hello"
    script.write_text(f"#!{old}/bin/python -s\nimport sys\nprint('hello', sys.flags.no_user_site)\n")
    script.chmod(0o755)
    new = str(tmp_path / ("d" * 60) / ("e" * 60))
    (Path(new) / "bin").mkdir(parents=True)
    os.symlink(sys.executable, Path(new) / "bin" / "python")
    assert len(f"#!{new}/bin/python -s") > SHEBANG_MAX
    assert relocate_tree(root, scan_tree(root, old), old, new, fsync=False) == ["bin/hello"]
    text = script.read_text()
    assert text.startswith("#!/bin/sh\n'''exec' ") and f"{new}/bin/python" in text
    out = subprocess.run([str(script)], capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout == "hello 1\n"


def test_long_non_python_shebang_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "r"
    root.mkdir()
    (root / "run.sh").write_text("#!/old/p/bin/bash\necho hi\n")
    with pytest.raises(RelocationError, match="run.sh.*not Python"):
        relocate_tree(root, scan_tree(root, "/old/p"), "/old/p", "/" + "x" * 130)
    assert (root / "run.sh").read_text() == "#!/old/p/bin/bash\necho hi\n"


def _build_elf_tree(root: Path, prefix: str, src: Path, dtags: str = "--enable-new-dtags") -> None:
    """prefix/lib/libgreet.so and prefix/bin/greet, both with RUNPATH (or RPATH) prefix/lib, absolute."""
    (root / "lib").mkdir(parents=True)
    (root / "bin").mkdir()
    src.mkdir(exist_ok=True)
    (src / "greet.c").write_text(f'const char *where = "{prefix}/share";\nconst char *greet(void) {{ return "hi"; }}\n')
    (src / "main.c").write_text(
        "#include <stdio.h>\nconst char *greet(void);\nint main(void) { puts(greet()); return 0; }\n"
    )
    flags = [f"-Wl,-rpath,{prefix}/lib", f"-Wl,{dtags}"]
    subprocess.run(
        [GCC, "-shared", "-fPIC", "-o", str(root / "lib" / "libgreet.so"), str(src / "greet.c"), *flags],
        check=True,
        timeout=120,
    )
    subprocess.run(
        [GCC, "-o", str(root / "bin" / "greet"), str(src / "main.c"), f"-L{root / 'lib'}", "-lgreet", *flags],
        check=True,
        timeout=120,
    )


@needs_gcc
def test_elf_runpath_becomes_origin_relative_and_survives_moves(tmp_path: Path) -> None:
    build = tmp_path / "build"
    _build_elf_tree(build, str(build), tmp_path / "src")
    occ = scan_tree(build, str(build))
    assert occ == [
        PrefixOccurrence(path="bin/greet", mode="elf-runpath"),
        PrefixOccurrence(path="lib/libgreet.so", mode="elf-runpath"),
    ]
    exe_runpath = elf.search_paths((build / "bin" / "greet").read_bytes())
    assert [(p.tag, p.value) for p in exe_runpath] == [(elf.DT_RUNPATH, f"{build}/lib")]

    moved = tmp_path / ("somewhere-much-longer-than-the-build-prefix-" * 2) / "tree"
    moved.parent.mkdir()
    shutil.move(build, moved)
    env = {"PATH": "/usr/bin:/bin"}
    broken = subprocess.run([str(moved / "bin" / "greet")], capture_output=True, timeout=60, env=env)
    assert broken.returncode != 0  # proves the absolute RUNPATH is what the loader used
    with pytest.raises(RelocationError, match="libgreet.so.*C string"):  # "<prefix>/share" cannot grow
        relocate_tree(moved, occ, str(build), str(moved))
    assert elf.search_paths((moved / "bin" / "greet").read_bytes())[0].value == f"{build}/lib"  # untouched

    short = tmp_path / "s"
    shutil.move(moved, short)
    assert sorted(relocate_tree(short, occ, str(build), str(short), fsync=False)) == ["bin/greet", "lib/libgreet.so"]
    assert elf.search_paths((short / "bin" / "greet").read_bytes())[0].value == "$ORIGIN/../lib"
    assert elf.search_paths((short / "lib" / "libgreet.so").read_bytes())[0].value == "$ORIGIN"
    assert str(build).encode() not in (short / "lib" / "libgreet.so").read_bytes()
    ok = subprocess.run([str(short / "bin" / "greet")], capture_output=True, text=True, timeout=60, env=env)
    assert (ok.returncode, ok.stdout) == (0, "hi\n")
    if shutil.which("readelf"):
        dyn = subprocess.run(
            ["readelf", "-d", str(short / "bin" / "greet")], capture_output=True, text=True, timeout=60
        )
        assert "Library runpath: [$ORIGIN/../lib]" in dyn.stdout

    again = tmp_path / "t"
    shutil.move(short, again)
    # Only the C string still names a prefix; the RUNPATH is $ORIGIN and is left alone.
    assert relocate_tree(again, occ, str(short), str(again), build_prefix=str(build), fsync=False) == [
        "lib/libgreet.so"
    ]
    ok = subprocess.run([str(again / "bin" / "greet")], capture_output=True, text=True, timeout=60, env=env)
    assert (ok.returncode, ok.stdout) == (0, "hi\n")


@needs_gcc
def test_runpath_into_another_tree_is_made_relative_to_it(tmp_path: Path) -> None:
    """A venv's copied python names the interpreter's lib/: the RUNPATH points across trees."""
    interp_old = tmp_path / "interp"
    _build_elf_tree(interp_old, str(interp_old), tmp_path / "src")
    venv = tmp_path / "b" / "venv"
    (venv / "bin").mkdir(parents=True)
    shutil.copy2(interp_old / "bin" / "greet", venv / "bin" / "greet")
    found = scan_prefixes(venv, [str(interp_old)])
    occ = found[str(interp_old)]
    assert occ == [PrefixOccurrence(path="bin/greet", mode="elf-runpath")]
    interp_new = tmp_path / "b" / "in"  # shorter than interp_old: libgreet's C string must fit
    shutil.move(interp_old, interp_new)
    relocate_tree(interp_new, scan_tree(interp_new, str(interp_old)), str(interp_old), str(interp_new), fsync=False)
    assert relocate_tree(venv, occ, str(interp_old), str(interp_new), fsync=False) == ["bin/greet"]
    assert elf.search_paths((venv / "bin" / "greet").read_bytes())[0].value == "$ORIGIN/../../in/lib"
    ok = subprocess.run([str(venv / "bin" / "greet")], capture_output=True, text=True, timeout=60, env={"PATH": "/bin"})
    assert (ok.returncode, ok.stdout) == (0, "hi\n")


def test_elf_reader_rejects_garbage() -> None:
    with pytest.raises(elf.ElfError):
        elf.search_paths(b"\x7fELF" + b"\x02\x01" + b"\0" * 10)
    assert elf.search_paths(Path("/bin/sh").resolve().read_bytes()) == []  # no RUNPATH at all


def test_scan_skip_prunes_folders_and_files(tmp_path: Path) -> None:
    old = str(tmp_path / "build")
    _tree(tmp_path / "build", old)
    seen: list[str] = []

    def skip(rel: str) -> bool:
        seen.append(rel)
        return rel == "lib" or rel.endswith(".pc")

    assert scan_tree(tmp_path / "build", old, skip=skip) == [PrefixOccurrence(path="bin/tool", mode="text")]
    assert "lib/conf.pc" not in seen  # the folder was pruned, its files never looked at


@needs_gcc
def test_debug_info_strings_fit_or_are_kept_but_loaded_strings_must_fit(tmp_path: Path) -> None:
    build = tmp_path / "build"
    (build / "include").mkdir(parents=True)
    (build / "lib").mkdir()
    (build / "include" / "k.h").write_text("static inline int k(void) { return 7; }\n")
    (build / "k.c").write_text('#include "k.h"\nint kk(void) { return k(); }\n')
    so = build / "lib" / "libk.so"
    subprocess.run(
        [GCC, "-g", "-shared", "-fPIC", f"-I{build}/include", "-o", str(so), str(build / "k.c")],
        check=True,
        timeout=120,
        cwd=build,
    )
    assert scan_tree(build, str(build)) == [PrefixOccurrence(path="lib/libk.so", mode="binary")]
    occ = [PrefixOccurrence(path="lib/libk.so", mode="binary")]
    original = so.read_bytes()
    notes: list[str] = []
    longer = str(build) + "/much/longer"
    assert relocate_tree(build, occ, str(build), longer, notes=notes) == []
    assert notes and all("never maps (debug info)" in n for n in notes)
    assert so.read_bytes() == original
    shorter = str(tmp_path / "s")
    assert relocate_tree(build, occ, str(build), shorter, fsync=False) == ["lib/libk.so"]
    data = so.read_bytes()
    assert len(data) == len(original) and str(build).encode() not in data and shorter.encode() in data


@needs_gcc
def test_kept_debug_strings_catch_up_when_a_later_prefix_fits(tmp_path: Path) -> None:
    build = tmp_path / "build"
    (build / "lib").mkdir(parents=True)
    (build / "k.c").write_text("int kk(void) { return 7; }\n")
    so = build / "lib" / "libk.so"
    subprocess.run(
        [GCC, "-g", "-shared", "-fPIC", "-o", str(so), str(build / "k.c")], check=True, timeout=120, cwd=build
    )
    occ = scan_tree(build, str(build))
    longer = str(tmp_path / ("x" * 80))
    relocate_tree(build, occ, str(build), longer, build_prefix=str(build), fsync=False)
    assert str(build).encode() in so.read_bytes()  # kept: the loader never maps debug info
    shorter = str(tmp_path / "s")
    assert relocate_tree(build, occ, longer, shorter, build_prefix=str(build), fsync=False) == ["lib/libk.so"]
    data = so.read_bytes()
    assert str(build).encode() not in data and shorter.encode() in data


def test_big_files_are_scanned_through_mmap_with_the_same_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reproduction.release import relocate

    old = str(tmp_path / "build")
    _tree(tmp_path / "build", old)
    expected = scan_tree(tmp_path / "build", old)
    monkeypatch.setattr(relocate, "MMAP_OVER", 0)
    assert scan_tree(tmp_path / "build", old) == expected


@needs_gcc
def test_old_style_rpath_is_rewritten_too(tmp_path: Path) -> None:
    build = tmp_path / "build"
    _build_elf_tree(build, str(build), tmp_path / "src", dtags="--disable-new-dtags")
    (build / "lib" / "libgreet.so").unlink()  # keep only the executable; rebuild the lib without the C string
    (tmp_path / "src" / "plain.c").write_text('const char *greet(void) { return "hi"; }\n')
    subprocess.run(
        [GCC, "-shared", "-fPIC", "-o", str(build / "lib" / "libgreet.so"), str(tmp_path / "src" / "plain.c")],
        check=True,
        timeout=120,
    )
    occ = scan_tree(build, str(build))
    assert occ == [PrefixOccurrence(path="bin/greet", mode="elf-runpath")]
    moved = tmp_path / "m"
    shutil.move(build, moved)
    assert relocate_tree(moved, occ, str(build), str(moved), fsync=False) == ["bin/greet"]
    assert [(p.tag, p.value) for p in elf.search_paths((moved / "bin" / "greet").read_bytes())] == [
        (elf.DT_RPATH, "$ORIGIN/../lib")
    ]
    ok = subprocess.run(
        [str(moved / "bin" / "greet")], capture_output=True, text=True, timeout=60, env={"PATH": "/bin"}
    )
    assert (ok.returncode, ok.stdout) == (0, "hi\n")


@needs_gcc
def test_runpath_falls_back_to_absolute_then_refuses_when_nothing_fits(tmp_path: Path) -> None:
    interp = tmp_path / "interp"
    _build_elf_tree(interp, str(interp), tmp_path / "src")
    capacity = elf.search_paths((interp / "bin" / "greet").read_bytes())[0].capacity
    assert capacity >= len(f"{interp}/lib")
    deep = tmp_path.joinpath(*["d"] * (capacity // 3 + 1))  # so deep that "../" x depth overflows the slot
    deep.mkdir(parents=True)
    shutil.copy2(interp / "bin" / "greet", deep / "greet")
    occ = [PrefixOccurrence(path="greet", mode="elf-runpath")]
    # "$ORIGIN/../../.../opt/x/lib" is longer than the slot; "/opt/x/lib" fits: the absolute form is used.
    assert relocate_tree(deep, occ, str(interp), "/opt/x", fsync=False) == ["greet"]
    assert elf.search_paths((deep / "greet").read_bytes())[0].value == "/opt/x/lib"
    before = (deep / "greet").read_bytes()
    with pytest.raises(RelocationError, match="RUNPATH '/opt/x/lib' cannot be rewritten"):
        relocate_tree(deep, occ, "/opt/x", "/" + "z" * capacity, build_prefix=str(interp))
    assert (deep / "greet").read_bytes() == before


@needs_gcc
def test_runpath_sharing_its_tail_with_a_symbol_name_is_never_rewritten(tmp_path: Path) -> None:
    """Linkers merge string tails: if any name points inside the RUNPATH string, rewriting it would rename that."""
    build = tmp_path / "build"
    _build_elf_tree(build, str(build), tmp_path / "src")
    exe = build / "bin" / "greet"
    data = bytearray(exe.read_bytes())
    reader = elf._Reader(data)
    strtab = reader.to_offset(dict(reader.dynamic())[elf.DT_STRTAB])
    runpath = elf.search_paths(data)[0]
    dynsym = next(s for s in elf._sections(reader) if s[0] == elf.SHT_DYNSYM)
    struct.pack_into("<I", data, dynsym[2] + dynsym[4], runpath.offset - strtab + 5)  # symbol 1's name -> inside
    exe.write_bytes(bytes(data))
    assert elf.search_paths(data)[0].capacity == -1
    with pytest.raises(RelocationError, match="shares bytes with another name"):
        relocate_tree(build, [PrefixOccurrence(path="bin/greet", mode="elf-runpath")], str(build), "/s")
    assert exe.read_bytes() == bytes(data)


@needs_gcc
def test_runpath_of_a_file_without_section_headers_is_not_rewritten(tmp_path: Path) -> None:
    """sstrip-ed files: no .dynsym header, so tail sharing cannot be ruled out; refuse rather than guess."""
    build = tmp_path / "build"
    _build_elf_tree(build, str(build), tmp_path / "src")
    exe = build / "bin" / "greet"
    data = bytearray(exe.read_bytes())
    struct.pack_into("<Q", data, 40, 0)  # e_shoff
    struct.pack_into("<H", data, 60, 0)  # e_shnum
    exe.write_bytes(bytes(data))
    sp = elf.search_paths(data)[0]
    assert (sp.value, sp.capacity) == (f"{build}/lib", -1)
    assert elf.unmapped_ranges(data) == []
    with pytest.raises(RelocationError, match="no section headers"):
        relocate_tree(build, [PrefixOccurrence(path="bin/greet", mode="elf-runpath")], str(build), "/s")


def test_elf_reader_on_damaged_files_raises_only_elf_error() -> None:
    """scan_tree reads arbitrary files: truncated or bit-flipped ELF must give ElfError or a result, nothing else."""
    import random

    original = Path(sys.executable).resolve().read_bytes()
    rng = random.Random(1234)
    for trial in range(300):
        data = bytearray(original[: rng.randrange(16, len(original))] if trial % 3 == 0 else original)
        for _ in range(rng.randrange(1, 8)):
            at = rng.randrange(0, min(len(data), 4096) if trial % 2 else len(data))
            data[at] = rng.randrange(256)
        data[:4] = elf.ELF_MAGIC
        for probe in (elf.search_paths, elf.unmapped_ranges):
            try:
                probe(bytes(data))
            except elf.ElfError:
                pass
