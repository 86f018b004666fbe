"""The one place that starts or joins Ray: every start and connect is bounded, and fails with one line
naming the address and the fix (RayUnavailableError, exit 58), never an internal error.

- `start_local(cpus)`: a private one-node Ray on 127.0.0.1 (no dashboard). Ray waits a fixed 30 s for
  its raylet to register; on a busy machine that start can time out ("The current node timed out during
  startup"), so it is tried twice before giving up.
- `RunRay`: the one cluster a run's stages share (the runner holds it for the whole run): the joined
  --ray-address, else a local one started by `start_local` when a stage first asks, stopped at the end.
- `connect(address, timeout_s)`: join an existing cluster. `ray.init(address=...)` has no timeout (a
  cluster started on 127.0.0.1, whose address Ray rewrites to the host's IP, hung it for 600 s), so a
  child process joins first under `timeout_s`, then this process joins the cluster the child reached. A malformed
  address, a host that does not resolve or a port that refuses a TCP connect fails before that probe, at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from reproduction.errors import RayUnavailableError

START_TRIES = 2
"""Local starts tried before giving up (each is bounded by Ray's own 30 s raylet wait)."""
CONNECT_TIMEOUT_S = 60.0
"""Default bound of a connect when the caller has no configured one (a stage's `start_timeout_s`)."""
WORKER_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
"""Set in the driver before a local start: the raylet's env is inherited by every worker it starts."""
RAY_LOGGING_LEVEL = logging.WARNING
"""The driver's `ray` logger level (ray.init's `logging_level`, INFO by default): its INFO lines ("Started a local Ray
instance.") are no talk of `portable`, and reached stderr even under -q (audit60 L2); Ray's warnings and errors stay."""
_PROBE = "import os, sys, ray; ray.init(address=sys.argv[1], log_to_driver=False); os._exit(0)"
_LOOPBACK = ("127.", "localhost", "[::1]", "::1")
KEYWORDS = ("auto", "local")
"""Addresses Ray resolves itself (no host:port to check)."""
REACH_S = 2.0
"""Bound of the TCP connect `connect` tries before its Ray probe: a refused port fails at once, not after the probe's
whole bound (audit51 F4)."""


def parse_address(address: str) -> tuple[str, int] | None:
    """The (host, port) of a Ray address `host:port`, `[v6]:port` or `ray://host:port`; None for a Ray keyword
    (`auto`, `local`). Raises ValueError saying what is wrong (empty, no port, a port that is not 1-65535)."""
    text = address.strip()
    if not text:
        raise ValueError("it is empty (an unset shell variable?)")
    if text in KEYWORDS:
        return None
    rest = text.removeprefix("ray://").rpartition("@")[2]  # ray://TOKEN@host:port: the credential is no host
    host, sep, port = rest.rpartition(":")
    if not sep or not host:
        raise ValueError("it is not host:port (e.g. 10.0.0.5:6379)")
    if host.startswith("["):
        if not host.endswith("]"):
            raise ValueError("it is not host:port (an IPv6 host goes in brackets: [::1]:6379)")
        host = host[1:-1]
    if not host or any(c.isspace() for c in host) or (":" in host and not rest.startswith("[")):
        raise ValueError("it is not host:port (e.g. 10.0.0.5:6379; an IPv6 host goes in brackets)")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"its port {port!r} is not a number from 1 to 65535")
    return host, int(port)


def plain_log_prefix() -> None:
    """RAY_COLOR_PREFIX=0 in this process (the driver, which prints its workers' lines) when stdout or stderr is no
    terminal, NO_COLOR is set or TERM is dumb: Ray wraps each worker line's `(pid=...)` prefix in ANSI colour codes
    otherwise, whatever the stream is (audit60 L6). A RAY_COLOR_PREFIX the user set is kept."""
    if "RAY_COLOR_PREFIX" in os.environ:
        return
    plain = os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb"
    if plain or not all(_is_tty(stream) for stream in (sys.stdout, sys.stderr)):
        os.environ["RAY_COLOR_PREFIX"] = "0"


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):  # None (pythonw), a closed or replaced stream
        return False


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return (text[:300] + "...") if len(text) > 300 else text or type(exc).__name__


START_SECONDS: list[float] = []
"""Wall seconds of each local Ray this process started (its import included): `portable demo` reports them."""


@contextlib.contextmanager
def _sigterm_kept() -> Iterator[None]:
    """ray.init installs Ray's own SIGTERM handler in the driver (it calls sys.exit(1)) over the one `portable`
    installed to answer SIGTERM as Ctrl-C: a SIGTERM during the value or advantages stages then ended as exit 54 "the
    stage called sys.exit(1)", recorded `failed` (audit47 kill2 F1). Puts a Python handler that was there before
    back; a default one is left to Ray. A SIGTERM that arrives while ray.init runs meets Ray's handler, whose
    sys.exit(SIGTERM) is raised here as the KeyboardInterrupt the handler before would have raised (audit51 K1:
    exit 54 and the stage `failed`, not 130 and `interrupted`). A no-op off the main thread."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGTERM)
    try:
        yield
    except SystemExit as exc:
        if callable(before) and exc.code == signal.SIGTERM and signal.getsignal(signal.SIGTERM) is not before:
            try:  # through the handler itself, so the CLI's guard notes the interrupt (guards.interrupts_noted)
                before(signal.SIGTERM, None)
            except KeyboardInterrupt as interrupt:
                raise interrupt from None
            raise KeyboardInterrupt("SIGTERM") from None
        raise
    finally:
        if callable(before) and signal.getsignal(signal.SIGTERM) is not before:
            signal.signal(signal.SIGTERM, before)


def start_local(*, cpus: int, init: Callable[..., Any] | None = None) -> None:
    """Start a private local Ray with `cpus` CPUs in this process (`init` is ray.init; a seam for tests).

    Tries START_TRIES times (shutting a half-started Ray down between tries); then raises
    RayUnavailableError naming 127.0.0.1, what Ray said and what to do.
    """
    import time

    t0 = time.perf_counter()
    import ray

    init = init or ray.init
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # Ray 2.60 token auth: off for a private local cluster
    for key, value in WORKER_ENV.items():
        os.environ.setdefault(key, value)
    plain_log_prefix()
    last: BaseException | None = None
    for _ in range(START_TRIES):
        try:
            # A private one-node cluster: advertise loopback, so nothing it tells its workers points off-host.
            with _sigterm_kept():
                init(
                    address="local",
                    num_cpus=cpus,
                    include_dashboard=False,
                    object_store_memory=200 * 1024 * 1024,
                    log_to_driver=True,
                    logging_level=RAY_LOGGING_LEVEL,
                    _node_ip_address="127.0.0.1",
                )
            START_SECONDS.append(time.perf_counter() - t0)
            return
        except Exception as exc:  # Ray raises a bare Exception for a start that timed out
            last = exc
            try:
                ray.shutdown()
            except Exception:
                pass
    raise RayUnavailableError(
        f"a local Ray on 127.0.0.1 ({cpus} CPUs) did not start in {START_TRIES} tries: {_one_line(last)}",
        address="127.0.0.1",
        hint="the machine is busy or short of memory (Ray waits 30 s for its raylet): run again when it is "
        "quieter (--resume keeps every finished stage), or start Ray yourself with `ray start --head "
        "--node-ip-address 127.0.0.1 --port 6379` and pass --ray-address 127.0.0.1:6379",
    )


def connect(address: str, *, timeout_s: float = CONNECT_TIMEOUT_S, init: Callable[..., Any] | None = None) -> None:
    """Join the Ray cluster at `address` in this process, bounded by `timeout_s`.

    A child process joins first (killed at `timeout_s`); only when it reached the cluster does this
    process call ray.init. Raises RayUnavailableError naming the address, the bound and the fix.
    """
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    reachable(address)
    loopback = address.startswith(_LOOPBACK)
    fix = (
        "Ray rewrites a loopback address to this host's IP, where a cluster started on 127.0.0.1 may not answer: "
        "start the cluster with `ray start --head --node-ip-address <this host's IP>` and pass that address, or "
        "leave --ray-address out (run then starts a private Ray on 127.0.0.1 itself)"
        if loopback
        else "check the address (`ray status` on the head node prints it) and that this host can reach it, "
        "or leave --ray-address out to let run start a private local Ray"
    )
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", _PROBE, address],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    except OSError as exc:
        raise RayUnavailableError(f"cannot start a Ray probe for {address}: {exc}", address=address) from None
    try:
        _, err = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except OSError:
            pass
        child.communicate()
        raise RayUnavailableError(
            f"cannot join the Ray cluster at {address}: no answer within {timeout_s:.0f} s",
            address=address,
            hint=fix,
        ) from None
    if child.returncode != 0:
        last = [line for line in (err or "").splitlines() if line.strip()][-1:] or [f"exit {child.returncode}"]
        raise RayUnavailableError(
            f"cannot join the Ray cluster at {address}: {' '.join(last[0].split())[:300]}", address=address, hint=fix
        )
    plain_log_prefix()
    with _sigterm_kept():
        (init or ray.init)(address=address, log_to_driver=True, logging_level=RAY_LOGGING_LEVEL)


def shown(address: str) -> str:
    """`address` as an error may show it: a `ray://TOKEN@` credential replaced by `<redacted>`."""
    return re.sub(r"^(ray://)[^@/]*@", r"\1<redacted>@", address)


def reachable(address: str) -> None:
    """Fail at once, with the cause, for an address that cannot be a cluster: malformed, a host that does not resolve,
    or a port that refuses a TCP connect on every address the host resolves to (nothing listens), each tried in turn
    as socket.create_connection does. A connect that times out or fails otherwise, on any address, is left to the
    bounded Ray probe (a firewall, a slow network). The whole check, the host's resolution included, takes at most
    REACH_S."""
    try:
        where = parse_address(address)
    except ValueError as exc:
        raise RayUnavailableError(
            f"cannot join the Ray cluster at {shown(address)!r}: {exc}",
            address=address,
            hint="pass --ray-address HOST:PORT, the address `ray status` prints on the head node",
        ) from None
    if where is None:
        return
    host, port = where
    deadline = time.monotonic() + REACH_S
    try:  # the name's resolution is inside the bound too: getaddrinfo has no timeout of its own (audit56 F2)
        infos = _within(REACH_S, lambda: socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
    except TimeoutError:
        return  # a name that resolves slowly: left to the bounded Ray probe, as a slow connect is
    except socket.gaierror as exc:
        raise RayUnavailableError(
            f"cannot join the Ray cluster at {shown(address)}: host {host!r} does not resolve ({exc.strerror})",
            address=address,
            hint="check the host name, or pass the head node's IP address",
        ) from None
    except OSError:
        return
    # Each address in turn, as socket.create_connection does: a name with AAAA and A records (or `localhost`, ::1
    # first on hosts whose /etc/hosts says so) whose head listens on IPv4 only is refused on the first (audit56 R3).
    all_refused = bool(infos)
    for family, kind, proto, _, sockaddr in infos:
        left = deadline - time.monotonic()
        if left <= 0:
            return  # the bound spent before every address was tried: left to the bounded Ray probe
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(max(left, 0.05))
                sock.connect(sockaddr)
            return
        except ConnectionRefusedError:
            pass
        except OSError:  # a timeout, no route, IPv6 off on this host: not "nothing listens"; the next one is tried
            all_refused = False
    if all_refused:
        raise RayUnavailableError(
            f"cannot join the Ray cluster at {shown(address)}: nothing listens there (connection refused)",
            address=address,
            hint="is the Ray head running, on that port? `ray status` on the head node prints its address; "
            "or leave --ray-address out to let run start a private local Ray",
        )


def _within(seconds: float, fn: Callable[[], Any]) -> Any:
    """`fn()` run on a daemon thread, waited for at most `seconds` (TimeoutError after that; the thread is left to
    finish on its own): for a blocking call that takes no timeout. What `fn` raises is raised here."""
    done: list[Any] = []

    def run() -> None:
        try:
            done.append((True, fn()))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            done.append((False, exc))

    thread = threading.Thread(target=run, name="portable-bounded-call", daemon=True)
    thread.start()
    thread.join(seconds)
    if not done:
        raise TimeoutError(f"no answer within {seconds:g} s")
    ok, value = done[0]
    if not ok:
        raise value
    return value


def may_use_ray(stages: Iterable[Any], plain: dict[str, Any], config: Any = None) -> bool:
    """Whether one of `stages` (StageSpecs) may run its workers on Ray under the run's config (`config` typed,
    `plain` its plain dict). A stage that declares `uses_ray` is asked, with `config`: the predicate its function hands
    ctx.ray_for, so probe and stage agree (audit56 R4: the advantages stage joins Ray for value.infer.workers > 1, a
    key it does not declare, and eval's workers are a process pool); one whose predicate raises counts as using Ray.
    For one that does not (an out-of-tree recipe), or without `config`: a config key it reads (StageSpec.config)
    holds, at any depth, `launcher: ray` or `workers` above 1. What a joined --ray-address is probed for before
    anything runs (audit56 F2: a dead head stopped `--stages compare`, which joins no cluster); a Ray use this misses
    fails at the join, exit 58 alike."""

    def rayish(value: Any) -> bool:
        if not isinstance(value, dict):
            return False
        if value.get("launcher") == "ray":
            return True
        workers = value.get("workers")
        if isinstance(workers, int) and not isinstance(workers, bool) and workers > 1:
            return True
        return any(rayish(v) for v in value.values())

    for stage in stages:
        predicate = getattr(stage, "uses_ray", None)
        if predicate is not None and config is not None:
            try:
                if predicate(config):
                    return True
            except Exception:  # noqa: BLE001 - the stage raises it when it runs; a probe now costs at most REACH_S
                return True
            continue
        for key in stage.config:
            value: Any = plain
            for part in key.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            if rayish(value):
                return True
    return False


_ON_CLUSTER_LOST: list[Callable[[BaseException], None]] = []


@contextlib.contextmanager
def on_cluster_lost(record: Callable[[BaseException], None]) -> Iterator[None]:
    """While the block runs, `record(error)` is called if a watchdog ends the process because the Ray cluster was
    lost (the runner records its stage `failed` with it): a RayUnavailableError, or the KeyboardInterrupt the main
    thread was unwinding when a group SIGTERM stopped the local Ray too (recorded `interrupted`, audit60 L7). It runs
    on the watchdog thread while the main thread may be stuck in Ray, so it must only write its own record; whatever it
    raises is ignored."""
    _ON_CLUSTER_LOST.append(record)
    try:
        yield
    finally:
        _ON_CLUSTER_LOST.remove(record)


def cluster_lost_hooks() -> list[Callable[[BaseException], None]]:
    """The `on_cluster_lost` records now registered, oldest first."""
    return list(_ON_CLUSTER_LOST)


class RunRay:
    """The Ray cluster one run shares, as a context manager the runner holds for the whole run.

    `address()` is what a stage calls when its workers need Ray: the joined `--ray-address` when one was
    given (never started or stopped here), else a private local Ray started on the first call (start_local,
    so RayUnavailableError exit 58 when it does not start) and stopped when the context exits. None when
    this process already runs a Ray it did not start through here (the launcher then uses that one).
    Folds, datasets and stages so share one cluster instead of each starting their own.
    """

    def __init__(
        self,
        joined: str | None = None,
        *,
        cpus: int | None = None,
        start: Callable[[int], str] | None = None,
        stop: Callable[[], None] | None = None,
    ):
        """`start(cpus) -> address` and `stop()` start and stop the local Ray (seams for tests)."""
        self.joined = joined
        """--ray-address: a cluster to join (stages get it as it is)."""
        self._cpus = cpus
        self._start = start or _start_local_address
        self._stop = stop or _shutdown
        self._local: str | None = None
        self._started = False

    def address(self) -> str | None:
        """The cluster's address, starting the local one on the first call (see the class docstring)."""
        if self.joined:
            return self.joined
        if self._started:
            return self._local
        import ray

        if ray.is_initialized():
            return None
        self._local = self._start(self._cpus or os.cpu_count() or 1)
        self._started = True
        return self._local

    def __enter__(self) -> RunRay:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._started:
            self._started, self._local = False, None
            self._stop()


def _start_local_address(cpus: int) -> str:
    import ray

    start_local(cpus=cpus)  # bounded; RayUnavailableError (exit 58) when it does not start
    return ray.get_runtime_context().gcs_address


def _shutdown() -> None:
    import ray

    ray.shutdown()


def shutdown_for_exit() -> bool:
    """Shut this process's Ray driver down now, if Ray was imported (a start that an interrupt cut short leaves Ray's
    processes up with `ray.is_initialized()` False): what Ray's atexit hook would do at the interpreter's exit, where
    a KeyboardInterrupt left its C++ teardown half done (audit51 K3). Bounded by Ray's own waits (about 1 s per Ray
    process it started: terminate, then kill); a joined cluster is only left. Never raises an Exception.

    Returns whether this process had a Ray driver, or was starting one (`ray.init` sets the worker's mode before it
    creates the core worker), whose native core worker may outlive this: an interrupt inside `ray.init` can come after
    the core worker started and before Python holds it, so `ray.shutdown` cannot stop it, and its C++ teardown at the
    process's exit (a libc atexit handler, after Python's own) then crashes on its dead raylet: SIGSEGV, not exit 130
    (audit64 segv). True when Ray was imported but its state cannot be read (another Ray version)."""
    ray = sys.modules.get("ray")
    if ray is None:
        return False
    worker = getattr(getattr(getattr(ray, "_private", None), "worker", None), "global_worker", None)
    driver = worker is None or getattr(worker, "mode", None) is not None
    try:
        ray.shutdown()
    except Exception:
        pass
    return driver


KILL_LOCAL_S = 3.0
"""Bound of `kill_local`: a /proc read or a kill that blocks does not hold up the exit that follows it."""


def kill_local(bound_s: float = KILL_LOCAL_S) -> None:
    """SIGKILL, now, every process of the local Ray this process started (Ray's node object of a head: the GCS, the
    raylet, the dashboard, the monitors) and every process those started (the raylet's dashboard and runtime-env
    agents, its workers), without a word to the GCS: for an exit that cannot wait for `ray.shutdown`. The launcher's
    watchdog ends an interrupted run after INTERRUPTED_CLEANUP_S while the main thread may still be in that
    shutdown, and the os._exit left the agents running for about 90 s (review64 K L1). A joined cluster (a driver's
    connect-only node, which started nothing) is left alone, and so is a Ray that was never imported. Bounded by
    `bound_s`; never raises."""
    ray = sys.modules.get("ray")
    if ray is None:
        return

    def kill() -> None:
        try:
            node = ray._private.worker._global_node
            if node is None or not getattr(node, "head", False):
                return
            started = [info.process for infos in list(node.all_processes.values()) for info in list(infos)]
        except Exception:  # noqa: BLE001 - another Ray's internals: nothing known to kill
            return
        roots = {process.pid for process in started if process.poll() is None}
        for pid in roots | _descendants(roots):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    thread = threading.Thread(target=kill, name="portable-ray-kill", daemon=True)
    thread.start()
    thread.join(bound_s)


def _descendants(roots: set[int]) -> set[int]:
    """The processes below `roots` (children, theirs, ...), from /proc's parent pids; none where there is no /proc."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return set()
    for name in entries:
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as stat:
                    parent = int(stat.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(name))
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found and child not in roots:
                found.add(child)
                todo.append(child)
    return found
