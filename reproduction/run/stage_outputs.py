"""A stage's recorded outputs: {path relative to its folder: [size, mtime_ns, sha256]} as run.json keeps them, how
they are collected when the stage returns (held to the stage protocol: files in its folder or the run's evidence/),
checked on --resume, digested for the stages downstream (their keys' `upstream` part), and the other stages' recorded
files watched while a stage runs (`OutputsWatch`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reproduction.digest_cache import DigestCache
from reproduction.errors import StageProtocolError
from reproduction.recipe import StageSpec


def collect_outputs(
    spec: StageSpec,
    stage_dir: Path,
    written: Sequence[Path],
    digests: DigestCache | None = None,
    before: OutputsWatch | None = None,
) -> dict[str, list]:
    """{path relative to the stage folder: [size, mtime_ns, sha256]} of the stage's outputs: files it
    returned plus files matching its globs (hashed through the run's `digests`). Each must be a file in the stage's
    folder or in the run's shared `evidence/` (where eval stages write): StageProtocolError (exit 54) names a
    returned path that is no file, or one elsewhere (another stage's folder, outside the run, a link out).
    A glob match outside the stage's folder (`../evidence/*.json`) is taken only when the stage returned it or
    wrote it during this call: absent from, or of another (inode, size, mtime_ns) than, `before`'s listing of
    evidence/ taken before the stage ran (without `before`: only when returned). evidence/ is shared and keeps an
    earlier step's file as history, and a failed attempt's leftovers: recorded, they became this stage's pinned
    outputs, and a --restart-stage then deleted them (audit54 A5)."""
    stage_real = stage_dir.resolve()  # each path is resolved once: a resolve is a stat per path component
    run_dir = stage_real.parent
    homes = (stage_real, run_dir / "evidence")
    files: set[Path] = set()
    returned = {Path(p).resolve() for p in written}
    shared_before = before.evidence_stats if before is not None else None

    def add(path: Path, real: Path) -> None:
        if not any(home in real.parents for home in homes):
            where = f"{path} (a link to {real})" if real != Path(os.path.abspath(path)) else str(path)
            watched = before.files if before is not None else {}
            owner = watched.get(os.path.abspath(path)) or watched.get(str(real))
            # another stage's recorded file: said so, with its owner (audit56 B5: "outside its folder" hid whose)
            whose = f"stage {owner[0]}'s file, " if owner is not None else ""
            raise StageProtocolError(
                f"stage {spec.name}: output {where} is {whose}outside its folder {stage_real}",
                stage=spec.name,
                hint=f"write a stage's outputs into its folder (ctx.out_dir) or {run_dir / 'evidence'}, as files",
            )
        files.add(real)

    for p, real in glob_outputs(spec, stage_dir):
        if stage_real not in real.parents and real not in returned:
            add(p, real)  # refuses one outside the homes first: a glob into another stage's folder
            if shared_before is None or _shared_stat(str(real)) == shared_before.get(str(real), ()):
                files.discard(real)  # there before the stage ran, untouched: history or a leftover
            continue
        add(p, real)
    for p in written:
        p = Path(p)
        if not p.is_file():
            raise StageProtocolError(
                f"stage {spec.name} returned {p} among its files, which is not a file",
                stage=spec.name,
                hint="list in StageOutput.files the paths of the files the stage wrote",
            )
        add(p, p.resolve())
    paths = sorted(files)
    stats = {p: p.stat() for p in paths}  # before hashing: a file rewritten meanwhile differs from its record
    shas = (digests or DigestCache()).files(paths)
    return {os.path.relpath(p, stage_real): [stats[p].st_size, stats[p].st_mtime_ns, shas[p]] for p in paths}


def glob_outputs(spec: StageSpec, stage_dir: Path) -> Iterator[tuple[Path, Path]]:
    """(match, its real path) of each file `spec`'s `outputs` globs match from `stage_dir`: what `collect_outputs`
    records when the stage returns and what `verify_outputs` looks for files added since (one walk, one rule)."""
    for pattern in spec.outputs:
        for p in stage_dir.glob(pattern):
            if p.is_file():
                yield p, p.resolve()


def verify_outputs(
    stage_dir: Path, recorded: dict[str, list], digests: DigestCache | None = None, spec: StageSpec | None = None
) -> list[str]:
    """Problems with a completed stage's recorded outputs (missing, changed), and with `spec`, files its `outputs`
    globs now match in its folder that the record lacks (added: a stage downstream that reads its folder by glob
    would read it, audit58 B2). A file is checked by its stat: a size that differs is a change, an mtime_ns that
    differs is rehashed, and a size and mtime_ns match is trusted without reading the bytes (`lineage --verify`
    rehashes); its recorded digest is then handed to the run's `digests` (lineage pins it without hashing). A glob
    match outside the folder (the run's shared evidence/, which keeps earlier steps' files) is not an addition."""
    digests = digests or DigestCache()
    problems = []
    for rel, (size, mtime, sha) in recorded.items():
        p = stage_dir / rel
        try:
            st = p.stat()
        except OSError:
            problems.append(f"{rel} is missing")
            continue
        if st.st_size != size or (st.st_mtime_ns != mtime and digests.file(p) != sha):
            problems.append(f"{rel} was modified")
        elif st.st_mtime_ns == mtime:
            digests.remember(p, size, mtime, sha)
    if spec is not None:
        stage_real = stage_dir.resolve()
        added = set()  # two globs may match one file
        for _, real in glob_outputs(spec, stage_dir):
            rel = os.path.relpath(real, stage_real)  # as collect_outputs keys the record
            if stage_real in real.parents and rel not in recorded:
                added.add(rel)
        problems += [f"{rel} was added" for rel in sorted(added)]
    return problems


TAKEN_OVER = ("evidence/comparison.json",)
"""The files (relative to the run) a stage may take over from another stage's record: a run made before the
comparison became its own stage recorded evidence/comparison.json as eval's; the compare stage now writes it (and
removes it when no reference is set)."""


def _taken_over(run_dir: Path) -> set[str]:
    return {os.path.normpath(run_dir / rel) for rel in TAKEN_OVER}


def others_outputs(state: dict[str, Any], run_dir: Path, stage: str) -> dict[str, tuple[str, str, Any]]:
    """{normalised absolute path: (owning stage, its path relative to that stage's folder, the recorded entry)} of
    the outputs every stage but `stage` records in run.json (a record without outputs, or not a dict, has none)."""
    out: dict[str, tuple[str, str, Any]] = {}
    root = str(run_dir)  # string joins: Path objects cost ~10 us a file, and a run may record thousands
    for name, rec in state["stages"].items():
        if name == stage or not isinstance(rec, dict) or not isinstance(rec.get("outputs"), dict):
            continue
        for rel, entry in rec["outputs"].items():
            path = f"{root}/{name}/{rel}"
            out.setdefault(os.path.normpath(path) if "/." in path else path, (name, rel, entry))
    return out


def refuse_others_files(state: dict[str, Any], run_dir: Path, spec: StageSpec, outputs: dict[str, list]) -> None:
    """StageProtocolError (exit 54) when an output this stage returned is recorded as another stage's (another
    stage's file in the run's shared evidence/: two eval stages writing the same eval_<name>_<step>.json), except the
    files of `TAKEN_OVER`: taking it over silently left the other stage complete with its file gone from its record
    and its lineage statement naming bytes no longer there."""
    allowed = _taken_over(run_dir)
    others = others_outputs(state, run_dir, spec.name)
    for rel in outputs:
        path = os.path.normpath(run_dir / spec.name / rel)
        if path in others and path not in allowed:
            owner = others[path][0]
            raise StageProtocolError(
                f"stage {spec.name} ({spec.fn}) returned {os.path.relpath(path, run_dir)}, which is stage {owner}'s "
                "output",
                stage=spec.name,
                hint=f"give the file a name of its own (e.g. with the stage's name in it); "
                f"--restart-stage {owner} then writes {owner}'s file again",
            )


def take_over(
    state: dict[str, Any], run_dir: Path, stage: str, outputs: dict[str, list], changed: set[str] = frozenset()
) -> set[str]:
    """The files of `TAKEN_OVER` this stage returned, or rewrote or removed (`changed`: EvidenceWatch's), are no
    longer another stage's: drop them from the other records (any other file was refused first). Returns the stages
    whose records changed (their outputs' digest is in the keys of the stages downstream)."""
    allowed = _taken_over(run_dir)
    mine = ({os.path.normpath(run_dir / stage / rel) for rel in outputs} | set(changed)) & allowed
    if not mine:
        return set()
    touched = set()
    for name, rec in state["stages"].items():
        if name == stage or not isinstance(rec, dict) or not isinstance(rec.get("outputs"), dict):
            continue
        kept = {rel: v for rel, v in rec["outputs"].items() if os.path.normpath(run_dir / name / rel) not in mine}
        if len(kept) != len(rec["outputs"]):
            rec["outputs"] = kept
            touched.add(name)
    return touched


@dataclass(slots=True)
class OutputsWatch:
    """The outputs every other stage recorded (in its own folder or in the run's shared evidence/), stat'ed before a
    stage runs (`watch`) and again after it returns (`refuse_changed`): a stage that rewrote or removed one without
    returning it left that stage's record naming bytes no longer there, exit 0, and the next --resume refused the run
    (exit 52) until the other stage was redone (audit50_B F7; until then only evidence/ was watched). Only those files
    are stat'ed (none in a one-stage run; two stats per recorded file of the others a stage: with 5,000 recorded files,
    watch about 90 ms and the check about 60 ms on 2 cores at load 8, where the 5,000 bare os.stat calls alone took
    30-90 ms; stat-bound), no stage folder is listed, and a file is hashed only when its size is unchanged but its
    mtime_ns moved. evidence/ alone is listed (one flat folder), so a file a refused stage planted there is known as
    its own (`remove_planted`)."""

    run_dir: Path
    """The run's folder."""
    files: dict[str, tuple[str, str, tuple[int, int] | None]] = field(default_factory=dict)
    """Path -> (owning stage, path relative to its folder, (size, mtime_ns) before the stage ran or None if absent)."""
    recorded_sha: dict[str, str] = field(default_factory=dict)
    """Path -> the sha256 its owner recorded (a rewrite with the same bytes is no change)."""
    evidence_before: frozenset[str] | None = None
    """The names evidence/ held before the stage ran (None: it did not exist)."""
    evidence_stats: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    """Real path -> (inode, size, mtime_ns) of each file under evidence/ before the stage ran: a glob match there
    unchanged since is not the stage's output (`collect_outputs`)."""

    @classmethod
    def watch(cls, run_dir: Path, state: dict[str, Any], stage: str) -> OutputsWatch:
        """Stat the files that stages other than `stage` recorded as their outputs; list evidence/."""
        watch = cls(run_dir)
        for path, (owner, rel, entry) in others_outputs(state, run_dir, stage).items():
            watch.files[path] = (owner, rel, _stat(path))
            if isinstance(entry, list) and len(entry) == 3:
                watch.recorded_sha[path] = entry[2]
        try:
            watch.evidence_before = frozenset(os.listdir(run_dir / "evidence"))
        except OSError:
            watch.evidence_before = None
        else:
            watch.evidence_stats = _shared_stats(str((run_dir / "evidence").resolve()))
        return watch

    def refuse_changed(
        self, spec: StageSpec, stage_dir: Path, outputs: dict[str, list], digests: DigestCache | None = None
    ) -> set[str]:
        """StageProtocolError (exit 54, the stage then recorded `failed` like one returning another stage's file)
        naming every watched file that `spec`'s stage wrote, rewrote or removed without returning it (a returned one
        was refused or taken over already). Returns the `TAKEN_OVER` files it so changed (the stage takes them
        over: `take_over`). Nothing is mutated."""
        if not self.files:
            return set()
        allowed = _taken_over(self.run_dir)
        mine = {os.path.normpath(stage_dir / rel) for rel in outputs}
        taken, found = set(), []
        for path, (owner, rel, before) in self.files.items():
            now = _stat(path)
            if now == before or path in mine:
                continue
            if now is not None and before is not None and now[0] == before[0]:  # same size, mtime moved: same bytes?
                if (digests or DigestCache()).file(Path(path)) == self.recorded_sha.get(path):
                    continue
            if path in allowed:
                taken.add(path)
                continue
            done = "removed" if now is None else "wrote" if before is None else "overwrote"
            shown = os.path.normpath(f"{owner}/{rel}")  # relative to the run
            found.append((f"{done} {shown}, which is stage {owner}'s output", owner, shown))
        if found:
            owners = sorted({owner for _, owner, _ in found})
            evidence = all(shown.startswith("evidence/") for _, _, shown in found)
            mend = "write the stage's evidence under a name of its own (e.g. with the stage's name in it)"
            raise StageProtocolError(
                f"stage {spec.name} ({spec.fn}) {'; '.join(what for what, _, _ in found)}, without returning "
                f"{'it' if len(found) == 1 else 'them'}",
                stage=spec.name,
                hint=(mend if evidence else "write a stage's files into its own folder (ctx.out_dir)")
                + "; "
                + "; ".join(f"--restart-stage {owner} then writes {owner}'s file again" for owner in owners),
            )
        return taken

    def remove_planted(self, returned: Sequence[Path | str]) -> list[str]:
        """After a refusal: remove each path the stage returned that lies directly in evidence/, was not there before
        it ran, and is no stage's recorded output (a file or a link it planted there: the link itself, never its
        target), so `portable compare` does not read it as the run's evidence. Returns them, relative to the run.
        A file it planted in another stage's folder is left (named in the error, and by the next `--resume` as a file
        added to that stage's outputs when its globs match it): telling it from that stage's unrecorded files would
        take listing every stage folder before each stage."""
        if self.evidence_before is None and not (self.run_dir / "evidence").is_dir():
            return []
        evidence = os.path.normpath(self.run_dir / "evidence")
        removed = []
        for p in returned:
            path = os.path.abspath(p) if isinstance(p, (str, Path)) else None  # as collect_outputs reads it
            if path is None or os.path.dirname(path) != evidence or path in self.files:
                continue
            if os.path.basename(path) in (self.evidence_before or ()) or not os.path.lexists(path):
                continue
            if os.path.isdir(path) and not os.path.islink(path):
                continue
            try:
                os.unlink(path)  # a link is removed, not followed
            except OSError:
                continue
            removed.append(os.path.relpath(path, self.run_dir))
        return removed


def _shared_stat(path: str) -> tuple[int, int, int] | tuple[()]:
    """(inode, size, mtime_ns) of the file at `path` (followed), () if none: the inode tells an atomic rewrite
    (os.replace) within one mtime tick from the file it replaced."""
    try:
        st = os.stat(path)
    except OSError:
        return ()
    return st.st_ino, st.st_size, st.st_mtime_ns


def _shared_stats(folder: str) -> dict[str, tuple[int, int, int]]:
    """`_shared_stat` of every file under `folder` (real path, links not descended), a stat per entry: evidence/
    holds a few files per evaluation."""
    out: dict[str, tuple[int, int, int]] = {}
    stack = [folder]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
            elif entry.is_file():  # a link to a file: its target, as collect_outputs resolves a match
                real = os.path.realpath(entry.path) if entry.is_symlink() else entry.path
                st = _shared_stat(real)
                if st:
                    out[real] = st
    return out


def _stat(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns
