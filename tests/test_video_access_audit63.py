"""audit63 V H1, M3: how the reader reaches video frames.

H1: a single-row read (value and policy training read one shuffled row at a time) decoded the row's whole episode
and kept 4 whole decoded episodes (GBs at 480x640). Now a read decodes from the keyframe at or before the wanted
frame (or reads on from where the last read stopped), and the pixels are the ones the sequential whole-episode
decode gives, for every codec, GOP and layout (v3.0 episodes back to back in one mp4, v2.1 a file per episode).
M3: in a v3.0 file an episode with more rows than frames in its video segment read the next episode's frames;
its `videos/<key>/to_timestamp` now bounds the segment (DatasetError, exit 40, as for a file's last episode)."""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from reproduction.data import video
from reproduction.data.reader import open_dataset
from reproduction.data.video import VideoEncoder, decode_episode
from reproduction.data.writer import EpisodeData, write_dataset
from reproduction.errors import DatasetError

CAM = "observation.images.front"
H, W = 48, 64


def _frames(n: int, seed: int) -> np.ndarray:
    """Moving gradients with noise: every frame differs, so P/B frames carry real residuals."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:H, 0:W]
    out = np.empty((n, H, W, 3), np.uint8)
    for i in range(n):
        base = np.stack([(xx * 3 + i * 7) % 256, (yy * 5 + i * 3 + seed * 40) % 256, (xx + yy + i * 11) % 256], -1)
        out[i] = np.clip(base + rng.integers(-20, 20, (H, W, 3)), 0, 255)
    return out


def _dataset(root: Path, lengths: list[int], *, codec: str = "libx264", version: str = "v3.0") -> Path:
    eps = [
        EpisodeData(
            episode_index=e,
            task="t",
            frames={"observation.state": np.zeros((n, 2), np.float32), CAM: _frames(n, e)},
        )
        for e, n in enumerate(lengths)
    ]
    feats = {"observation.state": {"dtype": "float32", "shape": [2]}, CAM: {"dtype": "video", "shape": [H, W, 3]}}
    return write_dataset(root, eps, fps=15, features=feats, version=version, image_storage="video", video_codec=codec)


def _sequential(root: Path) -> np.ndarray:
    """Every row's frame by the sequential whole-episode decode (the reader's path before audit63 V H1)."""
    ds = open_dataset(root)
    parts = []
    for ep in ds.episodes.column("episode_index").to_pylist():
        path, start, length = ds.video_location(CAM, ep)
        parts.append(decode_episode(path, from_timestamp=start, num_frames=length, fps=ds.info.fps, episode=ep))
    return np.concatenate(parts)


class _Counted:
    """An av container whose decode() counts the frames it yields (main's and this reader's decodes alike)."""

    decoded = 0

    def __init__(self, container):
        self._c = container

    def __getattr__(self, name):
        return getattr(self._c, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._c.__exit__(*exc)

    def decode(self, *args, **kwargs):
        for frame in self._c.decode(*args, **kwargs):
            _Counted.decoded += 1
            yield frame


@pytest.fixture
def counted(monkeypatch):
    real = av.open
    monkeypatch.setattr(av, "open", lambda *a, **k: _Counted(real(*a, **k)))
    _Counted.decoded = 0
    return _Counted


@pytest.mark.parametrize(
    "codec, version",
    [
        ("libx264", "v3.0"),  # g=16 with B-frames: pts ahead of dts, episodes start mid-GOP in one stream
        ("libx265", "v3.0"),  # x265's defaults: open GOPs (CRA), one keyframe in 250 frames
        ("libsvtav1", "v3.0"),
        ("libx264", "v2.1"),
        ("libx265", "v2.1"),
    ],
)
def test_sparse_and_dense_reads_give_the_sequential_decodes_pixels(tmp_path, codec, version):
    lengths = [37, 52, 9, 44]
    root = _dataset(tmp_path / "ds", lengths, codec=codec, version=version)
    want = _sequential(root)
    n = sum(lengths)
    assert np.array_equal(open_dataset(root).read_frames(np.arange(n), [CAM])[CAM], want)  # dense, one call
    rng = np.random.default_rng(0)
    ds = open_dataset(root)
    order = rng.permutation(n)
    single = np.stack([ds.read_frames([int(r)], [CAM])[CAM][0] for r in order])  # the training pattern
    assert np.array_equal(single, want[order])
    for _ in range(6):  # shuffled micro batches, repeated rows, one file read on and back
        rows = rng.integers(0, n, 7)
        assert np.array_equal(ds.read_frames(rows, [CAM])[CAM], want[rows])
    ds = open_dataset(root)
    for lo in range(0, n, 16):  # stage 3: sorted batches
        assert np.array_equal(ds.read_frames(np.arange(lo, min(lo + 16, n)), [CAM])[CAM], want[lo : lo + 16])


def test_a_single_row_decodes_about_a_gop_not_its_whole_episode(tmp_path, counted):
    root = _dataset(tmp_path / "ds", [300, 40])  # libx264 at g=16
    want = _sequential(root)
    for row in (250, 17, 299, 120, 305):  # each on a dataset opened afresh: nothing decoded before
        ds = open_dataset(root)
        counted.decoded = 0
        got = ds.read_frames([row], [CAM])[CAM]
        assert np.array_equal(got[0], want[row])
        assert counted.decoded <= 2 * 16, (row, counted.decoded)  # was 300 (40) per row: the whole episode
    for row in (17, 299, 305, 120):  # and on one dataset, in shuffled order
        counted.decoded = 0
        assert np.array_equal(ds.read_frames([row], [CAM])[CAM][0], want[row])
        assert counted.decoded <= 2 * 16, (row, counted.decoded)
    counted.decoded = 0
    ds.read_frames(np.arange(120, 300), [CAM])  # a sorted sweep reads on: each frame once, from the last keyframe
    assert counted.decoded <= 180 + 16
    assert not ds._video._episodes  # no decoded episode is kept


def test_a_seek_that_lands_after_the_frame_falls_back_to_the_sequential_decode(tmp_path, monkeypatch):
    root = _dataset(tmp_path / "ds", [40, 40])
    want = _sequential(root)
    calls = []
    real = video.decode_episode
    monkeypatch.setattr(video, "decode_episode", lambda *a, **k: calls.append(k["from_timestamp"]) or real(*a, **k))

    def seek_to_the_end(self, time):
        self.container.seek(10**9, stream=self.stream, backward=True, any_frame=False)
        self.frames, self.pending, self.last_time, self._last_key = (
            video._decode_frames(self.container, self.stream),
            None,
            None,
            None,
        )

    monkeypatch.setattr(video._OpenVideo, "seek", seek_to_the_end)
    ds = open_dataset(root)
    for row in (50, 55, 10):
        assert np.array_equal(ds.read_frames([row], [CAM])[CAM][0], want[row])
    assert calls == [pytest.approx(40 / 15), 0.0]  # each episode decoded once, sequentially, then kept


def _add_rows(root: Path, episode: int, extra: int) -> None:
    """Give `episode` `extra` more rows than frames in its video segment (lerobot's from/to_timestamp untouched):
    the data parquet, the episode table's length and indices, info.json's total_frames."""
    data = next((root / "data").rglob("*.parquet"))
    table = pq.read_table(data)
    ep = table.column("episode_index").to_numpy()
    last = int(np.flatnonzero(ep == episode)[-1])
    rows = table.to_pylist()
    fps = json.loads((root / "meta/info.json").read_text())["fps"]
    for k in range(1, extra + 1):
        row = dict(rows[last])
        row["frame_index"] += k
        row["timestamp"] = row["frame_index"] / fps
        rows.insert(last + k, row)
    for i, row in enumerate(rows):
        row["index"] = i
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), data)
    meta = next((root / "meta/episodes").rglob("*.parquet"))
    et = pq.read_table(meta)
    lengths = [
        int(n) + (extra if e == episode else 0)
        for e, n in zip(et["episode_index"].to_pylist(), et["length"].to_pylist())
    ]
    ends = np.cumsum(lengths)
    for name, values in (("length", lengths), ("dataset_from_index", ends - lengths), ("dataset_to_index", ends)):
        et = et.set_column(
            et.column_names.index(name), name, pa.array(np.asarray(values).tolist(), et.schema.field(name).type)
        )
    pq.write_table(et, meta)
    info = json.loads((root / "meta/info.json").read_text())
    info["total_frames"] = int(ends[-1])
    (root / "meta/info.json").write_text(json.dumps(info, indent=4))


@pytest.mark.parametrize("episode", [0, 1, 2])
def test_rows_past_the_episodes_video_segment_are_exit_40_not_the_next_episodes_frames(tmp_path, episode):
    root = _dataset(tmp_path / "ds", [20, 25, 15])
    _add_rows(root, episode, 2)
    ds = open_dataset(root)
    lengths = ds.episodes.column("length").to_pylist()
    first = sum(lengths[:episode])
    start = sum([20, 25, 15][:episode]) / 15
    mp4 = next((root / "videos").rglob("*.mp4"))
    for rows in (
        np.arange(ds.num_frames),
        [first + lengths[episode] - 1],
        [first],
    ):  # dense, the foreign row, its first
        with pytest.raises(DatasetError) as err:
            open_dataset(root).read_frames(rows, [CAM])
        assert err.value.exit_code == 40
        assert str(err.value).startswith(
            f"{mp4}: episode {episode}: 2 of {lengths[episode]} frames from t={start:.3f}s are not in the video"
        )
        if episode < 2:  # the file's last episode ends with the file
            assert f"(its segment ends at to_timestamp {start + [20, 25, 15][episode] / 15:.3f}s)" in str(err.value)


def test_an_episode_table_without_to_timestamp_reads_as_before(tmp_path):
    root = _dataset(tmp_path / "ds", [20, 25, 15])
    want = _sequential(root)
    meta = next((root / "meta/episodes").rglob("*.parquet"))
    et = pq.read_table(meta)
    pq.write_table(et.drop([c for c in et.column_names if c.endswith("/to_timestamp")]), meta)
    ds = open_dataset(root)
    assert not [c for c in ds.episodes.column_names if c.endswith("to_timestamp")]
    assert np.array_equal(ds.read_frames(np.arange(60), [CAM])[CAM], want)
    assert np.array_equal(open_dataset(root).read_frames([44, 3], [CAM])[CAM], want[[44, 3]])
    # a null to_timestamp (a writer that leaves it out for one episode) reads the same way
    et = et.set_column(
        et.column_names.index(f"videos/{CAM}/to_timestamp"),
        f"videos/{CAM}/to_timestamp",
        pc.if_else(pa.array([True, False, True]), pa.nulls(3, pa.float64()), et.column(f"videos/{CAM}/to_timestamp")),
    )
    pq.write_table(et, meta)
    assert np.array_equal(open_dataset(root).read_frames([21, 59, 0], [CAM])[CAM], want[[21, 59, 0]])


def test_a_video_shorter_than_its_episode_is_exit_40_on_a_single_row_read(tmp_path):
    """v2.1, a file per episode: a single read of an early row of an episode whose file lacks its last frames is
    refused as the whole-episode decode refuses it (the first read of an episode checks a packet per frame)."""
    root = _dataset(tmp_path / "ds", [20, 25], version="v2.1")
    mp4 = sorted((root / "videos").rglob("*.mp4"))[1]
    mp4.unlink()
    enc = VideoEncoder(mp4, fps=15, width=W, height=H)
    enc.write(_frames(23, 1))
    enc.close()
    for rows in ([20], [30], np.arange(45)):
        with pytest.raises(DatasetError) as err:
            open_dataset(root).read_frames(rows, [CAM])
        assert err.value.exit_code == 40
        assert str(err.value) == f"{mp4}: episode 1: 2 of 25 frames from t=0.000s are not in the video"
    assert open_dataset(root).read_frames([5], [CAM])[CAM].shape == (1, H, W, 3)  # episode 0 is whole


def test_keyframes_presented_after_their_decode_time_are_found_without_the_sequential_decode(tmp_path, monkeypatch):
    """lerobot's hevc (g=2): a keyframe's pts is frames after its dts, and mp4 seeks by dts, so a seek to a frame's
    pts can land on the keyframe after it; the reader then seeks further back, not to the whole-episode decode."""
    root = _dataset(tmp_path / "ds", [30, 30], version="v2.1")
    mp4 = sorted((root / "videos").rglob("*.mp4"))[1]
    with av.open(str(mp4), "w") as out:
        stream = out.add_stream("libx265", rate=15, options={"g": "2", "crf": "30", "x265-params": "log-level=none"})
        stream.width, stream.height, stream.pix_fmt = W, H, "yuv420p"
        for rgb in _frames(30, 1):
            for packet in stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    with av.open(str(mp4)) as check:
        packets = [p for p in check.demux(check.streams.video[0]) if p.pts is not None]
        assert any(p.is_keyframe and p.pts > p.dts + 512 for p in packets)  # the case this test is about
    want = _sequential(root)
    monkeypatch.setattr(video, "decode_episode", lambda *a, **k: pytest.fail("fell back to the sequential decode"))
    ds = open_dataset(root)
    order = np.random.default_rng(1).permutation(60)
    assert np.array_equal(np.stack([ds.read_frames([int(r)], [CAM])[CAM][0] for r in order]), want[order])
