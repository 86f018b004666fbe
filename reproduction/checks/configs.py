"""Read a bundle's run configs (TOML, YAML or JSON under <bundle>/config/) and look keys up by dotted name.

Used by the hazard probe. YAML needs PyYAML and TOML on Python 3.10 needs tomli; when the parser is
missing the file is reported as unread rather than guessed at. The keys read, first found wins
(RLinf's names first):

    save interval       runner.save_interval, trainer.save_interval, save_interval
    validation interval runner.val_check_interval, trainer.val_check_interval, val_check_interval
    micro batch         actor.micro_batch_size, actor.train.micro_batch_size, train.micro_batch_size, micro_batch_size
    global batch        actor.global_batch_size, actor.train.global_batch_size, train.global_batch_size,
                        global_batch_size
    workers             cluster.num_workers, train.workers, workers, num_workers, world_size;
                        else cluster.num_nodes x cluster.num_gpus_per_node (a missing factor counts 1)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONFIG_SUFFIXES = (".toml", ".yaml", ".yml", ".json")
SAVE_KEYS = ("runner.save_interval", "trainer.save_interval", "save_interval")
VAL_KEYS = ("runner.val_check_interval", "trainer.val_check_interval", "val_check_interval")
MICRO_KEYS = ("actor.micro_batch_size", "actor.train.micro_batch_size", "train.micro_batch_size", "micro_batch_size")
GLOBAL_KEYS = (
    "actor.global_batch_size",
    "actor.train.global_batch_size",
    "train.global_batch_size",
    "global_batch_size",
)
WORKER_KEYS = ("cluster.num_workers", "train.workers", "workers", "num_workers", "world_size")
NODE_KEYS = ("cluster.num_nodes", "cluster.num_gpus_per_node")
OWN_INTERVALS = (("save_interval", "eval_interval"), ("save_every", "eval_every"))
"""recap-portable's own run configs, in any section: a training core's (value.train, policy.train, sft.train:
reproduction/train/config.py) and GRPO's rl (reproduction/recipes/grpo/config.py) (save, eval) interval keys."""
OWN_BATCH = ("global_batch", "micro_batch", "world_size")
"""A training core section's global batch, micro batch and worker count (world_size, default 1)."""


def config_files(bundle: Path) -> list[Path]:
    """Every TOML/YAML/JSON file under <bundle>/config/, sorted."""
    root = Path(bundle) / "config"
    if not root.is_dir():
        return []
    return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in CONFIG_SUFFIXES)


def load_config(path: Path) -> tuple[dict[str, Any] | None, str]:
    """(parsed mapping, '') or (None, why it was not read)."""
    suffix = path.suffix.lower()
    try:
        text = path.read_text(encoding="utf-8")
        if suffix == ".json":
            data = json.loads(text)
        elif suffix == ".toml":
            try:
                import tomllib as toml_parser
            except ImportError:  # Python 3.10
                try:
                    import tomli as toml_parser  # type: ignore[no-redef]
                except ImportError:
                    return None, "TOML needs Python >= 3.11 or tomli"
            data = toml_parser.loads(text)
        else:
            try:
                import yaml
            except ImportError:
                return None, "YAML needs PyYAML (pip install pyyaml)"
            data = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"unreadable: {exc}"
    except Exception as exc:  # each parser has its own error type; all mean "malformed"
        return None, f"malformed: {str(exc).splitlines()[0][:120]}"
    if not isinstance(data, dict):
        return None, "top level is not a mapping"
    return data, ""


def lookup(data: dict[str, Any], dotted: str) -> Any:
    """The value at `dotted` ('runner.save_interval'), or None when any part is missing."""
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def first_int(data: dict[str, Any], keys: tuple[str, ...]) -> tuple[str, int] | None:
    """(key, value) of the first key holding an integer (interpolations like '${...}' are skipped)."""
    for key in keys:
        value = lookup(data, key)
        if isinstance(value, int) and not isinstance(value, bool):
            return key, value
    return None


def sections(data: dict[str, Any], prefix: str = "") -> list[tuple[str, dict[str, Any]]]:
    """(dotted path, mapping) of every mapping in `data`, itself first ('' for the top level)."""
    out = [(prefix, data)]
    for key, value in data.items():
        if isinstance(value, dict):
            out += sections(value, f"{prefix}{key}.")
    return out


def worker_count(data: dict[str, Any]) -> tuple[str, int] | None:
    """(how it was found, number of workers), or None when the config names none."""
    found = first_int(data, WORKER_KEYS)
    if found:
        return found
    factors = [first_int(data, (k,)) for k in NODE_KEYS]
    if not any(factors):
        return None
    total = 1
    for f in factors:
        total *= f[1] if f else 1
    return " x ".join(k for k in NODE_KEYS if first_int(data, (k,))), total
