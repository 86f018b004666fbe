"""Every PORTABLE_* environment knob in one place: its name, default and meaning, and how it is read.

Stdlib only (the control plane reads these before any runtime is restored). Modules read a knob through this
module (`value`, `flag`, `cache_root`, `hub_values`), never os.environ by name, so this table is the complete
list; docs/settings.md is generated from it (`python -m reproduction.settings > docs/settings.md`, a test keeps it
current). The launcher forwards every PORTABLE_* variable of the driver to its workers (train/launcher.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

PREFIX = "PORTABLE_"
"""What every knob's name starts with (train/launcher.py forwards such variables to workers)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Setting:
    """One environment knob."""

    name: str
    """The variable, e.g. PORTABLE_CACHE_DIR (for a family: its prefix, PORTABLE_HUB_)."""
    default: str
    """What applies when it is unset or empty, in words."""
    doc: str
    """What it changes."""
    read_by: str
    """The module(s) reading it."""


CACHE_DIR = "PORTABLE_CACHE_DIR"
CACHE_DIR_OLD = "RECAP_PORTABLE_CACHE"
"""CACHE_DIR's old name, still honoured when CACHE_DIR is unset."""
CPU_KERNELS = "PORTABLE_CPU_KERNELS"
HEAP = "PORTABLE_HEAP"
NO_PROGRESS = "PORTABLE_NO_PROGRESS"
PLAIN = "PORTABLE_PLAIN"
HUB = "PORTABLE_HUB_"

SETTINGS: tuple[Setting, ...] = (
    Setting(
        name=CACHE_DIR,
        default="~/.cache/recap-portable (LIBERO's files: <temp dir>/recap-portable-<uid>/libero)",
        doc="Cache root: dataset fingerprints and content digests under fingerprints/, LIBERO's assets, config and "
        "shader cache under libero/. Also read as RECAP_PORTABLE_CACHE (its old name). A file (or a path under one) "
        "is exit 4.",
        read_by="data/fingerprint.py, run/content.py, sim/libero/_runtime.py",
    ),
    Setting(
        name=CPU_KERNELS,
        default="avx2",
        doc="avx2 pins torch's and MKL's CPU kernels to AVX2 (the same bits on an AVX2 server and an AVX-512 AMD "
        "EPYC; not on an AVX-512 Intel Xeon, measured); native leaves them to the CPU (faster on AVX-512, results "
        "tied to the machine). Another value is exit 4.",
        read_by="numerics.py (set before torch loads)",
    ),
    Setting(
        name=HEAP,
        default="hold",
        doc="hold: while a trainer runs, glibc serves big blocks from its heap and reuses freed ones (an update's "
        "tensors above 32 MiB were mapped and zero-filled anew at every step: the demo's GRPO update took twice as "
        "long; the same bytes either way); system leaves glibc's defaults. Another value is exit 4.",
        read_by="train/heap.py",
    ),
    Setting(
        name=NO_PROGRESS,
        default="unset: progress bars on a terminal",
        doc="Any non-empty value turns progress bars off, like --no-progress.",
        read_by="ui.py, release/hub.py",
    ),
    Setting(
        name=PLAIN,
        default="unset: a rich table on a terminal",
        doc="Any non-empty value prints `portable check`'s report as plain lines.",
        read_by="checks/report.py",
    ),
    Setting(
        name=HUB + "<FIELD>",
        default="see the field",
        doc="Hub transfer tunables, one variable per HubSettings field: PORTABLE_HUB_JOBS [8], _RETRIES [5], "
        "_BACKOFF_S [1], _BACKOFF_MAX_S [30], _STALL_TIMEOUT_S [60], _CONNECT_TIMEOUT_S [20], _BATCH_FILES [200], "
        "_BATCH_BYTES [17179869184, i.e. 16 GiB: a count of bytes, without a unit]. A value that is not a number is "
        "exit 4.",
        read_by="release/hub_transfer.py",
    ),
)
"""Every knob (tests may also read PORTABLE_FUZZ_EXAMPLES and PORTABLE_PARENT_SITE: test knobs, not the tool's)."""


def value(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The knob's value, None when unset or empty; KeyError for a name this module does not declare."""
    if not any(s.name == name or (s.name.endswith("<FIELD>") and name.startswith(s.name[:-7])) for s in SETTINGS):
        raise KeyError(f"{name} is not a declared setting (reproduction/settings.py)")
    env = os.environ if environ is None else environ
    return env.get(name) or None


def choice(name: str, choices: tuple[str, ...], hint: str, environ: Mapping[str, str] | None = None) -> str:
    """The knob's value, one of `choices` (case and surrounding blanks ignored; unset or blank = choices[0]).
    Raises ConfigError (exit 4) naming the variable and its value, with `hint`, for anything else."""
    raw = value(name, environ)
    chosen = (raw or "").strip().lower() or choices[0]
    if chosen not in choices:
        from reproduction.errors import ConfigError

        raise ConfigError(f"{name}={raw!r} is not one of {', '.join(choices)}", field=name, hint=hint)
    return chosen


def flag(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """True when the knob is set to anything non-empty."""
    return value(name, environ) is not None


def cache_root(environ: Mapping[str, str] | None = None) -> str | None:
    """PORTABLE_CACHE_DIR (else its old name RECAP_PORTABLE_CACHE), None when neither is set."""
    env = os.environ if environ is None else environ
    return value(CACHE_DIR, env) or env.get(CACHE_DIR_OLD) or None


def check_cache_root(environ: Mapping[str, str] | None = None) -> None:
    """ConfigError (exit 4, as any knob's bad value) when PORTABLE_CACHE_DIR (or its old name) is, or lies under, a
    file: no cache could be written there, and every command went on without one and without a word."""
    env = os.environ if environ is None else environ
    raw = cache_root(env)
    if raw is None:
        return
    name = CACHE_DIR if value(CACHE_DIR, env) else CACHE_DIR_OLD
    probe = Path(raw).expanduser().absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        from reproduction.errors import ConfigError

        where = "is a file" if probe == Path(raw).expanduser().absolute() else f"lies under the file {probe}"
        raise ConfigError(
            f"{name}={raw!r} {where}, not a folder: no cache can be kept there",
            field=name,
            hint=f"point {name} at a folder (it is created when missing), or unset it for {default_cache_root()}",
        )


def default_cache_root() -> Path:
    """Where the cache lives when PORTABLE_CACHE_DIR is unset: ~/.cache/recap-portable."""
    return Path.home() / ".cache" / "recap-portable"


def hub_values(fields: tuple[str, ...], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """{field: raw value} of the PORTABLE_HUB_<FIELD> variables that are set and non-empty."""
    env = os.environ if environ is None else environ
    return {f: env[HUB + f.upper()] for f in fields if env.get(HUB + f.upper())}


def reference() -> str:
    """docs/settings.md: every knob with its default and meaning (generated)."""
    lines = [
        "# Environment settings",
        "",
        "Generated from reproduction/settings.py by `python -m reproduction.settings > docs/settings.md`; a test",
        "fails when this file is out of date. Every knob starts with PORTABLE_; `portable run`'s training workers",
        "inherit the driver's.",
        "",
        "| variable | default | meaning | read by |",
        "|---|---|---|---|",
    ]
    for s in SETTINGS:
        lines.append(f"| `{s.name}` | {s.default} | {s.doc} | {s.read_by} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    sys.stdout.write(reference())
