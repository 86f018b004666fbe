"""audit56 E3: a fractional fps (29.97, the NTSC camera rate lerobot 0.4.4's create() writes as is) is read and
written frame-exactly; 0, negatives, NaN, inf, bools and strings are still refused with the one-line error."""

from __future__ import annotations

import json

import numpy as np
import pytest

from reproduction.data.info import info_from_dict
from reproduction.data.reader import open_dataset
from reproduction.data.writer import EpisodeData, write_dataset
from reproduction.errors import DatasetError, InvalidInputError

LENGTHS = [40, 1, 97]  # episode 2 starts at frame 41 of the shared v3.0 mp4: from_timestamp 41/29.97 is no tick
CAM = "observation.images.front"
FEATURES = {"observation.state": {"dtype": "float32", "shape": [2]}, CAM: {"dtype": "video", "shape": [32, 48, 3]}}


def _greys(start: int, n: int) -> np.ndarray:
    """Frames whose flat grey (40 * (frame % 6)) tells neighbours 40 levels apart, far beyond codec error."""
    levels = (40 * ((start + np.arange(n)) % 6)).astype(np.uint8)
    return np.repeat(levels[:, None, None, None], 32 * 48 * 3).reshape(n, 32, 48, 3)


def _episodes() -> list[EpisodeData]:
    eps, start = [], 0
    for e, n in enumerate(LENGTHS):
        state = np.stack([np.arange(n), np.full(n, e)], axis=1).astype(np.float32)
        eps.append(
            EpisodeData(episode_index=e, task=f"t{e}", frames={"observation.state": state, CAM: _greys(start, n)})
        )
        start += n
    return eps


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_a_29_97_fps_video_dataset_round_trips_frame_for_frame(tmp_path, version):
    root = write_dataset(
        tmp_path / "ds", _episodes(), fps=29.97, features=FEATURES, version=version, image_storage="video"
    )
    info = json.loads((root / "meta" / "info.json").read_text())
    assert info["fps"] == 29.97 and isinstance(info["fps"], float)
    assert '"fps": 29.97,' in (root / "meta" / "info.json").read_text()  # the decimal as given, not 29.969999...
    assert info["features"][CAM]["info"]["video.fps"] == 29.97
    ds = open_dataset(root)
    assert ds.info.fps == 29.97
    total = sum(LENGTHS)
    got = ds.read_frames(np.arange(total), ["observation.state", "timestamp", "frame_index", CAM])
    frame = got["frame_index"]
    assert np.array_equal(got["timestamp"], (frame / 29.97).astype(np.float32))
    grey = got[CAM].reshape(total, -1).mean(axis=1)
    want = 40 * (np.arange(total) % 6)
    assert np.abs(grey - want).max() < 6  # every frame its own (a neighbour is 40 levels off)
    # reversed and scattered reads find the same frames (the episode cache and seeks at 41/29.97 s)
    rows = np.array([137, 41, 40, 0, 100, 39])
    again = ds.read_frames(rows, [CAM])[CAM].reshape(rows.size, -1).mean(axis=1)
    assert np.abs(again - want[rows]).max() < 6


def test_whole_fps_stays_an_int_in_info_json(tmp_path):
    root = write_dataset(tmp_path / "ds", _episodes()[:1], fps=30, features=FEATURES, image_storage="video")
    text = (root / "meta" / "info.json").read_text()
    assert '"fps": 30,' in text and '"video.fps": 30,' in text
    assert open_dataset(root).info.fps == 30 and isinstance(open_dataset(root).info.fps, int)


@pytest.mark.parametrize(("raw", "want"), [(29.97, 29.97), (30, 30), (30.0, 30), (0.5, 0.5), (59.94, 59.94)])
def test_info_json_fps_positive_and_finite_is_read(raw, want):
    info = info_from_dict({"codebase_version": "v3.0", "fps": raw, "features": {"x": {"dtype": "float32"}}})
    assert info.fps == want and type(info.fps) is type(want)


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        (0, "0"),
        (-29.97, "-29.97"),
        (0.0, "0.0"),
        (float("nan"), "NaN"),
        (float("inf"), "Infinity"),
        (True, "true"),
        ("29.97", '"29.97"'),
        (None, "null"),
    ],
)
def test_info_json_fps_not_a_positive_finite_number_is_exit_40(tmp_path, raw, shown):
    path = tmp_path / "info.json"
    with pytest.raises(DatasetError) as err:
        info_from_dict({"codebase_version": "v3.0", "fps": raw, "features": {"x": {"dtype": "float32"}}}, path=path)
    assert str(err.value) == f"{path}: fps is {shown}, not a positive finite number of frames per second"
    assert err.value.exit_code == 40 and err.value.field == "fps"


@pytest.mark.parametrize("fps", [0, -1, float("nan"), float("inf"), True, "30"])
def test_writer_refuses_an_fps_that_is_not_a_positive_finite_number(tmp_path, fps):
    with pytest.raises(InvalidInputError, match=r"^fps is .*, not a positive finite number of frames per second$"):
        write_dataset(tmp_path / "ds", _episodes()[:1], fps=fps, features=FEATURES, image_storage="video")
    assert not (tmp_path / "ds").exists()


def test_writer_writes_a_numpy_fps_as_its_decimal(tmp_path):
    feats = {"observation.state": FEATURES["observation.state"]}
    ep = EpisodeData(episode_index=0, task="t", frames={"observation.state": np.zeros((3, 2), np.float32)})
    root = write_dataset(tmp_path / "ds", [ep], fps=np.float32(29.97), features=feats)
    assert '"fps": 29.97,' in (root / "meta" / "info.json").read_text()
