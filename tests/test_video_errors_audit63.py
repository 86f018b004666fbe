"""audit63 V M1, L1: damaged video inputs of a LeRobot dataset are data errors (DatasetError, exit 40, one line naming
the file, the episode or column, and what to do), where they ended in `error: internal error` (exit 1): an mp4 cut
to its first 100 bytes or holding no video stream (IndexError in video.py's `_decode`), an episode table without
the `videos/<key>/...` columns of a video key info.json lists (KeyError) or with a null one (TypeError), and a
video whose frames are not the size info.json declares (read without a word, then a ValueError mixing sizes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reproduction.data.reader import open_dataset
from reproduction.data.video import VideoEncoder
from reproduction.data.writer import EpisodeData, write_dataset
from reproduction.errors import DatasetError

REPO = Path(__file__).resolve().parent.parent
CAM = "observation.images.front"
H, W = 32, 48
LENGTHS = [5, 7]
EPISODES_HINT = "the episode table is damaged or from another dataset: copy or export the dataset's meta/ again"


def _dataset(root: Path, version: str = "v3.0") -> Path:
    feats = {
        "observation.state": {"dtype": "float32", "shape": [11]},
        "observation.goal": {"dtype": "float32", "shape": [3]},
        "action": {"dtype": "float32", "shape": [4]},
        "is_success": {"dtype": "bool", "shape": [1]},
        CAM: {"dtype": "video", "shape": [H, W, 3]},
    }
    eps = [
        EpisodeData(
            episode_index=e,
            task="push",
            frames={
                "observation.state": np.zeros((n, 11), np.float32),
                "observation.goal": np.zeros((n, 3), np.float32),
                "action": np.zeros((n, 4), np.float32),
                "is_success": np.full(n, e == 0),
                CAM: np.full((n, H, W, 3), 40 * e, np.uint8),
            },
        )
        for e, n in enumerate(LENGTHS)
    ]
    return write_dataset(root, eps, fps=10, features=feats, version=version, image_storage="video")


def _mp4(root: Path, n: int = 0) -> Path:
    return sorted((root / "videos").rglob("*.mp4"))[n]


def _read_all(root: Path) -> None:
    ds = open_dataset(root)
    ds.read_frames(np.arange(ds.num_frames), [CAM])


def _audio_only(path: Path) -> None:
    import av

    path.unlink()
    with av.open(str(path), "w") as c:
        s = c.add_stream("aac", rate=16000)
        f = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        f.sample_rate = 16000
        for pk in [*s.encode(f), *s.encode()]:
            c.mux(pk)


def _cut_faststart(path: Path, frames: int) -> None:
    """`path` written again as lerobot's encoder writes it (moov first, `movflags=faststart`), then cut to its first
    100 bytes (an interrupted copy): FFmpeg opens that without an error and finds no stream."""
    import av

    path.unlink()
    with av.open(str(path), "w", options={"movflags": "faststart"}) as c:
        s = c.add_stream("libx264", rate=10)
        s.width, s.height, s.pix_fmt = W, H, "yuv420p"
        for i in range(frames):
            c.mux(s.encode(av.VideoFrame.from_ndarray(np.zeros((H, W, 3), np.uint8), format="rgb24")))
        c.mux(s.encode())
    assert path.read_bytes()[36:40] == b"moov"
    path.write_bytes(path.read_bytes()[:100])


def _episode_table(root: Path) -> Path:
    (table,) = sorted((root / "meta" / "episodes").glob("*/*.parquet"))
    return table


def _set_column(path: Path, column: str, values: list, type_: pa.DataType) -> None:
    t = pq.read_table(path)
    pq.write_table(t.set_column(t.column_names.index(column), column, pa.array(values, type_)), path)


# -- M1: an mp4 FFmpeg opens but that holds no video stream ----------------------------------------


@pytest.mark.parametrize("damage", ["cut_to_100_bytes", "audio_only"])
@pytest.mark.parametrize("version", ["v2.1", "v3.0"])
def test_an_mp4_without_a_video_stream_is_a_dataset_error_naming_file_and_episode(tmp_path, damage, version):
    root = _dataset(tmp_path / "ds", version)
    mp4 = _mp4(root)  # v2.1: episode 0's own file; v3.0: the one file of both episodes
    if damage == "audio_only":
        _audio_only(mp4)
    else:
        _cut_faststart(mp4, LENGTHS[0] if version == "v2.1" else sum(LENGTHS))
    with pytest.raises(DatasetError) as err:
        _read_all(root)
    assert err.value.exit_code == 40
    assert str(err.value) == f"{mp4}: episode 0: not a readable video (it holds no video stream)"
    assert "truncated or corrupt" in err.value.hint and "videos/" in err.value.hint


# -- M1: the episode table's video columns ---------------------------------------------------------


@pytest.mark.parametrize("name", ["chunk_index", "file_index", "from_timestamp"])
def test_an_episode_table_without_a_video_column_is_exit_40_on_open(tmp_path, name):
    root = _dataset(tmp_path / "ds")
    table = _episode_table(root)
    column = f"videos/{CAM}/{name}"
    t = pq.read_table(table)
    pq.write_table(t.drop_columns([column]), table)
    with pytest.raises(DatasetError) as err:
        open_dataset(root)
    assert err.value.exit_code == 40 and err.value.field == column
    assert str(err.value) == (
        f"{table}: no column {column} (info.json lists the video {CAM}: an episode table has its integer "
        "chunk_index and file_index and its from_timestamp in seconds)"
    )
    assert err.value.hint == EPISODES_HINT


def test_an_episode_table_with_all_video_columns_dropped_names_the_first(tmp_path):
    """The audit's case: every `videos/` column gone (a table written without them)."""
    root = _dataset(tmp_path / "ds")
    table = _episode_table(root)
    t = pq.read_table(table)
    pq.write_table(t.drop_columns([c for c in t.column_names if c.startswith("videos/")]), table)
    with pytest.raises(DatasetError) as err:
        open_dataset(root)
    assert err.value.exit_code == 40
    assert str(err.value).startswith(f"{table}: no column videos/{CAM}/chunk_index (info.json lists the video {CAM}")


@pytest.mark.parametrize(
    ("name", "values", "type_", "shown"),
    [
        ("from_timestamp", [0.0, None], pa.float64(), "episode 1 has videos/{cam}/from_timestamp null, not a time"),
        ("from_timestamp", [None, None], pa.null(), "episode 0 has videos/{cam}/from_timestamp null, not a time"),
        ("from_timestamp", [0.0, float("nan")], pa.float64(), "episode 1 has videos/{cam}/from_timestamp nan, not a"),
        ("from_timestamp", [-1.0, 0.5], pa.float64(), "episode 0 has videos/{cam}/from_timestamp -1.0, not a time"),
        ("chunk_index", [None, 0], pa.int64(), "episode 0 has videos/{cam}/chunk_index null, not a whole number"),
        ("file_index", [0, -2], pa.int64(), "episode 1 has videos/{cam}/file_index -2, not a whole number >= 0"),
    ],
)
def test_a_null_or_negative_video_column_is_exit_40_naming_the_episode(tmp_path, name, values, type_, shown):
    root = _dataset(tmp_path / "ds")
    table = _episode_table(root)
    _set_column(table, f"videos/{CAM}/{name}", values, type_)
    with pytest.raises(DatasetError) as err:
        open_dataset(root)
    assert err.value.exit_code == 40 and err.value.field == f"videos/{CAM}/{name}"
    assert str(err.value).startswith(f"{table}: " + shown.format(cam=CAM))
    assert err.value.hint == EPISODES_HINT


def test_a_video_column_of_another_type_is_exit_40(tmp_path):
    root = _dataset(tmp_path / "ds")
    table = _episode_table(root)
    _set_column(table, f"videos/{CAM}/file_index", ["0", "0"], pa.string())
    with pytest.raises(DatasetError) as err:
        open_dataset(root)
    assert err.value.exit_code == 40
    assert str(err.value).startswith(f"{table}: a string column videos/{CAM}/file_index (info.json lists the video")


def test_a_whole_number_from_timestamp_and_an_unlisted_key_are_read(tmp_path):
    """An integer from_timestamp is a time too; columns of a video key info.json does not list are not asked."""
    root = _dataset(tmp_path / "ds")
    table = _episode_table(root)
    t = pq.read_table(table)
    ts = t.column(f"videos/{CAM}/from_timestamp").to_pylist()
    assert ts == [0.0, 0.5]
    _set_column(table, f"videos/{CAM}/from_timestamp", [0, 0], pa.int64())
    t = pq.read_table(table)
    pq.write_table(t.append_column("videos/observation.images.gone/chunk_index", pa.array([None, None])), table)
    ds = open_dataset(root)
    assert ds.read_frames(np.array([0]), [CAM])[CAM].shape == (1, H, W, 3)


# -- L1: a video of another frame size than info.json declares --------------------------------------


def _reencode(path: Path, frames: int, height: int, width: int) -> None:
    path.unlink()
    enc = VideoEncoder(path, fps=10, width=width, height=height)
    enc.write(np.zeros((frames, height, width, 3), np.uint8))
    enc.close()


@pytest.mark.parametrize("version", ["v2.1", "v3.0"])
def test_a_video_of_another_frame_size_is_exit_40_naming_file_key_and_both_sizes(tmp_path, version):
    root = _dataset(tmp_path / "ds", version)
    if version == "v2.1":
        mp4, first = _mp4(root, 1), 1  # episode 1's own file: episode 0 reads fine, then 1 is refused
        _reencode(mp4, LENGTHS[1], 16, 64)
    else:
        mp4, first = _mp4(root), 0
        _reencode(mp4, sum(LENGTHS), 16, 64)
    ds = open_dataset(root)
    if version == "v2.1":
        assert ds.read_frames(np.arange(LENGTHS[0]), [CAM])[CAM].shape == (LENGTHS[0], H, W, 3)
    for rows in (np.arange(ds.num_frames), np.array([ds.num_frames - 1])):  # a batch, and one row alone
        with pytest.raises(DatasetError) as err:
            ds.read_frames(rows, [CAM])
        assert err.value.exit_code == 40 and err.value.field == CAM
        assert str(err.value) == (
            f"{mp4}: episode {first if rows.size > 1 else 1}: {CAM} frames are 16x64 (height x width), where "
            f"meta/info.json declares {H}x{W} for {CAM}"
        )
        assert f"re-encode this file at {H}x{W}" in err.value.hint


@pytest.mark.parametrize(
    ("feature", "size"),
    [
        ({"shape": [96, 128, 3], "names": ["height", "width", "channels"]}, (96, 128)),
        ({"shape": [3, 96, 128], "names": ["channels", "height", "width"]}, (96, 128)),
        ({"shape": [96, 128, 3]}, (96, 128)),
        ({"shape": [3, 96, 128]}, (96, 128)),
        ({"shape": [96, 128], "info": {"video.height": 96, "video.width": 128}}, (96, 128)),
        ({"shape": [96, 128]}, None),
        ({"shape": [5, 6, 7]}, None),
    ],
)
def test_the_declared_frame_size_reads_shape_names_and_video_info(feature, size):
    from reproduction.data.reader import declared_frame_size

    assert declared_frame_size({"dtype": "video", **feature}) == size


# -- through `portable run`: one line, exit 40, no traceback ---------------------------------------


def test_portable_run_on_an_audio_only_mp4_is_exit_40_in_one_line(tmp_path):
    """The audit's reproducer (errors_cli.py) on a small dataset: the value stage reads the camera."""
    root = _dataset(tmp_path / "ds")
    mp4 = _mp4(root)
    _audio_only(mp4)
    train = "{max_steps: 1, global_batch: 2, micro_batch: 2, launcher: inprocess, device: cpu, save_interval: 1}"
    overrides = [
        f"datasets=[{{path: {root}, type: rollout}}]",
        f"value.model={{preset: tiny, cameras: {{base_0_rgb: {CAM}}}, augment: false, eval_max_samples: 2}}",
        f"value.train={train}",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "reproduction.portable", "run", "--output", str(tmp_path / "run")]
        + ["--stages", "returns,value", *overrides],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 40, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith(("error:", "hint:", "Traceback"))]
    assert lines[0] == f"error: {mp4}: episode 0: not a readable video (it holds no video stream)"
    assert lines[1].startswith("hint: the file is truncated or corrupt") and len(lines) == 2
