"""One dataset listed twice in a run: the same folder through a link, or a byte-identical copy.

Listed twice, a dataset's frames count twice (the global threshold, the mixtures) and, worse, the value
stage's folds are drawn per dataset name, so an episode held out of fold k under one name is trained on in
fold k under the other: the "held-out" values stage 3 labels from would come from a model that saw them
(audit54 D6). Two datasets whose info.json differ cannot hold the same frames, so the content fingerprint is
only asked for when two info.json are equal: the usual run pays nothing here, and the fingerprint it does ask
for is the one the run's stage keys compute (and cache) anyway.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reproduction.errors import ConfigError, PortableError


def duplicate_dataset_problems(datasets: Sequence[Any], opened: dict[str, Any], key: str = "datasets") -> list[Any]:
    """ConfigError (exit 4) for each dataset of `datasets` (entries with a `.path`) that is an earlier one again:
    the same folder once links are resolved, or (for datasets opened into `opened`, keyed by folder name, whose
    `.dataset.info.raw` are equal) the same content fingerprint (`.fingerprint`, which for RECAP's RunDataset
    covers every file's bytes). Each problem names both `{key}[i].path` and why; a dataset that does not exist or
    was not opened is compared by its resolved path only. Reads nothing beyond what the run reads anyway."""
    problems: list[Any] = []
    seen: list[tuple[str, str, str, Any]] = []  # (key, path as given, resolved folder, opened dataset or None)
    for i, entry in enumerate(datasets):
        path = str(entry.path)
        if "/path/to/" in path:  # a placeholder: run_problems names it
            continue
        this_key = f"{key}[{i}].path"
        resolved = os.path.realpath(path)
        this = opened.get(Path(path).name)
        for other_key, other_path, other_resolved, other in seen:
            why = None
            if resolved == other_resolved:
                why = f"the same folder {resolved} once links are resolved"
            elif this is not None and other is not None and _same_content(this, other):
                why = "byte-identical copies (the same content fingerprint)"
            if why is not None:
                problems.append(
                    ConfigError(
                        f"{other_key} ({other_path}) and {this_key} ({path}) are the same dataset: {why}",
                        field=this_key,
                        hint="list each dataset once (its frames would count twice, and the value stage's "
                        "cross-fitting would train on the episodes it holds out); raise its `weight` to count it more",
                    )
                )
                break
        else:
            seen.append((this_key, path, resolved, this))
    return problems


def _same_content(a: Any, b: Any) -> bool:
    """True when two opened datasets hold the same content: equal info.json first (free), then fingerprints."""
    try:
        if a.dataset.info.raw != b.dataset.info.raw:
            return False
        return bool(a.fingerprint == b.fingerprint)
    except (AttributeError, OSError, PortableError):  # without those parts: told apart by path alone
        return False
