"""glibc's heap told to keep the trainer's freed blocks, so a step's big tensors reuse pages instead of faulting
new ones in.

glibc serves an allocation of 32 MiB or more with its own mmap and gives it back with munmap when freed (the
threshold can rise no higher). A GRPO update with all 10 denoising steps in the loss has 32,000 loss rows (6 steps:
19,200), and more of its tensors pass that size: each of them, at every step, was mapped, zero-filled page by page
and unmapped (190 million minor page faults in the demo against 36 million with 6 steps). Measured on 2 cores
(the demo's bundle, 4 GRPO steps, `portable run`): rl 39.9 s, 8.2 million minor page faults, 15 s of system time
without the hold; 29.3 s, 2.0 million, 4 s with it; an update-only step 3.2-4.0 s
instead of 6.0-6.4; the rl export's bytes the same (allocation moves no arithmetic: torch aligns every CPU buffer to
64 bytes either way). The whole GRPO demo: 18 min 20 s -> 12 min 46 s alone, the same export (docs/grpo.md).
Inside `hold_freed_blocks` big blocks come from the heap and a freed one is reused; the heap's top is not
trimmed. On the way out glibc's defaults are back and `malloc_trim` returns the free pages to the system; a block
allocated inside and freed after it (a tensor that outlives the trainer's loop) goes to glibc's free lists with its
pages resident and serves later allocations of its size without a fault, as any heap block does (glibc trims only
the heap's top; tests/test_heap.py measures faults in a fresh interpreter because of it).

`PORTABLE_HEAP=system` leaves glibc alone; on a C library other than glibc (macOS, musl) this does nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from reproduction import settings
from reproduction.settings import HEAP

if TYPE_CHECKING:
    import ctypes

CHOICES = ("hold", "system")
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
"""mallopt's parameter numbers (malloc.h)."""
DEFAULTS = {M_TRIM_THRESHOLD: 128 * 1024, M_MMAP_MAX: 65536}
"""glibc's defaults for both (mallopt(3)), put back on the way out."""
HOLD = {M_TRIM_THRESHOLD: 2**31 - 1, M_MMAP_MAX: 0}
"""Inside: no mmap for big blocks, and the heap's top kept however large (mallopt takes an int)."""


def _glibc() -> ctypes.CDLL | None:
    """This process's C library when it is glibc (it has gnu_get_libc_version and mallopt), else None."""
    import ctypes  # here, not at import: `portable` imports this module for every command, and ctypes costs ~2 ms

    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - an AttributeError here means another C library
        libc.mallopt  # noqa: B018
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def choice(environ: Mapping[str, str] | None = None) -> str:
    """PORTABLE_HEAP's value: hold (the default) or system. Raises ConfigError (exit 4) for another value."""
    hint = f"unset {HEAP} (the trainer reuses its freed blocks), or {HEAP}=system (glibc's defaults)"
    return settings.choice(HEAP, CHOICES, hint, environ)


@contextmanager
def hold_freed_blocks() -> Iterator[bool]:
    """Inside, glibc serves big blocks from the heap and keeps freed ones for reuse (yields True), unless
    PORTABLE_HEAP=system or the C library is not glibc (yields False, nothing changed). On the way out, even on
    an error, glibc's defaults are restored and the heap's free pages returned (malloc_trim). mallopt is
    process-wide: the trainer's worker body holds it around its whole loop. Raises ConfigError for a bad
    PORTABLE_HEAP."""
    libc = _glibc() if choice() == "hold" else None
    if libc is None:
        yield False
        return
    for param, setting in HOLD.items():
        libc.mallopt(param, setting)
    try:
        yield True
    finally:
        for param, setting in DEFAULTS.items():
            libc.mallopt(param, setting)
        libc.malloc_trim(0)
