"""Strict weight loading for the value model: exports, and pretrained SigLIP/Gemma3 files from a manifest.

Upstream loads with `strict=False`, so a wrong path trains from an untrained head (RECAP.md 7 item
3). Here every load compares key sets and shapes first and raises one `CheckpointError` naming every
missing, unexpected and mis-shaped key. A weights manifest (`weights_manifest/*.json`, format and
schema in reproduction/release/weights_manifest.py and weights_manifest/schema.json) lists the files
a preset starts from; this module reads its components' `weights` files and renames their keys with
each component's `key_mapping` ({"source_prefix": "vision_model.", "target_prefix": "vision.",
"ignore_prefixes": [...]}); parameters under `fresh_prefixes` may stay random. A file whose sha256
is "to-be-pinned" is refused unless `allow_unpinned`; one whose bytes differ from its pin always is.

The `tiny` preset's manifest (weights_manifest/value_tiny.json) names `build_value_model` and
`ValueModelConfig` as its builder: its weights are a function of the config and the seed, pinned by
the digest of the safetensors they yield (reproduction/release/weights_build.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from reproduction.errors import CheckpointError, InputNotFoundError, IntegrityError

UNPINNED = "to-be-pinned"
_SHOW = 12


def _names(keys: list[str]) -> str:
    shown = ", ".join(keys[:_SHOW])
    return shown + (f" (and {len(keys) - _SHOW} more)" if len(keys) > _SHOW else "")


def check_state_keys(
    model: torch.nn.Module,
    state: Mapping[str, torch.Tensor],
    *,
    source: str,
    allow_missing_prefixes: tuple[str, ...] = (),
) -> None:
    """Raise CheckpointError naming every missing/unexpected/mis-shaped key; nothing is loaded.

    Keys of `model` starting with one of `allow_missing_prefixes` may be absent (fresh parameters).
    """
    expected = model.state_dict()
    missing = sorted(k for k in expected if k not in state and not k.startswith(allow_missing_prefixes))
    unexpected = sorted(k for k in state if k not in expected)
    shapes = sorted(
        f"{k} {tuple(state[k].shape)} != {tuple(expected[k].shape)}"
        for k in state
        if k in expected and tuple(state[k].shape) != tuple(expected[k].shape)
    )
    problems = []
    if missing:
        problems.append(f"missing keys: {_names(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {_names(unexpected)}")
    if shapes:
        problems.append(f"shape mismatches (file != model): {_names(shapes)}")
    if problems:
        raise CheckpointError(
            f"{source}: weights do not match the value model; " + "; ".join(problems),
            missing=missing,
            unexpected=unexpected,
            shapes=shapes,
            hint="the file belongs to another architecture/preset, or the path is wrong",
        )


def load_state_strict(
    model: torch.nn.Module,
    state: Mapping[str, torch.Tensor],
    *,
    source: str,
    allow_missing_prefixes: tuple[str, ...] = (),
) -> None:
    """`check_state_keys`, then copy the tensors into `model` (which is untouched if the check fails)."""
    check_state_keys(model, state, source=source, allow_missing_prefixes=allow_missing_prefixes)
    model.load_state_dict(dict(state), strict=not allow_missing_prefixes)


def load_safetensors_strict(model: torch.nn.Module, path: Path) -> None:
    """Load `path` (a safetensors file written from this architecture) into `model`, strictly."""
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise InputNotFoundError(
            f"value model weights {path} do not exist",
            path=path,
            hint="point at the value stage's export folder (it holds model.safetensors)",
        )
    load_state_strict(model, load_file(str(path)), source=str(path))


def read_weights_manifest(path: Path) -> dict[str, Any]:
    """Parse and check a weights manifest (schema, license ids); returns it as a dict.

    Raises InputNotFoundError, InvalidInputError naming the field, UnsupportedFormatError for another format.
    """
    from reproduction.release.weights_manifest import load_weights_manifest

    return load_weights_manifest(Path(path)).to_dict()


def _weights_files(comp: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The component's files holding tensors (configs and tokenizers are not loaded here)."""
    return [f for f in comp["files"] if f.get("kind", "weights") == "weights" and f["path"].endswith(".safetensors")]


def _verify_file(path: Path, entry: Mapping[str, Any], *, allow_unpinned: bool) -> None:
    from reproduction.digests import sha256_file

    if not path.is_file():
        raise InputNotFoundError(
            f"pretrained weights {path} do not exist",
            path=path,
            hint="restore the bundle (its weights/ folder holds the files the manifest lists)",
        )
    want = entry.get("sha256")
    if want in (None, UNPINNED):
        if not allow_unpinned:
            raise IntegrityError(
                f"{path}: the weights manifest does not pin its sha256 yet ({want!r})",
                hint="pin it where the Hub is reachable (portable weights pin MANIFEST) or pass allow_unpinned=True",
            )
        return
    got = sha256_file(path)
    if got != want:
        raise IntegrityError(
            f"{path}: sha256 {got} != manifest {want}",
            problems=[str(path)],
            hint="the file is not the pinned upstream file; fetch it again (portable weights fetch MANIFEST DIR)",
        )


def pretrained_state(
    manifest: Mapping[str, Any], weights_dir: Path, *, allow_unpinned: bool = False
) -> dict[str, torch.Tensor]:
    """Read every component's files and rename their keys into the value model's namespace.

    Keys outside `source_prefix` or under an `ignore_prefixes` entry (SigLIP's text tower and
    pooling head, Gemma's tied lm_head) are dropped on purpose; everything else is kept, so an
    unknown key surfaces as `unexpected` in the strict check.
    """
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for comp in manifest["components"]:
        mapping = comp.get("key_mapping")
        if mapping is None:  # a tokenizer or processor: nothing to load into the model
            continue
        src, dst = mapping["source_prefix"], mapping["target_prefix"]
        ignore = tuple(mapping.get("ignore_prefixes", ()))
        for entry in _weights_files(comp):
            path = Path(weights_dir) / entry["path"]
            _verify_file(path, entry, allow_unpinned=allow_unpinned)
            for key, tensor in load_file(str(path)).items():
                if key.startswith(ignore):
                    continue
                state[dst + key[len(src) :] if key.startswith(src) else f"{comp['role']}:{key}"] = tensor
    return state


def load_pretrained(
    model: torch.nn.Module, manifest_path: Path, weights_dir: Path, *, allow_unpinned: bool = False
) -> None:
    """Initialise the backbones from the manifest's files; only `fresh_prefixes` may stay random."""
    manifest = read_weights_manifest(manifest_path)
    state = pretrained_state(manifest, weights_dir, allow_unpinned=allow_unpinned)
    fresh = tuple(manifest.get("fresh_prefixes", ("projector.", "value_head.")))
    fresh += ("state_proj.",)  # the optional state token is never part of a pretrained checkpoint
    load_state_strict(model, state, source=str(manifest_path), allow_missing_prefixes=fresh)
