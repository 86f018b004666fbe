"""train/heap.py: inside hold_freed_blocks a freed 64 MiB buffer is reused (no new page faults), outside and after
it glibc maps a fresh one each time; PORTABLE_HEAP=system leaves glibc alone; a bad value is exit 4."""

from __future__ import annotations

import resource

import pytest

from reproduction.errors import ConfigError
from reproduction.train import heap

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(heap._glibc() is None, reason="glibc only (mallopt)")

CYCLES, MIB = 12, 64
PAGES = CYCLES * (MIB << 20) // resource.getpagesize()  # pages a fresh buffer per cycle touches


def big_buffer_faults() -> int:
    """Minor page faults of CYCLES allocate-fill-free rounds of a MIB buffer (above glibc's 32 MiB mmap cap)."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(CYCLES):
        buf = torch.empty(MIB << 20, dtype=torch.uint8)
        buf.fill_(1)
        del buf
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def test_hold_reuses_freed_big_blocks_and_restores_glibc_on_exit(monkeypatch):
    monkeypatch.delenv("PORTABLE_HEAP", raising=False)
    outside = big_buffer_faults()
    assert outside >= PAGES // 2  # mmap per buffer: every page faulted in again
    with heap.hold_freed_blocks() as held:
        assert held is True
        big_buffer_faults()  # the first round grows the heap
        inside = big_buffer_faults()
    after = big_buffer_faults()
    assert inside < PAGES // 20, (inside, outside)
    assert after >= PAGES // 2, (after, outside)  # mmap again: the defaults are back


def test_hold_restores_glibc_when_the_body_raises(monkeypatch):
    monkeypatch.delenv("PORTABLE_HEAP", raising=False)
    with pytest.raises(RuntimeError, match="boom"), heap.hold_freed_blocks():
        raise RuntimeError("boom")
    assert big_buffer_faults() >= PAGES // 2


def test_system_leaves_glibc_alone(monkeypatch):
    monkeypatch.setenv("PORTABLE_HEAP", "system")
    with heap.hold_freed_blocks() as held:
        assert held is False
        big_buffer_faults()
        assert big_buffer_faults() >= PAGES // 2


def test_bad_value_is_a_config_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv("PORTABLE_HEAP", "jemalloc")
    with pytest.raises(ConfigError) as err, heap.hold_freed_blocks():
        pass
    assert err.value.message == "PORTABLE_HEAP='jemalloc' is not one of hold, system"
    assert err.value.exit_code == 4 and "PORTABLE_HEAP=system" in err.value.hint
    assert heap.choice({"PORTABLE_HEAP": " HOLD "}) == "hold" and heap.choice({}) == "hold"
