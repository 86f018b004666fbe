"""Camera streams in mp4 files: read frames of an episode, encode episodes back to back.

`decode_episode` decodes a whole episode sequentially: one seek to the keyframe at or before its start, then
forward. `VideoReader` reads the frames a read asks for: it keeps a few files open, each positioned after the last
frame it decoded, and reads on from there when the next wanted frame lies within a GOP ahead (a sorted sweep decodes
each frame once), else seeks to the keyframe at or before that frame, as lerobot's decoders do (a single frame costs
about a GOP, whatever the episode's length). Frames are placed by their presentation time, so a file holding many
episodes (LeRobot v3.0) and a file per episode (v2.1) read the same way.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from reproduction.errors import DatasetError, InputNotFoundError, InvalidInputError


def frame_rate(fps: int | float) -> Fraction:
    """`fps` as the exact fraction a stream's rate and time base need: 30 -> 30, 29.97 -> 2997/100 (the decimal
    written in info.json, so a frame's time i * 100/2997 is the timestamp i / 29.97 lerobot computes; the binary
    float's own fraction has a 2**-k denominator no mp4 time base holds). PyAV 15 refuses a float rate."""
    if isinstance(fps, int):
        return Fraction(fps)
    return Fraction(repr(float(fps))).limit_denominator(1_000_000)


def segment_frames(from_timestamp: float, to_timestamp: float | None, num_frames: int, fps: int | float) -> int:
    """How many of an episode's `num_frames` slots its video segment can hold: all of them without `to_timestamp`
    (a v2.1 file per episode, or an older writer), else the slots before round((to - from) * fps), where the next
    episode of a v3.0 file begins (audit63 V M3: rows past it read the next episode's frames)."""
    if to_timestamp is None:
        return num_frames
    return max(0, min(num_frames, int(round((float(to_timestamp) - from_timestamp) * float(fps)))))


def decode_episode(
    path: Path,
    *,
    from_timestamp: float,
    num_frames: int,
    fps: int | float,
    episode: int | None = None,
    to_timestamp: float | None = None,
) -> np.ndarray:
    """Frames [from_timestamp, from_timestamp + num_frames/fps) of `path` as uint8 (num_frames, H, W, 3).

    Raises InputNotFoundError when the file is missing and DatasetError (exit 40) when FFmpeg cannot read
    it (a truncated or corrupt file: PyAV's FFmpegError, which is no PortableError) or it holds fewer frames
    than the episode needs (a truncated or mismatched video, or a segment that ends at `to_timestamp`, where the
    next episode of the file begins, before the episode's frames do); the message names `episode` when given.
    A frame goes to slot round((time - from_timestamp) * fps), the frame nearest the slot's timestamp, which is the
    one lerobot's decoder picks (nearest loaded frame to the query timestamp), for a whole or fractional fps alike.
    """
    import av

    path = Path(path)
    if not path.is_file():
        raise InputNotFoundError(
            f"{path}: video file missing", path=path, hint="the dataset is incomplete; copy its videos/ folder too"
        )
    what = f"episode {episode}: " if episode is not None else ""
    held = segment_frames(from_timestamp, to_timestamp, num_frames, fps)
    try:
        back = 0.0
        while True:
            out, filled, first = _decode(av, path, from_timestamp, held, fps, seek_to=from_timestamp - back)
            # the seek's keyframe is shown after the episode's first frames (an open GOP, whose leading frames need
            # the GOP before: review63 V M1): seek a keyframe further back, as far as the file's start
            if first is None or first <= 0 or from_timestamp - back <= 0:
                break
            back = max(1.0, 2 * back)
    except (av.error.FFmpegError, _NoVideoStream) as exc:
        why = str(exc) if isinstance(exc, _NoVideoStream) else f"{type(exc).__name__}: {exc.strerror or exc}"
        raise DatasetError(
            f"{path}: {what}not a readable video ({why})",
            path=path,
            hint="the file is truncated or corrupt (an interrupted copy or download?): copy or fetch the dataset's "
            "videos/ again, or restore this file from its source",
        ) from None
    if out is None or not filled.all() or held < num_frames:
        missing = int((~filled).sum()) + num_frames - held
        end = f" (its segment ends at to_timestamp {float(to_timestamp):.3f}s)" if held < num_frames else ""
        raise DatasetError(
            f"{path}: {what}{missing} of {num_frames} frames from t={from_timestamp:.3f}s are not in the video{end}",
            path=path,
            hint="the video does not match the episode metadata; re-encode or re-copy it",
        )
    return out


def _decode(
    av: Any, path: Path, from_timestamp: float, num_frames: int, fps: int | float, *, seek_to: float
) -> tuple[np.ndarray | None, np.ndarray, int | None]:
    """(frames or None if none decoded, which of the num_frames were found, the slot of the first frame decoded after
    the seek to `seek_to` seconds, None if none): decode_episode's read."""
    out: np.ndarray | None = None
    filled = np.zeros(num_frames, dtype=bool)
    first: int | None = None
    with av.open(str(path)) as container:
        if not container.streams.video:  # a file cut short in its header, or one holding audio only (audit63 V M1)
            raise _NoVideoStream("it holds no video stream")
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        if seek_to > 0:
            # int() floors the pts: with backward=True the seek lands on a keyframe at or before the first frame even
            # when from_timestamp (frames / fps, a float) lies a hair below it; frames before it are skipped below
            container.seek(int(seek_to / stream.time_base), stream=stream, backward=True, any_frame=False)
        for frame in container.decode(stream):
            if frame.time is None:
                continue
            k = int(round((frame.time - from_timestamp) * fps))
            if first is None:
                first = k
            if k < 0:
                continue
            if k >= num_frames:
                break
            rgb = frame.to_ndarray(format="rgb24")
            if out is None:
                out = np.empty((num_frames, *rgb.shape), dtype=np.uint8)
            out[k] = rgb
            filled[k] = True
    return out, filled, first


class _NoVideoStream(Exception):
    """_decode's file opened but has no video stream: decode_episode makes it the DatasetError of an unreadable
    video (FFmpeg opens a 100-byte cut of an mp4, or an audio-only one, without an error)."""


MIN_READ_AHEAD = 8
"""A VideoReader's open file reads on to a wanted frame up to this many frames ahead (or the longest keyframe
interval it has seen, if longer) instead of seeking to it."""
EPISODE_CACHE_BYTES = 256 << 20
"""Most bytes of whole decoded episodes a VideoReader keeps, for files it cannot seek in (the fallback path)."""


def _decode_frames(container: Any, stream: Any) -> Iterator[Any]:
    """The frames `container` decodes from `stream` from where it stands (one place, so tests can count them)."""
    yield from container.decode(stream)


class _SeekMissed(Exception):
    """A seek landed after the wanted frame, or the wanted frames are not where their timestamps say: the caller
    decodes the episode sequentially instead, which finds them or raises decode_episode's error."""


class _OpenVideo:
    """One open mp4 and its decoder, positioned after the last frame it decoded (plus a frame read past it)."""

    def __init__(self, av: Any, path: Path) -> None:
        self.container = av.open(str(path))
        self.stream = self.container.streams.video[0]
        self.stream.thread_type = "AUTO"
        self.frames: Iterator[Any] | None = None  # None until the first seek, and after the file's end
        self.pending: tuple[float, Any] | None = None  # (time, frame) decoded past the last wanted one
        self.last_time: float | None = None  # time of the last frame taken from `frames`
        self.gop = 0.0  # the longest keyframe interval seen, in seconds
        self.back = 0  # frames to seek before a wanted one: mp4 seeks by decode time, which B-frames put earlier
        self._last_key: float | None = None

    def close(self) -> None:
        self.frames = self.pending = None
        self.container.close()

    def seek(self, time: float) -> None:
        """Go to the keyframe at or before `time` (s); the frames decoded next start there."""
        self.container.seek(round(time / self.stream.time_base), stream=self.stream, backward=True, any_frame=False)
        self.frames = _decode_frames(self.container, self.stream)
        self.pending = self.last_time = self._last_key = None

    def next(self) -> tuple[float, Any] | None:
        """(time, frame) of the next frame with a time, or None at the file's end."""
        if self.pending is not None:
            got, self.pending = self.pending, None
            return got
        for frame in self.frames or ():
            time = frame.time
            if time is None:
                continue
            self.last_time = time
            if frame.key_frame:
                if self._last_key is not None:
                    self.gop = max(self.gop, time - self._last_key)
                self._last_key = time
            return time, frame
        self.frames = None
        return None

    def reaches(self, time: float, fps: float) -> bool:
        """Whether reading on reaches the frame at `time` without passing it, within a GOP (else: seek)."""
        if self.pending is not None:
            here = self.pending[0] - 0.5 / fps  # the pending frame itself may be the wanted one
        elif self.frames is not None and self.last_time is not None:
            here = self.last_time + 0.5 / fps  # frames up to the last one taken are spent
        else:
            return False
        return here <= time <= here + max(MIN_READ_AHEAD / fps, self.gop)


class VideoReader:
    """Frames of episodes by slot, decoding what a read asks for: see the module docstring.

    Keeps at most `max_open` files open (least recently used closed first) and, for files whose frames a seek does
    not find where their timestamps say, whole decoded episodes up to `cache_bytes` (at most `cache_episodes`).
    Thread-safe (one read at a time); in a forked child the parent's open files are dropped, not shared.
    """

    def __init__(self, *, max_open: int = 4, cache_episodes: int = 4, cache_bytes: int = EPISODE_CACHE_BYTES) -> None:
        self._max_open, self._cache_episodes, self._cache_bytes = max(1, max_open), max(1, cache_episodes), cache_bytes
        self._lock = threading.Lock()
        self._reset()
        _READERS.add(self)

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._open: OrderedDict[Path, _OpenVideo] = OrderedDict()
        self._episodes: OrderedDict[tuple[Path, float, int], np.ndarray] = OrderedDict()
        self._checked: set[tuple[Path, float, int]] = set()  # episodes with a packet for every frame
        self._no_seek: set[Path] = set()

    def __getstate__(self) -> dict:
        return {"_max_open": self._max_open, "_cache_episodes": self._cache_episodes, "_cache_bytes": self._cache_bytes}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._reset()
        _READERS.add(self)

    def _before_fork(self) -> None:
        """Held across a fork (os.register_at_fork, below): waits for a read in another thread, then closes the
        open files here, in the parent. A child that inherited an open decoder hung for ever freeing it
        (avcodec_free_context waits on the parent's decoding threads, which the child lacks), and one forked while
        another thread held the lock waited on it for ever (review63 V H1: a torch DataLoader with workers)."""
        self._lock.acquire()
        self._close_open()

    def _after_fork_in_parent(self) -> None:
        self._lock.release()

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()  # the parent's is held by the forking thread's hook
        self._pid = os.getpid()

    def close(self) -> None:
        with self._lock:
            self._close_open()

    def _close_open(self) -> None:
        """Close the open files (the caller holds the lock)."""
        for video in self._open.values():
            video.close()
        self._open.clear()

    def frames(
        self,
        path: Path,
        slots: np.ndarray,
        *,
        from_timestamp: float,
        num_frames: int,
        fps: int | float,
        episode: int | None = None,
        to_timestamp: float | None = None,
    ) -> np.ndarray:
        """uint8 (len(slots), H, W, 3): the episode's frames at `slots` (sorted, unique, in [0, num_frames)), the
        same pixels `decode_episode` gives them. Raises what decode_episode raises for the episode (a missing,
        unreadable or short video, a segment shorter than the episode), which the first read of an episode
        checks (a packet for each of its frames), whichever frames it asks for."""
        import av

        path = Path(path)
        slots = np.asarray(slots, dtype=np.int64)
        whole = (path, float(from_timestamp), int(num_frames))
        if self._pid != os.getpid():  # forked without the hooks (a C-level fork): leave the parent's decoders be
            _ABANDONED.append(self._open)  # freeing one here hangs (see _before_fork); kept from the collector
            self._lock = threading.Lock()
            self._reset()
        with self._lock:
            if whole in self._episodes:
                self._episodes.move_to_end(whole)
                return self._episodes[whole][slots]
            if path not in self._no_seek and path.is_file():
                try:
                    if whole not in self._checked:
                        if segment_frames(from_timestamp, to_timestamp, num_frames, fps) < num_frames:
                            raise _SeekMissed
                        self._check_packets(av, path, from_timestamp, num_frames, fps)
                        self._checked.add(whole)
                    return self._read(av, path, slots, from_timestamp, fps)
                except _SeekMissed:
                    pass
                except (av.error.FFmpegError, IndexError):  # decode_episode says what is wrong with the file
                    self._drop(path)
            frames = decode_episode(
                path,
                from_timestamp=from_timestamp,
                num_frames=num_frames,
                fps=fps,
                episode=episode,
                to_timestamp=to_timestamp,
            )
            self._no_seek.add(path)  # it found what the seek did not: read this file sequentially from now on
            if frames.nbytes <= self._cache_bytes:
                self._episodes[whole] = frames
                while len(self._episodes) > self._cache_episodes or (
                    sum(f.nbytes for f in self._episodes.values()) > self._cache_bytes
                ):
                    self._episodes.popitem(last=False)
            return frames[slots]

    def _video(self, av: Any, path: Path) -> _OpenVideo:
        video = self._open.get(path)
        if video is None:
            video = self._open[path] = _OpenVideo(av, path)
            while len(self._open) > self._max_open:
                self._open.popitem(last=False)[1].close()
        self._open.move_to_end(path)
        return video

    def _drop(self, path: Path) -> None:
        video = self._open.pop(path, None)
        if video is not None:
            try:
                video.close()
            except Exception:  # noqa: BLE001 - a broken file closes as it can; decode_episode reports it
                pass

    def _check_packets(self, av: Any, path: Path, from_timestamp: float, num_frames: int, fps: int | float) -> None:
        """_SeekMissed unless every slot of the episode has a packet of `path` (packets only: nothing is decoded),
        so a video shorter than its episode, or one missing a frame, is refused on any read of the episode, as
        decode_episode refuses it. Seeks a second before the episode: mp4 seeks by decode time, and a keyframe
        presented after the episode's first frame may be decoded before it (B-frames)."""
        seen = np.zeros(num_frames, dtype=bool)
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            if from_timestamp > 1:
                container.seek(int((from_timestamp - 1) / stream.time_base), stream=stream, backward=True)
            tb, rate = float(stream.time_base), float(fps)
            for packet in container.demux(stream):
                pts, dts = packet.pts, packet.dts
                if pts is None:
                    continue
                k = int(round((pts * tb - from_timestamp) * rate))
                if 0 <= k < num_frames:
                    seen[k] = True
                when = pts if dts is None else dts  # pts >= dts: no later packet presents before this one
                if round((when * tb - from_timestamp) * rate) >= num_frames:
                    break
        if not seen.all():
            raise _SeekMissed

    def _read(self, av: Any, path: Path, slots: np.ndarray, from_timestamp: float, fps: int | float) -> np.ndarray:
        """The frames at `slots`, reading on or seeking (see _OpenVideo.reaches); _SeekMissed when a seek from the
        episode's start lands after the wanted frame or a wanted slot has no frame."""
        video, rate = self._video(av, path), float(fps)
        wanted, n = slots.tolist(), len(slots)
        filled = [False] * n
        out: np.ndarray | None = None
        i, missed = 0, False
        while i < n:
            want = from_timestamp + wanted[i] / rate
            fresh = missed or not video.reaches(want, rate)
            if fresh:
                start = max(from_timestamp, want - video.back / rate)
                video.seek(start)
            target, missed = i, False
            while i < n:
                got = video.next()
                if got is None:  # the file's end: only the slot being filled may be complete
                    if i == n - 1 and filled[i]:
                        return out
                    raise _SeekMissed
                k = int(round((got[0] - from_timestamp) * rate))
                if fresh and k > wanted[i]:  # the seek landed after the wanted frame
                    if start <= from_timestamp:
                        raise _SeekMissed  # as far back as decode_episode seeks
                    video.back = max(2 * video.back, video.back + k - wanted[i] + 1)
                    missed = True
                    break
                fresh = False
                while i < n and wanted[i] < k:
                    if not filled[i]:
                        raise _SeekMissed  # no frame at this slot
                    i += 1
                if i == n:
                    video.pending = got  # it may be the next read's first frame
                elif wanted[i] == k:  # a later frame at the same slot replaces it, as in decode_episode
                    rgb = got[1].to_ndarray(format="rgb24")
                    if out is None:
                        out = np.empty((n, *rgb.shape), dtype=np.uint8)
                    out[i], filled[i] = rgb, True
                elif i > target and not video.reaches(from_timestamp + wanted[i] / rate, rate):
                    video.pending = got
                    break  # the next wanted frame is more than a GOP ahead: seek to it
        assert out is not None  # slots is not empty
        return out


_READERS: weakref.WeakSet[VideoReader] = weakref.WeakSet()
"""Every live VideoReader of this process, for the fork hooks below: a fork must find no open decoder and no held lock
in any of them. (Module state, as logging keeps for its locks: a fork hook cannot be told which objects exist.)"""
_ABANDONED: list[Any] = []
"""Open files a child found from its parent when the fork hooks did not run: never freed (see _before_fork)."""


def _each_reader(method: str) -> None:
    for reader in list(_READERS):
        getattr(reader, method)()


os.register_at_fork(
    before=lambda: _each_reader("_before_fork"),
    after_in_parent=lambda: _each_reader("_after_fork_in_parent"),
    after_in_child=lambda: _each_reader("_after_fork_in_child"),
)


SMALLEST_FRAME = {"libsvtav1": 32}
"""Codec -> the smallest width and height VideoEncoder accepts. SVT-AV1 3.0 (PyAV 15.1's) dies of SIGFPE, taking
the Python process with it, on frames 24 px wide or narrower (8, 16, 24 at any height; 25 and up worked, heights
down to 4 too): 32x32 keeps a margin for other builds."""


def check_frame_size(codec: str, width: int, height: int, where: str) -> None:
    """Raise InvalidInputError (exit 4), naming `where`, the size and the codec, for frames smaller than
    SMALLEST_FRAME says `codec` can encode."""
    small = SMALLEST_FRAME.get(codec)
    if small is not None and (width < small or height < small):
        raise InvalidInputError(
            f"{where}: {width}x{height} frames (width x height) are too small for {codec}, which needs "
            f"{small}x{small} or more (SVT-AV1 kills the process with SIGFPE on frames 24 px wide or narrower)",
            field="video_codec",
            hint=f"write these frames with video_codec='libx264' (h264), or make them at least {small}x{small}",
        )


class VideoEncoder:
    """Append episodes' frames to one mp4 at `fps`; `close()` finishes the file.

    `codec` is "libx264" (fast, default), "libsvtav1" (what lerobot writes; frames of at least 32x32, see
    SMALLEST_FRAME: InvalidInputError otherwise) or any PyAV encoder; `crf` trades size for fidelity (0 is
    lossless in luma for x264).
    """

    def __init__(
        self,
        path: Path,
        *,
        fps: int | float,
        width: int,
        height: int,
        codec: str = "libx264",
        crf: int = 18,
        pix_fmt: str = "yuv420p",
    ) -> None:
        import av

        self.path = Path(path)
        check_frame_size(codec, width, height, str(self.path))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._container = av.open(str(self.path), mode="w")
        options = {"crf": str(crf)}
        if codec == "libx264":
            options.update({"preset": "veryfast", "g": "16"})
        rate = frame_rate(fps)
        self._stream = self._container.add_stream(codec, rate=rate, options=options)
        self._stream.width, self._stream.height, self._stream.pix_fmt = width, height, pix_fmt
        self._stream.codec_context.time_base = 1 / rate
        self._time_base = 1 / rate
        self.frames_written = 0

    def write(self, frames: np.ndarray) -> None:
        """Append uint8 (n, H, W, 3) frames; their timestamps continue from the previous call."""
        import av

        for rgb in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb, dtype=np.uint8), format="rgb24")
            frame.pts = self.frames_written
            frame.time_base = self._time_base
            for packet in self._stream.encode(frame):
                self._container.mux(packet)
            self.frames_written += 1

    def close(self) -> None:
        for packet in self._stream.encode():
            self._container.mux(packet)
        self._container.close()
