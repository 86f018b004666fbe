"""Pinned weights in bundles: verify a folder against a manifest, place weights and licenses when
packing, plan a pack without writing (`pack --dry-run`), and check a bundle's weights on restore.

In a bundle::

    <bundle>/
      weights/<file path>               every file the bundle's weight manifests name
      weights_manifest/<name>.json      a copy of each manifest (pinned by bundle.json like any file)
      LICENSES/<file> + index.json      exactly the licenses its manifests and spec name, and this runner's
      bundle.json  metadata.weights = [{"manifest", "dest", "name"}], metadata.licenses = {component: text}

`bundle.json` pins bytes to what pack saw; the weight manifests pin them to what upstream published.
Restore and run compare the two and refuse a weights file whose bytes are not the manifest's.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reproduction.digest_cache import DigestCache
from reproduction.digests import sha256_file, sha256_files
from reproduction.errors import InputNotFoundError, IntegrityError, InvalidInputError
from reproduction.release.manifest import Manifest, check_relative_path
from reproduction.release.weights_manifest import (
    UNPINNED,
    LicenseIndex,
    WeightsManifest,
    load_license_index,
    load_weights_manifest,
    project_root,
)
from reproduction.ui import UiOptions, human_bytes, say

RUNNER_COMPONENT = "recap-portable"
MANIFEST_DIR = "weights_manifest"


# -- verify -------------------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class WeightsProblem:
    kind: str
    """unpinned / missing / size / digest."""
    path: str
    detail: str = ""

    def describe(self) -> str:
        return f"{self.kind:8} {self.path}" + (f": {self.detail}" if self.detail else "")


@dataclass(kw_only=True, slots=True)
class WeightsReport:
    """What `verify_weights` found; `exit_code` 0 ok, 5 bytes missing or different, 4 only unpinned fields."""

    manifest: str
    files: int = 0
    ok: int = 0
    problems: list[WeightsProblem] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        if any(p.kind != "unpinned" for p in self.problems):
            return 5
        return 4 if self.problems else 0

    def summary(self) -> str:
        head = f"{self.manifest}: {self.ok} of {self.files} files verified"
        if not self.problems:
            return head + ", all match their pinned sha256"
        kinds: dict[str, int] = {}
        for p in self.problems:
            kinds[p.kind] = kinds.get(p.kind, 0) + 1
        counts = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        lines = [head + f"; {counts}"] + ["  " + p.describe() for p in self.problems]
        if "unpinned" in kinds:
            lines.append(
                f"  ({kinds['unpinned']} field(s) still read {UNPINNED!r}: the manifest cannot vouch for them)"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "manifest": self.manifest,
            "files": self.files,
            "ok": self.ok,
            "exit_code": self.exit_code,
            "problems": [{"kind": p.kind, "path": p.path, "detail": p.detail} for p in self.problems],
        }


def verify_weights(
    manifest: WeightsManifest, weights_dir: Path, *, jobs: int | None = None, digests: DigestCache | None = None
) -> WeightsReport:
    """Hash every file of `manifest` under `weights_dir`; report unpinned fields, missing files, wrong sizes
    and digests (collects everything, raises nothing). `digests`: a run's digest cache to hash through."""
    weights_dir = Path(weights_dir)
    report = WeightsReport(manifest=str(manifest.path or manifest.name), files=len(manifest.files()))
    report.problems += [WeightsProblem(kind="unpinned", path=u) for u in manifest.unpinned()]
    to_hash = {}
    for _, f in manifest.files():
        path = weights_dir / f.path
        if not path.is_file():
            report.problems.append(WeightsProblem(kind="missing", path=f.path, detail=f"not under {weights_dir}"))
        elif f.size != UNPINNED and path.stat().st_size != f.size:
            report.problems.append(
                WeightsProblem(kind="size", path=f.path, detail=f"{path.stat().st_size} bytes, pinned {f.size}")
            )
        elif f.sha256 != UNPINNED:
            to_hash[path] = f
    hashed = (digests.files(to_hash) if digests is not None else sha256_files(to_hash, jobs=jobs)) if to_hash else {}
    for path, digest in hashed.items():
        if digest != to_hash[path].sha256:
            report.problems.append(
                WeightsProblem(
                    kind="digest", path=to_hash[path].path, detail=f"sha256 {digest}, pinned {to_hash[path].sha256}"
                )
            )
        else:
            report.ok += 1
    return report


def verify_or_raise(manifest: WeightsManifest, weights_dir: Path) -> WeightsReport:
    """`verify_weights`, raising IntegrityError (naming every bad file) on missing or different bytes.

    Unpinned fields alone do not raise here (a caller decides whether it accepts them)."""
    report = verify_weights(manifest, weights_dir)
    bad = [p for p in report.problems if p.kind != "unpinned"]
    if bad:
        raise IntegrityError(
            f"weights under {weights_dir} differ from {report.manifest}:\n  " + "\n  ".join(p.describe() for p in bad),
            problems=[p.path for p in bad],
            hint=f"fetch them again: portable weights fetch {report.manifest} {weights_dir}",
        )
    return report


# -- pack ---------------------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class WeightsPlan:
    """What pack would do for one [[weights]] entry: files found, to build, missing."""

    manifest: WeightsManifest
    dest: str
    found: list[tuple[Path, str, int]] = field(default_factory=list)
    """(source file, bundle path, size) of files present with the pinned bytes."""
    build: list[str] = field(default_factory=list)
    """Bundle paths of built components pack builds (torch present)."""
    missing: list[str] = field(default_factory=list)
    """One line per file pack cannot place, saying why."""
    differ: list[str] = field(default_factory=list)
    """Those of `missing` that are present with other bytes than the pinned ones."""
    licenses: list[str] = field(default_factory=list)
    """License file names (in LICENSES/) the manifest needs."""


def plan_weights(spec: Any, *, licenses: LicenseIndex | None = None) -> list[WeightsPlan]:
    """Look for every file of every [[weights]] entry of `spec` (a BundleSpec); hashes what it finds."""
    index = licenses or load_license_index(near=spec.path, needed_by=f"pack {spec.path}")
    plans = []
    can_build = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("safetensors") is not None
    for ws in spec.weights:
        wm = load_weights_manifest(ws.manifest, licenses=index)
        plan = WeightsPlan(manifest=wm, dest=ws.dest, licenses=index.check(wm))
        unpinned = {i for i, comp in enumerate(wm.components) if comp.unpinned()}
        plan.missing += [line for i in sorted(unpinned) for line in _unpinned_lines(ws, wm.components[i])]
        candidates = {}
        for i, comp in enumerate(wm.components):
            if i in unpinned:
                continue
            for f in comp.files:
                path = (ws.source / f.path) if ws.source is not None else None
                if path is not None and path.is_file() and path.stat().st_size == f.size:
                    candidates[path] = (comp, f)
                elif path is not None and path.is_file():
                    line = f"{ws.dest}/{f.path}: {path} has {path.stat().st_size} bytes, the manifest pins {f.size}"
                    plan.missing.append(line)
                    plan.differ.append(line)
                elif comp.kind == "built" and can_build:
                    plan.build.append(f"{ws.dest}/{f.path}")
                else:
                    where = f" under {ws.source}" if ws.source is not None else " (the spec names no source folder)"
                    how = (
                        f"portable weights fetch {ws.manifest} DIR"
                        if comp.kind == "hub"
                        else "torch and safetensors installed (pack then builds it from its manifest's config and seed)"
                    )
                    plan.missing.append(f"{ws.dest}/{f.path}: not found{where}; get it with {how}")
        for path, digest in (sha256_files(candidates) if candidates else {}).items():
            comp, f = candidates[path]
            if digest == f.sha256:
                plan.found.append((path, f"{ws.dest}/{f.path}", int(f.size)))
            else:
                line = f"{ws.dest}/{f.path}: {path} has sha256 {digest}, the manifest pins {f.sha256}"
                plan.missing.append(line)
                plan.differ.append(line)
        plans.append(plan)
    return plans


def _unpinned_lines(ws: Any, comp: Any) -> list[str]:
    """One 'not pinned' line per file of a component with "to-be-pinned" fields."""
    src = comp.source.get("repo") or comp.source.get("builder")
    lines = []
    for f in comp.files:
        fields = [k for k in ("size", "sha256") if getattr(f, k) == UNPINNED]
        if comp.source.get("commit") == UNPINNED:
            fields.insert(0, "commit")
        lines.append(
            f"{ws.dest}/{f.path}: not pinned ({', '.join(fields) or 'model_config'}) [{src}]; "
            f"pin with: portable weights pin {ws.manifest}"
        )
    return lines


def license_files(spec: Any, plans: list[WeightsPlan], index: LicenseIndex) -> dict[str, str]:
    """{component: license file} for this runner, the spec's `licenses` and every manifest component."""
    out = {RUNNER_COMPONENT: index.component_file(RUNNER_COMPONENT, where="licenses")}
    for name in spec.licenses:
        out[name] = index.component_file(name, where="licenses", path=spec.path)
    for plan in plans:
        for comp in plan.manifest.components:
            out[f"{plan.manifest.name}/{comp.role}"] = comp.license["file"].removeprefix("LICENSES/")
    return out


def place_weights(spec: Any, stage: Path, *, ui: UiOptions | None = None) -> dict[str, Any]:
    """Copy (or build) every [[weights]] file into `stage`, copy the manifests and the licenses; returns
    the bundle.json metadata to add ({"weights": [...], "licenses": {...}}).

    Raises InputNotFoundError listing every file it cannot place, IntegrityError naming a file whose
    bytes differ from its manifest (also one an earlier [[file]] entry already copied there). Pack
    then checks the digests it records against the manifests (`check_bundle_weights`), so a source
    file changed after it was hashed here is caught without hashing it a third time.
    """
    from reproduction.release.weights_build import build_component

    if not spec.weights and not spec.licenses and not (project_root(spec.path) / "LICENSES" / "index.json").is_file():
        # A runner installed without its checkout (a wheel) has no LICENSES/; nothing here needs one.
        say("  no LICENSES/ beside this runner: the bundle carries no license files", options=ui)
        return {}
    index = load_license_index(near=spec.path, needed_by=f"pack {spec.path}")
    plans = plan_weights(spec, licenses=index)
    differ = [m for p in plans for m in p.differ]
    if differ:
        raise IntegrityError(
            f"{len(differ)} weights file(s) are not the bytes their manifests pin:\n  " + "\n  ".join(differ),
            problems=differ,
            hint="fetch them again: portable weights fetch MANIFEST DIR (then point the spec's source at DIR)",
        )
    missing = [m for p in plans for m in p.missing]
    if missing:
        raise InputNotFoundError(
            f"{len(missing)} weights file(s) cannot be placed:\n  " + "\n  ".join(missing),
            path=spec.path,
            hint=f"see what is missing with: portable pack {spec.path} --out DIR --dry-run",
        )
    meta = []
    for plan in plans:
        for src, rel, _ in plan.found:
            dst = stage / rel
            if dst.exists():
                _same_or_raise(dst, src, rel)
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
        for comp in plan.manifest.components:
            if comp.kind == "built" and any(f"{plan.dest}/{f.path}" in plan.build for f in comp.files):
                build_component(comp, stage / plan.dest)
                say(f"  built {comp.label} -> {plan.dest}/{comp.files[0].path}", options=ui)
        rel_manifest = (
            f"{MANIFEST_DIR}/{plan.manifest.path.name if plan.manifest.path else plan.manifest.name + '.json'}"
        )
        _write_own(stage, rel_manifest, plan.manifest.dumps().encode("utf-8"), "the copy of a weights manifest")
        meta.append({"name": plan.manifest.name, "manifest": rel_manifest, "dest": plan.dest})
        size = sum(int(f.size) for _, f in plan.manifest.files())
        say(f"  weights {plan.manifest.name}: {len(plan.manifest.files())} files, {human_bytes(size)}", options=ui)
    chosen = license_files(spec, plans, index)
    copy_licenses(stage / "LICENSES", set(chosen.values()), index)
    return {"weights": meta, "licenses": {k: f"LICENSES/{v}" for k, v in sorted(chosen.items())}}


def _same_or_raise(dst: Path, src: Path, rel: str) -> None:
    got, want = sha256_file(dst), sha256_file(src)
    if got != want:
        raise IntegrityError(
            f"{rel}: another spec entry already wrote different bytes there (sha256 {got}, the manifest pins {want})",
            problems=[rel],
            hint="drop the [[file]] entry that copies weights, or give it other bytes",
        )


def copy_licenses(dest: Path, names: set[str], index: LicenseIndex) -> None:
    """Copy the named license files and an index.json limited to them into `dest` (the stage's LICENSES/); refuses
    (exit 4) to replace a different file a [[file]] entry put there (`_write_own`)."""
    for name in sorted(names):
        _write_own(dest.parent, f"{dest.name}/{name}", (index.root / name).read_bytes(), "a license text")
    sub = {
        "format_version": 1,
        "licenses": {n: index.files[n] for n in sorted(names)},
        "components": {k: v for k, v in sorted(index.components.items()) if v["file"] in names},
    }
    index_text = (json.dumps(sub, indent=2) + "\n").encode("utf-8")
    _write_own(dest.parent, f"{dest.name}/index.json", index_text, "the license index")


def _write_own(stage: Path, rel: str, data: bytes, what: str) -> None:
    """Write a file pack itself adds at `stage`/`rel`. The plain files are copied first, so a file already there came
    from a [[file]] or [[config]] entry: InvalidInputError (exit 4) when its bytes differ, rather than replacing the
    user's file without a word (audit63 A M1)."""
    path = stage / rel
    clash = path.parent if path.parent.exists() and not path.parent.is_dir() else path
    if clash.exists() and not (clash.is_file() and clash == path and path.read_bytes() == data):
        raise InvalidInputError(
            f"{clash.relative_to(stage)}: a [[file]] or [[config]] entry put a file there, where pack writes "
            f"{what} ({rel}), so nothing was packed",
            field="file.dest",
            hint="give that entry another dest (or exclude the file from its folder)",
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


# -- restore and run ------------------------------------------------------------------------------------


def weights_items(manifest: Manifest) -> list[dict[str, str]]:
    """bundle.json's `metadata.weights`: a list of {"manifest": PATH, "dest": PATH}, checked as the input it is.

    `metadata` is free-form, so a string or a list of numbers there ended in an AttributeError (exit 1)
    and a non-string manifest path in a multi-line integrity error (audit F14): InvalidInputError (4).
    """
    items = manifest.metadata.get("weights") or []
    ok = isinstance(items, list) and all(
        isinstance(x, dict) and isinstance(x.get("manifest"), str) and isinstance(x.get("dest", "weights"), str)
        for x in items
    )
    if not ok:
        raise InvalidInputError(
            f'bundle.json metadata.weights should be a list of {{"manifest": PATH, "dest": PATH}} objects, got '
            f"{json.dumps(items)[:60]}",
            field="metadata.weights",
            hint="the manifest is damaged or hostile; fetch or pack the bundle again",
        )
    for i, x in enumerate(items):
        for key in ("manifest", "dest"):
            if key in x:
                check_relative_path(x[key], where=f"metadata.weights[{i}].{key}")
    return items


def check_bundle_weights(bundle: Path, manifest: Manifest) -> int:
    """Refuse a bundle whose weights are not the bytes its weight manifests pin; returns the files checked.

    Compares bundle.json's sha256 of each `weights/<path>` with the weight manifest's (restore's
    verify then proves the bytes on disk are bundle.json's). The manifests themselves are checked
    against bundle.json first. Raises IntegrityError naming every file that differs or is absent.
    """
    bundle = Path(bundle)
    items = weights_items(manifest)
    if not items:
        return 0
    lic_root = bundle / "LICENSES"
    index = load_license_index(lic_root if (lic_root / "index.json").is_file() else None)
    problems, checked = [], 0
    for item in items:
        rel = item["manifest"]
        entry = manifest.file(rel)
        if entry is None or not (bundle / rel).is_file() or sha256_file(bundle / rel) != entry.sha256:
            problems.append(f"{rel}: the weight manifest is absent or not the one bundle.json pins")
            continue
        wm = load_weights_manifest(bundle / rel, licenses=index)
        for _, f in wm.files():
            path = f"{item.get('dest', 'weights')}/{f.path}"
            have = manifest.file(path)
            checked += 1
            if have is None:
                problems.append(f"{path}: named by {rel} but not in the bundle")
            elif f.sha256 == UNPINNED:
                problems.append(f"{path}: {rel} does not pin its sha256")
            elif have.sha256 != f.sha256 or have.size != f.size:
                problems.append(f"{path}: sha256 {have.sha256} differs from {rel}'s pinned {f.sha256}")
    if problems:
        raise IntegrityError(
            f"{bundle}: weights differ from their manifests:\n  " + "\n  ".join(problems),
            problems=problems,
            hint="these are not the pinned upstream weights; repack the bundle from verified weights "
            "(portable weights verify MANIFEST DIR)",
        )
    return checked


def verify_bundle_weights(bundle: Path, *, digests: DigestCache | None = None) -> int:
    """For `run`'s preflight: rehash the weights a bundle's manifests name, on disk now; returns the files.

    `check_bundle_weights` (restore) compares bundle.json with the manifests; this one reads the bytes,
    so a weights file edited or replaced after restore is refused. Collects every bad file, then raises
    one IntegrityError (exit 5) whose message is one line naming each file by its bundle path, what
    differs and the manifest that pins it. A folder that is not a bundle (no bundle.json) or names no
    weight manifests checks nothing and returns 0. `digests`: the run's digest cache to hash through.
    """
    from reproduction.release.manifest import MANIFEST_NAME, load_manifest

    bundle = Path(bundle)
    if not (bundle / MANIFEST_NAME).is_file():
        return 0
    manifest = load_manifest(bundle)
    check_bundle_weights(bundle, manifest)
    lic_root = bundle / "LICENSES"
    index = load_license_index(lic_root if (lic_root / "index.json").is_file() else None)
    count, problems = 0, []
    for item in weights_items(manifest):
        rel, dest = item["manifest"], item.get("dest", "weights")
        report = verify_weights(load_weights_manifest(bundle / rel, licenses=index), bundle / dest, digests=digests)
        count += report.ok
        problems += [
            f"{dest}/{p.path}: {p.detail or p.kind} (pinned by {rel})" for p in report.problems if p.kind != "unpinned"
        ]
    if problems:
        raise IntegrityError(
            f"{len(problems)} weights file(s) of {bundle} differ from their manifests: " + "; ".join(problems),
            problems=problems,
            hint=f"they changed after restore: `portable verify {bundle}` lists every changed file; copy or fetch "
            "the bundle again and restore it",
        )
    return count
