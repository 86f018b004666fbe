"""Built weights: components made from a config and a seed (the `tiny` presets), deterministically.

A built component names `builder` ("module:function", called as `function(config, seed=seed)` and
returning a state dict of tensors or a module with `state_dict()`), the `seed` and the model `config`
(a dict, or with `config_class` = "module:Class" the value of `Class.from_dict(config)`), so any
model factory such as `build_policy_model(config, *, seed)` serves without a wrapper. Building calls it under a
forked RNG (the caller's RNG state is untouched), makes every tensor contiguous and unshared, and
writes one safetensors file with no metadata beyond the format tag: the same torch release gives the
same bytes, so the file is pinned by sha256 like a downloaded one. `built_with` records the torch and
safetensors versions of the pinning build, because another torch release may initialise differently.

torch and safetensors are imported inside functions: the control plane imports this module lazily.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reproduction.digests import sha256_file
from reproduction.errors import IntegrityError, InvalidInputError, MissingDependencyError
from reproduction.release.weights_manifest import UNPINNED, Component, canonical_sha256


def _builder(spec: str) -> Callable[..., Any]:
    module, func = spec.split(":", 1)
    try:
        fn = getattr(importlib.import_module(module), func)
    except ImportError as exc:
        raise MissingDependencyError(
            f"building weights with {spec} needs the pipeline packages ({exc})",
            hint="install the pipeline extra (pip install -e '.[pipeline]') or restore the bundle's runtime",
        ) from None
    except AttributeError:
        raise InvalidInputError(f"builder {spec!r}: {module} has no {func}", field="source.builder") from None
    return fn


def weights_file(comp: Component) -> Any:
    """The one file a built component produces; InvalidInputError if it lists another number."""
    if len(comp.files) != 1:
        raise InvalidInputError(
            f"built component {comp.role}: lists {len(comp.files)} files; a builder writes exactly one",
            field="files",
        )
    return comp.files[0]


def build_bytes(comp: Component, out: Path) -> tuple[int, str]:
    """Build `comp` into the file `out` (atomically: a temp file then rename); returns (size, sha256)."""
    try:
        import torch
        from safetensors.torch import save_file
    except ImportError as exc:
        raise MissingDependencyError(
            f"building {comp.label} needs torch and safetensors ({exc})",
            hint="install the pipeline extra (pip install -e '.[pipeline]')",
        ) from None
    fn = _builder(str(comp.source["builder"]))
    config: Any = dict(comp.source["config"])
    if comp.source.get("config_class"):
        config = _builder(str(comp.source["config_class"])).from_dict(config)
    with torch.random.fork_rng(devices=[]):
        state = fn(config, seed=int(comp.source["seed"]))
    if hasattr(state, "state_dict"):
        state = state.state_dict()
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in sorted(state.items())}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        save_file(tensors, str(tmp), metadata={"format": "pt"})
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out.stat().st_size, sha256_file(out)


def built_with() -> dict[str, str]:
    import safetensors
    import torch

    return {"torch": str(torch.__version__), "safetensors": str(safetensors.__version__)}


def build_component(comp: Component, weights_dir: Path) -> Path:
    """Build `comp` into `weights_dir`/<its file path> and check the bytes against the pinned sha256.

    Raises IntegrityError (naming the file, the digests and both torch versions) when the pinned
    digest differs: the builder, the config or the torch release changed since pinning.
    """
    entry = weights_file(comp)
    dest = Path(weights_dir) / entry.path
    size, digest = build_bytes(comp, dest)
    if entry.sha256 != UNPINNED and (digest != entry.sha256 or size != entry.size):
        dest.unlink(missing_ok=True)
        pinned_with = comp.source.get("built_with", {})
        raise IntegrityError(
            f"{entry.path}: built bytes have sha256 {digest} ({size} bytes), the manifest pins {entry.sha256} "
            f"({entry.size} bytes); pinned with {pinned_with or 'unknown versions'}, built with {built_with()}",
            problems=[entry.path],
            hint="build with the torch release the manifest names, or re-pin: portable weights pin MANIFEST",
        )
    return dest


def pin_built(comp: Component, scratch: Path) -> None:
    """Build `comp` in `scratch` and record its size, sha256, config digest and library versions (mutates `comp`)."""
    entry = weights_file(comp)
    size, digest = build_bytes(comp, Path(scratch) / entry.path)
    entry.size, entry.sha256, entry.kind = size, digest, entry.kind or "weights"
    comp.model_config = {"sha256": canonical_sha256(comp.source["config"])}
    comp.source["built_with"] = built_with()


def built_manifest(
    *,
    name: str,
    model: str,
    presets: tuple[str, ...],
    builder: str,
    config: dict[str, Any],
    seed: int,
    path: str,
    config_class: str | None = None,
    role: str = "model",
    scratch: Path,
) -> Any:
    """A pinned manifest for weights built from `config` and `seed` (e.g. a demo's tiny models, whose
    vocabulary comes from a tokenizer trained on the spot): builds once in `scratch`/<path> and records
    the digest. The license is this runner's (Apache-2.0): built weights hold no upstream bytes."""
    from reproduction.release.weights_manifest import Component, WeightFile, WeightsManifest

    source: dict[str, Any] = {"kind": "built", "builder": builder, "seed": seed, "config": config}
    if config_class:
        source["config_class"] = config_class
    comp = Component(
        role=role,
        source=source,
        license={"id": "apache-2.0", "file": "LICENSES/Apache-2.0.txt", "source": "built by recap-portable"},
        model_config={"sha256": UNPINNED},
        files=[WeightFile(path=path, kind="weights", size=UNPINNED, sha256=UNPINNED)],
        key_mapping={"source_prefix": "", "target_prefix": ""},
        presets=tuple(presets),
    )
    pin_built(comp, Path(scratch))
    manifest = WeightsManifest(name=name, model=model, presets=tuple(presets), components=[comp])
    return WeightsManifest.from_dict(manifest.to_dict())
