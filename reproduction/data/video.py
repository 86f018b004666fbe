"""Camera streams in mp4 files: decode one episode's frames sequentially, encode episodes back to back.

Decoding seeks once to the episode's first keyframe and then reads forward (never frame-by-frame
seeks, which re-decode a whole GOP per frame). Frames are placed by their presentation time, so
a file holding many episodes (LeRobot v3.0) and a file per episode (v2.1) read the same way.
"""

from __future__ import annotations

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


def decode_episode(
    path: Path, *, from_timestamp: float, num_frames: int, fps: int | float, episode: int | None = None
) -> np.ndarray:
    """Frames [from_timestamp, from_timestamp + num_frames/fps) of `path` as uint8 (num_frames, H, W, 3).

    Raises InputNotFoundError when the file is missing and DatasetError (exit 40) when FFmpeg cannot read
    it (a truncated or corrupt file: PyAV's FFmpegError, which is no PortableError) or it holds fewer frames
    than the episode needs (a truncated or mismatched video); the message names `episode` when given.
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
    try:
        out, filled = _decode(av, path, from_timestamp, num_frames, fps)
    except (av.error.FFmpegError, _NoVideoStream) as exc:
        why = str(exc) if isinstance(exc, _NoVideoStream) else f"{type(exc).__name__}: {exc.strerror or exc}"
        raise DatasetError(
            f"{path}: {what}not a readable video ({why})",
            path=path,
            hint="the file is truncated or corrupt (an interrupted copy or download?): copy or fetch the dataset's "
            "videos/ again, or restore this file from its source",
        ) from None
    if out is None or not filled.all():
        missing = int((~filled).sum())
        raise DatasetError(
            f"{path}: {what}{missing} of {num_frames} frames from t={from_timestamp:.3f}s are not in the video",
            path=path,
            hint="the video does not match the episode metadata; re-encode or re-copy it",
        )
    return out


def _decode(
    av: Any, path: Path, from_timestamp: float, num_frames: int, fps: int | float
) -> tuple[np.ndarray | None, np.ndarray]:
    """(frames or None if none decoded, which of the num_frames were found): decode_episode's read."""
    out: np.ndarray | None = None
    filled = np.zeros(num_frames, dtype=bool)
    with av.open(str(path)) as container:
        if not container.streams.video:  # a file cut short in its header, or one holding audio only (audit63 V M1)
            raise _NoVideoStream("it holds no video stream")
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        if from_timestamp > 0:
            # int() floors the pts: with backward=True the seek lands on a keyframe at or before the first frame even
            # when from_timestamp (frames / fps, a float) lies a hair below it; frames before it are skipped below
            container.seek(int(from_timestamp / stream.time_base), stream=stream, backward=True, any_frame=False)
        for frame in container.decode(stream):
            if frame.time is None:
                continue
            k = int(round((frame.time - from_timestamp) * fps))
            if k < 0:
                continue
            if k >= num_frames:
                break
            rgb = frame.to_ndarray(format="rgb24")
            if out is None:
                out = np.empty((num_frames, *rgb.shape), dtype=np.uint8)
            out[k] = rgb
            filled[k] = True
    return out, filled


class _NoVideoStream(Exception):
    """_decode's file opened but has no video stream: decode_episode makes it the DatasetError of an unreadable
    video (FFmpeg opens a 100-byte cut of an mp4, or an audio-only one, without an error)."""


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
