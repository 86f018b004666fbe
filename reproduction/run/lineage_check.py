"""Reading lineage back: the chain from a run's final outputs to the bundle manifest, and `--verify`.

`lineage_chain(run)` walks from the outputs nothing else consumed back to the bundle manifest by
matching each dependency to the subject with the same place and digest; `verify_lineage(run)` rehashes every subject and
dependency of every statement, checks the statements against run.json's stage records, and returns the differences
(exit codes as `portable verify`: 11 missing, 14 digest mismatch or a record that disagrees, lowest wins). The
statements are written by reproduction/run/lineage.py.
Stdlib only: the control plane's `portable lineage` imports this module.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from reproduction.digests import canonical_json, is_sha256, json_sha256, sha256_file
from reproduction.errors import InputNotFoundError, InvalidInputError, os_error
from reproduction.redaction import REDACTED
from reproduction.run.lineage import (
    LINEAGE_DIR,
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    SUFFIX,
    manifest_tree_sha256,
    tree_changes,
    tree_digests,
    tree_lines,
    tree_sha256,
)
from reproduction.run.stale import stale_stages

EXIT_MISSING = 11
EXIT_DIGEST = 14


# -- reading ------------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True, frozen=True)
class LoadedStatement:
    """A statement read back from a run's lineage folder."""

    file: Path
    data: dict[str, Any]

    @property
    def stage(self) -> str:
        return self.data["predicate"]["buildDefinition"]["externalParameters"]["stage"]

    @property
    def subjects(self) -> list[dict[str, Any]]:
        return self.data["subject"]

    @property
    def dependencies(self) -> list[dict[str, Any]]:
        return self.data["predicate"]["buildDefinition"]["resolvedDependencies"]

    @property
    def bundle(self) -> str | None:
        return self.data["predicate"]["buildDefinition"]["externalParameters"].get("bundle")

    @property
    def internal(self) -> dict[str, Any]:
        return self.data["predicate"]["buildDefinition"]["internalParameters"]

    @property
    def metadata(self) -> dict[str, Any]:
        return self.data["predicate"]["runDetails"]["metadata"]


def load_statements(run_dir: Path) -> list[LoadedStatement]:
    """Every statement in <run_dir>/lineage/, sorted by start time; raises for a missing folder or a malformed file."""
    folder = Path(run_dir) / LINEAGE_DIR
    if not folder.is_dir():
        raise InputNotFoundError(
            f"no lineage in {run_dir}: {folder} does not exist",
            path=folder,
            hint="give the folder `portable run --output` wrote (it holds run.json and lineage/)",
        )
    out = []
    for path in sorted(folder.glob(f"*{SUFFIX}")):
        try:
            raw = path.read_bytes()
        except OSError as exc:  # a loop, a folder, no permission: unreadable, exit 3 like any input (audit47 F11)
            raise os_error(
                exc,
                f"the lineage statement {path}",
                op="read",
                hint="rerun the stage with `portable run --resume --restart-stage NAME` to write it again",
            ) from exc
        try:
            data = json.loads(raw.decode("utf-8"))
            loaded = LoadedStatement(file=path, data=data)
            ok = data.get("_type") == STATEMENT_TYPE and data.get("predicateType") == PREDICATE_TYPE
            # the field types first, so a wrong one is named (file and field), not a TypeError of the reads below
            # (audit60 L9: "subject": 5 surfaced as "unsupported operand type(s) for +")
            wrong = _shape_problem(data) if ok else None
            if ok and wrong is None:
                _ = (loaded.stage, loaded.subjects, loaded.dependencies, loaded.internal, loaded.metadata["startedOn"])
                ok = all("sha256" in d.get("digest", {}) for d in loaded.subjects + loaded.dependencies)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InvalidInputError(
                f"{path} is not a readable lineage statement ({type(exc).__name__}: {exc})",
                path=path,
                hint="the file is damaged; rerun the stage with `portable run --resume --restart-stage NAME`",
            ) from exc
        if not ok:
            raise InvalidInputError(
                f"{path} is not an in-toto Statement v1 with an SLSA provenance v1 predicate and sha256 digests",
                path=path,
                hint="the file is damaged; rerun the stage with `portable run --resume --restart-stage NAME`",
            )
        if wrong is not None:  # a field read later of the wrong type: exit 4 here, not a crash there (audit51 G8)
            raise InvalidInputError(
                f"{path}: {wrong}",
                path=path,
                hint="the file is damaged; rerun the stage with `portable run --resume --restart-stage NAME`",
            )
        out.append(loaded)
    if not out:
        raise InputNotFoundError(
            f"no lineage statements (*{SUFFIX}) in {folder}",
            path=folder,
            hint=f"`portable lineage {folder.parent} --verify` names the completed stages whose statements were "
            "lost, and `portable run --resume` writes them again from run.json"
            if (folder.parent / "run.json").is_file()  # a run that lost them, not a folder that never had any (R3)
            else "a run writes one per stage as it completes: give the folder `portable run --output` wrote, "
            "after a stage completed",
        )
    return sorted(out, key=lambda s: (s.metadata["startedOn"], s.stage))


def _kind(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _shape_problem(data: Mapping[str, Any]) -> str | None:
    """The first field the chain or verify reads whose type is not the one written, as "FIELD is VALUE, not
    WHAT" (None when every such field has its type): the loader refuses it, so nothing later trips on it."""
    build, details = data["predicate"]["buildDefinition"], data["predicate"]["runDetails"]
    expect: list[tuple[str, Any, tuple[type, ...], str]] = [
        ("predicate.buildDefinition.externalParameters", build["externalParameters"], (dict,), "an object"),
        ("predicate.buildDefinition.internalParameters", build["internalParameters"], (dict,), "an object"),
        ("predicate.runDetails.metadata", details["metadata"], (dict,), "an object"),
        ("subject", data["subject"], (list,), "a list"),
        ("predicate.buildDefinition.resolvedDependencies", build["resolvedDependencies"], (list,), "a list"),
    ]
    for name, value, types, what in expect:
        if not isinstance(value, types):
            return f"{name} is {_kind(value)}, not {what}"
    external, internal, meta = build["externalParameters"], build["internalParameters"], details["metadata"]
    optional: list[tuple[str, Any, tuple[type, ...], str]] = [
        ("predicate.buildDefinition.externalParameters.stage", external.get("stage"), (str,), "a string"),
        (
            "predicate.buildDefinition.externalParameters.bundle",
            external.get("bundle", ""),
            (str, type(None)),
            "a string",
        ),
        ("predicate.buildDefinition.externalParameters.config", external.get("config", {}), (dict,), "an object"),
        ("predicate.buildDefinition.internalParameters.status", internal.get("status", ""), (str,), "a string"),
        (
            "predicate.buildDefinition.internalParameters.resumed_from",
            internal.get("resumed_from"),
            (dict, type(None)),
            "an object",
        ),
        ("predicate.runDetails.metadata.startedOn", meta.get("startedOn"), (str,), "a string"),
        ("predicate.runDetails.metadata.finishedOn", meta.get("finishedOn", ""), (str,), "a string"),
    ]
    for name, value, types, what in optional:
        if not isinstance(value, types):
            return f"{name} is {_kind(value)}, not {what}"
    for field_name, items in (
        ("subject", data["subject"]),
        ("predicate.buildDefinition.resolvedDependencies", build["resolvedDependencies"]),
    ):
        for i, desc in enumerate(items):
            where = f"{field_name}[{i}]"
            if not isinstance(desc, dict):
                return f"{where} is {_kind(desc)}, not an object"
            if not isinstance(desc.get("digest"), dict):
                return f"{where}.digest is {_kind(desc.get('digest'))}, not an object"
            sha = desc["digest"].get("sha256")
            if not is_sha256(sha):
                return f"{where}.digest.sha256 is {_kind(sha)}, not 64 lowercase hex digits"
            for key in ("name", "uri"):
                if not isinstance(desc.get(key, ""), str):
                    return f"{where}.{key} is {_kind(desc[key])}, not a string"
            ann = desc.get("annotations", {})
            if not isinstance(ann, dict):
                return f"{where}.annotations is {_kind(ann)}, not an object"
            for key in ("root", "path", "role", "kind"):
                if not isinstance(ann.get(key, ""), str):
                    return f"{where}.annotations.{key} is {_kind(ann[key])}, not a string"
            if ann.get("root") == "run":  # joined to the run folder: one that climbs out would be hashed (audit51 G5)
                rel = ann.get("path", desc.get("name", ""))
                if not isinstance(rel, str) or _outside(rel):
                    return f"{where}.annotations.path is {_kind(rel)}, not a path inside the run folder"
            if not isinstance(ann.get("files", {}), dict):
                return f"{where}.annotations.files is {_kind(ann['files'])}, not an object"
    return None


def _outside(rel: str) -> bool:
    """True for a run-relative path that is absolute, empty or climbs out with `..` (on either separator)."""
    parts = rel.replace("\\", "/").split("/")
    return not rel or rel.startswith(("/", "\\")) or ".." in parts or (len(rel) > 1 and rel[1] == ":")


def resolve(descriptor: Mapping[str, Any], run_dir: Path, statement: LoadedStatement) -> Path:
    """Where a subject or dependency lives now: under the run folder, the bundle, or its absolute uri."""
    ann = descriptor.get("annotations", {})
    root, rel = ann.get("root"), ann.get("path", descriptor.get("name", ""))
    if root == "run":
        return Path(run_dir) / rel
    if root == "bundle" and statement.bundle:
        return Path(statement.bundle) / rel
    uri = descriptor.get("uri", "")
    if not uri.startswith("file://"):
        return Path(rel)
    # lineage.py writes Path.as_uri(): percent-encoded bytes (a space, `%`, `${` in a dataset's path: review62 S M3)
    return Path(os.fsdecode(urllib.parse.unquote_to_bytes(uri[len("file://") :])))


# -- the chain ----------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class ChainNode:
    """One line of the chain: a stage run (with the outputs it produced) or a leaf input."""

    label: str
    """Stage name, or the input's role (dataset, bundle_manifest, ...)."""
    name: str
    """Path of the artifact (relative to the run or the bundle)."""
    sha256: str
    note: str = ""
    """Status, duration, resumed-from, "in bundle.json", "seen above"."""
    children: list[ChainNode] = field(default_factory=list)
    outputs: list[ChainNode] = field(default_factory=list)
    """For a stage that produced several model exports (the policy's modes, the value's cross-fit models):
    each export by name (label: the mode, name: the folder, sha256: its tree digest). Printed under the
    stage's line as what it produced, not as inputs; `name` then says how many there are."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "name": self.name,
            "sha256": self.sha256,
            "note": self.note,
            "outputs": [o.to_dict() for o in self.outputs],
            "children": [c.to_dict() for c in self.children],
        }


@dataclass(kw_only=True, slots=True)
class Chain:
    """The lineage of a run's final outputs, as trees rooted at the stage runs nothing else consumed."""

    run_dir: Path
    roots: list[ChainNode]

    def lines(self) -> list[tuple[int, ChainNode]]:
        """(depth, node) in print order: stages and inputs (a stage's `outputs` are part of its node)."""
        out: list[tuple[int, ChainNode]] = []

        def walk(node: ChainNode, depth: int) -> None:
            out.append((depth, node))
            for child in node.children:
                walk(child, depth + 1)

        for root in self.roots:
            walk(root, 0)
        return out

    def render(self) -> str:
        text = []
        for depth, node in self.lines():
            lead = "  " * (depth - 1) + "<- " if depth else ""
            note = f"  ({node.note})" if node.note else ""
            digest = f"  sha256:{node.sha256[:12]}" if node.sha256 else ""
            text.append(f"{lead}{node.label}: {node.name}{digest}{note}")
            for out in node.outputs:
                text.append(
                    f"{'  ' * depth}   = {out.label}: {out.name}  sha256:{out.sha256[:12]}  ({out.note})".rstrip()
                )
        return "\n".join(text)

    def to_dict(self) -> dict[str, Any]:
        return {"run_dir": str(self.run_dir), "roots": [r.to_dict() for r in self.roots]}


def _stage_note(st: LoadedStatement) -> str:
    meta, internal = st.metadata, st.internal
    parts = [internal.get("status", "?"), f"run {meta.get('invocationId', '?')}"]
    try:
        start = datetime.fromisoformat(meta["startedOn"].replace("Z", "+00:00"))
        end = datetime.fromisoformat(meta["finishedOn"].replace("Z", "+00:00"))
        parts.append(f"{(end - start).total_seconds():.1f} s")
    except (KeyError, ValueError):
        pass
    if internal.get("resumed_from"):
        parts.append(f"resumed from {internal['resumed_from'].get('name')}")
    return ", ".join(parts)


def _bundle_manifest(st: LoadedStatement, run_dir: Path) -> dict[str, Any] | None:
    for dep in st.dependencies:
        if dep.get("annotations", {}).get("role") == "bundle_manifest":
            try:
                return json.loads(resolve(dep, run_dir, st).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return None
    return None


def _in_manifest(dep: Mapping[str, Any], manifest: Mapping[str, Any] | None) -> bool:
    """True when bundle.json pins this dependency's digest (a file entry, or a folder's tree of entries)."""
    if manifest is None:
        return False
    digest = dep["digest"]["sha256"]
    ann = dep.get("annotations", {})
    if ann.get("kind") == "tree" and ann.get("root") == "bundle":
        return manifest_tree_sha256(manifest, ann.get("path", "")) == digest
    return any(f.get("sha256") == digest for f in manifest.get("files", []))


def _export_of(descriptor: Mapping[str, Any]) -> str | None:
    """The model export folder a subject belongs to ("policy/recap/export" for
    "policy/recap/export/model.safetensors", or a subject that is itself an ".../export" folder), else None."""
    path = str(descriptor.get("annotations", {}).get("path", descriptor.get("name", "")))
    parts = path.split("/")
    if "export" not in parts[:-1] and parts[-1] != "export":
        return None
    return "/".join(parts[: parts.index("export") + 1])


def _headline(used: list[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The subject a stage's line shows (its other files counted as "+N more"): the first outside a trainer's
    checkpoint folders (`checkpoints/step_<n>/...`, train/checkpoint.py), which a stage keeps to resume from, not as
    its result; the first when all are. Subjects are listed by path, so a checkpointing stage showed
    `checkpoints/step_1/state.json`, not the weights it returned (audit56 B6)."""
    for subject in used:
        path = str(subject.get("annotations", {}).get("path", subject.get("name", "")))
        if not _CHECKPOINT_RE.search(path):
            return subject
    return used[0]


_CHECKPOINT_RE = re.compile(r"(^|/)checkpoints/step_\d+(\.partial)?(/|$)")
"""A path inside a trainer's checkpoint folder: train/checkpoint.py's `step_N/` (`step_N.partial/` while written)."""


def _exports(used: list[Mapping[str, Any]]) -> tuple[list[ChainNode], int]:
    """The model exports among a stage's used subjects, each as one node (its tree digest computed from the
    recorded file digests, as `lineage.tree_sha256` would from the files), and how many subjects lie outside
    any export."""
    groups: dict[str, dict[str, str]] = {}
    others = 0
    for subject in used:
        folder = _export_of(subject)
        if folder is None:
            others += 1
            continue
        path = str(subject.get("annotations", {}).get("path", subject.get("name", "")))
        files = groups.setdefault(folder, {})
        if path == folder:  # the export recorded as one folder: its digest is the tree digest already
            files[""] = subject["digest"]["sha256"]
        else:
            files[path[len(folder) + 1 :]] = subject["digest"]["sha256"]
    nodes = []
    for folder, files in groups.items():
        parts = folder.split("/")
        label = parts[-2] if len(parts) > 2 else "export"  # policy/<mode>/export -> the mode
        if "" in files:
            sha, count = files[""], "one folder"
        else:
            sha = hashlib.sha256(tree_lines(files)).hexdigest()
            count = f"{len(files)} file{'s' if len(files) > 1 else ''}"
        nodes.append(ChainNode(label=label, name=folder, sha256=sha, note=count))
    return nodes, others


def edge_key(descriptor: Mapping[str, Any]) -> tuple[str, str, str]:
    """(root, path, sha256) of a subject or dependency: a dependency is a stage's output when all three match."""
    ann = descriptor.get("annotations", {})
    return (str(ann.get("root", "")), str(ann.get("path", descriptor.get("name", ""))), descriptor["digest"]["sha256"])


def lineage_chain(run_dir: Path) -> Chain:
    """Walk the run's statements from the outputs nothing consumed back to the bundle manifest.

    A dependency that is a subject of another statement (the same place, the run's or the bundle's
    relative path, and the same digest) continues into the stage that produced it; a digest alone
    draws no edge (two stages may write identical bytes, e.g. the same tokenizer file). Other
    dependencies are leaves, marked "in bundle.json" when the bundle manifest the stage read pins
    their digest. Each upstream stage is one node however many of its files were read ("+N more files");
    a stage already printed is shown once more as "seen above", without its inputs.
    """
    statements = load_statements(run_dir)
    producer: dict[tuple[str, str, str], LoadedStatement] = {}
    for st in statements:
        for subject in st.subjects:
            producer[edge_key(subject)] = st
    consumed = {edge_key(dep) for st in statements for dep in st.dependencies}
    roots_st = [st for st in statements if not any(edge_key(s) in consumed for s in st.subjects)]
    if not roots_st:  # a cycle cannot be built from digests, but a hand-edited folder can hold one
        roots_st = statements[-1:]
    shown: set[Path] = set()
    leaves_shown: set[str] = set()
    by_key: dict[Path, dict[tuple[str, str, str], Mapping[str, Any]]] = {}

    def subject_by_key(st: LoadedStatement) -> dict[tuple[str, str, str], Mapping[str, Any]]:
        """`st`'s subjects by edge_key, built once per statement; the first of equal keys wins, as a scan would."""
        if st.file not in by_key:
            keyed: dict[tuple[str, str, str], Mapping[str, Any]] = {}
            for subject in st.subjects:
                keyed.setdefault(edge_key(subject), subject)
            by_key[st.file] = keyed
        return by_key[st.file]

    def stage_node(st: LoadedStatement, used: list[Mapping[str, Any]]) -> ChainNode:
        """`used`: the subjects of `st` the consumer read (all of them for a root)."""
        used = used or st.subjects[:1]
        exports, others = _exports(used)
        if len(exports) > 1:  # every export by name (the policy's modes), under a line that counts them
            names = ", ".join(e.label for e in exports)
            node = ChainNode(label=st.stage, name=f"{len(exports)} model exports: {names}", sha256="")
            node.outputs = exports
            extra = others
        elif exports:  # one export: the folder, by its tree digest
            node = ChainNode(label=st.stage, name=exports[0].name, sha256=exports[0].sha256)
            extra = others
        else:
            head = _headline(used)
            node = ChainNode(label=st.stage, name=head["name"], sha256=head["digest"]["sha256"])
            extra = len(used) - 1
        more = f"+{extra} more file{'s' if extra > 1 else ''}" if extra else ""
        if st.file in shown:  # its exports were listed where it was first shown
            node.note = ", ".join(x for x in (more, "seen above") if x)
            node.outputs = []
            return node
        shown.add(st.file)
        node.note = ", ".join(x for x in (more, _stage_note(st)) if x)
        # One child per upstream stage (however many of its files were read), newest first and depth first,
        # so the chain reads policy -> advantages -> value -> returns -> datasets -> bundle manifest and shared
        # inputs (bundle manifest, layers) print once, under the deepest stage that read them.
        # Keyed, not scanned: a stage of n output files read by the next one was n^2 edge_key calls (8000 files:
        # 32M calls, 99 s per report.html; audit58 B1). `seen` keeps each file once, in first-read order.
        upstreams: dict[Path, tuple[LoadedStatement, list[Mapping[str, Any]], set[tuple[str, str, str]]]] = {}
        leaves = []
        for dep in st.dependencies:
            key = edge_key(dep)
            upstream = producer.get(key)
            if upstream is not None and upstream.file != st.file:
                _, matches, seen = upstreams.setdefault(upstream.file, (upstream, [], set()))
                if key not in seen:
                    seen.add(key)
                    matches.append(subject_by_key(upstream)[key])
            else:
                leaves.append(dep)
        for upstream, matches, _ in sorted(upstreams.values(), key=lambda g: g[0].metadata["startedOn"], reverse=True):
            node.children.append(stage_node(upstream, matches))
        manifest = _bundle_manifest(st, run_dir)
        repeated = 0
        for dep in sorted(leaves, key=lambda d: d.get("annotations", {}).get("role") == "bundle_manifest"):
            digest = dep["digest"]["sha256"]
            if digest in leaves_shown:
                repeated += 1
                continue
            leaves_shown.add(digest)
            role = dep.get("annotations", {}).get("role", "input")
            note = "in bundle.json" if role != "bundle_manifest" and _in_manifest(dep, manifest) else ""
            if role == "weights":  # what the stage's model started from (pretrained_manifest, its files)
                note = ", ".join(x for x in ("starting weights", note) if x)
            node.children.append(ChainNode(label=role, name=dep["name"], sha256=digest, note=note))
        if repeated:
            node.note += f", {repeated} more input{'s' if repeated > 1 else ''} shown below"
        return node

    return Chain(run_dir=Path(run_dir), roots=[stage_node(st, list(st.subjects)) for st in reversed(roots_st)])


# -- verification -------------------------------------------------------------------------------

RUN_JSON = "run.json"


@dataclass(kw_only=True, slots=True, frozen=True)
class LineageProblem:
    """A subject or dependency whose bytes are not the ones recorded, or a statement run.json disagrees with."""

    kind: str
    """"missing" (exit 11), "digest", "link", "record" or "unrecorded" (exit 14)."""
    statement: str
    """The statement file's name."""
    what: str
    """"subject" or the dependency's role ("statement", "run.json" for the run's record itself)."""
    path: str
    expected: str
    actual: str | None = None
    files: tuple[str, ...] = ()
    """For a folder, what changed inside it ("changed: meta/info.json"), when the record lists its files."""
    looked_at: str = ""
    """For a missing bundle material: the absolute path it was looked for at (the bundle the statement names)."""

    def __str__(self) -> str:
        if self.kind in ("record", "unrecorded", "link"):
            return f"{'differs' if self.kind == 'record' else self.kind}: {self.path} ({self.actual})"
        if self.what == "statement":
            return f"missing: {self.path} (stage {self.statement} is complete in run.json, its statement is gone)"
        if self.what == RUN_JSON:
            return (
                f"missing: {self.path} ({self.actual}): which stages are complete cannot be told, so a deleted "
                "statement would go unnoticed; only the statements there were checked"
            )
        if self.kind == "missing":
            where = f"; looked for at {self.looked_at}" if self.looked_at else ""
            return (
                f"missing: {self.path} ({self.what} of {self.statement}; expected sha256:{self.expected[:12]}{where})"
            )
        inside = f"; {', '.join(self.files[:8])}{' ...' if len(self.files) > 8 else ''}" if self.files else ""
        return (
            f"digest differs: {self.path} ({self.what} of {self.statement}): "
            f"recorded sha256:{self.expected[:12]}, now sha256:{(self.actual or '')[:12]}{inside}"
        )

    def to_dict(self) -> dict[str, Any]:
        keys = ("kind", "statement", "what", "path", "expected", "actual")
        return {**{k: getattr(self, k) for k in keys}, "files": list(self.files), "looked_at": self.looked_at}


@dataclass(kw_only=True, slots=True)
class LineageReport:
    """The result of `verify_lineage`: how many items were rehashed and what differs."""

    statements: int
    checked: int
    problems: list[LineageProblem]
    notes: list[str] = field(default_factory=list)
    """Lines that say why (stale stages) or what to do (restore the bundle), printed after the problems."""

    @property
    def exit_code(self) -> int:
        """0 when everything matches; else 11 (something missing) or 14 (a digest or a record differs), lowest wins."""
        kinds = {p.kind for p in self.problems}
        return EXIT_MISSING if "missing" in kinds else EXIT_DIGEST if kinds else 0

    def summary(self) -> str:
        if not self.problems:
            return f"lineage verified: {self.checked} subjects and materials of {self.statements} statements match"
        n = len(self.problems)
        head = (
            f"lineage differs: {n} of {self.checked} subjects and materials"
            if self.checked
            else f"lineage differs: {n} problem{'s' if n != 1 else ''} (no statement left to check)"  # review R3
        )
        return "\n".join([head, *(f"  {p}" for p in self.problems), *self.notes])

    def to_dict(self) -> dict[str, Any]:
        return {
            "statements": self.statements,
            "checked": self.checked,
            "exit_code": self.exit_code,
            "problems": [p.to_dict() for p in self.problems],
            "notes": list(self.notes),
        }


def verify_lineage(run_dir: Path) -> LineageReport:
    """Rehash every subject and resolved dependency of every statement (each path once); collect all differences.

    Also checks each statement against its stage's record in run.json (`_against_record`): a stage run.json
    records complete whose statement is gone, a statement of no stage there, a status or a config that disagrees
    with the record written with it. A missing or unreadable run.json is itself a problem (exit 11): without it a
    deleted statement cannot be noticed. A subject or material under the run that is (or lies under) a link is a
    problem ("link"), not followed: recording a stage refuses outputs that link out.

    Raises InputNotFoundError / InvalidInputError when the lineage folder is missing or a statement is
    malformed (a path of root "run" outside the run folder included); ReadFailedError naming the path when one
    cannot be read; differences in the bytes are returned, not raised.
    """
    state, why = _read_state(Path(run_dir))
    try:
        statements = load_statements(run_dir)
    except InputNotFoundError:
        # every statement (or lineage/ itself) gone from a run whose run.json records complete stages is those
        # stages' statements missing, exit 11 as when one of several is gone (audit53 V4: it was exit 3, no hint)
        if not _unstated(state or {"stages": {}}, set()):
            raise
        statements = []
    items: list[tuple[LoadedStatement, str, Mapping[str, Any]]] = []
    for st in statements:
        items += [(st, "subject", s) for s in st.subjects]
        items += [(st, d.get("annotations", {}).get("role", "dependency"), d) for d in st.dependencies]
    cache: dict[Path, tuple[str, dict[str, str] | None] | str | None] = {}
    problems: list[LineageProblem] = []
    bundles_missing: set[str] = set()
    recorded_state, _ = _read_state(Path(run_dir))
    for st, what, desc in items:
        path = _moved_path(resolve(desc, run_dir, st), recorded_state, st)
        ann = desc.get("annotations", {})
        if path not in cache:
            link = _link_in_run(path, Path(run_dir)) if ann.get("root") == "run" else None
            cache[path] = (
                link if link is not None else _hash(path, f"{desc.get('name', path)} ({what} of {st.file.name})")
            )
        expected, shown = desc["digest"]["sha256"], desc.get("name", str(path))
        now = cache[path]
        if isinstance(now, str):  # a link: named, not followed
            problems.append(
                LineageProblem(
                    kind="link", statement=st.file.name, what=what, path=shown, expected=expected,
                    actual=f"{what} of {st.file.name}: {now}; recording a stage refuses an output that links out",
                )
            )  # fmt: skip
            continue
        if now is None and what == "checkpoint":
            continue  # the checkpoint a stage resumed from, digested at load: keep-last prunes it (audit53 U1)
        if now is None:
            bundled = ann.get("root") == "bundle" and st.bundle
            if bundled:
                bundles_missing.add(str(st.bundle))
            problems.append(
                LineageProblem(
                    kind="missing", statement=st.file.name, what=what, path=shown, expected=expected,
                    looked_at=str(path) if bundled else "",
                )
            )  # fmt: skip
            continue
        actual, files = now
        if actual != expected:
            recorded = _recorded_files(desc, st, run_dir)
            changes = tuple(tree_changes(recorded, files)) if recorded is not None and files is not None else ()
            problems.append(
                LineageProblem(
                    kind="digest",
                    statement=st.file.name,
                    what=what,
                    path=shown,
                    expected=expected,
                    actual=actual,
                    files=changes,
                )
            )
    notes = []
    if state is None:
        problems.append(
            LineageProblem(kind="missing", statement="", what=RUN_JSON, path=RUN_JSON, expected="", actual=why)
        )
    else:
        problems += _unstated(state, {st.file.name for st in statements})
        problems += _against_record(state, statements)
        notes += _stale_notes(state, statements, problems)
    notes += _statement_hints(problems, state, Path(run_dir))
    for bundle in sorted(bundles_missing):
        notes.append(
            f"hint: the bundle these statements read is not at {bundle} (or lacks those files); restore or copy "
            "the bundle back to that folder and verify again"
        )
    return LineageReport(statements=len(statements), checked=len(items), problems=problems, notes=notes)


def _statement_hints(problems: list[LineageProblem], state: Mapping[str, Any] | None, run_dir: Path) -> list[str]:
    """One hint per kind of statement problem, each naming what makes `--verify` pass (audit56 H1: every kind got the
    lost statement's `--resume` hint, which leaves an extra or edited statement as it is). A statement deleted, the
    stage's record still there, is what `--resume` writes again from run.json (`runner._rewrite_lost_statement`)."""
    stages = (state or {}).get("stages") or {}
    lost = [p for p in problems if p.what == "statement" and p.kind == "missing"]
    extra = [p.path for p in problems if p.kind == "unrecorded" and p.statement[: -len(SUFFIX)] not in stages]
    swapped = [p.path for p in problems if p.kind == "unrecorded" and p.statement[: -len(SUFFIX)] in stages]
    edited = list(dict.fromkeys(p.path for p in problems if p.kind == "record"))
    resume = f"`portable run --resume` on {run_dir} (with the config it ran with)"
    lines = []
    if lost:
        lines.append(f"hint: `portable run --resume` on {run_dir} writes a lost statement again from run.json")
    if extra:
        lines.append(f"hint: no stage of run.json wrote {', '.join(extra)}: delete it from {run_dir} and verify again")
    if swapped:
        lines.append(
            f"hint: {', '.join(swapped)} holds another stage's statement: delete it, then {resume} writes the "
            "stage's own again from run.json"
        )
    if edited:
        restart = " ".join(f"--restart-stage {Path(rel).name[: -len(SUFFIX)]}" for rel in edited)
        lines.append(
            f"hint: {', '.join(edited)} is not the statement written with run.json's record of its stage: delete it, "
            f"then {resume} writes it again from run.json (or `{restart}` redoes the stage)"
        )
    stale = stale_stages(state) if state is not None else {}
    # a stale stage's differing upstream output has its `note:` (`_stale_notes`): the run says so, nothing to put back
    unexplained = [p for p in problems if not (p.what == "upstream_output" and p.statement[: -len(SUFFIX)] in stale)]
    lines += _material_hints(unexplained, run_dir)
    return lines


def _material_hints(problems: list[LineageProblem], run_dir: Path) -> list[str]:
    """The hints for bytes that changed or became links after a stage recorded them (exit 14 had none: audit60 L8).
    A changed subject is redone by restarting the stage that wrote it; a changed input is put back."""
    changed = list(dict.fromkeys(p.path for p in problems if p.kind == "digest"))
    writers = list(
        dict.fromkeys(p.statement[: -len(SUFFIX)] for p in problems if p.kind == "digest" and p.what == "subject")
    )
    links = list(dict.fromkeys(p.path for p in problems if p.kind == "link"))
    lines = []
    if changed and writers:
        restart = " ".join(f"--restart-stage {name}" for name in writers)
        lines.append(
            f"hint: {', '.join(changed)} changed after the run recorded it: put the recorded bytes back (a copy "
            f"of the run folder), or `portable run --resume {restart}` on {run_dir} redoes the stage and writes "
            "its statement again"
        )
    elif changed:
        lines.append(
            f"hint: {', '.join(changed)} is not what the stages read: put the recorded bytes back (restore the "
            "bundle or copy the files again) and verify again"
        )
    if links:
        lines.append(f"hint: replace the link(s) {', '.join(links)} with the files themselves and verify again")
    return lines


def _read_state(run_dir: Path) -> tuple[dict[str, Any] | None, str]:
    """run.json as a dict with a `stages` object, else (None, why not in a few words)."""
    path = run_dir / RUN_JSON
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, "not there"
    except (OSError, ValueError) as exc:
        return None, f"unreadable: {type(exc).__name__}"
    if not isinstance(state, dict) or not isinstance(state.get("stages"), dict):
        return None, "unreadable: no `stages` object"
    return state, ""


def _unstated(state: Mapping[str, Any], files: set[str]) -> list[LineageProblem]:
    """A `missing` problem for each stage run.json records complete whose statement file is not there (a deleted
    statement leaves nothing to rehash, so the loop over statements alone would verify)."""
    return [
        LineageProblem(
            kind="missing",
            statement=name,
            what="statement",
            path=f"{LINEAGE_DIR}/{name}{SUFFIX}",
            expected="",
        )
        for name, rec in state["stages"].items()
        if isinstance(rec, dict) and rec.get("status") == "complete" and f"{name}{SUFFIX}" not in files
    ]


def _select(config: Any, dotted: str) -> Any:
    """config[a][b] for "a.b", None when absent (as the runner's `select`, which key_parts are made with)."""
    for part in dotted.split("."):
        if not isinstance(config, dict) or part not in config:
            return None
        config = config[part]
    return config


def _disagreement(recorded: Any, stated: Any, where: str) -> tuple[str, Any, Any] | None:
    """The first place where `stated` does not hold what `recorded` does: a mapping's keys are compared only as far
    as `recorded` has them (key_parts leave out the keys declared not to change outputs), anything else exactly.
    A value redacted on either side is not compared (both were redacted when written)."""
    if isinstance(recorded, dict):
        if not isinstance(stated, dict):
            return where, recorded, stated
        for key, value in recorded.items():
            found = _disagreement(value, stated.get(key), f"{where}.{key}")
            if found is not None:
                return found
        return None
    if REDACTED in canonical_json(recorded) or REDACTED in canonical_json(stated):
        return None
    return None if canonical_json(recorded) == canonical_json(stated) else (where, recorded, stated)


def _against_record(state: Mapping[str, Any], statements: list[LoadedStatement]) -> list[LineageProblem]:
    """What a statement says that its stage's record in run.json, written together with it, contradicts.

    The rule: a stage's record (status, `key_parts.config`, `lineage.config_sha256`) and its statement are written
    by the same invocation (a statement written again by --resume only when the config digests agree), so they
    must agree; a statement carries the config of the invocation that ran its stage, and run.json's top-level
    `config` is the latest invocation's (a later one may change keys that do not change outputs, or leave stages
    out with --stages), so the top-level config is not compared. A statement whose file names no stage of
    run.json, or another stage than its own, is named too (audit51 G1, G2)."""
    stages = state["stages"]
    out = []
    for st in statements:
        rel = f"{LINEAGE_DIR}/{st.file.name}"
        name = st.file.name[: -len(SUFFIX)]
        if name not in stages:
            out.append(_record_problem("unrecorded", st, rel, f"run.json has no stage {name!r}"))
            continue
        if st.stage != name:
            out.append(_record_problem("unrecorded", st, rel, f"it is the statement of stage {st.stage!r}"))
            continue
        rec = stages[name]
        if not isinstance(rec, dict) or rec.get("status") != "complete":
            continue
        status = st.internal.get("status")
        if status != "succeeded":
            out.append(
                _record_problem("record", st, rel, f"its status is {status!r}; run.json records stage {name} complete")
            )
        config = st.data["predicate"]["buildDefinition"]["externalParameters"].get("config")
        recorded = (rec.get("key_parts") or {}).get("config")
        # a stage `--inputs-moved` kept: its statement holds the paths it ran with, the record where the data is now
        stated = _moved(config, rec.get("moved"))
        found = None
        if isinstance(recorded, dict):
            for key, value in recorded.items():
                if value is None:  # a stage that names its training key itself: the runner blanks it (--target-step)
                    continue
                found = _disagreement(value, _select(stated, key), key)
                if found is not None:
                    break
        if found is not None:
            where, want, have = found
            out.append(
                _record_problem(
                    "record", st, rel,
                    f"config {where} is {_kind(have)}; run.json's record of stage {name} (key_parts) has {_kind(want)}",
                )
            )  # fmt: skip
            continue
        sha = (rec.get("lineage") or {}).get("config_sha256") if isinstance(rec.get("lineage"), dict) else None
        if isinstance(sha, str) and isinstance(config, dict) and REDACTED not in canonical_json(config):
            if json_sha256(config) != sha:
                out.append(
                    _record_problem(
                        "record", st, rel,
                        f"its config is not the one run.json's record of stage {name} was run with "
                        f"(stages.{name}.lineage.config_sha256 {sha[:12]})",
                    )
                )  # fmt: skip
    return out


def _moved_path(path: Path, state: Mapping[str, Any] | None, st: LoadedStatement) -> Path:
    """Where `path`, a dependency of statement `st`, is now: under the new folder of a [old, new] pair its stage's
    record in run.json notes (`moved`, what `portable run --resume --inputs-moved` accepted) when it lay under the
    old one; `path` itself otherwise."""
    rec = ((state or {}).get("stages") or {}).get(st.file.name[: -len(SUFFIX)])
    moved = rec.get("moved") if isinstance(rec, dict) else None
    for pair in moved if isinstance(moved, list) else []:
        if isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair):
            old = Path(pair[0])
            if path == old or old in path.parents:
                return Path(pair[1]) / path.relative_to(old)
    return path


def _moved(config: Any, moved: Any) -> Any:
    """`config` with each string that is the old path of a [old, new] pair of a record's `moved` read as the new one
    (a copy); `config` itself when the record notes no move."""
    pairs = (
        {a: b for a, b in moved if isinstance(a, str)}
        if isinstance(moved, list) and all(isinstance(p, list) and len(p) == 2 for p in moved)
        else {}
    )
    if not pairs:
        return config
    if isinstance(config, dict):
        return {k: _moved(v, moved) for k, v in config.items()}
    if isinstance(config, list):
        return [_moved(v, moved) for v in config]
    return pairs.get(config, config) if isinstance(config, str) else config


def _record_problem(kind: str, st: LoadedStatement, rel: str, why: str) -> LineageProblem:
    return LineageProblem(kind=kind, statement=st.file.name, what="statement", path=rel, expected="", actual=why)


def _stale_notes(
    state: Mapping[str, Any], statements: list[LoadedStatement], problems: list[LineageProblem]
) -> list[str]:
    """One line per upstream stage that changed, naming the stages a differing upstream output of makes stale
    (`portable run --stages X --target-step N` leaves them so until a --resume redoes them): it is no tampering."""
    stale = stale_stages(state)
    stage_of = {st.file.name: st.stage for st in statements}
    changed = []  # the upstream stages a differing upstream output of a stale stage points to
    for p in problems:
        stage = stage_of.get(p.statement)
        if p.kind == "digest" and p.what == "upstream_output" and stage in stale and stale[stage] not in changed:
            changed.append(stale[stage])
    lines = []
    for up in changed:
        names = [name for name, since in stale.items() if since == up]
        verb, they, it = ("is", "it", "it") if len(names) == 1 else ("are", "they", "them")
        lines.append(
            f"note: {', '.join(names)} {verb} stale since {up} changed after {they} ran; "
            f"`portable run --resume` redoes {it}"
        )
    return lines


def _link_in_run(path: Path, run_dir: Path) -> str | None:
    """ "<path> -> <target>" when `path` or a folder between the run folder and it is a symbolic link, else None."""
    try:
        rel = path.relative_to(run_dir)
    except ValueError:
        return None
    node = run_dir
    for part in rel.parts:
        node = node / part
        if node.is_symlink():
            try:
                target = os.readlink(node)
            except OSError:
                target = "?"
            return f"{node.relative_to(run_dir).as_posix()} -> {target}"
    return None


def _hash(path: Path, what: str) -> tuple[str, dict[str, str] | None] | None:
    """`_current`, with an OSError named by the path and the statement it was read for (audit51 G5)."""
    try:
        return _current(path)
    except OSError as exc:
        raise os_error(
            exc, f"{path}, {what}", op="read", hint="check that file; `portable lineage RUN --verify` only reads"
        ) from exc


def _current(path: Path) -> tuple[str, dict[str, str] | None] | None:
    """(sha256, per-file digests for a folder) of what is at `path` now; None when nothing is there."""
    if path.is_dir():
        files = tree_digests(path)
        return tree_sha256(path, files), files
    if path.is_file():
        return sha256_file(path), None
    return None


def _recorded_files(desc: Mapping[str, Any], st: LoadedStatement, run_dir: Path) -> dict[str, str] | None:
    """The per-file digests a folder had when recorded: its annotations' list, else bundle.json's entries."""
    ann = desc.get("annotations", {})
    if isinstance(ann.get("files"), dict):
        return dict(ann["files"])
    manifest = _bundle_manifest(st, run_dir)
    if ann.get("root") == "bundle" and manifest is not None:
        prefix = ann.get("path", "").rstrip("/") + "/"
        return {
            f["path"][len(prefix) :]: f["sha256"] for f in manifest.get("files", []) if f["path"].startswith(prefix)
        }
    return None
