"""Talk to the person at the terminal: messages and progress on stderr, never stdout.

`rich` is used when it is importable (it is not on a bare server's Python before restore); the
plain fallback prints one line per finished task so logs stay readable. `NO_COLOR`, `-q` and
`--no-progress` are honoured. stdout is reserved for data (`--json`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass, field
from typing import Protocol

from reproduction.settings import NO_PROGRESS, flag


@dataclass(kw_only=True, slots=True)
class UiOptions:
    """How chatty the CLI is; built once in `portable.py` from the global flags."""

    quiet: bool = False
    """Only errors and final results."""
    progress: bool = True
    """Show progress bars (off with --no-progress, or when stderr is not a terminal and rich is absent)."""


def options_from_args(args: object) -> UiOptions:
    """The UiOptions of parsed CLI arguments: `-q` / `--quiet` and `--no-progress` (absent flags count as not given).

    The one place that reads the global flags, for `portable.py` and every command module."""
    return UiOptions(quiet=bool(getattr(args, "quiet", False)), progress=not getattr(args, "no_progress", False))


class Task(Protocol):
    """One progress line: `advance(n)` by units done; `total` may be updated later.

    `show(rate=..., eta=...)` replaces the bar's own rate (bytes/s) and time-remaining columns with
    texts the caller computes (a trainer shows samples/s and an ETA from its step times)."""

    def advance(self, n: float = 1) -> None: ...

    def set_total(self, total: float) -> None: ...

    def show(self, **fields: str) -> None: ...


@dataclass(slots=True)
class _NullTask:
    def advance(self, n: float = 1) -> None:
        pass

    def set_total(self, total: float) -> None:
        pass

    def show(self, **fields: str) -> None:
        pass


@dataclass(slots=True)
class _RichTask:
    progress: object
    task_id: int

    def advance(self, n: float = 1) -> None:
        self.progress.advance(self.task_id, n)  # type: ignore[attr-defined]

    def set_total(self, total: float) -> None:
        self.progress.update(self.task_id, total=total)  # type: ignore[attr-defined]

    def show(self, **fields: str) -> None:
        self.progress.update(self.task_id, **fields)  # type: ignore[attr-defined]


@dataclass(slots=True)
class Progress:
    """A group of progress tasks; use `ui.progress(options)` as a context manager."""

    _rich: object | None = None
    _tasks: list = field(default_factory=list)

    def task(self, description: str, total: float | None = None) -> Task:
        if self._rich is None:
            return _NullTask()
        task_id = self._rich.add_task(description, total=total)  # type: ignore[attr-defined]
        return _RichTask(self._rich, task_id)


def _rich_available() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def bars_wanted(options: UiOptions | None) -> bool:
    """True when progress bars may be drawn: not -q / --no-progress / PORTABLE_NO_PROGRESS, and stderr is a
    terminal. The one decision, also applied to huggingface_hub's own tqdm bars (`release.hub._client`), so no
    command writes `\\r` rewrites or cursor codes into a log that captures stderr (audit60 L1)."""
    options = options or UiOptions()
    if options.quiet or not options.progress or flag(NO_PROGRESS):
        return False
    if _rich_available():  # rich's test also honours FORCE_TERMINAL / TTY_COMPATIBLE, as the rich bars do
        from rich.console import Console

        return Console(stderr=True).is_terminal
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stderr: no terminal to draw on
        return False


@contextmanager
def progress(options: UiOptions | None = None, *, transient: bool = True) -> Iterator[Progress]:
    """Yield a `Progress`; bars render on stderr with rate and ETA when rich is present."""
    options = options or UiOptions()
    if not bars_wanted(options) or not _rich_available():
        yield Progress()
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TaskProgressColumn,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )
    from rich.progress import (
        Progress as RichProgress,
    )

    console = Console(stderr=True, no_color=bool(os.environ.get("NO_COLOR")))
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        MofNCompleteColumn(),
        _field_or(TransferSpeedColumn, "rate", "progress.data.speed")(),
        _field_or(TimeRemainingColumn, "eta", "progress.remaining")(),
    )
    with RichProgress(*columns, console=console, transient=transient, disable=not console.is_terminal) as bar:
        yield Progress(bar)


def _field_or(column: type, name: str, style: str) -> type:
    """A subclass of the rich `column` that renders the task's `name` field when a caller set one
    (`Task.show`), else what `column` itself computes (restore/verify/fetch keep bytes/s)."""
    from rich.text import Text

    class FieldOr(column):  # type: ignore[misc, valid-type]
        def render(self, task):  # noqa: ANN001, ANN202 - rich's signature
            text = task.fields.get(name)
            return Text(str(text), style=style) if text is not None else super().render(task)

    return FieldOr


def say(message: str, *, options: UiOptions | None = None) -> None:
    """A line of talk on stderr (suppressed by -q)."""
    if options is not None and options.quiet:
        return
    print(message, file=sys.stderr, flush=True)


@contextmanager
def stdout_to_stderr(active: bool = True) -> Iterator[None]:
    """While user code runs under `--json` (a recipe's module, its stages, its report): what it writes to stdout goes
    to stderr, at the file-descriptor level too (a subprocess or C code writes to fd 1), so stdout holds only the
    command's JSON document, written after this ends (a stage's print() broke `portable run --json`: audit65_B M3).
    fd 1 and sys.stdout are put back on every way out (an error, Ctrl-C), after flushing what was written meanwhile
    (Python's buffer of the real stdout, C's stdio buffers) to stderr. Without `active`, nothing is changed."""
    if not active:
        yield
        return
    for stream in (sys.stdout, sys.stderr):  # what was written before goes where it was meant to
        _flush(stream)
    try:
        saved: int | None = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no fd 1 (closed): sys.stdout alone is redirected
        saved = None
    try:
        with redirect_stdout(sys.stderr):
            yield
    finally:
        _flush(sys.stdout)  # a reference to the real stdout kept from before (a logging handler): fd 1 is stderr yet
        _flush_c_stdio()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


def _flush(stream: object) -> None:
    try:
        stream.flush()  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):  # closed, or no stream at all
        pass


def _flush_c_stdio() -> None:
    """fflush(NULL): C code's buffered stdout (fully buffered on a pipe) is written while fd 1 is still stderr."""
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError, TypeError):  # no C library to ask (not a POSIX build)
        pass


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
