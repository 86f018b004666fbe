"""The one return-normalisation contract shared by value training (stage 2) and advantages (stage 3).

Upstream used two formulas (value SFT: G/|min|; advantages: (x-min)/(max-min)-1) that agree only
when max == 0 and both runs saw the same datasets (RECAP.md section 7, item 1). Here the range is
fixed once, from the training datasets' returns, stored in the value checkpoint, and read back
from there by stage 3; nothing recomputes it.

    value space   y = (G - max) / (max - min)     maps [min, max] onto [-1, 0] (the head's bins)
    reward sums   r = R / (max - min)             a pure scale: a sum of rewards is a difference
                                                  of returns, so the offset must not be applied

With max == 0 (any success present) both equal upstream's formulas exactly.

ReturnRange itself lives in reproduction/value_export.py (a torch-free leaf the control plane's
`portable check` may import too); it is named here for the stages.
"""

from __future__ import annotations

from reproduction.value_export import ReturnRange

__all__ = ["ReturnRange"]
