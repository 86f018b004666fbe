"""The value stage's mixture rule by counts alone (data.py's module docstring states it; `mixture_table` draws it):
torch-free, so RECAP's preflight sizes each training set without importing the model's data pipeline."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from reproduction.errors import DatasetError


def mixture_counts(sizes: Sequence[int], weights: Sequence[float], *, balance_weights: bool = True) -> np.ndarray:
    """Samples of each dataset in the mixture `mixture_table` draws (its length is their sum), from the datasets'
    sizes alone: what RECAP's preflight compares with a global batch before any stage runs. DatasetError when a
    dataset has no frames."""
    sizes = np.asarray(sizes, dtype=np.int64)
    if (sizes <= 0).any():
        raise DatasetError(f"mixture: a dataset has no frames (sizes {sizes.tolist()})")
    share = np.asarray(weights, dtype=np.float64) * (sizes if balance_weights else 1.0)
    share = share / share.sum()
    length = int(max(math.ceil(n / p - 1e-9) for n, p in zip(sizes, share)))
    return np.maximum(np.floor(share * length).astype(np.int64), sizes)
