"""review63 V: the sparse video reader (audit63 V H1) against a fork, an open GOP and a bad to_timestamp.

H1: a child forked after its parent had read video frames hung for ever: freeing the parent's open decoder in the
child waits on decoding threads the child lacks, and a fork while another thread held the reader's lock left the
child waiting on it (a torch DataLoader with workers). The reader now closes its files, holding its lock, across
every fork (os.register_at_fork), and the child starts with a fresh lock.
M1: an open-GOP v3.0 file whose episode begins on a keyframe's leading frames: decode_episode (seeking to the
episode's start) dropped them and refused the episode (exit 40), while sparse reads served most of its rows. It now
seeks a keyframe further back; every read of the episode gives the file's frames.
L1: a NaN or inf `videos/<key>/to_timestamp` ended in an internal error; it is a DatasetError (exit 40) naming the
episode table, the column and the episode, as a bad from_timestamp is."""

from __future__ import annotations

import os
import signal
import threading
import time
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reproduction.data.reader import open_dataset
from reproduction.data.video import decode_episode, frame_rate
from reproduction.data.writer import EpisodeData, write_dataset
from reproduction.errors import DatasetError

CAM = "observation.images.c0"
H, W, FPS = 48, 64, 30


def _frames(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:H, 0:W]
    out = np.empty((n, H, W, 3), np.uint8)
    for i in range(n):
        base = np.stack([(xx * 3 + i * 7) % 256, (yy * 5 + i * 3 + seed * 40) % 256, (xx + yy + i * 11) % 256], -1)
        out[i] = np.clip(base + rng.integers(-25, 25, (H, W, 3)), 0, 255)
    return out


def _dataset(root: Path, lengths: list[int]) -> tuple[Path, list[np.ndarray]]:
    pix = [_frames(n, 1000 + e) for e, n in enumerate(lengths)]
    eps = [
        EpisodeData(episode_index=e, task="t", frames={"observation.state": np.zeros((n, 2), np.float32), CAM: pix[e]})
        for e, n in enumerate(lengths)
    ]
    feats = {
        "observation.state": {"dtype": "float32", "shape": [2]},
        CAM: {"dtype": "video", "shape": [H, W, 3], "names": ["height", "width", "channels"]},
    }
    write_dataset(root, eps, fps=FPS, features=feats, version="v3.0", image_storage="video")
    return root, pix


def _open_gop(root: Path, pix: list[np.ndarray]) -> Path:
    """The dataset's one mp4 encoded again in one go with x264's open GOPs (keyint 5, 5 B-frames), same timestamps."""
    mp4 = next((root / "videos").rglob("*.mp4"))
    tb = Fraction(1, 90000)
    params = "keyint=5:min-keyint=2:bframes=5:b-pyramid=normal:scenecut=0:open-gop=1"
    with av.open(str(mp4), "w") as out:
        stream = out.add_stream("libx264", rate=frame_rate(FPS), options={"crf": "28", "x264-params": params})
        stream.width, stream.height, stream.pix_fmt = W, H, "yuv420p"
        stream.codec_context.time_base = stream.time_base = tb
        for i, rgb in enumerate(np.concatenate(pix)):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
            frame.pts, frame.time_base = int(round(i / FPS / tb)), tb
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return mp4


def _whole_file(mp4: Path) -> np.ndarray:
    """Every frame of the file, decoded from its first frame with no seek (the truth)."""
    with av.open(str(mp4)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(container.streams.video[0])])


def _wait(pid: int, seconds: float) -> int | None:
    """The child's exit status, or None (it is killed) when it has not exited within `seconds`."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def _child_reads(ds, row: int, want: np.ndarray) -> int:
    """Fork; the child reads `row` and exits 0 when it got `want` (3 otherwise); the parent's exit code for it."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            code = 0 if np.array_equal(ds.read_frames([row], [CAM])[CAM][0], want) else 3
        finally:
            os._exit(code)
    return _wait(pid, 30)


def test_a_child_forked_after_the_parent_read_frames_reads_them_too(tmp_path):
    root, pix = _dataset(tmp_path / "ds", [20, 20])
    ds = open_dataset(root)
    ds.read_frames([25], [CAM])  # the parent now has the file open, its decoder threads running
    rows = ds.read_frames([3, 30], [CAM])[CAM]
    assert _child_reads(ds, 3, rows[0]) == 0  # main's code: the child hung (None: killed after 30 s)
    assert _child_reads(ds, 30, rows[1]) == 0
    assert np.array_equal(ds.read_frames([30], [CAM])[CAM][0], rows[1])  # the parent reads on after the fork


def test_a_fork_while_another_thread_reads_waits_for_the_read_not_for_ever(tmp_path):
    root, _ = _dataset(tmp_path / "ds", [20, 20])
    ds = open_dataset(root)
    want = ds.read_frames([7], [CAM])[CAM][0]
    reader = ds._video
    held = threading.Event()

    def hold() -> None:  # a read in progress: the reader's lock held for a while
        with reader._lock:
            held.set()
            time.sleep(0.5)

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(10)
    try:
        assert _child_reads(ds, 7, want) == 0  # main's code: the child waited on the copied, held lock for ever
    finally:
        thread.join(10)


def test_an_open_gop_episode_reads_the_same_whichever_way(tmp_path):
    root, pix = _dataset(tmp_path / "ds", [7, 65, 75, 50])
    mp4 = _open_gop(root, pix)
    truth = _whole_file(mp4)
    ds = open_dataset(root)
    path, start, n = ds.video_location(CAM, 1)
    assert n == 65 and path == mp4
    got = decode_episode(path, from_timestamp=start, num_frames=n, fps=FPS, episode=1)  # main: exit 40, 3 missing
    assert np.array_equal(got, truth[7 : 7 + 65])
    order = np.random.default_rng(0).permutation(len(truth))
    single = np.stack([open_dataset(root).read_frames([int(r)], [CAM])[CAM][0] for r in order[:40]])
    assert np.array_equal(single, truth[order[:40]])
    assert np.array_equal(open_dataset(root).read_frames(np.arange(len(truth)), [CAM])[CAM], truth)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_a_to_timestamp_that_is_no_time_after_the_start_is_exit_40_naming_it(tmp_path, bad):
    root, _ = _dataset(tmp_path / "ds", [20, 20])
    table_path = next((root / "meta" / "episodes").rglob("*.parquet"))
    table = pq.read_table(table_path)
    col = f"videos/{CAM}/to_timestamp"
    values = table.column(col).to_pylist()
    values[1] = bad
    table = table.set_column(table.column_names.index(col), col, pa.array(values, pa.float64()))
    pq.write_table(table, table_path)
    with pytest.raises(DatasetError) as info:
        open_dataset(root)
    assert info.value.exit_code == 40
    assert f"episode 1 has {col} {bad!r}, not a time in seconds at or after its from_timestamp" in str(info.value)
    assert str(table_path) in str(info.value)
