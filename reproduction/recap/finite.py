"""One answer to "are these feature columns finite?" for the models' inputs (value state, policy state and action)."""

from __future__ import annotations

from typing import Any

import numpy as np

from reproduction.errors import DatasetError


def refuse_non_finite(
    ds: Any,
    values: np.ndarray,
    owner: np.ndarray,
    keys: list[str],
    *,
    what: str,
    hint: str,
    rows: np.ndarray | None = None,
) -> None:
    """DatasetError (exit 40) `{root}: {what} {feature!r} is NaN or inf at N frame(s), the first at episode E frame F`
    when `values` (n, C) holds a NaN or inf; `owner[c]` is the index into `keys` of column c's feature and `rows` the
    dataset rows of `values` (None = all rows in the reader's order). A NaN or inf makes the input statistics NaN,
    so every loss is NaN and training silently skips every step (audit50_D F7 for the value model, audit60_E E1
    for the policy). One np.isfinite pass; the episode and frame are looked up only on failure."""
    finite = np.isfinite(values)
    if finite.all():
        return
    bad_rows = np.flatnonzero(~finite.all(axis=1))
    at = rows[bad_rows] if rows is not None else bad_rows  # dataset rows
    keys_table = ds.frame_table(["episode_index", "frame_index"])
    ep = keys_table.column("episode_index").to_numpy()[at]
    fr = keys_table.column("frame_index").to_numpy()[at]
    k = int(np.lexsort((fr, ep))[0])
    feature = keys[int(owner[np.flatnonzero(~finite[bad_rows[k]])[0]])]
    raise DatasetError(
        f"{ds.root}: {what} {feature!r} is NaN or inf at {bad_rows.size} frame(s), the first at episode {int(ep[k])} "
        f"frame {int(fr[k])}",
        path=ds.root,
        field=feature,
        hint=hint,
    )
