"""The value-inference sharding plan: contiguous frame shards, each extended so V(t+N) is local.

Rows are a dataset's frames sorted by (episode, frame). Worker r owns rows [start, stop) (earlier
workers take the remainder, as RLinf's get_shard_indices) and infers values for [start, infer_stop),
where infer_stop reaches N rows past `stop` but never past the end of the last owned row's episode
(a later episode's frames are never a V(t+N) of an owned row). Each worker returns its owned rows'
values as (episode_index, frame_index, value); `merge_values` joins them by (episode, frame), so
nothing is pickled to every worker and no row order is assumed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from reproduction.errors import ConfigError, DatasetError


@dataclass(kw_only=True, slots=True, frozen=True)
class Shard:
    """One worker's rows: owned [start, stop), inferred [start, infer_stop)."""

    rank: int
    start: int
    stop: int
    infer_stop: int

    @property
    def owned(self) -> slice:
        return slice(self.start, self.stop)

    @property
    def inferred(self) -> slice:
        return slice(self.start, self.infer_stop)


def plan_shards(row_end: np.ndarray, world_size: int, lookahead: int, *, align: int = 1) -> list[Shard]:
    """Shards for `world_size` workers over rows whose episode ends are `row_end` (exclusive, per row).

    With `align` > 1 the rows are dealt out in blocks of `align` (earlier workers take the remainder
    block), so every shard starts on a multiple of `align`: value inference cuts its batches there,
    which makes each batch, and so each value, independent of the number of workers.
    """
    if world_size < 1 or lookahead < 0 or align < 1:
        raise ConfigError(
            f"world_size {world_size} / lookahead {lookahead} / align {align} must be >= 1 / >= 0 / >= 1",
            field="world_size",
        )
    n = int(row_end.size)
    blocks = -(-n // align)
    base, extra = divmod(blocks, world_size)
    shards, start = [], 0
    for rank in range(world_size):
        stop = min(start + (base + (1 if rank < extra else 0)) * align, n)
        infer_stop = stop if stop == start else int(min(stop + lookahead, row_end[stop - 1]))
        shards.append(Shard(rank=rank, start=start, stop=stop, infer_stop=max(infer_stop, stop)))
        start = stop
    return shards


def shard_values_table(
    episode_index: np.ndarray, frame_index: np.ndarray, values: np.ndarray, shard: Shard
) -> pa.Table:
    """A worker's result: its owned rows' (episode_index, frame_index, value); `values` cover `inferred`."""
    own = slice(0, shard.stop - shard.start)
    return pa.table(
        {
            "episode_index": pa.array(episode_index[shard.owned], pa.int64()),
            "frame_index": pa.array(frame_index[shard.owned], pa.int64()),
            "value": pa.array(np.asarray(values, dtype=np.float64)[own]),
        }
    )


def merge_values(parts: Sequence[pa.Table]) -> pa.Table:
    """Concatenate workers' value tables and sort by (episode, frame); a frame twice is an error."""
    from reproduction.recap.returns import sort_frames

    table = (
        pa.concat_tables(parts)
        if parts
        else pa.table(
            {
                "episode_index": pa.array([], pa.int64()),
                "frame_index": pa.array([], pa.int64()),
                "value": pa.array([], pa.float64()),
            }
        )
    )
    try:
        order = sort_frames(table.column("episode_index").to_numpy(), table.column("frame_index").to_numpy())
    except DatasetError as exc:
        raise DatasetError(f"merging value shards: {exc.message}", hint="two shards inferred the same frame") from None
    return table if order is None else table.take(pa.array(order))
