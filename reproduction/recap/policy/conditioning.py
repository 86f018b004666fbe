"""Advantage conditioning as upstream does it: prompt text per sample, routed by label and a dropout draw.

    plain     "{task}"
    positive  "{task}\\nAdvantage: positive"
    negative  "{task}\\nAdvantage: negative"
(the tokenizer's normalisation turns the newline into a space, as openpi's does).

Routing per training sample, u ~ U(0, 1), p = condition dropout (RECAP.md 4):
    positive_only: positive prompt iff label and u >= p; negatives and dropped positives -> plain
    both:          positive/negative prompt by label iff u >= p; else plain
sft samples are always labelled positive. Modes `bc` and `filtered_bc` never condition (plain only).
"""

from __future__ import annotations

import numpy as np

PLAIN, POSITIVE, NEGATIVE = 0, 1, 2
KINDS = ("plain", "positive", "negative")
MODES = ("recap", "bc", "filtered_bc")


def prompt_text(task: str, kind: int) -> str:
    """The raw prompt of `kind` for `task` (before the tokenizer's template and normalisation)."""
    if kind == PLAIN:
        return task
    return f"{task}\nAdvantage: {KINDS[kind]}"


def route(label: bool, u: float, *, mode: str, dropout: float, positive_only: bool) -> int:
    """The prompt kind of one training sample (module docstring); `u` is its uniform draw."""
    if mode != "recap":
        return PLAIN
    if u < dropout:
        return PLAIN
    if label:
        return POSITIVE
    return PLAIN if positive_only else NEGATIVE


def route_batch(labels: np.ndarray, u: np.ndarray, *, mode: str, dropout: float, positive_only: bool) -> np.ndarray:
    """`route` over arrays (int8 kinds); same rule, for statistics and tests."""
    labels = np.asarray(labels, dtype=bool)
    kinds = np.full(labels.shape, PLAIN, dtype=np.int8)
    if mode != "recap":
        return kinds
    keep = np.asarray(u) >= dropout
    kinds[keep & labels] = POSITIVE
    if not positive_only:
        kinds[keep & ~labels] = NEGATIVE
    return kinds
