"""`portable check`: run every probe, render the table on stderr, write the JSON report, pick the exit code.

`collect_report` runs the probes and returns a `CheckReport` (what `run` stores in its evidence);
`run_checks` is collect + render + JSON + exit code, for the CLI. The bundle is read first (its
restored interpreter is the target), then the interpreter's facts, then the probes in parallel
threads (each waits in subprocesses, so threads suffice), then `--jit-smoke` last so its kernel does
not race the GPU process census. JSON report (format "recap-portable-check" 1.0)::

    {"format", "format_version", "created", "seconds", "status": ok|warn|fail, "exit_code",
     "python", "bundle", "device": {"requested", "selected", "why"}, "jit_smoke",
     "interpreter": {"version", "dists": {"torch": "2.13.0+cpu", "numpy": ...}},
     "results": [{"name", "status", "finding", "fix", "failure", "exit_code", "seconds", "details"}]}
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reproduction.checks import (
    accelerator_ascend,
    accelerator_cuda,
    filesystems,
    hazards,
    host,
    jit,
    render,
)
from reproduction.checks import (
    bundle as bundle_probes,
)
from reproduction.checks.context import CheckContext, load_facts, select_device
from reproduction.checks.probe import FAIL, OK, WARN, ProbeResult, RunCommand, run_command
from reproduction.checks.toolchain import probe_toolchain
from reproduction.errors import WriteFailedError
from reproduction.fsio import atomic_write_text
from reproduction.ui import UiOptions

FORMAT = "recap-portable-check"
FORMAT_VERSION = "1.0"


@dataclass(kw_only=True, slots=True)
class CheckReport:
    """Everything one `portable check` found."""

    results: list[ProbeResult]
    """Rows in display order."""
    python: str
    """The interpreter the probes targeted."""
    bundle: str | None
    """The bundle checked, if any."""
    device: dict[str, str]
    """requested, selected and why."""
    jit_smoke: bool
    seconds: float
    interpreter: dict[str, Any] = field(default_factory=dict)
    """The target interpreter: Python version and installed versions of torch, torch-npu, numpy, ..."""
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    @property
    def exit_code(self) -> int:
        """0 unless some row failed; then the lowest failure-class code (20-24)."""
        codes = [r.exit_code for r in self.results if r.status == FAIL]
        return min(codes) if codes else 0

    @property
    def status(self) -> str:
        statuses = {r.status for r in self.results}
        return FAIL if FAIL in statuses else WARN if WARN in statuses else OK

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "created": self.created,
            "seconds": round(self.seconds, 3),
            "status": self.status,
            "exit_code": self.exit_code,
            "python": self.python,
            "bundle": self.bundle,
            "device": self.device,
            "jit_smoke": self.jit_smoke,
            "interpreter": self.interpreter,
            "results": [r.to_dict() for r in self.results],
        }


def _timed(fn: Callable[[], list[ProbeResult] | ProbeResult]) -> list[ProbeResult]:
    start = time.perf_counter()
    out = fn()
    rows = out if isinstance(out, list) else [out]
    elapsed = time.perf_counter() - start
    for row in rows:
        row.seconds = row.seconds or elapsed
    return rows


def collect_report(
    bundle: Path | None = None,
    *,
    jit_smoke: bool = False,
    device: str = "auto",
    run: RunCommand = run_command,
    env: dict[str, str] | None = None,
    ctx: CheckContext | None = None,
) -> CheckReport:
    """Run every probe and return the report; never raises for what it finds (findings are rows).

    `ctx` overrides the host paths and the command seam (tests; its bundle, device and jit_smoke are
    set from the arguments); otherwise the live machine is probed with `env` (default: os.environ).
    Probes run subprocesses and a C compile in a temporary folder; nothing else is written. Raises only
    for a bug.
    """
    start = time.perf_counter()
    if ctx is None:
        ctx = CheckContext(python=Path(sys.executable), env=dict(os.environ if env is None else env), run=run)
    ctx.bundle, ctx.jit_smoke, ctx.device = (Path(bundle) if bundle else None), jit_smoke, device
    rows: list[ProbeResult] = []
    manifest = None
    if ctx.bundle is not None:
        manifest, row = bundle_probes.load_bundle(ctx.bundle)
        rows.append(row)
        if manifest is not None:
            rows += [
                bundle_probes.probe_restored(ctx.bundle, manifest),
                bundle_probes.probe_disk(ctx.bundle, manifest, ctx.work_dir),
                *bundle_probes.probe_value_exports(ctx.bundle, manifest),
            ]
            ctx.python = bundle_probes.bundle_interpreter(ctx.bundle, manifest) or ctx.python
    load_facts(ctx)
    selected, why = select_device(ctx)
    tasks = [
        lambda: probe_toolchain(ctx.python, ctx=ctx),
        lambda: accelerator_cuda.probe_cuda(ctx, selected),
        lambda: accelerator_ascend.probe_ascend(ctx, selected),
        lambda: host.probe_host(ctx),
        lambda: host.probe_cpu_numerics(ctx),
        lambda: filesystems.probe_filesystems(ctx),
        lambda: hazards.probe_hazards(ctx, manifest),
        lambda: render.probe_libero_render(ctx),
    ]
    with ThreadPoolExecutor(max_workers=len(tasks), thread_name_prefix="portable-check") as pool:
        for group in pool.map(_timed, tasks):
            rows += group
    if jit_smoke:
        rows += _timed(lambda: jit.probe_jit(ctx, selected))
    return CheckReport(
        results=rows,
        python=str(ctx.python),
        bundle=str(ctx.bundle) if ctx.bundle else None,
        device={"requested": device, "selected": selected, "why": why},
        jit_smoke=jit_smoke,
        interpreter={
            "version": ctx.facts.get("version"),
            "dists": {k: v for k, v in (ctx.facts.get("dists") or {}).items() if v},
        },
        seconds=time.perf_counter() - start,
    )


_MARK = {OK: "ok", WARN: "WARN", FAIL: "FAIL", "skip": "skip"}
_STYLE = {OK: "green", WARN: "yellow", FAIL: "bold red", "skip": "dim"}


def render_table(report: CheckReport, *, options: UiOptions | None = None, stream: Any = None) -> None:
    """The table on stderr: one row per probe (status, finding, fix); rich when importable, plain otherwise.

    With -q only warn/fail rows are shown. NO_COLOR is honoured.
    """
    options = options or UiOptions()
    stream = stream or sys.stderr
    rows = [r for r in report.results if not options.quiet or r.status in (WARN, FAIL)]
    summary = (
        f"check: {report.status} (exit {report.exit_code}) in {report.seconds:.1f} s; device "
        f"{report.device['selected']} ({report.device['why']}); python {report.python}"
    )
    try:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:
        Console = None  # noqa: N806
    from reproduction.settings import PLAIN, flag

    if Console is not None and not flag(PLAIN) and rows:
        console = Console(
            file=stream,
            no_color=bool(os.environ.get("NO_COLOR")),
            width=None if stream.isatty() else 160,
            soft_wrap=False,
        )
        table = Table(show_lines=False, expand=False)
        for column in ("probe", "status", "finding", "fix"):
            table.add_column(column, overflow="fold")
        for r in rows:
            # Findings and fixes are plain text: `pip install -e '.[libero]'` is not rich markup.
            table.add_row(Text(r.name), Text(_MARK[r.status], style=_STYLE[r.status]), Text(r.finding), Text(r.fix))
        console.print(table)
        console.print(summary, markup=False, highlight=False)
        return
    width = max((len(r.name) for r in rows), default=5)
    for r in rows:
        stream.write(f"{r.name:<{width}}  {_MARK[r.status]:<4}  {r.finding}\n")
        if r.fix:
            stream.write(f"{'':<{width}}        fix: {r.fix}\n")
    stream.write(summary + "\n")
    stream.flush()


def write_json(report: CheckReport, json_path: Path) -> None:
    """Write the JSON report to `json_path` atomically, or to stdout when it is '-'.

    Raises WriteFailedError (exit 8)."""
    text = json.dumps(report.to_dict(), indent=1) + "\n"
    if str(json_path) == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        try:
            atomic_write_text(Path(json_path), text)
        except OSError as exc:
            raise WriteFailedError(
                f"cannot write the check report to {json_path}: {exc.strerror or exc}",
                path=str(json_path),
                hint="pass --json a writable file, or '-' for stdout",
            ) from None


def run_checks(
    *, bundle: Path | None, jit_smoke: bool, json_path: Path | None, device: str, ui: UiOptions | None = None
) -> int:
    """The CLI's `portable check`: collect, render on stderr, write JSON if asked; returns the exit code."""
    report = collect_report(bundle, jit_smoke=jit_smoke, device=device)
    render_table(report, options=ui)
    if json_path is not None:
        write_json(report, json_path)
    return report.exit_code
