"""`portable pack`: build a release bundle from a spec, reproducibly, with bundle.json written last.

The bundle is assembled in `<out>.partial/` and renamed to `<out>` only once complete, so a
failed or killed pack never leaves something that looks like a bundle. Layers are vetted with the
same safety rules restore applies, so an unsafe tree fails here rather than on the user's server.
Packing the same sources twice gives byte-identical bundles: `created` in bundle.json is
`SOURCE_DATE_EPOCH` when set (the reproducible-builds convention), else the newest mtime of any
file packed, never the wall clock.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from reproduction.digests import default_jobs, sha256_file
from reproduction.errors import (
    InvalidInputError,
    MissingDependencyError,
    PortableError,
    UnsafeArchiveError,
    os_error,
)
from reproduction.fsio import fsync_dir, make_output_folder, refuse_file_for_folder
from reproduction.release.archive import LayerContents, walk_tree, write_layer
from reproduction.release.layers import index_path, write_index
from reproduction.release.manifest import (
    FileEntry,
    LayerEntry,
    Manifest,
    PrefixOccurrence,
    check_relative_path,
    has_control,
    has_format,
    shown_name,
    write_manifest,
)
from reproduction.release.safety import check_targets, validate_layers
from reproduction.release.spec import BundleSpec, FileSpec, LayerSpec, excluded, layer_outputs, load_spec
from reproduction.release.weights import check_bundle_weights, place_weights
from reproduction.release.zstdio import backend
from reproduction.ui import UiOptions, human_bytes, say

RUNNER_EXCLUDE = ("__pycache__", "*.pyc", "*.pyo", ".*")
PLACEHOLDER = "${BUNDLE}"


def runner_source() -> Path:
    """The `reproduction/` package folder this process runs from (copied into every bundle)."""
    return Path(__file__).resolve().parent.parent


def placeholder_map(spec: BundleSpec) -> dict[str, str]:
    """Absolute prefix -> '${BUNDLE}/<bundle path>' for every layer, file and [paths] entry."""
    mapping = {str(layer.source): layer.target for layer in spec.layers}
    mapping.update({layer.build_prefix: layer.target for layer in spec.layers if layer.build_prefix})
    mapping.update({str(f.source): f.dest for f in spec.files})
    mapping.update(spec.paths)
    return {k.rstrip("/"): f"{PLACEHOLDER}/{v}".rstrip("/") for k, v in mapping.items() if k.rstrip("/")}


def rewrite_config(text: str, mapping: dict[str, str]) -> str:
    """Replace each absolute prefix (a whole path component, longest first) with its placeholder."""
    if not mapping:
        return text
    alternatives = "|".join(re.escape(k) for k in sorted(mapping, key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w.-])({alternatives})(?=$|[^\w.-])")
    return pattern.sub(lambda m: mapping[m.group(1)], text)


def _plain_sources(spec: BundleSpec) -> list[tuple[Path, str, FileSpec]]:
    """(source file, bundle path, its spec) for every plain file, folders expanded, excludes applied."""
    out: list[tuple[Path, str, FileSpec]] = []
    for f in spec.files:
        if f.source.is_file():
            out.append((f.source, f.dest, f))
            continue
        for rel, st in walk_tree(f.source, f.exclude):
            if os.path.isfile(f.source / rel) and not os.path.islink(f.source / rel):
                out.append((f.source / rel, f"{f.dest}/{rel}", f))
    runner = runner_source()
    for rel, st in walk_tree(runner, RUNNER_EXCLUDE):
        if os.path.isfile(runner / rel) and not os.path.islink(runner / rel):
            out.append((runner / rel, f"reproduction/{rel}", FileSpec(source=runner, dest="reproduction")))
    return out


def _copy_plain(
    stage: Path,
    items: list[tuple[Path, str, FileSpec]],
    mapping: dict[str, str],
    jobs: int,
    taken: dict[str, str] | None = None,
) -> float:
    """Copy the plain files into `stage`; returns the newest source mtime. InvalidInputError (exit 4), before any
    copy, for a path two entries write, one in `taken` (bundle path -> what pack writes there: spec.layer_outputs),
    or one bundle.json would refuse."""

    def copy(item: tuple[Path, str, FileSpec]) -> float:
        src, rel, fspec = item
        dst = stage / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if fspec.config:
            try:
                text = src.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise InvalidInputError(
                    f"config {src} is not UTF-8 text",
                    path=src,
                    field="config.source",
                    hint="list binary files under [[file]], not [[config]]",
                ) from None
            dst.write_text(rewrite_config(text, mapping), encoding="utf-8")
        else:
            shutil.copyfile(src, dst)
        st = src.stat()
        os.chmod(dst, st.st_mode & 0o755 | 0o644)
        return st.st_mtime

    seen: set[str] = set()
    for src, rel, _ in items:
        if rel in seen:
            raise InvalidInputError(
                f"two spec entries both write {rel!r}", field="file.dest", hint="give each a different dest"
            )
        seen.add(rel)
        if taken and rel in taken:  # a file of a [[file]] folder; spec.load_spec refused a dest there (audit63 A M1)
            raise InvalidInputError(
                f"file {rel!r} (from {src}) is {taken[rel]}, which pack writes there, so nothing was packed",
                field="file.source",
                hint="exclude it in the spec (exclude = [...]) or give that [[file]] entry another dest",
            )
        if has_control(rel) or has_format(rel):  # bundle.json would hold a path every load refuses (audit58 A5)
            raise InvalidInputError(
                f"file path {rel!r} holds a control or Unicode format character (invisible or text-reordering), "
                "which bundle.json refuses, so nothing was packed",
                field="file.source",
                hint="exclude it in the spec (exclude = [...]) or rename it in the source, then pack again",
            )
        _check_bundle_path(rel, src)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return max(pool.map(copy, items), default=0.0)


def _check_bundle_path(rel: str, src: Path) -> None:
    """InvalidInputError (exit 4) when bundle.json could not list `rel`: the rule every load of it applies
    (manifest.check_relative_path). A `\\` in a source file's name (systemd's `\\x2d` escapes) gave a bundle, exit 0,
    that verify, restore and publish all refused as damaged (audit63 A M2). Layer members are not bundle.json paths:
    safety.validate_layers vets them with restore's own member rule, which allows a backslash."""
    try:
        check_relative_path(rel, where="file")
    except InvalidInputError as exc:
        if "\\" in rel:
            problem = f"file path {rel!r} (from {src}) holds a backslash ('\\'), which bundle.json refuses"
        else:  # a path longer than filesystems allow, a lone surrogate: the rule's own words
            problem = f"file {src}: bundle.json refuses its bundle {exc.message.removeprefix('file: ')}"
        raise InvalidInputError(
            f"{problem} (every verify and restore applies that rule), so nothing was packed",
            field="file.source",
            hint="exclude it in the spec (exclude = [...]) or rename it in the source, then pack again",
        ) from None


def _scan_prefixes(
    layer: LayerSpec, spec: BundleSpec
) -> tuple[tuple[PrefixOccurrence, ...], dict[str, tuple[PrefixOccurrence, ...]]]:
    """(files holding this layer's build prefix, {other layer's archive: files holding its prefix})."""
    others = [x for x in spec.layers if x.relocatable and x.build_prefix]
    if not layer.relocatable or not layer.build_prefix:
        return (), {}
    try:
        from reproduction.release.relocate import normalize_prefix, scan_prefixes
    except ImportError as exc:
        raise MissingDependencyError(
            f"layer {layer.name} is relocatable but relocation is not available ({exc})",
            hint="this build of portable cannot pack relocatable layers",
        ) from None
    # Skipping excluded folders here means their bulk is never read (9 s -> 0.06 s for a Python prefix).
    found = scan_prefixes(layer.source, [x.build_prefix for x in others], skip=lambda rel: excluded(rel, layer.exclude))

    def keep(x: LayerSpec) -> tuple[PrefixOccurrence, ...]:
        return tuple(o for o in found.get(normalize_prefix(x.build_prefix), []) if not excluded(o.path, layer.exclude))

    foreign = {x.archive: keep(x) for x in others if x is not layer}
    return keep(layer), {k: v for k, v in foreign.items() if v}


def _warn_unrelocatable(
    layer: LayerSpec,
    own: tuple[PrefixOccurrence, ...],
    foreign: dict[str, tuple[PrefixOccurrence, ...]],
    ui: UiOptions | None,
) -> None:
    """Name the binary files holding a build prefix that restore's relocation will leave as they are (neither ELF
    nor a static library: a pickle, a zip; release/relocate.py's `cstring_format`, audit62 M3)."""
    from reproduction.release.relocate import cstring_format

    binary = sorted({o.path for o in (*own, *(o for occ in foreign.values() for o in occ)) if o.mode == "binary"})
    kept = []
    for rel in binary:
        try:
            with open(layer.source / rel, "rb") as fh:
                head = fh.read(8)
        except OSError:
            continue  # write_layer read it a moment ago; restore names it if it holds the prefix
        if not cstring_format(head):
            kept.append(rel)
    if kept:
        shown = ", ".join(map(shown_name, kept[:8])) + (f" and {len(kept) - 8} more" if len(kept) > 8 else "")
        say(
            f"warning: layer {layer.archive}: {len(kept)} binary file(s) hold a build prefix that restore cannot "
            f"rewrite (neither ELF nor a static library), so they will keep naming the build folder: {shown}",
            options=ui,
        )


def created_stamp(newest_mtime: float) -> str:
    """`created` for bundle.json: SOURCE_DATE_EPOCH if set, else `newest_mtime` (ISO-8601 UTC)."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    try:
        seconds = int(epoch) if epoch else int(newest_mtime)
    except ValueError:
        raise InvalidInputError(
            f"SOURCE_DATE_EPOCH={epoch!r} is not an integer number of seconds",
            field="SOURCE_DATE_EPOCH",
            hint="set it to a Unix time such as `git log -1 --format=%ct`, or unset it",
        ) from None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(max(0, seconds)))


def _pack_layers(spec: BundleSpec, stage: Path, jobs: int, ui: UiOptions | None) -> tuple[list[LayerEntry], float]:
    link_roots = {str(layer.source): layer.target for layer in spec.layers}
    link_roots.update({layer.build_prefix: layer.target for layer in spec.layers if layer.build_prefix})
    entries: list[LayerEntry] = []
    contents: list[tuple[str, str, LayerContents]] = []
    for layer in sorted(spec.layers, key=lambda x: x.order):
        out = stage / layer.archive
        out.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        content = write_layer(layer, out, link_roots=link_roots, threads=jobs)
        say(
            f"  layer {layer.archive}: {len(content.members)} members, {human_bytes(content.unpacked_size)} -> "
            f"{human_bytes(out.stat().st_size)} in {time.perf_counter() - started:.1f}s",
            options=ui,
        )
        contents.append((layer.archive, layer.target, content))
        own, foreign = _scan_prefixes(layer, spec)
        _warn_unrelocatable(layer, own, foreign, ui)
        index = index_path(layer.target)
        write_index(stage / index, content.members)
        entries.append(
            LayerEntry(
                archive=layer.archive,
                target=layer.target,
                kind=layer.kind,
                order=layer.order,
                members_index=index,
                build_prefix=layer.build_prefix,
                prefix_files=own,
                foreign_prefix_files=foreign,
                members=len(content.members),
                unpacked_size=content.unpacked_size,
                tar_size=content.tar_size,
            )
        )
    try:
        validate_layers([(a, t, c.members) for a, t, c in contents])
    except UnsafeArchiveError as exc:  # restore's wording ("nothing was extracted") misled a packer (audit48 F8)
        problems = exc.problems
        lines = [f"{a}: source path {m!r} {w}" for a, m, w in problems[:3]]
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise InvalidInputError(
            "a layer holds what restore would refuse, so nothing was packed: " + "; ".join(lines) + more,
            field="layer.source",
            hint="exclude it in the spec (exclude = [...]) or fix it in the source (a link must stay inside a "
            "packed layer), then pack again",
        ) from None
    return entries, max((c.newest_mtime for _, _, c in contents), default=0.0)


def _hash_all(stage: Path, jobs: int) -> list[FileEntry]:
    rels = sorted(str(p.relative_to(stage)) for p in stage.rglob("*") if p.is_file() and not p.is_symlink())
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        digests = list(pool.map(lambda r: sha256_file(stage / r), rels))
    return [FileEntry(path=r, size=(stage / r).stat().st_size, sha256=d) for r, d in zip(rels, digests)]


def _sources(spec: BundleSpec) -> list[tuple[str, Path]]:
    """(spec entry, absolute folder or file) for every source pack reads: layers, files, configs, weights, the
    runner's `reproduction/`."""
    found = [(f"layer[{i}].source", layer.source) for i, layer in enumerate(spec.layers)]
    for kind, config in (("file", False), ("config", True)):
        found += [(f"{kind}[{i}].source", f.source) for i, f in enumerate(x for x in spec.files if x.config is config)]
    found += [(f"weights[{i}].source", w.source) for i, w in enumerate(spec.weights) if w.source is not None]
    return [*found, ("the runner (reproduction/)", runner_source())]


def refuse_out_among_sources(spec: BundleSpec, out: Path) -> None:
    """InvalidInputError (exit 4, field --out) when `out` or its staging folder `<out>.partial` is a source the spec
    packs, lies inside one, or holds one; checked before anything is written. Inside a layer's folder pack packed its
    own half-written bundle into the layer, and each later pack the whole previous bundle (audit47 F1); holding a
    source, the staging folder's cleanup would delete it."""
    real = Path(os.path.realpath(out))
    targets = (
        ("--out", out, real),
        ("--out's staging folder", f"{out}.partial", real.with_name(real.name + ".partial")),
    )
    for where, source in _sources(spec):
        src = Path(os.path.realpath(source))
        for what, name, target in targets:
            if target == src:
                relation = f"is {where}"
            elif not src.is_dir():  # a folder inside a file cannot be made (exit 3, refuse_file_for_folder)
                continue
            elif target.is_relative_to(src):
                relation = f"lies inside {where} {src}"
            elif src.is_relative_to(target):
                relation = f"holds {where} {src}"
            else:
                continue
            raise InvalidInputError(
                f"{what} {name} {relation}: pack would read its own half-written bundle as a source",
                path=out,
                field="--out",
                hint=f"pack into a folder outside every source the spec names, e.g. --out /tmp/{spec.name}-bundle",
            )


def pack_bundle(
    spec_path: Path, out: Path, *, jobs: int | None = None, ui: UiOptions | None = None, root: Path | None = None
) -> Manifest:
    """Build the bundle `spec_path` describes at `out` (which must not exist or be empty).

    `root` overrides where the spec's relative sources start. On success `out` holds the complete
    bundle with bundle.json written last; on failure `out` is untouched and the partial build is
    removed. Raises InputNotFoundError / InvalidInputError (spec, or a layer
    restore would refuse), WriteFailedError (disk), MissingDependencyError (no zstd).
    """
    spec = load_spec(Path(spec_path), root=root)
    out = Path(out).absolute()
    refuse_out_among_sources(spec, out)
    # a file where the bundle folder goes is exit 3 "a file, not a folder", as fetch, restore and check say it
    refuse_file_for_folder(out, hint="pass a new or empty folder with --out")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InvalidInputError(
            f"{out} already exists and is not empty",
            path=out,
            field="--out",
            hint="pack into a new folder (or remove the old bundle first)",
        )
    jobs = jobs or default_jobs()
    stage = out.with_name(out.name + ".partial")
    shutil.rmtree(stage, ignore_errors=True)
    make_output_folder(stage, command="pack", flag="--out", exist_ok=False, shown=out)
    try:
        newest = _copy_plain(stage, _plain_sources(spec), placeholder_map(spec), jobs, layer_outputs(spec))
        placed = place_weights(spec, stage, ui=ui)  # weights named by manifests, checked; their licenses
        layers, newest_layer = _pack_layers(spec, stage, jobs, ui)
        files = _hash_all(stage, jobs)
        if spec.entry_config and spec.entry_config not in {f.path for f in files}:
            raise InvalidInputError(
                f"entry_config {spec.entry_config!r} is not a file of the bundle",
                path=spec.path,
                field="entry_config",
                hint="point it at a [[config]] dest",
            )
        manifest = Manifest(
            name=spec.name,
            files=files,
            layers=layers,
            entry_config=spec.entry_config,
            created=created_stamp(max(newest, newest_layer)),
            metadata={
                "description": spec.description,
                "packed_with": {"python": sys.version.split()[0], "zstd": backend(), "spec": spec.path.name},
                **placed,
            },
        )
        check_targets(manifest, packing=True)
        check_bundle_weights(stage, manifest)
        os.chmod(write_manifest(stage, manifest), 0o644)  # mkstemp made it 0600; a bundle is for sharing
        fsync_dir(stage)
        if out.exists():
            out.rmdir()
        os.rename(stage, out)
        fsync_dir(out.parent)
    except BaseException as exc:
        shutil.rmtree(stage, ignore_errors=True)
        if isinstance(exc, OSError) and not isinstance(exc, PortableError):
            writing = exc.filename is None or Path(os.fsdecode(exc.filename)).is_relative_to(stage)
            if writing:
                raise os_error(
                    exc, f"the bundle at {stage}", hint="check free space and permissions, then pack again"
                ) from None
            raise os_error(exc, "a source file the spec names", op="read") from None
        raise
    return manifest
