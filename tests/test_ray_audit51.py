"""Audit 51 F: a joined Ray cluster that goes away mid-stage, and --ray-address checked before the run starts.

F1: stopping the Ray head while a stage trained made `portable run` die 60 s later with exit 1 and only Ray's C++
line "Failed to connect to GCS within 60 seconds", the stage left `running`. The poll loop now probes the GCS and
raises RayUnavailableError (exit 58) within GCS_LOST_AFTER_S, well before Ray's own fatal timeout. (The real
scenario, a head stopped under `portable run`, was run by hand: exit 58 about 20 s after the kill, sft `failed`.)"""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from reproduction.errors import RayUnavailableError  # noqa: E402
from reproduction.train import launcher  # noqa: E402


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _watch(answers: list, clock: _Clock, probed: list) -> launcher.ClusterWatch:
    def connect(host, port, timeout):
        probed.append((host, port, timeout))
        answer = answers.pop(0)
        if answer is not None:
            raise answer

    return launcher.ClusterWatch(
        "192.0.2.2:6379", address="127.0.0.1:6379", what="the workers writing /r/sft", connect=connect, clock=clock
    )


def test_a_gcs_that_refuses_for_the_bound_is_exit_58_naming_address_work_and_resume():
    clock, probed = _Clock(), []
    watch = _watch([ConnectionRefusedError(111, "Connection refused")] * 10, clock, probed)
    watch.check()
    assert probed == []  # not due yet: a probe at most every GCS_PROBE_EVERY_S
    for _ in range(5):  # t = 2, 4, 6, 8, 10 s: failing since t = 2 s, lost at t = 12 s
        clock.now += 2.0
        watch.check()
    assert len(probed) == 5 and probed[0] == ("192.0.2.2", 6379, 2.0) and not watch.lost
    clock.now += 2.0
    with pytest.raises(RayUnavailableError) as caught:
        watch.check()
    err = caught.value
    assert err.exit_code == 58 and err.address == "127.0.0.1:6379" and watch.lost
    assert str(err) == (
        "lost the Ray cluster at 127.0.0.1:6379 while the workers writing /r/sft ran: its GCS at 192.0.2.2:6379 "
        "did not answer for 10 s (Connection refused)"
    )
    assert "--resume" in err.hint and "\n" not in str(err)
    assert launcher.GCS_LOST_AFTER_S + launcher.GCS_PROBE_EVERY_S * 2 < 60  # before Ray's own 60 s fatal timeout


def test_a_gcs_that_answers_again_resets_the_count():
    clock, probed = _Clock(), []
    refused = ConnectionRefusedError(111, "Connection refused")
    watch = _watch([refused] * 4 + [None] + [TimeoutError()] * 6, clock, probed)
    for _ in range(10):
        clock.now += 2.0
        watch.check()
    assert not watch.lost  # 8 s refused, one answer, then 8 s without: never 10 s in a row
    clock.now += 2.0
    with pytest.raises(RayUnavailableError, match=r"did not answer for 10 s \(no answer\)$"):
        watch.check()


def test_the_poll_loop_raises_the_watchs_error_and_sends_nothing_more_to_the_lost_cluster(monkeypatch):
    import ray

    waits, cancelled = [], []
    monkeypatch.setattr(ray, "wait", lambda pending, **kw: (waits.append(1), ([], pending))[1])
    monkeypatch.setattr(ray, "cancel", lambda ref, **kw: cancelled.append(ref))
    clock = _Clock()
    watch = _watch([ConnectionRefusedError(111, "Connection refused")] * 100, clock, [])

    def on_poll():
        clock.now += 1.0

    with pytest.raises(RayUnavailableError):
        launcher._wait_all(["ref0", "ref1"], on_poll, watch=watch)
    assert 10 <= len(waits) <= 14 and cancelled == []


def test_joining_a_port_where_nothing_listens_fails_at_once_with_the_cause():
    """F4: 127.0.0.1:<refused port> waited the probe's whole 120 s, then blamed Ray's loopback rewriting."""
    import socket
    import time

    from reproduction.train import ray_connect

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"  # closed again: connection refused
    t0 = time.monotonic()
    with pytest.raises(RayUnavailableError) as caught:
        ray_connect.connect(address, timeout_s=120, init=lambda **kw: pytest.fail("joined"))
    assert time.monotonic() - t0 < 5
    err = caught.value
    assert err.exit_code == 58 and err.address == address
    assert str(err) == f"cannot join the Ray cluster at {address}: nothing listens there (connection refused)"
    assert "ray status" in err.hint and "rewrites" not in err.hint


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1:60177x", "its port '60177x' is not a number from 1 to 65535"),
        ("127.0.0.1:0", "its port '0' is not a number from 1 to 65535"),
        ("bogus::addr", "it is not host:port (e.g. 10.0.0.5:6379; an IPv6 host goes in brackets)"),
        ("10.0.0.5", "it is not host:port (e.g. 10.0.0.5:6379)"),
        ("", "it is empty (an unset shell variable?)"),
    ],
)
def test_a_malformed_address_gets_its_own_message_without_the_loopback_hint(address, why):
    from reproduction.train import ray_connect

    with pytest.raises(ValueError) as parsed:
        ray_connect.parse_address(address)
    assert str(parsed.value) == why
    with pytest.raises(RayUnavailableError) as caught:
        ray_connect.connect(address, timeout_s=120, init=lambda **kw: pytest.fail("joined"))
    assert str(caught.value) == f"cannot join the Ray cluster at {address!r}: {why}"
    assert "HOST:PORT" in caught.value.hint and "rewrites" not in caught.value.hint


def test_well_formed_addresses_parse():
    from reproduction.train import ray_connect

    assert ray_connect.parse_address("10.0.0.5:6379") == ("10.0.0.5", 6379)
    assert ray_connect.parse_address("ray://head:10001") == ("head", 10001)
    assert ray_connect.parse_address("[::1]:6379") == ("::1", 6379)
    assert ray_connect.parse_address("auto") is None


@pytest.mark.parametrize(
    ("argv", "rc", "first"),
    [
        (
            ["--ray-address", "127.0.0.1:60177x"],
            4,
            "error: --ray-address '127.0.0.1:60177x' is not a Ray address: its port '60177x' is not a number from 1 "
            "to 65535",
        ),
        (["--ray-address", ""], 2, "error: --ray-address is empty"),
        (
            ["ray_address=10.0.0.5"],
            4,
            "error: ray_address '10.0.0.5' is not a Ray address: it is not host:port (e.g. 10.0.0.5:6379)",
        ),
    ],
)
def test_run_refuses_a_bad_ray_address_before_writing_anything(tmp_path, capsys, argv, rc, first):
    """F5: a malformed address failed only inside the first Ray stage (after sft/ was written and recorded failed,
    so the rerun needed --resume); an empty one (an unset shell variable) silently ran a private local Ray."""
    from reproduction import portable

    out = tmp_path / "o"
    assert portable.main(["run", "--output", str(out), *argv]) == rc
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == first and lines[1].startswith("hint: ") and len(lines) == 2
    assert not out.exists()


def test_a_ray_client_address_with_a_credential_parses_and_errors_hide_the_credential():
    from reproduction.train import ray_connect

    assert ray_connect.parse_address("ray://s3cretvalue@127.0.0.1:10001") == ("127.0.0.1", 10001)
    with pytest.raises(RayUnavailableError) as caught:
        ray_connect.connect("ray://s3cretvalue@127.0.0.1:1x", init=lambda **kw: pytest.fail("joined"))
    assert "s3cretvalue" not in str(caught.value) and "ray://<redacted>@127.0.0.1:1x" in str(caught.value)


@pytest.mark.parametrize(
    "address,client", [("ray://10.0.0.5:10001", False), (None, True)], ids=["ray-url", "RAY_ADDRESS"]
)
def test_a_ray_client_is_not_watched_by_the_heads_own_gcs_address(monkeypatch, address, client):
    """audit51 review R1: in client mode Ray's context reports the head's internal GCS address, which the client
    usually cannot reach; watching it called a healthy cluster lost (exit 58) after 10 s."""
    import ray

    class _Context:
        gcs_address = "10.96.0.17:6379"  # what a client's runtime context says: the head's own view

    monkeypatch.setattr(ray, "get_runtime_context", lambda: _Context())
    monkeypatch.setattr(launcher, "_client_connected", lambda: client)
    assert launcher._watch(address, "the workers writing RUN/sft") is None
    monkeypatch.setattr(launcher, "_client_connected", lambda: False)
    watched = launcher._watch("10.96.0.17:6379", "the workers writing RUN/sft")
    assert (watched.host, watched.port) == ("10.96.0.17", 6379)  # a joined cluster is still watched
