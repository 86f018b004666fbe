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
        doc="Cache root: dataset fingerprints and content digests under fingerprints/, the CPU numerics probe's "
        "answer (`portable check`) under numerics/, LIBERO's assets, config and shader cache under libero/. "
        "Also read as RECAP_PORTABLE_CACHE (its old name). `~` is expanded (also when the shell did not; "
        "`~name` for a user this machine does not know is exit 4); a blank value is unset; a relative path is"
        " exit 4 (it would put the cache in whichever folder a command runs from, e.g. inside a bundle), as "
        "is a file (or a path under one). A folder that cannot be written is no error (the cache is skipped, "
        "work recomputed): `portable check`'s host.cache row warns. `portable check`'s host.settings row "
        "warns about PORTABLE_* variables that nothing reads (a misspelled knob); every other command says so"
        " in one warning line on stderr.",
        read_by="settings.cache_root, used by data/fingerprint.py, run/content.py, checks/host.py, "
        "sim/libero/_runtime.py",
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
        read_by="ui.py (bars_wanted: its own bars and the Hub client's)",
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
        "exit 4, as is one out of range: _JOBS 1-256, _RETRIES 0-1000, _BATCH_FILES, _BATCH_BYTES whole numbers 1 or "
        "more; _BACKOFF_S, _BACKOFF_MAX_S seconds from 0 to 86400, _BACKOFF_S at most _BACKOFF_MAX_S; "
        "_STALL_TIMEOUT_S, _CONNECT_TIMEOUT_S seconds above 0, at most 86400 (inf and nan are refused: every wait "
        "stays bounded).",
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


def _cache_setting(env: Mapping[str, str]) -> tuple[str, str] | None:
    """(variable, value) of the cache root's knob in effect, None when neither name is set. A blank value is unset
    (an empty template substitution, `PORTABLE_CACHE_DIR=${X}`, means "no choice", not "a folder named blank")."""
    for name in (CACHE_DIR, CACHE_DIR_OLD):
        raw = env.get(name) or ""
        if raw.strip():
            return name, raw
    return None


def cache_root(environ: Mapping[str, str] | None = None) -> Path | None:
    """The cache root every writer uses: PORTABLE_CACHE_DIR (else its old name RECAP_PORTABLE_CACHE) with `~`
    expanded and made absolute, None when neither is set or both are blank. Raises ConfigError (exit 4, naming the
    variable) for a relative path: it would put the cache in whichever folder a command runs from (inside a bundle,
    an extra file `verify` refuses; audit53 V13), so one is refused, not resolved against the current folder."""
    env = os.environ if environ is None else environ
    found = _cache_setting(env)
    if found is None:
        return None
    name, raw = found
    from reproduction.fsio import expand_home

    expanded, unknown_user = expand_home(raw.strip())
    if unknown_user is not None:  # was exit 1 "internal error" from pathlib (audit60 review S1)
        from reproduction.errors import ConfigError

        raise ConfigError(
            f"{name}={raw!r}: no user {unknown_user!r} on this machine for ~{unknown_user} to expand to",
            field=name,
            hint=f"give an absolute path (e.g. {name}=$HOME/.cache/recap-portable), or unset it for "
            f"{default_cache_root()}",
        )
    path = Path(expanded)
    if not path.is_absolute():
        from reproduction.errors import ConfigError

        # a `$HOME/x` that reached us unexpanded (quoted in a unit file, a .env) is not meant relative to $PWD
        unexpanded = raw.strip().startswith("$")
        raise ConfigError(
            f"{name}={raw!r} is not an absolute path"
            + (" (no shell expanded its variable)" if unexpanded else "")
            + ": the cache would land in whichever folder a command runs from",
            field=name,
            hint=(
                f"write the folder out (e.g. {name}=/home/me/.cache/recap-portable), or unset it for "
                if unexpanded
                else f"give an absolute path (e.g. {name}=$PWD/{raw.strip()} or {name}=$HOME/...), or unset it for "
            )
            + f"{default_cache_root()}",
        )
    return Path(os.path.abspath(path))  # normalised (`..`, `//`), links kept: the folder the user named


def cache_root_or_default(environ: Mapping[str, str] | None = None) -> Path:
    """`cache_root()`, else `default_cache_root()`: the absolute folder fingerprints/ and numerics/ go under."""
    return cache_root(environ) or default_cache_root()


def check_cache_root(environ: Mapping[str, str] | None = None) -> None:
    """ConfigError (exit 4, as any knob's bad value) when PORTABLE_CACHE_DIR (or its old name) is relative, or is,
    or lies under, a file: no cache could be written there, and every command went on without one and without a
    word. A folder that cannot be written is not refused here (a read-only cache only costs recomputation):
    `portable check`'s host.cache row names it."""
    env = os.environ if environ is None else environ
    found = _cache_setting(env)
    if found is None:
        return
    name, raw = found
    probe = root = cache_root(env)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        from reproduction.errors import ConfigError

        where = "is a file" if probe == root else f"lies under the file {probe}"
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


TEST_KNOBS = ("PORTABLE_FUZZ_EXAMPLES", "PORTABLE_PARENT_SITE")
"""PORTABLE_* variables the tests read (not the tool's knobs, but not typos either)."""
HUB_FIELDS = (
    "jobs",
    "retries",
    "backoff_s",
    "backoff_max_s",
    "stall_timeout_s",
    "connect_timeout_s",
    "batch_files",
    "batch_bytes",
)
"""The HubSettings fields read as PORTABLE_HUB_<FIELD> (release/hub_transfer.py reads exactly these)."""


def known_names() -> tuple[str, ...]:
    """Every PORTABLE_* variable something reads: the knobs, the Hub's fields, the test knobs."""
    plain = tuple(s.name for s in SETTINGS if not s.name.endswith("<FIELD>"))
    return (*plain, *(HUB + f.upper() for f in HUB_FIELDS), *TEST_KNOBS)


def unknown_settings(environ: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """[(variable, the closest known name or None)] for every PORTABLE_* variable in the environment that nothing
    reads, sorted: a misspelled knob (PORTABLE_HUB_STALL_TIMEOUT without _S) otherwise silently keeps the default
    (audit53 V18)."""
    import difflib

    env = os.environ if environ is None else environ
    known = known_names()
    tails = {k[len(PREFIX) :]: k for k in known}  # compared without the shared PORTABLE_, which would match anything
    out: list[tuple[str, str | None]] = []
    for name in sorted(n for n in env if n.startswith(PREFIX) and n not in known):
        near = difflib.get_close_matches(name[len(PREFIX) :], tails, n=1, cutoff=0.6)
        out.append((name, tails[near[0]] if near else None))
    return out


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
