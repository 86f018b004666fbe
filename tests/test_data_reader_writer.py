"""LeRobot v2.1/v3.0 write -> read round trips (PNG and video), row addressing, fingerprints, refusals."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest

from reproduction.data.reader import open_dataset
from reproduction.data.writer import EpisodeData, write_dataset
from reproduction.errors import DatasetError, InputNotFoundError, InvalidInputError, UnsupportedFormatError

FEATURES = {
    "observation.state": {"dtype": "float32", "shape": [3]},
    "observation.images.front": {"dtype": "image", "shape": [32, 48, 3]},
    "is_success": {"dtype": "bool", "shape": [1]},
}
SPEC = [(3, 9), (10, 5), (11, 12), (40, 1)]  # non-contiguous ids (allow_id_gaps), one 1-frame episode


def _episodes():
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:32, 0:48]
    for ep, n in SPEC:
        img = np.stack(
            [
                np.stack([(xx * 2 + i * 5 + ep) % 256, (yy * 3 + ep * 9) % 256, np.full_like(xx, (i * 17) % 256)], -1)
                for i in range(n)
            ]
        ).astype(np.uint8)
        yield EpisodeData(
            episode_index=ep,
            task=f"task {ep % 2}",
            frames={
                "observation.state": rng.normal(size=(n, 3)).astype(np.float32),
                "observation.images.front": img,
                "is_success": np.arange(n) == n - 1,
            },
        )


ALL = list(_episodes())
STATE = np.concatenate([e.frames["observation.state"] for e in ALL])
IMAGES = np.concatenate([e.frames["observation.images.front"] for e in ALL])


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
@pytest.mark.parametrize("storage", ["png", "video"])
def test_round_trip(tmp_path, version, storage):
    root = write_dataset(
        tmp_path / "ds",
        _episodes(),
        fps=10,
        features=FEATURES,
        version=version,
        image_storage=storage,
        data_file_mb=0.00001,
        allow_id_gaps=True,
    )  # tiny: one file per episode in v3.0 too
    ds = open_dataset(root)
    assert ds.info.codebase_version == version and ds.info.fps == 10
    assert ds.num_frames == 27 and ds.num_episodes == 4 and ds.tasks == {0: "task 1", 1: "task 0"}
    assert ds.camera_keys == ["observation.images.front"]
    assert (ds.video_keys == ["observation.images.front"]) == (storage == "video")
    table = ds.frame_table()
    assert table.column_names == ["episode_index", "frame_index", "index", "task_index", "timestamp", "is_success"]
    np.testing.assert_array_equal(
        table.column("episode_index").to_numpy(), np.repeat([e for e, _ in SPEC], [n for _, n in SPEC])
    )
    np.testing.assert_array_equal(table.column("index").to_numpy(), np.arange(27))
    assert len(ds.data_files) == 4
    rows = np.array([26, 0, 13, 14, 8, 9, 25, 13])  # unsorted, repeated, across files and episodes
    got = ds.read_frames(rows, ["observation.state", "observation.images.front", "is_success"])
    np.testing.assert_array_equal(got["observation.state"], STATE[rows])
    assert got["is_success"].tolist() == [True, False, True, False, True, False, True, True]
    err = np.abs(got["observation.images.front"].astype(int) - IMAGES[rows])
    if storage == "png":
        assert err.max() == 0
    else:
        assert got["observation.images.front"].dtype == np.uint8 and err.mean() < 6  # lossy codec, frames aligned


def _drifting(tmp_path, name, timestamps):
    """One 40-frame video episode at 10 fps, frame i a flat grey of 6 * i, with the timestamps given."""
    n = len(timestamps)
    img = np.repeat((np.arange(n) * 6).astype(np.uint8)[:, None, None, None], 32 * 48 * 3).reshape(n, 32, 48, 3)
    ep = EpisodeData(episode_index=0, task="t", frames={"observation.images.front": img}, timestamps=timestamps)
    feats = {"observation.images.front": {"dtype": "video", "shape": [32, 48, 3]}}
    return write_dataset(tmp_path / name, [ep], fps=10, features=feats, image_storage="video")


def test_timestamps_that_drift_from_the_frames_are_refused_at_the_first_frame_beyond_tolerance(tmp_path):
    """audit46 data F5: frames are found by timestamp; a recording at 9.8 Hz labelled 10 fps read frames 25-39 of
    a 40-frame episode one frame late with no error, and a longer drift blamed the video. Now any video read
    refuses the dataset, naming the first frame whose timestamp is beyond tolerance."""
    frames = np.arange(40)
    root = _drifting(tmp_path, "drift", frames / 9.8)
    ds = open_dataset(root)
    with pytest.raises(DatasetError) as err:
        ds.read_frames(np.arange(25, 31), ["observation.images.front"])  # in the video, one frame late
    assert str(err.value) == (
        f"{root}: episode 0 frame 20 has timestamp 2.0408s where frame_index/fps is 20/10 = 2.0000s, 0.0408s apart, "
        "beyond the tolerance of 0.0400s (0.4 frame); 20 of 40 rows drift so"
    )
    assert err.value.exit_code == 40 and err.value.field == "timestamp"
    with pytest.raises(DatasetError, match="episode 0 frame 20 has timestamp"):
        ds.read_frames([0], ["observation.images.front"])  # a row before the drift: the dataset is refused
    # a real clock's jitter of 0.3 frame finds every frame
    jitter = (frames + np.random.default_rng(0).uniform(-0.3, 0.3, 40)) / 10
    got = open_dataset(_drifting(tmp_path, "jitter", np.maximum(jitter, 0))).read_frames(
        frames, ["observation.images.front"]
    )
    grey = got["observation.images.front"].reshape(40, -1).mean(axis=1)
    assert np.abs(grey - frames * 6).max() < 2


def test_video_decodes_each_frame_once_in_order(tmp_path, monkeypatch):
    root = write_dataset(
        tmp_path / "ds", _episodes(), fps=10, features=FEATURES, image_storage="video", allow_id_gaps=True
    )
    import reproduction.data.video as video

    seeks, decoded = [], []
    real_seek, real_frames = video._OpenVideo.seek, video._decode_frames
    monkeypatch.setattr(video._OpenVideo, "seek", lambda self, t: seeks.append(t) or real_seek(self, t))
    monkeypatch.setattr(video, "_decode_frames", lambda c, s: (decoded.append(f.pts) or f for f in real_frames(c, s)))
    ds = open_dataset(root, video_cache_episodes=1)
    for start in range(0, 27, 4):  # a sequential sweep in batches, across the episodes of the shared mp4
        ds.read_frames(np.arange(start, min(start + 4, 27)), ["observation.images.front"])
    assert seeks == [0.0] and len(decoded) == 27  # one seek, then each frame decoded once (audit63 V H1)


def test_fingerprint_changes_with_frames_not_with_unrelated_files(tmp_path, monkeypatch):
    monkeypatch.setenv("PORTABLE_CACHE_DIR", str(tmp_path / "cache"))
    root = write_dataset(tmp_path / "ds", _episodes(), fps=10, features=FEATURES, allow_id_gaps=True)
    fp = open_dataset(root).fingerprint
    assert open_dataset(root).fingerprint == fp  # second call from the stat cache
    assert list((tmp_path / "cache" / "fingerprints").glob("*.json"))
    (root / "meta" / "returns.parquet").write_bytes(b"sidecar")  # sidecars in meta/ do not change it
    assert open_dataset(root).fingerprint == fp
    refiltered = write_dataset(
        tmp_path / "re",
        [e for e in _episodes() if e.episode_index != 10],
        fps=10,
        features=FEATURES,
        allow_id_gaps=True,
    )
    assert open_dataset(refiltered).fingerprint != fp
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    assert open_dataset(copy).fingerprint == fp  # content, not location


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_episode_ids_with_a_gap_are_refused(tmp_path, version):
    """audit46 data F2: lerobot 0.4.4 wants ids 0..N-1 (it went to the Hub for a dataset with gaps, and reads
    episodes by position); the writer refuses a gap, naming it, and leaves nothing behind."""
    feats = {"observation.state": {"dtype": "float32", "shape": [3]}}

    def eps(ids):
        return [
            EpisodeData(episode_index=i, task="t", frames={"observation.state": np.zeros((2, 3), np.float32)})
            for i in ids
        ]

    tail = "; episodes are numbered 0..N-1 in the order written (lerobot 0.4.4 cannot load a dataset with gaps)"
    for ids, message in [
        ([0, 2, 3], "episode_index 2 follows 0: id 1 is missing"),
        ([3, 4], "episode_index 3 comes first: ids 0..2 are missing"),
        ([0, 1, 5], "episode_index 5 follows 1: ids 2..4 are missing"),
        ([1, 0], "episode_index 1 comes first: id 0 is missing"),
    ]:
        with pytest.raises(DatasetError) as err:
            write_dataset(tmp_path / "gaps", eps(ids), fps=10, features=feats, version=version)
        assert str(err.value) == message + tail and err.value.exit_code == 40
        assert err.value.hint == "renumber the episodes 0, 1, 2, ... in the order they are written"
        assert not (tmp_path / "gaps").exists() and not list(tmp_path.glob(".gaps.partial-*"))
    root = write_dataset(tmp_path / "ok", eps([0, 1, 2]), fps=10, features=feats, version=version)
    assert open_dataset(root).num_episodes == 3
    gapped = write_dataset(
        tmp_path / "gapped", eps([0, 2]), fps=10, features=feats, version=version, allow_id_gaps=True
    )
    assert open_dataset(gapped).frame_table(["episode_index"]).column(0).to_pylist() == [0, 0, 2, 2]


def test_refusals(tmp_path):
    with pytest.raises(InputNotFoundError, match="no LeRobot info.json"):
        open_dataset(tmp_path)
    root = write_dataset(tmp_path / "ds", _episodes(), fps=10, features=FEATURES, allow_id_gaps=True)
    with pytest.raises(InvalidInputError, match="already exists"):
        write_dataset(root, _episodes(), fps=10, features=FEATURES, allow_id_gaps=True)
    ds = open_dataset(root)
    with pytest.raises(DatasetError, match="row 27 out of range"):
        ds.read_frames([27], ["observation.state"])
    with pytest.raises(DatasetError, match="unknown feature 'action'"):
        ds.read_frames([0], ["action"])
    info = json.loads((root / "meta" / "info.json").read_text())
    info["codebase_version"] = "v2.0"
    (root / "meta" / "info.json").write_text(json.dumps(info))
    with pytest.raises(UnsupportedFormatError, match="codebase_version 'v2.0' is not supported") as err:
        open_dataset(root)
    assert err.value.exit_code == 4
    bad = [
        EpisodeData(
            episode_index=0,
            task="t",
            frames={
                "observation.state": np.zeros((2, 3), np.float32),
                "observation.images.front": np.zeros((3, 32, 48, 3), np.uint8),
                "is_success": np.zeros(2, bool),
            },
        )
    ]
    with pytest.raises(DatasetError, match="has 3 frames, expected 2"):
        write_dataset(tmp_path / "bad", bad, fps=10, features=FEATURES)
    assert not (tmp_path / "bad").exists() and not list(tmp_path.glob(".bad.partial-*"))  # nothing half-written


def test_v30_files_are_what_lerobot_expects(tmp_path):
    root = write_dataset(
        tmp_path / "ds", _episodes(), fps=10, features=FEATURES, image_storage="video", allow_id_gaps=True
    )
    ep = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [e["dataset_from_index"] for e in ep] == [0, 9, 14, 26]
    assert ep[1]["videos/observation.images.front/from_timestamp"] == pytest.approx(0.9)
    tasks = pq.read_table(root / "meta/tasks.parquet")
    assert b"pandas" in tasks.schema.metadata and tasks.column("task_index").to_pylist() == [0, 1]
    info = json.loads((root / "meta/info.json").read_text())
    assert info["features"]["observation.images.front"]["dtype"] == "video" and info["total_frames"] == 27
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"


AV1_SCRIPT = """
import sys
import numpy as np
from reproduction.data.reader import open_dataset
from reproduction.data.writer import EpisodeData, write_dataset
from reproduction.errors import PortableError

root, h, w = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
frames = {"observation.images.front": np.full((3, h, w, 3), 90, np.uint8)}
feats = {"observation.images.front": {"dtype": "video", "shape": [h, w, 3]}}
try:
    write_dataset(root, [EpisodeData(episode_index=0, task="t", frames=frames)], fps=10, features=feats,
                  image_storage="video", video_codec="libsvtav1")
except PortableError as e:
    print(e.exit_code, e, e.hint, sep="\\n")
else:
    got = open_dataset(root).read_frames([0, 1, 2], ["observation.images.front"])["observation.images.front"]
    print("ok", int(got.mean()))
"""


def test_frames_too_small_for_svt_av1_are_refused_before_encoding(tmp_path):
    """audit46 data F6: SVT-AV1 killed the process (SIGFPE, exit 136) on 16x16 frames and left a partial folder;
    the writer refuses such frames first, naming the size and the codec (in a child: without the check the crash
    would take the test process with it)."""
    import subprocess
    import sys

    def run(name, h, w):
        root = tmp_path / name
        proc = subprocess.run(
            [sys.executable, "-c", AV1_SCRIPT, str(root), str(h), str(w)], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
        return root, proc.stdout.splitlines()

    for h, w in [(16, 16), (64, 24), (8, 64)]:
        root, out = run(f"av1_{h}x{w}", h, w)
        assert out == [
            "4",
            f"{root}: observation.images.front: {w}x{h} frames (width x height) are too small for libsvtav1, which "
            "needs 32x32 or more (SVT-AV1 kills the process with SIGFPE on frames 24 px wide or narrower)",
            "write these frames with video_codec='libx264' (h264), or make them at least 32x32",
        ]
        assert not root.exists() and not list(tmp_path.glob(f".{root.name}.partial-*"))
    root, out = run("av1_32x32", 32, 32)
    assert out[0].startswith("ok") and abs(int(out[0].split()[1]) - 90) <= 2


def test_a_killed_writers_partial_folder_is_removed_by_the_next_write(tmp_path):
    """audit46 data F6: a writer killed mid-write (SIGKILL, a codec's SIGFPE) never runs its cleanup; the next
    write next to it removes its `.<name>.partial-<pid>` folder, and leaves a live writer's alone."""
    import os
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a pid whose process is gone
    dead = tmp_path / f".ds.partial-{child.pid}"
    live = tmp_path / f".ds.partial-{os.getppid()}"
    other = tmp_path / f".other.partial-{child.pid}"  # another dataset's: its own next write removes it
    for folder in (dead, live, other):
        (folder / "data").mkdir(parents=True)
    eps = [EpisodeData(episode_index=0, task="t", frames={"observation.state": np.zeros((2, 3), np.float32)})]
    write_dataset(tmp_path / "ds", eps, fps=10, features={"observation.state": {"dtype": "float32", "shape": [3]}})
    assert not dead.exists() and live.is_dir() and other.is_dir()
