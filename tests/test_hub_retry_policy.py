"""Which Hub failures are retried: a host name that does not resolve and a 404 fail at once (no
backoff), while dropped connections keep their bounded retries. Against the local test hub server and
an unresolvable name (`.invalid` is reserved: it never resolves)."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from hubserver import HubServer, portable_cmd, portable_env

from reproduction.release.hub_transfer import HubSettings, is_retryable, unresolved_host, with_retries

TOKEN = "hf_portableRetryPolicy_51f0"
SLOW_RETRIES = {"PORTABLE_HUB_RETRIES": "5", "PORTABLE_HUB_BACKOFF_S": "2", "PORTABLE_HUB_BACKOFF_MAX_S": "2"}


def _dns_error() -> httpx.ConnectError:
    try:
        try:
            socket.getaddrinfo("hub.invalid", 443)
        except socket.gaierror as exc:
            raise httpx.ConnectError(str(exc)) from exc
    except httpx.ConnectError as err:
        return err
    pytest.skip("this machine's DNS resolves hub.invalid (a reserved name that must not resolve)")


def test_an_unresolvable_host_is_not_retried_but_a_refused_connection_is():
    dns = _dns_error()
    assert unresolved_host(dns) and not is_retryable(dns)
    refused = httpx.ConnectError("[Errno 111] Connection refused")
    assert not unresolved_host(refused) and is_retryable(refused)
    calls = []

    def lookup() -> None:
        calls.append(1)
        raise dns

    with pytest.raises(Exception, match="does not resolve") as info:
        with_retries(lookup, what="resolve", settings=HubSettings(retries=5, backoff_s=5.0))
    assert calls == [1] and info.value.exit_code == 33


def test_fetch_from_a_host_that_does_not_resolve_fails_at_once(tmp_path: Path):
    _dns_error()
    env = portable_env(_Endpoint("http://hub.invalid:9"), tmp_path / "hfhome", token=None, **SLOW_RETRIES)
    start = time.monotonic()
    got = subprocess.run(
        portable_cmd("fetch", "alice/r", str(tmp_path / "out")), env=env, capture_output=True, text=True, timeout=60
    )
    took = time.monotonic() - start
    assert got.returncode == 33, got.stderr
    assert "host name does not resolve" in got.stderr and "retry " not in got.stderr
    assert took < 8, f"took {took:.1f} s: five retries with 2 s backoff would take at least 10 s"


def test_fetch_of_a_repo_that_does_not_exist_asks_once(tmp_path: Path):
    hub = HubServer(tmp_path / "hub", tokens={TOKEN: ("alice", "write")}).start()
    try:
        start = time.monotonic()
        got = subprocess.run(
            portable_cmd("fetch", "alice/nothing-here", str(tmp_path / "out")),
            env=portable_env(hub, tmp_path / "hfhome", token=TOKEN, **SLOW_RETRIES),
            capture_output=True,
            text=True,
            timeout=60,
        )
        took = time.monotonic() - start
        assert got.returncode == 32, got.stderr
        assert "repository not found" in got.stderr and "retry " not in got.stderr
        assert len(hub.requests("GET", r"nothing-here")) == 1, "a 404 is never retried"
        assert took < 8
    finally:
        hub.stop()


class _Endpoint:
    """What `portable_env` reads from a server: its URL."""

    def __init__(self, url: str) -> None:
        self.url = url
