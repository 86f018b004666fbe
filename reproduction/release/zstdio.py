"""zstd for layers on any Python: the `zstandard` module, else the `zstd` command, else a clear error.

A bare server Python usually has neither typer nor zstandard; most Linux hosts have the `zstd`
command. Both produce and read standard zstd frames. Decompression is single-threaded in both, so
callers parallelise across layers. Readers can hash the compressed bytes as they pass (`hasher`),
which verifies an archive in the same read that extracts it.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from reproduction.errors import MissingDependencyError, WriteFailedError

CHUNK = 1 << 20
INSTALL_HINT = "install one of them: `python3 -m pip install zstandard` or `apt-get install zstd` (dnf/yum: zstd)"


_LOCK = threading.Lock()
_CACHE: list[Any] = []


def _module() -> Any | None:
    """The zstandard module or None, decided once per process (restore imports it from threads)."""
    with _LOCK:
        if not _CACHE:
            try:
                import zstandard
            except ImportError:
                zstandard = None
            _CACHE.append(zstandard)
        return _CACHE[0]


def backend() -> str:
    """'module' (python zstandard), 'cli' (the zstd command) or 'none'."""
    if _module() is not None:
        return "module"
    if shutil.which("zstd"):
        return "cli"
    return "none"


def require_backend(what: str) -> str:
    """The backend to use, or MissingDependencyError (exit 10) naming what to install."""
    name = backend()
    if name == "none":
        raise MissingDependencyError(
            f"cannot {what}: neither the Python module 'zstandard' nor the 'zstd' command is available",
            hint=INSTALL_HINT,
        )
    return name


class _HashingReader(io.RawIOBase):
    """A raw file that feeds every byte it returns to `hasher` (and can drain the rest into it)."""

    def __init__(self, fh: IO[bytes], hasher: Any | None) -> None:
        self._fh, self._hasher = fh, hasher

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        n = self._fh.readinto(buf)
        if n and self._hasher is not None:
            self._hasher.update(memoryview(buf)[:n])
        return n or 0

    def read(self, size: int = -1) -> bytes:
        data = self._fh.read(size)
        if data and self._hasher is not None:
            self._hasher.update(data)
        return data

    def drain(self) -> None:
        """Hash whatever the decompressor did not need (trailing bytes), so the digest covers the file."""
        while self._hasher is not None:
            data = self._fh.read(CHUNK)
            if not data:
                break
            self._hasher.update(data)


@contextmanager
def open_decompressed(path: Path, *, hasher: Any | None = None) -> Iterator[IO[bytes]]:
    """A readable stream of the decompressed bytes of `path`.

    If `hasher` is given it receives every compressed byte of the file once the stream has been
    read to its end (the caller must read to EOF for the digest to be complete). Raises
    MissingDependencyError when no zstd is available, InvalidInputError-free: corrupt frames raise
    `zstd_error` (a ValueError) from read().
    """
    name = require_backend(f"read {path}")
    with open(path, "rb", buffering=0) as raw:
        reader = _HashingReader(raw, hasher)
        if name == "module":
            zstandard = _module()
            with zstandard.ZstdDecompressor().stream_reader(reader, read_size=CHUNK, read_across_frames=True) as stream:
                yield stream
            reader.drain()
            return
        with _cli_decompress(reader) as stream:
            yield stream


@contextmanager
def _cli_decompress(reader: _HashingReader) -> Iterator[IO[bytes]]:
    """Pipe `reader` through `zstd -dc`; a feeder thread writes stdin so stdout never deadlocks."""
    proc = subprocess.Popen(
        ["zstd", "-dcq", "--no-progress"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
    )
    errors: list[BaseException] = []

    def feed() -> None:
        try:
            while True:
                data = reader.read(CHUNK)
                if not data:
                    break
                proc.stdin.write(data)
        except BrokenPipeError:
            reader.drain()
        except BaseException as exc:  # reported after the stream is consumed
            errors.append(exc)
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        yield _CliStream(proc)
    except Exception:
        code, err = _end(proc, feeder)
        if errors:  # the file could not be read: zstd saw a short input
            raise errors[0] from None
        # zstd refused the input itself (not our closing its output: SIGPIPE, or EPIPE where that is ignored): its
        # words, not what the reader made of the short stream it got (audit63 A L7: a frame it would not decode, a
        # 2 GiB window, was reported as the member index and the archive disagreeing)
        if code > 0 and "Broken pipe" not in err:
            raise zstd_error()(f"zstd -d failed (exit {code}): {err}") from None
        raise
    except BaseException:
        _end(proc, feeder)
        raise
    code, err = _end(proc, feeder)
    if errors:
        raise errors[0]
    if code != 0:
        raise zstd_error()(f"zstd -d failed (exit {code}): {err}")


def _end(proc: subprocess.Popen, feeder: threading.Thread) -> tuple[int, str]:
    """Close zstd's output, wait for it and the feeder; (its exit code, its stderr on one line, at most 300 chars)."""
    proc.stdout.close()
    feeder.join(timeout=600)
    try:
        err = proc.stderr.read().decode("utf-8", "replace")
    finally:
        proc.stderr.close()
    code = proc.wait(timeout=60)
    lines = [line.removeprefix("/*stdin*\\ :").removeprefix("zstd:").strip() for line in err.splitlines()]
    return code, "; ".join(line for line in lines if line)[:300]


class _CliStream(io.RawIOBase):
    """stdout of `zstd -dc`; a truncated or corrupt input surfaces as an error at the end."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self._out = proc.stdout

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        return self._out.readinto(buf) or 0


def zstd_error() -> type[Exception]:
    """The exception type a corrupt frame raises (zstandard.ZstdError when present)."""
    module = _module()
    return getattr(module, "ZstdError", ValueError) if module is not None else ValueError


@contextmanager
def open_compressor(out: Path, *, level: int = 3, threads: int = 2) -> Iterator[IO[bytes]]:
    """A writable stream that compresses into `out` (multi-threaded; output is deterministic).

    zstd's multi-threaded output depends on level and parameters, not on the thread count, so
    packing the same tree twice gives the same bytes. On failure `out` may be partial: callers
    write to a temp name and rename.
    """
    name = require_backend(f"write {out}")
    with open(out, "wb") as fh:
        if name == "module":
            zstandard = _module()
            cctx = zstandard.ZstdCompressor(level=level, threads=max(1, threads), write_checksum=True)
            with cctx.stream_writer(fh, closefd=False) as writer:
                yield writer
            return
        proc = subprocess.Popen(
            ["zstd", "-q", f"-{level}", f"-T{max(1, threads)}", "--check", "-c"],
            stdin=subprocess.PIPE,
            stdout=fh,
            stderr=subprocess.PIPE,
        )
        try:
            yield proc.stdin
        finally:
            proc.stdin.close()
            err = proc.stderr.read().decode("utf-8", "replace").strip()
            code = proc.wait(timeout=600)
        if code != 0:
            raise WriteFailedError(f"zstd failed writing {out} (exit {code}): {err[:200]}", path=out)
