"""review63 V L2: a Dataset that has read anything did not pickle (`cannot pickle '_thread.RLock' object`: the
fingerprint left pending by iter_file_batches held the digest thread's futures), so a torch DataLoader with spawn or
forkserver workers, or a process pool, could not take one once it had been used. Dataset.__getstate__ now resolves
those digests and drops the cached table (the video reader drops its open files and lock itself); the copy reads the
same rows and has the same fingerprint."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np

from reproduction.data.reader import open_dataset
from reproduction.data.writer import EpisodeData, write_dataset

CAM = "observation.images.c0"
H, W, FPS = 32, 48, 30
REPO = Path(__file__).resolve().parent.parent

CHILD = """
import pickle, sys
import numpy as np
ds = pickle.loads(sys.stdin.buffer.read())
rows = np.load(sys.argv[1] + "/rows.npy")
got = ds.read_frames(rows, [sys.argv[2], "observation.state"])
np.savez(sys.argv[1] + "/child.npz", **{k.replace(".", "_"): v for k, v in got.items()})
print(ds.fingerprint)
"""


def _dataset(root: Path, lengths: list[int]) -> Path:
    rng = np.random.default_rng(0)
    eps = [
        EpisodeData(
            episode_index=e,
            task="t",
            frames={
                "observation.state": rng.standard_normal((n, 2)).astype(np.float32),
                CAM: rng.integers(0, 256, (n, H, W, 3), dtype=np.uint8),
            },
        )
        for e, n in enumerate(lengths)
    ]
    feats = {
        "observation.state": {"dtype": "float32", "shape": [2]},
        CAM: {"dtype": "video", "shape": [H, W, 3], "names": ["height", "width", "channels"]},
    }
    write_dataset(root, eps, fps=FPS, features=feats, version="v3.0", image_storage="video")
    return root


def test_a_dataset_that_has_read_pickles_and_reads_the_same_rows_in_a_fresh_interpreter(tmp_path: Path) -> None:
    ds = open_dataset(_dataset(tmp_path / "ds", [20, 25, 15]))
    rows = np.array([44, 0, 3, 21, 59, 30, 2, 45], dtype=np.int64)
    before = ds.read_frames(rows, [CAM, "observation.state"])  # opens video files, leaves a pending fingerprint
    blob = pickle.dumps(ds)  # was: TypeError: cannot pickle '_thread.RLock' object
    np.save(tmp_path / "rows.npy", rows)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), CAM],
        input=blob,
        capture_output=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr.decode()[-2000:]
    got = np.load(tmp_path / "child.npz")
    np.testing.assert_array_equal(got[CAM.replace(".", "_")], before[CAM])
    np.testing.assert_array_equal(got["observation_state"], before["observation.state"])
    assert child.stdout.decode().strip() == ds.fingerprint  # the digests computed here travelled, unchanged

    # and in this process too: the copy has no open file of the original's and reads on its own
    copy = pickle.loads(blob)
    again = copy.read_frames(rows[::-1], [CAM])
    np.testing.assert_array_equal(again[CAM], before[CAM][::-1])
    assert copy.fingerprint == ds.fingerprint
    # the original still reads after it was pickled
    np.testing.assert_array_equal(ds.read_frames(rows, [CAM])[CAM], before[CAM])


def test_a_dataset_pickles_after_a_full_scan_before_its_fingerprint_was_read(tmp_path: Path) -> None:
    ds = open_dataset(_dataset(tmp_path / "ds", [12, 9]))
    table = ds.frame_table()  # iter_file_batches: the fingerprint is left pending on the digest thread's futures
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.num_frames == table.num_rows == 21
    assert copy.fingerprint == open_dataset(tmp_path / "ds").fingerprint == ds.fingerprint
