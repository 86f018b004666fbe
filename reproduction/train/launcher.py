"""Start the workers: a Ray placement group of one worker per device, or one in-process worker.

The driver picks the rendezvous (MASTER_ADDR/MASTER_PORT), starts a local Ray by itself (and stops
it) unless given `ray_address` or an already-initialised Ray, and waits with bounds: a worker that
raises or dies fails the run at once with its traceback (`WorkerFailedError`, exit 51) and the other
workers are killed; a `PortableError` raised in a worker (bad checkpoint, bad config) is re-raised
as itself. Ray is imported only here and only when used.

`run_tasks` serves inference stages with the same machinery: N independent payloads, one Ray task
(one device) each, no process group, results in payload order.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reproduction.errors import (
    DISK_FULL_ERRNOS,
    PortableError,
    RayUnavailableError,
    WorkerFailedError,
    killed_worker_hint,
    os_error,
    render_error,
)
from reproduction.settings import PREFIX as SETTINGS_PREFIX
from reproduction.train import ray_connect
from reproduction.train.config import TrainConfig
from reproduction.train.device import DeviceSpec
from reproduction.train.dist import free_port
from reproduction.train.ray_connect import WORKER_ENV  # re-exported: the workers' environment

POLL_S = 0.5
ANSI = re.compile(r"\x1b\[[0-9;]*m")
GCS_PROBE_EVERY_S = 2.0
"""How often the poll loop checks that the cluster's GCS still accepts a connection (each try bounded by itself)."""
GCS_LOST_AFTER_S = 10.0
"""A GCS that refused or ignored every probe for this long is lost. Ray's own driver ends the process with exit 1 and
only a C++ log line once the GCS has been gone for `RAY_gcs_rpc_server_reconnect_timeout_s` (60 s by default), so
this must stay well below that (audit51 F1)."""
LOST_GRACE_S = 2.0
"""After the watchdog thread found the cluster lost, how long the main thread gets to notice it itself (a poll loop
that is not stuck in Ray) before the watchdog ends the process (audit55 J1)."""
LOST_FALLBACK_S = 20.0
"""After the main thread claimed a loss, how long its way out (the stage's record, the error line, Ray calls that
may block until Ray's own 60 s) gets before the watchdog ends the process anyway (audit55 review3 R1)."""
INTERRUPTED_HINT = (
    "run the same command again (`portable run` with --resume): completed stages are kept, an interrupted one "
    "continues from its last checkpoint"
)
"""The hint under the watchdog's `error: interrupted`. The watchdog ends `portable run`, `demo` and `eval` alike and
does not know which one it ends (portable.py's INTERRUPT_HINTS, per command, is not importable from train/): `demo`
has no --resume (review60 T1), so the hint names the one command that needs the flag."""
INTERRUPTED_LOST_AFTER_S = 2.0
"""The bound of GCS_LOST_AFTER_S while the main thread unwinds an interrupt: a SIGTERM to the whole process group
(`timeout`, `kill -- -PGID`, Slurm) stops the local Ray's GCS and raylet too, and the main thread's cleanup then blocks
in Ray (audit60 L7)."""
INTERRUPTED_CLEANUP_S = 10.0
"""How long the Ray calls on the way out of a block an interrupt unwinds (the placement group's removal, the local Ray's
shutdown: about 2 s on a busy machine) may take before the watchdog ends the process as that interrupt, exit 130, even
while the GCS still accepts a connection: a GCS that accepts but no longer answers (stopped, starved, stuck in its own
SIGTERM shutdown) passes every probe, and the removal then blocked until Ray's own timeout, whose GetTimeoutError
replaced the interrupt (audit64 sig)."""
END_BOUND_S = 10.0
"""How long the watchdog's record of a lost cluster (run.json's `failed` record) and its error line may take before it
exits 58 anyway: a hung disk or a held lock must not keep a process whose cluster is gone alive (audit56 F2)."""


class ClusterWatch:
    """Bounded checks, between the poll loop's waits, that the Ray cluster's GCS still answers.

    `check()` tries a TCP connect to the GCS (at most `every_s` apart, each bounded by `every_s`) and raises
    RayUnavailableError (exit 58) naming `address` and `what` once every try for `lost_after_s` failed; `lost` is
    then True, and the caller must make no further GCS call (each would block until Ray ends the process).
    `connect(host, port, timeout)` and `clock()` are seams for tests.
    """

    def __init__(
        self,
        gcs_address: str,
        *,
        address: str,
        what: str,
        every_s: float = GCS_PROBE_EVERY_S,
        lost_after_s: float = GCS_LOST_AFTER_S,
        connect: Callable[[str, int, float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        host, _, port = gcs_address.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)
        self.address, self.what = address, what
        self.every_s, self.lost_after_s = every_s, lost_after_s
        self._connect = connect or _tcp_connect
        self._clock = clock
        self._next = clock() + every_s
        self._failing_since: float | None = None
        self._why = ""
        self.lost = False
        self.error: RayUnavailableError | None = None
        self.interrupt: KeyboardInterrupt | None = None
        """The interrupt the main thread unwinds with (set by `_placed`): a loss found then is reported as it, exit 130
        and the stage `interrupted`, not as exit 58 (audit60 L7: a group SIGTERM stopped the local Ray with the run)."""
        self.claimed_by: str | None = None  # "main" (check()'s raise) or "watchdog" (claim()): the one that reports
        self.ended = threading.Event()  # set when the watchdog's end(error) returned (a test's: the real one exits)
        self._lock = threading.Lock()

    @property
    def claimed(self) -> bool:
        """Whether someone (the main thread's poll loop or the watchdog) took the report of the loss."""
        return self.claimed_by is not None

    def check(self) -> None:
        """Probe when one is due; raises RayUnavailableError once the GCS is lost (see the class docstring), also when
        the watchdog thread found it lost first; the raise claims the loss, so the watchdog leaves it to the caller.
        When the watchdog claimed it first, it records and prints it and ends the process: this waits for that
        (END_BOUND_S and a margin) instead of raising, so the loss is reported once (audit56 F2), and raises only if
        the process is still alive then."""
        with self._lock:
            self._probe()
            if self.error is None:
                return
            if self.claimed_by is None:
                self.claimed_by = "main"
            mine = self.claimed_by == "main"
        if not mine:
            self.ended.wait(END_BOUND_S + 5.0)
        raise self.error

    def probe(self) -> None:
        """Probe when one is due (the watchdog thread's call): sets `lost` and `error`, raises nothing."""
        with self._lock:
            self._probe()

    def claim(self) -> bool:
        """Take the report of the loss; True for the first caller only (check()'s raise claims it too)."""
        with self._lock:
            mine = self.claimed_by is None
            if mine:
                self.claimed_by = "watchdog"
            return mine

    def _probe(self) -> None:
        if self.error is not None:
            return
        now = self._clock()
        if now < self._next:
            return
        try:
            self._connect(self.host, self.port, self.every_s)
        except OSError as exc:
            self._why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__)
            if self._failing_since is None:
                self._failing_since = now
        else:
            self._failing_since = None
        now = self._clock()
        self._next = now + self.every_s
        lost_after = min(self.lost_after_s, INTERRUPTED_LOST_AFTER_S) if self.interrupt else self.lost_after_s
        if self._failing_since is not None and now - self._failing_since >= lost_after:
            self.lost = True
            self.error = RayUnavailableError(
                f"lost the Ray cluster at {self.address} while {self.what} ran: its GCS at {self.host}:{self.port} "
                f"did not answer for {now - self._failing_since:.0f} s ({self._why})",
                address=self.address,
                hint="the Ray head stopped or is unreachable: restart it (`ray status` on the head node) or leave "
                "--ray-address out, then rerun with --resume (finished stages and this stage's checkpoints are kept)",
            )


def _tcp_connect(host: str, port: int, timeout: float) -> None:
    with socket.create_connection((host, port), timeout=timeout):
        pass


def _end_process(error: RayUnavailableError | KeyboardInterrupt, *, exit: Callable[[int], Any] | None = None) -> None:
    """The run's end when its cluster is lost and the main thread does not come back from Ray: Ray's core worker
    blocks a pending `ray.wait` while it retries the GCS, then kills the driver after 60 s with only its own log line
    (exit 1, the stage left `running`, audit55 J1). Records through the `ray_connect.on_cluster_lost` hooks, prints the
    one-line error and exits with its code without unwinding (the main thread cannot be unwound). The record and the
    line get END_BOUND_S together: a hung disk, lock or stderr does not keep the process alive (audit56 F2). `exit` is
    a seam for tests (None: os._exit). A KeyboardInterrupt (ClusterWatch.interrupt: the cluster went down with the
    process group's SIGTERM) is recorded through the same hooks (the runner then records the stage `interrupted`) and
    ends the process as portable.main answers an interrupt: `error: interrupted` and exit 130 (audit60 L7). Before the
    exit, the processes of the local Ray this process started are killed (ray_connect.kill_local): the main thread
    may still be in, or before, its ray.shutdown (review64 K L1)."""
    interrupted = isinstance(error, KeyboardInterrupt)

    def report() -> None:
        for record in ray_connect.cluster_lost_hooks():
            try:
                record(error)
            except BaseException:  # noqa: BLE001 - the exit below must happen whatever a record does
                pass
        try:
            if interrupted:
                print(f"error: interrupted\nhint: {INTERRUPTED_HINT}", file=sys.stderr)
            else:
                render_error(error)
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001 - a stderr that cannot be written does not change the exit code
            pass

    thread = threading.Thread(target=report, name="portable-ray-lost-report", daemon=True)
    thread.start()
    thread.join(END_BOUND_S)
    if exit is None:  # no ray.shutdown comes: the local Ray this process started goes with it (review64 K L1)
        ray_connect.kill_local()
    (exit or os._exit)(130 if interrupted else error.exit_code)


@contextmanager
def _watchdog(
    watch: ClusterWatch | None,
    *,
    grace_s: float = LOST_GRACE_S,
    fallback_s: float = LOST_FALLBACK_S,
    cleanup_s: float = INTERRUPTED_CLEANUP_S,
    end: Callable[[RayUnavailableError | KeyboardInterrupt], None] = _end_process,
) -> Iterator[None]:
    """While the block runs, a daemon thread probes `watch` (each probe bounded, ClusterWatch) so a lost cluster is
    found even when the main thread is blocked inside Ray. Once lost, the main thread gets `grace_s` to claim the
    error itself (its poll loop's `watch.check()`); unclaimed, `end(error)` is called (by default it ends the
    process with exit 58). Claimed, the thread outlives the block: a Ray call on the main thread's way out (the
    driver's shutdown) can block until Ray's own 60 s and exit 1 (audit55 review3 R1), so `end(error)` still comes
    after `fallback_s` unless the process has exited by then. Once `watch.interrupt` is set (the main thread unwinds
    an interrupt), the block gets `cleanup_s` more, lost cluster or not, before `end(watch.interrupt)` (exit 130):
    a GCS that accepts connections but answers nothing is never found lost (INTERRUPTED_CLEANUP_S). Without a loss,
    leaving the block stops the thread. `end` is a seam for tests."""
    if watch is None:
        yield
        return
    stop = threading.Event()

    def run() -> None:
        interrupted_at: float | None = None  # when this thread first saw watch.interrupt
        while not stop.wait(min(watch.every_s, 1.0) / 2):
            watch.probe()
            if watch.interrupt is not None and interrupted_at is None:
                interrupted_at = time.monotonic()
            if watch.error is None:
                if interrupted_at is not None and time.monotonic() - interrupted_at >= cleanup_s and watch.claim():
                    try:
                        end(watch.interrupt)
                    finally:
                        watch.ended.set()
                    return
                continue
            if not stop.wait(grace_s) and watch.claim():
                try:
                    end(watch.interrupt or watch.error)
                finally:
                    watch.ended.set()
                return
            break
        if watch.lost:  # the main thread claimed it and is on its way out
            time.sleep(fallback_s)
            end(watch.interrupt or watch.error)  # an interrupt's way out that hung too is still exit 130 (review60 T2)

    thread = threading.Thread(target=run, name="portable-ray-watchdog", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()


def _watch(ray_address: str | None, what: str) -> ClusterWatch | None:
    """A ClusterWatch of the cluster this process is connected to; None when Ray does not say where its GCS is, or
    when this process is a Ray client (`ray://`): a client's context reports the head's own GCS address, which the
    client usually cannot reach (that is why it is a client), so probing it would call a healthy cluster lost
    (audit51 review R1); the client connection has its own failure path."""
    import ray

    if (ray_address or "").startswith("ray://") or _client_connected():
        return None
    try:
        gcs = ray.get_runtime_context().gcs_address
        return ClusterWatch(gcs, address=ray_address or gcs, what=what)
    except Exception:  # noqa: BLE001 - no GCS address to watch (Ray client mode, an odd address): poll unwatched
        return None


def _client_connected() -> bool:
    """Whether this process talks to its cluster through Ray client (`ray://`, including RAY_ADDRESS)."""
    try:
        from ray.util.client import ray as client

        return bool(client.is_connected())
    except Exception:  # noqa: BLE001 - no client support in this Ray: not a client
        return False


@dataclass(kw_only=True)
class Payload:
    """Everything a worker needs; pickled once per worker by Ray (make_task by cloudpickle)."""

    make_task: Callable
    config: TrainConfig
    out_dir: Path
    resume: bool
    spec: DeviceSpec
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    writers_lock: Path | None = None
    """The run folder's writers file (reproduction/writers_lock.py WRITERS_FILE) each Ray worker holds shared for its
    whole life, so the next invocation on the run waits for it (audit51 K2); None: none (outside a run, in-process)."""


def run_inprocess(payload: Payload, *, on_record: Callable[[dict], None] | None = None) -> Any:
    """World size 1 in this process (tests, bench): the same worker code, no Ray."""
    return _worker_body(payload, rank=0, world_size=1, local_rank=0, on_record=on_record)


def _worker_body(
    payload: Payload, *, rank: int, world_size: int, local_rank: int, on_record: Callable[[dict], None] | None = None
) -> Any:
    from reproduction.train import device as device_mod
    from reproduction.train import dist, loop
    from reproduction.train.heap import hold_freed_blocks

    device = device_mod.local_device(payload.spec, local_rank)
    with cpu_threads(payload.config.cpu_threads if device.type == "cpu" else 0), hold_freed_blocks():
        dist.init(
            backend=payload.spec.backend,
            master_addr=payload.master_addr,
            master_port=payload.master_port,
            rank=rank,
            world_size=world_size,
            timeout_s=payload.config.collective_timeout_s,
            device=device,
        )
        ok = False
        try:
            result = loop.run_worker(
                payload.make_task,
                payload.config,
                out_dir=payload.out_dir,
                resume=payload.resume,
                spec=payload.spec,
                device=device,
                on_record=on_record,
            )
            ok = True
            return result
        finally:
            dist.destroy(clean=ok)


@contextmanager
def cpu_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to `n` inside (0 = left alone) and put back on the way out, even
    when the process group fails to start, for whatever an in-process caller does next."""
    import torch

    before = torch.get_num_threads()
    if n and n != before:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


@dataclass(frozen=True, kw_only=True)
class WorkerOutcome:
    """What a worker hands back to the driver: its value, or the PortableError it raised, carried as
    the error's type and constructor arguments (its fields survive pickling; the driver rebuilds it
    through its own constructor, so subclass invariants hold). Bugs travel as Ray task errors."""

    value: Any = None
    error_type: type[PortableError] | None = None
    message: str = ""
    hint: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    traceback: str = ""
    """The worker-side traceback of `error_type` (kept as the rebuilt error's `worker_traceback`)."""

    @classmethod
    def of_error(cls, exc: PortableError) -> WorkerOutcome:
        return cls(
            error_type=type(exc),
            message=exc.message,
            hint=exc.hint,
            fields=dict(exc.fields),
            traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        )

    def unwrap(self) -> Any:
        """The value, or raise the worker's error rebuilt in this process."""
        if self.error_type is None:
            return self.value
        err = self.error_type(self.message, hint=self.hint, **self.fields)
        err.worker_traceback = self.traceback
        raise err


@dataclass(frozen=True, kw_only=True)
class WorkerFailure:
    """A worker that raised something other than a PortableError (a bug), or whose process died."""

    rank: int
    died: bool
    """True when the process was lost (killed, crashed, node gone); False when it raised."""
    summary: str
    """One line: the exception (`RuntimeError: boom`) or how it died (`WorkerCrashedError: ...`)."""
    traceback: str
    """The worker's traceback (ANSI colours removed) or Ray's account of the death."""

    def error(self, label: str | None = None, killed_hint: str | None = None) -> WorkerFailedError:
        """As a WorkerFailedError: with `label` one line naming `label` and the index (run_tasks),
        without it the training form naming `worker rank N` with the worker's traceback in the message.
        `killed_hint` (the label form): the hint when the process died, from the caller, which knows how its command
        continues and the key it reads the worker count from (errors.killed_worker_hint); None: a plain rerun."""
        if label is not None:
            verb = "died:" if self.died else "raised"
            hint = (
                (killed_hint or killed_worker_hint(resume=False))
                if self.died
                else "a bug in the worker (its traceback is the error's `traceback`); "
                "rerun with one worker to see it in this process"
            )
            return WorkerFailedError(
                f"{label} {self.rank} {verb} {self.summary}", rank=self.rank, traceback=self.traceback, hint=hint
            )
        if self.died:
            return WorkerFailedError(
                f"worker rank {self.rank} died: {self.summary}",
                rank=self.rank,
                traceback=self.traceback,
                hint="a worker process was killed (out of memory? kill -9?); "
                "rerun with resume to continue from the last checkpoint",
            )
        return WorkerFailedError(
            f"worker rank {self.rank} raised:\n{self.traceback}",
            rank=self.rank,
            traceback=self.traceback,
            hint="the traceback above is the worker's; fix the cause and rerun with resume",
        )


class _WorkerFailed(Exception):
    """Internal: `_wait_all` found a failed worker; the caller turns it into its WorkerFailedError."""

    def __init__(self, failure: WorkerFailure) -> None:
        super().__init__(failure.summary)
        self.failure = failure


def _ray_worker(payload: Payload, rank: int) -> WorkerOutcome:
    """Ray task body: PortableErrors come back as values (their fields survive), bugs as tracebacks."""
    from reproduction.writers_lock import hold_writers

    try:
        local_rank = rank if payload.spec.kind == "cpu" else 0  # Ray narrows the visible devices to one
        world_size = payload.config.world_size
        with hold_writers(payload.writers_lock):  # a killed driver's ranks keep it until they finish or die
            value = _worker_body(payload, rank=rank, world_size=world_size, local_rank=local_rank)
        return WorkerOutcome(value=value)
    except PortableError as exc:
        return WorkerOutcome.of_error(exc)
    except OSError as exc:
        if exc.errno not in DISK_FULL_ERRNOS:
            raise
        return WorkerOutcome.of_error(os_error(exc, "a file of the run"))  # a full disk is not a bug (exit 8)


def run_ray(payload: Payload, *, ray_address: str | None, on_poll: Callable[[], None] | None = None) -> Any:
    """Run `config.world_size` workers under Ray; returns rank 0's result."""
    cfg = payload.config
    with _placed(
        ray_address,
        payload.spec,
        workers=cfg.world_size,
        cpus_per_worker=cfg.cpus_per_worker,
        start_timeout_s=cfg.start_timeout_s,
        what=f"the workers writing {payload.out_dir}",
    ) as (pg, single_node, watch):
        payload.master_addr, payload.master_port = _rendezvous(pg, cfg, single_node)
        refs = _submit(payload, pg, local=single_node)
        try:
            return _wait_all(refs, on_poll, watch=watch)[0]
        except _WorkerFailed as failed:
            raise failed.failure.error() from None


def _task_body(fn: Callable[[Any], Any], payload: Any, writers_lock: Path | None = None) -> WorkerOutcome:
    """`run_tasks`' Ray task body: the `_ray_worker` protocol without a process group, holding `writers_lock` shared
    while `fn` runs (reproduction/writers_lock.py hold_writers)."""
    from reproduction.writers_lock import hold_writers

    try:
        with hold_writers(writers_lock):
            value = fn(payload)
        return WorkerOutcome(value=value)
    except PortableError as exc:
        return WorkerOutcome.of_error(exc)
    except OSError as exc:
        if exc.errno not in DISK_FULL_ERRNOS:
            raise
        return WorkerOutcome.of_error(os_error(exc, "a file of the run"))


def run_tasks(
    fn: Callable[[Any], Any],
    payloads: Sequence[Any],
    *,
    spec: DeviceSpec,
    ray_address: str | None,
    cpus_per_worker: float = 1.0,
    start_timeout_s: float = 120.0,
    on_done: Callable[[int], None] | None = None,
    on_poll: Callable[[], None] | None = None,
    label: str = "task",
    writers_lock: Path | None = None,
    killed_hint: str | None = None,
) -> list[Any]:
    """`fn(payload)` for each payload, each as its own Ray task on one device; results in payload order.

    `fn` must be importable by the workers (a module-level function) and should return something
    small. Ray is started locally (and stopped) unless given `ray_address` or already initialised;
    each task is a fresh process (max_calls=1) with WORKER_ENV and the driver's PORTABLE_* and pinned-kernel variables,
    reserving `cpus_per_worker` CPUs and one GPU/NPU when `spec` has one. Placement is bounded by
    `start_timeout_s`; `on_done(i)` is called as payload i finishes. The first task that raises or
    dies kills the others and raises a one-line WorkerFailedError (exit 51) naming `label` and the
    payload's index (`rank`), with the worker's text in `traceback`; a PortableError raised in a task
    is re-raised as itself. `on_poll()` runs between bounded waits; whatever it raises cancels every
    task and propagates (the caller's way to abort the run). Each task holds `writers_lock` shared while it runs
    (the caller passes the run's, StageContext.writers_lock; None: nothing held), so the next invocation on the run
    waits for tasks a killed driver left running. `killed_hint`: the hint when a task's process died
    (WorkerFailure.error).
    """
    import ray

    # absolute: the tasks run in another cwd (or on another node)
    writers = Path(os.path.abspath(writers_lock)) if writers_lock is not None else None

    if not payloads:
        return []
    with _placed(
        ray_address,
        spec,
        workers=len(payloads),
        cpus_per_worker=cpus_per_worker,
        start_timeout_s=start_timeout_s,
        what=f"{len(payloads)} {label}(s)",
    ) as (pg, single_node, watch):
        env = _worker_env(local=single_node)
        remote = ray.remote(max_calls=1)(_task_body)  # a fresh process per task: its device, nothing left over
        refs = [
            remote.options(**_task_options(spec, cpus_per_worker, pg, i, env)).remote(fn, payload, writers)
            for i, payload in enumerate(payloads)
        ]
        try:
            results = _wait_all(refs, on_poll, on_done, watch=watch)
        except _WorkerFailed as failed:
            raise failed.failure.error(label, killed_hint) from None
        return [results[i] for i in range(len(payloads))]


@contextmanager
def _placed(
    ray_address: str | None,
    spec: DeviceSpec,
    *,
    workers: int,
    cpus_per_worker: float,
    start_timeout_s: float,
    what: str = "the workers",
) -> Iterator[tuple[Any, bool, ClusterWatch | None]]:
    """Ray connected (a local one started if needed) and a placement group of `workers` bundles,
    yielded with whether the cluster is one node and a ClusterWatch of it (`what` names the work in its error);
    the group is removed, and a Ray this call started is shut down, on the way out, unless the watch found the
    cluster lost (each of those calls would then block until Ray's own fatal timeout)."""
    import ray

    started = _connect(ray_address, cpus=max(int(workers * cpus_per_worker + 0.999), 1), timeout_s=start_timeout_s)
    pg = None
    watch = _watch(ray_address, what)
    # every Ray call below, not only the poll loop's wait, blocks once the GCS is gone (audit55 J1: the head stopped
    # as the group was removed): the watchdog thread finds the loss wherever the main thread is stuck
    interrupt: KeyboardInterrupt | None = None
    with _watchdog(watch):
        try:
            pg = _placement_group(
                spec, workers=workers, cpus_per_worker=cpus_per_worker, start_timeout_s=start_timeout_s
            )
            yield pg, sum(1 for node in ray.nodes() if node.get("Alive")) == 1, watch
        except KeyboardInterrupt as exc:
            interrupt = exc
            if watch is not None:  # the Ray calls below may block on a cluster the same SIGTERM stopped (audit60 L7)
                watch.interrupt = exc
            raise
        finally:
            lost = watch is not None and watch.lost
            if pg is not None and not lost:
                _cleanup(lambda: ray.util.remove_placement_group(pg), interrupt)
            if started and not lost:
                _cleanup(ray.shutdown, interrupt)


def _cleanup(step: Callable[[], Any], interrupt: KeyboardInterrupt | None) -> None:
    """`step()`, a Ray call on `_placed`'s way out. While `interrupt` unwinds, an Exception it raises is dropped, so the
    interrupt stays what ends the run: Ray's GetTimeoutError from a GCS that no longer answered replaced it, and the
    stage was recorded `failed` and the run did not exit 130 (audit64 sig). Otherwise it propagates."""
    try:
        step()
    except Exception:
        if interrupt is None:
            raise


def _connect(ray_address: str | None, *, cpus: int, timeout_s: float) -> bool:
    """Make sure Ray is initialised (a local one gets `cpus` CPUs), bounded (train/ray_connect.py); True
    when this call started it (and must shut it down)."""
    import ray

    if ray.is_initialized():
        return False
    if ray_address:
        ray_connect.connect(ray_address, timeout_s=timeout_s)
    else:
        ray_connect.start_local(cpus=cpus)
    return True


def _placement_group(spec: DeviceSpec, *, workers: int, cpus_per_worker: float, start_timeout_s: float):
    import ray
    from ray.util.placement_group import placement_group

    bundle: dict[str, float] = {"CPU": cpus_per_worker}
    if spec.ray_resource:
        bundle[spec.ray_resource] = 1
    pg = placement_group([dict(bundle) for _ in range(workers)], strategy="PACK")
    try:
        ray.get(pg.ready(), timeout=start_timeout_s)
    except ray.exceptions.GetTimeoutError:
        ray.util.remove_placement_group(pg)
        raise WorkerFailedError(
            f"Ray could not place {workers} workers of {bundle} within {start_timeout_s:.0f} s "
            f"(cluster has {ray.cluster_resources()})",
            hint="lower world_size, free the cluster, or raise start_timeout_s",
        ) from None
    return pg


def _rendezvous(pg, config: TrainConfig, single_node: bool) -> tuple[str, int]:
    """MASTER_ADDR/MASTER_PORT: loopback on one machine; on a cluster, the node of rank 0's bundle
    (asked by a tiny probe task placed there, since it need not be the driver's node)."""
    if single_node:
        return "127.0.0.1", free_port()
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=0)
    probe = ray.remote(_probe_address).options(num_cpus=0, scheduling_strategy=strategy, max_retries=0)
    try:
        return ray.get(probe.remote(), timeout=config.start_timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise WorkerFailedError(
            f"rank 0's node did not answer within {config.start_timeout_s:.0f} s",
            hint="check the Ray cluster's health (`ray status`)",
        ) from None


def _probe_address() -> tuple[str, int]:
    import ray

    return ray.util.get_node_ip_address(), free_port()


def _submit(payload: Payload, pg, *, local: bool) -> list:
    import ray

    env = _worker_env(local=local)
    remote = ray.remote(max_calls=1)(_ray_worker)  # a fresh process per run: no leftover group or RNG
    refs = []
    for rank in range(payload.config.world_size):
        options = _task_options(payload.spec, payload.config.cpus_per_worker, pg, rank, env)
        refs.append(remote.options(**options).remote(payload, rank))
    return refs


def _worker_env(*, local: bool) -> dict[str, str]:
    """Workers' environment: WORKER_ENV, the driver's PORTABLE_* knobs and pinned CPU kernels, and on one machine
    its sys.path. The kernels travel explicitly: a worker's own node may have been started without them (a remote
    cluster, or a local Ray started before `pin_cpu_kernels`), and its values would differ in the last bits."""
    from reproduction.numerics import PINNED

    env = dict(WORKER_ENV)
    env.update({k: v for k, v in os.environ.items() if k.startswith(SETTINGS_PREFIX) or k in PINNED})
    if local:  # workers import what the driver imports (tests, scripts next to the driver)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    return env


def _task_options(spec: DeviceSpec, cpus: float, pg, index: int, env: dict[str, str]) -> dict[str, Any]:
    """Ray options of the worker in bundle `index`: its CPUs, its device (GPU or a declared NPU), no retries."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=index)
    options = {"num_cpus": cpus, "max_retries": 0, "scheduling_strategy": strategy, "runtime_env": {"env_vars": env}}
    if spec.ray_resource == "GPU":
        options["num_gpus"] = 1
    elif spec.ray_resource:
        options["resources"] = {spec.ray_resource: 1}
    return options


def _wait_all(
    refs: list,
    on_poll: Callable[[], None] | None,
    on_done: Callable[[int], None] | None = None,
    *,
    watch: ClusterWatch | None = None,
) -> dict[int, Any]:
    """Every ref's result by index; the first failure cancels the rest and raises (a collective's lost-peer error
    gives way to the rank that died, `_root_cause`); a cluster `watch` finds lost raises its RayUnavailableError
    (exit 58). Each wait is bounded."""
    import ray

    rank_of = {ref: rank for rank, ref in enumerate(refs)}
    pending, results = list(refs), {}
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=POLL_S)
            for ref in done:
                try:
                    results[rank_of[ref]] = _outcome(ref, rank_of[ref])
                except _WorkerFailed as failed:
                    raise _root_cause(failed, pending, rank_of) from None
                if on_done is not None:
                    on_done(rank_of[ref])
            if watch is not None:
                watch.check()
            if on_poll is not None:
                on_poll()
    finally:
        # peers of a failed rank sit in a collective: kill them now (no cancel reaches a lost cluster)
        for ref in pending if watch is None or not watch.lost else ():
            ray.cancel(ref, force=True)
    return results


PEER_LOST = re.compile(r"connection (closed|reset)|remote worker|by peer|gloo|nccl|hccl", re.IGNORECASE)
"""A collective's error when a peer went away: the rank that raised it is a consequence, not the cause."""
PEER_WAIT_S = 10.0


def _root_cause(failed: _WorkerFailed, pending: list, rank_of: dict) -> _WorkerFailed:
    """The failure to report: `failed`, unless it is a collective's error about a lost peer (PEER_LOST) and a pending
    rank turns out to have died within PEER_WAIT_S: when a worker's process dies, its peers' collectives can fail
    before Ray reports the death, and naming the peer that merely noticed hid the rank that crashed. A pending rank's
    own PortableError (a rank whose simulator worker was killed, a bad checkpoint) is raised as itself: that rank
    returned it and exited, which is what the peer noticed (audit63 K M1)."""
    import ray

    if failed.failure.died or not pending or not PEER_LOST.search(failed.failure.traceback):
        return failed
    done, _ = ray.wait(pending, num_returns=len(pending), timeout=PEER_WAIT_S)
    for ref in done:
        try:
            _outcome(ref, rank_of[ref])
        except _WorkerFailed as other:
            if other.failure.died:
                return other
        except PortableError:
            raise
        except Exception:  # noqa: BLE001 - another rank's own error: `failed` came first, it stays the report
            pass
    return failed


def _outcome(ref, rank: int) -> Any:
    """Rank `rank`'s value; its PortableError re-raised as itself; _WorkerFailed when it raised
    anything else or died."""
    import ray

    try:
        outcome: WorkerOutcome = ray.get(ref, timeout=60)
    except ray.exceptions.RayTaskError as exc:
        text = ANSI.sub("", str(exc))  # the traceback's last line is the worker's exception
        raise _WorkerFailed(WorkerFailure(rank=rank, died=False, summary=_last_line(text), traceback=text)) from None
    except (
        ray.exceptions.WorkerCrashedError,
        ray.exceptions.ActorDiedError,
        ray.exceptions.NodeDiedError,
        ray.exceptions.ObjectLostError,
        ray.exceptions.TaskCancelledError,
    ) as exc:
        summary = f"{type(exc).__name__}: {exc}"
        raise _WorkerFailed(WorkerFailure(rank=rank, died=True, summary=summary, traceback=str(exc))) from None
    return outcome.unwrap()


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "an exception"
