"""The rule for signals that arrive while a command line stops after an interrupt: held, one note, quit at the Nth.

Stdlib only and a leaf (imports nothing of reproduction/), so `portable` (run/guards.py) and the simulator's
generators (sim/workers.py, which may not import run/) apply the one rule instead of two copies that drift.
"""

from __future__ import annotations

import contextlib
import os
import sys

HELD_SIGNALS = 2
"""Further Ctrl-C / SIGTERM a command holds while it stops after an interrupt; the next one quits at once, exit 130,
leaving the cleanup undone (a cleanup that hangs can still be stopped)."""

QUIT_LINE = "error: interrupted again: quitting without finishing the cleanup"
"""The line printed (stderr) by the signal that quits at once."""


def held_note(doing: str, leaving: str) -> str:
    """The one line printed by the first held signal: what the command is doing, and what quitting leaves."""
    return f"note: already stopping ({doing}); interrupt {HELD_SIGNALS} more times to quit at once, {leaving}"


def answer_held(held: int, note: str) -> None:
    """Answer the `held`-th signal held since the command began to stop (counted by the caller, from 1): the first
    prints `note` (held_note) on stderr; one past HELD_SIGNALS prints QUIT_LINE, flushes stdout and stderr and ends
    the process at once with exit 130 (os._exit: no cleanup, no atexit hooks); the others print nothing. Never
    raises (it runs inside a signal handler)."""
    if held > HELD_SIGNALS:
        say(QUIT_LINE)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(130)
    if held == 1:
        say(note)


def say(line: str) -> None:
    """One line on stderr from a signal handler: dropped when it cannot be written (the handler may run inside a
    write to stderr, and a reentrant call raises)."""
    with contextlib.suppress(Exception):
        print(line, file=sys.stderr, flush=True)
