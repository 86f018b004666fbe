"""Starting and joining Ray is bounded, and fails with one line naming the address and the fix (exit 58).

Regressions: a slow local start on a busy machine ended the quick demo with exit 1 "internal error ...
The current node timed out during startup"; joining a cluster whose address never answers hung in
`ray.init` (600 s for a cluster started on 127.0.0.1)."""

from __future__ import annotations

import socket
import time

import pytest

pytest.importorskip("ray")

from reproduction.errors import RayUnavailableError  # noqa: E402
from reproduction.train import ray_connect  # noqa: E402

TIMED_OUT = (
    "The current node timed out during startup. This could happen because some of the raylet failed to startup "
    "or the GCS has become overloaded."
)


def test_a_local_start_that_times_out_is_retried_once():
    calls = []

    def init(**kwargs):
        calls.append(kwargs)
        if len(calls) == 1:
            raise Exception(TIMED_OUT)  # noqa: TRY002 - Ray raises exactly this

    ray_connect.start_local(cpus=3, init=init)
    assert len(calls) == 2
    assert calls[1]["address"] == "local" and calls[1]["num_cpus"] == 3
    assert calls[1]["_node_ip_address"] == "127.0.0.1" and calls[1]["include_dashboard"] is False


def test_a_local_start_that_keeps_timing_out_is_exit_58_naming_the_fix():
    calls = []

    def init(**kwargs):
        calls.append(kwargs)
        raise Exception(TIMED_OUT)  # noqa: TRY002

    with pytest.raises(RayUnavailableError) as caught:
        ray_connect.start_local(cpus=2, init=init)
    err = caught.value
    assert len(calls) == ray_connect.START_TRIES == 2
    assert err.exit_code == 58 and err.address == "127.0.0.1"
    assert str(err) == f"a local Ray on 127.0.0.1 (2 CPUs) did not start in 2 tries: {TIMED_OUT}"
    assert "--ray-address 127.0.0.1:6379" in err.hint and "--resume" in err.hint


def test_the_cli_renders_it_as_one_line_and_exit_58(monkeypatch, capsys, tmp_path):
    from reproduction import portable

    def fail(args):
        ray_connect.start_local(cpus=1, init=lambda **kw: (_ for _ in ()).throw(Exception(TIMED_OUT)))

    monkeypatch.setattr("reproduction.run.cli.cmd_run", fail)
    rc = portable.main(["run", "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 58, err
    lines = err.strip().splitlines()
    assert lines[0].startswith("error: a local Ray on 127.0.0.1 (1 CPUs) did not start in 2 tries: The current node")
    assert lines[1].startswith("hint: the machine is busy") and len(lines) == 2 and "Traceback" not in err


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


def test_joining_a_cluster_that_never_answers_is_bounded_and_names_the_address():
    with socket.socket() as silent:  # accepts TCP (the kernel's backlog) but never speaks Ray (audit51 F4)
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        joined = []
        t0 = time.monotonic()
        with pytest.raises(RayUnavailableError) as caught:
            ray_connect.connect(address, timeout_s=6, init=lambda **kw: joined.append(kw))
    took = time.monotonic() - t0
    err = caught.value
    assert err.exit_code == 58 and err.address == address and joined == []  # this process never called ray.init
    assert str(err) == f"cannot join the Ray cluster at {address}: no answer within 6 s"
    assert took < 30, took
    assert "--node-ip-address" in err.hint and "leave --ray-address out" in err.hint  # the loopback fix


def test_a_run_starts_one_local_ray_on_first_use_and_stops_it_at_the_end():
    started, stopped = [], []

    def start(cpus):
        started.append(cpus)
        return "127.0.0.1:6379"

    service = ray_connect.RunRay(cpus=3, start=start, stop=lambda: stopped.append(1))
    with service:
        assert started == []  # nothing asked yet: no Ray
        assert service.address() == "127.0.0.1:6379"
        assert service.address() == "127.0.0.1:6379"
        assert started == [3] and stopped == []
    assert stopped == [1]
    with ray_connect.RunRay(cpus=3, start=start, stop=lambda: stopped.append(2)):
        pass
    assert started == [3] and stopped == [1]  # never asked: never started nor stopped


def test_a_run_given_an_address_joins_it_and_never_starts_or_stops_ray():
    def start(cpus):
        raise AssertionError("started a local Ray")

    with ray_connect.RunRay("10.0.0.5:6379", start=start, stop=lambda: (_ for _ in ()).throw(AssertionError)) as rr:
        assert rr.address() == "10.0.0.5:6379"


def test_a_local_ray_that_does_not_start_is_exit_58_from_the_stage_that_asked():
    def start(cpus):
        ray_connect.start_local(cpus=cpus, init=lambda **kw: (_ for _ in ()).throw(Exception(TIMED_OUT)))

    with ray_connect.RunRay(cpus=1, start=start) as service, pytest.raises(RayUnavailableError) as caught:
        service.address()
    assert caught.value.exit_code == 58


def test_ray_init_does_not_take_over_portables_sigterm_handler():
    """audit47 kill2 F1: ray.init installs a SIGTERM handler in the driver that calls sys.exit(1); installed over the
    one `portable run` sets (SIGTERM as Ctrl-C), a SIGTERM in the value stage ended as exit 54 "the stage called
    sys.exit(1)", recorded failed. The handler that was there before ray.init is put back; a default one is left."""
    import signal
    import sys

    def rays(signum, frame):  # what Ray's driver installs
        sys.exit(1)

    def init(**kwargs):
        signal.signal(signal.SIGTERM, rays)

    def ours(signum, frame):
        raise KeyboardInterrupt("SIGTERM")

    before = signal.signal(signal.SIGTERM, ours)
    try:
        ray_connect.start_local(cpus=1, init=init)
        assert signal.getsignal(signal.SIGTERM) is ours
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        ray_connect.start_local(cpus=1, init=init)
        assert signal.getsignal(signal.SIGTERM) is rays  # nobody had asked for SIGTERM: Ray's stays
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_sigterm_while_ray_init_runs_is_an_interrupt_not_rays_exit():
    """audit51 K1: a SIGTERM during ray.init (seconds here) met the handler Ray's driver had just installed,
    sys.exit(SIGTERM): the stage was recorded `failed`, exit 54 "called sys.exit(15)", not `interrupted`, 130."""
    import os
    import signal
    import sys
    import time

    def rays(signum, frame):  # Ray 2.60's driver handler (ray/_private/worker.py)
        sys.exit(signum)

    def init(**kwargs):
        signal.signal(signal.SIGTERM, rays)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs at the next bytecode; never finished

    def ours(signum, frame):
        raise KeyboardInterrupt("SIGTERM")

    before = signal.signal(signal.SIGTERM, ours)
    try:
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            ray_connect.start_local(cpus=1, init=init)
        assert signal.getsignal(signal.SIGTERM) is ours
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # nobody asked for SIGTERM as an interrupt: Ray's exit stays
        with pytest.raises(SystemExit):
            ray_connect.start_local(cpus=1, init=init)
    finally:
        signal.signal(signal.SIGTERM, before)
