"""`portable pack SPEC --dry-run`: what a pack would include and exactly what is missing here, writing nothing.

Every source of the spec (layers, files, configs), every file of its weight manifests (hashed
against the pins when present), and the licenses the bundle would carry are listed; a missing
source says where to get it (the entry's `origin`), an unpinned or absent weights file says how
to pin or fetch it. Nothing is read beyond file sizes, except the weights files, which are hashed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reproduction.release.spec import excluded, load_spec
from reproduction.release.weights import license_files, plan_weights
from reproduction.release.weights_manifest import load_license_index
from reproduction.ui import human_bytes


@dataclass(kw_only=True, slots=True)
class PackPlan:
    """The dry run's answer; `exit_code` 0 when pack would have everything, 3 when something is missing."""

    spec: str
    name: str
    include: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 3 if self.missing else 0

    def summary(self) -> str:
        lines = [f"pack {self.spec} (dry run: nothing written) would include:"]
        lines += [f"  {line}" for line in self.include]
        if self.missing:
            lines.append(f"missing on this machine ({len(self.missing)}):")
            lines += [f"  {line}" for line in self.missing]
        else:
            lines.append("nothing is missing: `portable pack` would succeed")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"spec": self.spec, "name": self.name, "include": self.include, "missing": self.missing}


def _tree_size(src: Path, exclude: tuple[str, ...]) -> tuple[int, int]:
    if src.is_file():
        return 1, src.stat().st_size
    count = size = 0
    for root, dirs, names in os.walk(src):
        rel_root = os.path.relpath(root, src)
        rel_root = "" if rel_root == "." else rel_root + "/"
        dirs[:] = [d for d in dirs if not excluded(rel_root + d, exclude)]
        for name in names:
            if not excluded(rel_root + name, exclude):
                count += 1
                size += os.lstat(os.path.join(root, name)).st_size
    return count, size


def plan_pack(spec_path: Path, *, root: Path | None = None) -> PackPlan:
    """List what `pack_bundle(spec_path)` would include and what it would miss (see the module doc)."""
    missing_sources: list[str] = []
    spec = load_spec(Path(spec_path), root=root, missing=missing_sources)
    plan = PackPlan(spec=str(spec_path), name=spec.name)
    for line in missing_sources:
        src = line.split(" ", 1)[1]
        origin = spec.origins.get(src)
        plan.missing.append(line + (f" (get it from {origin})" if origin else ""))
    for layer in sorted(spec.layers, key=lambda x: x.order):
        if layer.source.exists():
            n, size = _tree_size(layer.source, layer.exclude)
            plan.include.append(
                f"layer {layer.archive} ({layer.kind}) <- {layer.source}: {n} files, {human_bytes(size)}"
            )
    for f in spec.files:
        if f.source.exists():
            n, size = _tree_size(f.source, f.exclude)
            what = "config" if f.config else "file"
            plan.include.append(f"{what} {f.dest} <- {f.source}: {n} files, {human_bytes(size)}")
    index = load_license_index(near=spec.path, needed_by=f"pack {spec.path}")
    plans = plan_weights(spec, licenses=index)
    for wp in plans:
        plan.include.append(f"weights_manifest/{wp.manifest.path.name if wp.manifest.path else wp.manifest.name}")
        plan.include += [f"{rel} <- {src} ({human_bytes(size)}, sha256 matches)" for src, rel, size in wp.found]
        plan.include += [f"{rel} (built from its manifest's config and seed)" for rel in wp.build]
        plan.missing += wp.missing
    by_file: dict[str, list[str]] = {}
    for component, name in sorted(license_files(spec, plans, index).items()):
        by_file.setdefault(name, []).append(component)
    for name, components in sorted(by_file.items()):
        gated = " (GATED: users must accept these terms on the Hub)" if index.files[name].get("gated") else ""
        plan.include.append(f"LICENSES/{name}{gated} for {', '.join(components)}")
    plan.include.append("reproduction/ (this runner) and bundle.json")
    return plan
