"""run.json's shape (checked on every load), and the seam between the runner and the lineage writer.

`check_state` validates a parsed run.json against the schema its `format_version` names and raises
RunStateError (exit 55) naming the first field that is wrong, so a hand-edited or damaged record is
refused with one line instead of failing deep in the runner. `make_recorder`: one StageRecord in, one
in-toto Statement out.

The runner calls `make_recorder(...)` once per run; it returns None when the lineage module
(reproduction/run/lineage.py) is not installed, so the runner works without it. Each stage's
statement lists its outputs (with the digests run.json holds), the datasets it read, the upstream
outputs, the bundle manifest with its runtime and source layers, and the checkpoint it continued from.
"""

from __future__ import annotations

import math
import posixpath
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reproduction.digests import is_sha256
from reproduction.errors import RunStateError

STATUSES = ("running", "complete", "failed", "interrupted")
"""A stage record's states: `running` (started, or the process was killed -9), `complete`, `failed` (the
stage raised), `interrupted` (Ctrl-C / SIGTERM). Every state but `complete` is continued or redone by --resume."""


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _kind(v: Any) -> str:
    names = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(v), "a number" if _number(v) or isinstance(v, (int, float)) else type(v).__name__)


def _output_problem(stage: str, rel: Any, value: Any) -> str | None:
    inside = isinstance(rel, str) and rel and not rel.startswith("/")
    if not inside or posixpath.normpath(f"{stage}/{rel}").split("/")[0] in ("..", "."):
        return f"path {rel!r} is not a path inside the run folder"  # (eval's evidence is ../evidence/...)
    ok = (
        isinstance(value, list)
        and len(value) == 3
        and _int(value[0])
        and value[0] >= 0
        and _int(value[1])
        and isinstance(value[2], str)
        and len(value[2]) == 64
    )
    return None if ok else f"{rel!r} is {_kind(value)} {value!r:.60}, expected [size, mtime_ns, sha256]"


# (field, test, expected) for a stage record's optional fields; `status` and `key` are required
_STAGE_FIELDS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("key_parts", lambda v: isinstance(v, dict), "a mapping"),
    ("summary", lambda v: isinstance(v, dict), "a mapping"),
    ("step", lambda v: v is None or (_int(v) and v >= 0), "a step number >= 0 or null"),
    ("resumed_from", lambda v: v is None or (_int(v) and v >= 0), "a step number >= 0 or null"),
    ("started", _number, "a number (seconds since the epoch)"),
    ("ended", _number, "a number (seconds since the epoch)"),
    ("seconds", _number, "a number"),
    ("error", lambda v: isinstance(v, str), "a string"),
    (
        "target_step",  # written during stop 54 (audit54 A6) on a stopped stage; read, no longer written (R2)
        lambda v: _int(v) and v >= 1,
        "a step number >= 1 (the --target-step the stopped stage was training to)",
    ),
    ("lineage", lambda v: isinstance(v, dict), "a mapping (what the stage's lineage statement recorded)"),
    # since stop 58 (audit58 B3): the StageSpec declarations it ran under, compared on --resume; older records lack it
    ("declaration", lambda v: isinstance(v, dict), "a mapping (the stage's declarations in the recipe)"),
    (
        "config_files",  # since stop 52 (audit51 I4); older records have none
        lambda v: (
            isinstance(v, list)
            and all(isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in v)
        ),
        "a list of [path, sha256] pairs (the --config layers the stage ran with)",
    ),
)


def _version_pairs(v: Any) -> bool:
    return isinstance(v, list) and all(
        isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and (p[1] is None or isinstance(p[1], str))
        for p in v
    )


# (key, test, expected) for every key of a stage record's `lineage`, all required: --resume writes a lost statement
# again from them (runner._rewrite_lost_statement), so a damaged one is refused here, not deep in the writer
# (but those in _LINEAGE_OPTIONAL, which a run.json written before them lacks)
_LINEAGE_FIELDS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("argv", lambda v: isinstance(v, list) and all(isinstance(a, str) for a in v), "a list of strings (the command)"),
    ("world_size", lambda v: _int(v) and v >= 1, "an integer >= 1"),
    ("device", lambda v: v is None or isinstance(v, str), "a string or null"),
    ("resumed_from_path", lambda v: v is None or isinstance(v, str), "a string (a checkpoint's path) or null"),
    (
        "resumed_from_sha256",
        lambda v: v is None or is_sha256(v),
        "a sha256 (64 lowercase hex digits) or null",
    ),
    ("versions", lambda v: v is None or _version_pairs(v), "null or a list of [name, version] string pairs"),
    (
        "config_sha256",
        is_sha256,
        "a sha256 (64 lowercase hex digits)",
    ),
    ("target_step", lambda v: _int(v) and v >= 1, "an integer >= 1 (the --target-step the stage trained to)"),
)


# target_step: present only where a --target-step applied (audit55 G1)
_LINEAGE_OPTIONAL = frozenset({"resumed_from_sha256", "target_step"})


def _lineage_problem(where: str, params: dict[str, Any]) -> str | None:
    for key, test, expected in _LINEAGE_FIELDS:
        if key not in params and key in _LINEAGE_OPTIONAL:
            continue
        if key not in params:
            return f"{where}.lineage.{key} is missing, expected {expected}"
        if not test(params[key]):
            shown = "null" if params[key] is None else f"{_kind(params[key])} {params[key]!r:.60}"
            return f"{where}.lineage.{key} is {shown}, expected {expected}"
    return None


def _stage_problem(name: str, rec: Any) -> str | None:
    where = f"stages.{name}"
    if not isinstance(rec, dict):
        return f"{where} is {_kind(rec)}, expected a mapping (the stage's record)"
    if rec.get("status") not in STATUSES:
        return f"{where}.status is {rec.get('status')!r}, expected one of {', '.join(STATUSES)}"
    if not isinstance(rec.get("key"), str):
        return f"{where}.key is {_kind(rec.get('key'))}, expected a string (the stage key's sha256)"
    for key, test, expected in _STAGE_FIELDS:
        if key in rec and not test(rec[key]):
            return f"{where}.{key} is {_kind(rec[key])}, expected {expected}"
    if "lineage" in rec:
        problem = _lineage_problem(where, rec["lineage"])
        if problem:
            return problem
    outputs = rec.get("outputs")
    if outputs is None and rec["status"] == "complete":
        return f"{where}.outputs is missing (a complete stage records its outputs)"
    if outputs is not None:
        if not isinstance(outputs, dict):
            return f"{where}.outputs is {_kind(outputs)}, expected a mapping of path -> [size, mtime_ns, sha256]"
        for rel, value in outputs.items():
            problem = _output_problem(name, rel, value)
            if problem:
                return f"{where}.outputs: {problem}"
    return None


def _run_target(v: Any) -> bool:
    return (
        isinstance(v, dict)
        and set(v) == {"step", "stages"}
        and _int(v["step"])
        and v["step"] >= 1
        and isinstance(v["stages"], list)
        and all(isinstance(n, str) and n for n in v["stages"])
    )


def state_problem(doc: Any, format_version: int) -> str | None:
    """The first field of a parsed run.json that does not fit schema `format_version` (1), or None."""
    if not isinstance(doc, dict):
        return f"the top level is {_kind(doc)}, expected a mapping"
    if doc.get("format_version") != format_version or not _int(doc.get("format_version")):
        return f"format_version is {doc.get('format_version')!r}, expected {format_version}"
    for key, test, expected in (
        ("recipe", lambda v: isinstance(v, str), "a string"),
        ("run_id", lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    ):
        if not test(doc.get(key)):
            return f"{key} is {_kind(doc.get(key))}, expected {expected}"
    if "recipe_ref" in doc and not (isinstance(doc["recipe_ref"], str) and doc["recipe_ref"]):
        return f"recipe_ref is {_kind(doc['recipe_ref'])}, expected a non-empty string (the config's recipe name)"
    if "created" in doc and not _number(doc["created"]):
        return f"created is {_kind(doc['created'])}, expected a number (seconds since the epoch)"
    if "config" in doc and not isinstance(doc["config"], dict):
        return f"config is {_kind(doc['config'])}, expected a mapping (the resolved config)"
    if not isinstance(doc.get("stages"), dict):
        return f"stages is {_kind(doc.get('stages'))}, expected a mapping of stage name -> record"
    if "target_step" in doc and not _run_target(doc["target_step"]):  # since stop 54 (audit54 R2); older: none
        return (
            f"target_step is {_kind(doc['target_step'])} {doc['target_step']!r:.60}, expected "
            '{"step": a step number >= 1, "stages": a list of stage names} (the --target-step of an invocation '
            "that has not completed)"
        )
    for name, rec in doc["stages"].items():
        problem = _stage_problem(name, rec)
        if problem:
            return problem
    return None


def upgrade_state(doc: dict[str, Any]) -> dict[str, Any]:
    """A checked run.json brought to today's fields, in memory (written back with the run's next state change).

    Records written before recipes had names (no `recipe_ref`) were made by `portable run`, which ran RECAP, or by
    code passing its own Recipe: their recipe is found by the name they recorded (`recap` for all of the former),
    and a RECAP record's config gains the `recipe` key its schema now has, so a `--resume` sees the config it ran
    with (stage keys read config subsets only and do not change). Mutates and returns `doc`."""
    if "recipe_ref" not in doc:
        doc["recipe_ref"] = doc["recipe"]
        if doc["recipe"] == "recap" and isinstance(doc.get("config"), dict):
            doc["config"] = {"recipe": "recap", **doc["config"]}
    return doc


def mend_steps(doc: Any) -> Any:
    """`doc` with the stage records' `step` / `resumed_from` that runs before stop 47 wrote unchecked brought back
    to what the stage meant, mutated in place: the runner recorded a numpy integer as its str() ("5") and a float as
    it was (5.0), and every later read refused the folder (exit 55), --restart-stage of the stage included. A string
    of digits or a whole float >= 0 becomes the int; any other value that is no step (a string of words, 5.5, -1)
    makes the record `failed` with its step unset and the reason in `error`, so --resume continues (a training stage)
    or redoes the stage, which now has its return value checked (exit 54). Nothing else is changed."""
    stages = doc.get("stages") if isinstance(doc, dict) else None
    for rec in stages.values() if isinstance(stages, dict) else ():
        if not isinstance(rec, dict):
            continue
        for key in ("step", "resumed_from"):
            v = rec.get(key)
            if v is None or (_int(v) and v >= 0):
                continue
            if isinstance(v, str) and v.isascii() and v.isdigit():
                rec[key] = int(v)
            elif isinstance(v, float) and v.is_integer() and v >= 0:
                rec[key] = int(v)
            else:
                rec.update(step=None, resumed_from=None)
                if rec.get("status") == "complete":
                    rec["status"] = "failed"
                    rec["error"] = f"the stage returned {key} {v!r:.60}, which is no step number (--resume redoes it)"
                break
    return doc


def check_state(doc: Any, path: Path, format_version: int) -> dict[str, Any]:
    """`doc` (a parsed run.json) when it fits the schema, after `mend_steps`; RunStateError (exit 55) naming the
    field otherwise."""
    problem = state_problem(mend_steps(doc), format_version)
    if problem:
        raise RunStateError(
            f"{path}: {problem}",
            path=path,
            hint="put back the run.json the run wrote, or start a new run in a new --output",
        )
    return doc


def make_recorder(bundle: Path | None) -> Callable[[Any], None] | None:
    """A recorder writing <run>/lineage/<stage>.intoto.json per stage, or None without the lineage module."""
    try:
        from reproduction.run import lineage
    except ImportError:
        return None
    if not hasattr(lineage, "write_stage_statement"):
        return None
    own = lineage.DigestCache()  # for a runner that hands no cache of its own

    def record(rec: Any) -> dict[str, Any]:
        """Write rec's statement; returns the versions it recorded (rec.versions, or today's)."""
        A = lineage.Artifact
        # The bundle manifest and its runtime/source layer archives (digests from bundle.json, which restore
        # verified): every stage ran that code on that runtime.
        inputs = list(lineage.bundle_inputs(Path(bundle))) if bundle is not None else []
        for item in rec.inputs.values():  # an opened input's folder (.root) or file (.path): what it was read from
            root = getattr(item, "root", None) or getattr(item, "path", None)
            if root is not None and Path(root).exists():
                inputs.append(A(path=Path(root), role="dataset"))
        for rel, sha in rec.upstream_files.items():
            inputs.append(A(path=rec.run_dir / rel, role="upstream_output", sha256=sha))
        for path, sha in getattr(rec, "input_files", {}).items():  # files a stage reads by path (a reference)
            inputs.append(A(path=Path(path), role="input_file", sha256=sha))
        for path in getattr(rec, "weight_files", []):  # the starting weights: manifest, then its files
            inputs.append(A(path=Path(path), role="weights"))
        resumed = None
        resumed_sha = getattr(rec, "resumed_from_sha256", None)
        if rec.resumed_from_path is not None and resumed_sha is not None:
            # The checkpoint as the trainer loaded it: keep-last has usually deleted it by now (audit53 U1)
            resumed = A(path=Path(rec.resumed_from_path), role="checkpoint", sha256=resumed_sha, kind="tree")
        elif rec.resumed_from_path is not None and Path(rec.resumed_from_path).exists():
            resumed = A(path=Path(rec.resumed_from_path), role="checkpoint")
        outputs = [A(path=rec.run_dir / rel, sha256=sha) for rel, sha in rec.subjects.items()]
        versions = getattr(rec, "versions", None)
        versions = dict(versions) if versions is not None else lineage.runtime_versions()
        lineage.write_stage_statement(
            lineage.StageRun(
                stage=rec.stage,
                run_id=rec.run_id,
                run_dir=rec.run_dir,
                outputs=outputs,
                inputs=inputs,
                argv=rec.argv,
                config=rec.config,
                world_size=rec.world_size,
                device=rec.device,
                started_on=rec.started,
                finished_on=rec.ended,
                status="succeeded",
                resumed_from=resumed,
                bundle_dir=Path(bundle) if bundle is not None else None,
                versions=versions,
                cache=getattr(rec, "digests", None) or own,
                target_step=getattr(rec, "target_step", None),
            )
        )
        return versions

    return record
