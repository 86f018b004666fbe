"""Deterministic sample order: which samples step N uses, as a function of (seed, epoch, position).

Every optimizer step consumes `global_batch` consecutive positions of its epoch's order; an epoch
has `len(dataset) // global_batch` steps (the remainder is dropped that epoch, but the next epoch's
permutation differs). Within a step the global batch is cut into micro batches interleaved over
ranks: accumulation pass a, rank r takes positions [(a * W + r) * M, (a * W + r + 1) * M). So a
resume needs only the step number, and the same global batch is seen for any world size.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from reproduction.errors import ConfigError


@dataclass(frozen=True, kw_only=True, slots=True)
class Cursor:
    """Where a step sits in the data stream."""

    epoch: int
    position: int
    """First position (within the epoch's order) of the step's global batch."""


def steps_per_epoch(n: int, global_batch: int) -> int:
    """Optimizer steps per epoch; a dataset smaller than one global batch is a ConfigError."""
    if n < global_batch:
        raise ConfigError(
            f"the training set has {n} samples, fewer than global_batch={global_batch}",
            field="global_batch",
            hint="lower global_batch or add data",
        )
    return n // global_batch


def cursor(step: int, *, n: int, global_batch: int) -> Cursor:
    """The cursor of 0-based optimizer step `step`."""
    per = steps_per_epoch(n, global_batch)
    return Cursor(epoch=step // per, position=(step % per) * global_batch)


@functools.lru_cache(maxsize=2)
def epoch_order(seed: int, epoch: int, n: int, *, shuffle: bool = True) -> np.ndarray:
    """Dataset indices in the order epoch `epoch` visits them (int64, a permutation of range(n)).

    Cached (read-only) for the current and the previous epoch: a step needs a few dozen entries,
    and drawing a permutation of a million-frame dataset on every step would cost ~15 ms each."""
    if not shuffle:
        order = np.arange(n, dtype=np.int64)
    else:
        order = np.random.default_rng(np.random.SeedSequence([seed, epoch, 0x5EED])).permutation(n)
    order.flags.writeable = False
    return order


def micro_batches(
    step: int,
    *,
    seed: int,
    n: int,
    global_batch: int,
    micro_batch: int,
    rank: int,
    world_size: int,
    shuffle: bool = True,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """This rank's micro batches for `step`: a list (one per accumulation pass) of
    (dataset indices, positions within the epoch), each of length micro_batch."""
    cur = cursor(step, n=n, global_batch=global_batch)
    order = epoch_order(seed, cur.epoch, n, shuffle=shuffle)
    accum = global_batch // (micro_batch * world_size)
    out = []
    for a in range(accum):
        lo = cur.position + (a * world_size + rank) * micro_batch
        positions = np.arange(lo, lo + micro_batch, dtype=np.int64)
        out.append((order[positions], positions))
    return out


def sample_rng(seed: int, epoch: int, position: int) -> np.random.Generator:
    """The RNG a sample's augmentation uses: fixed by (seed, epoch, position), independent of rank."""
    return np.random.default_rng(np.random.SeedSequence([seed, epoch, position, 0xA06]))


def _splitmix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over a uint64 array (wrapping arithmetic): a bijective 64-bit mix."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def sample_uniforms(seed: int, epoch: int, positions: np.ndarray, k: int = 1) -> np.ndarray:
    """(len(positions), k) float64 draws in [0, 1), each fixed by (seed, epoch, position, j): the
    batched counterpart of `sample_rng` (a counter-based hash, no Generator per sample, so a batch of
    256 costs microseconds instead of ~15 ms), independent of rank and of the batch a position is in."""
    key = _splitmix(np.array([seed & 0xFFFFFFFFFFFFFFFF], np.uint64) ^ np.uint64(0xA06B47C4))
    key = _splitmix(key ^ np.array([epoch & 0xFFFFFFFFFFFFFFFF], np.uint64))
    pos = np.asarray(positions, dtype=np.int64).astype(np.uint64)
    counter = pos[:, None] * np.uint64(k) + np.arange(k, dtype=np.uint64)[None, :]
    bits = _splitmix(_splitmix(counter ^ key) + key)
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
