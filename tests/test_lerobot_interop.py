"""Interoperability with lerobot 0.4.4: it loads datasets we write, and we read datasets it writes.

lerobot runs in a helper virtual environment of its own (lerobot is never a runtime dependency):
a plain venv made by the running interpreter, holding only lerobot and the runtime packages it
actually imports, installed with `--no-deps` at the pins below from the package index (its declared
ranges, torch<2.11 and huggingface_hub<0.36, exclude this stack). Every script run in it starts by
adding the running interpreter's site directories *after* the helper's own (`site.addsitedir`, from
$PORTABLE_PARENT_SITE), so it sees this environment's torch, numpy, pyarrow, huggingface_hub and av
whether the tests run on a system Python or inside a venv, while the pins win. The helper is marked
complete only after lerobot imports in it, and is checked again on every use (rebuilt if that fails).
It does not depend on which environment made it, so fresh CI venvs reuse it: it lives under
$PORTABLE_CACHE_DIR (default ~/.cache/recap-portable)/lerobot-venv-<hash of pins and base Python>.
PyPI's torchvision next to the CPU torch fails at import (`operator torchvision::nms does not
exist`); the drivers define those two operator schemas before lerobot imports torchvision.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from reproduction.data.reader import open_dataset
from reproduction.data.writer import EpisodeData, write_dataset

pytestmark = pytest.mark.slow

PINS = [
    "lerobot==0.4.4",
    "accelerate==1.15.0",
    "datasets==4.8.5",
    "deepdiff==9.1.0",
    "dill==0.4.1",
    "draccus==0.10.0",
    "einops==0.8.2",
    "jsonlines==4.0.0",
    "mergedeep==1.3.4",
    "multiprocess==0.70.19",
    "orderly-set==5.5.0",
    "pandas==3.1.1",
    "psutil==7.2.2",
    "pytz==2026.6",
    "pyyaml-include==2.2",
    "termcolor==3.3.0",
    "toml==0.10.2",
    "torchvision==0.29.1",
    "tzdata==2026.6",
    "xxhash==4.1.0",
    "typing-inspect",
    "mypy-extensions",
    "imageio",
    "python-dateutil",
    "fsspec",
    "requests",
]

SHIM = """
import os, site
for _d in os.environ.get("PORTABLE_PARENT_SITE", "").split(os.pathsep):
    if _d:
        site.addsitedir(_d)  # after the helper's own site-packages: its pins win
import torch
_lib = torch.library.Library("torchvision", "DEF")
_lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
"""

READ_DRIVER = (
    SHIM
    + """
import sys, numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset
ds = LeRobotDataset("local/ours", root=sys.argv[1])
items = [ds[i] for i in range(len(ds))]
np.savez(sys.argv[2],
         state=np.stack([it["observation.state"].numpy() for it in items]),
         image=np.stack([(it["observation.images.front"].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
                         for it in items]),
         success=np.array([bool(it["is_success"]) for it in items]),
         episode_index=np.array([int(it["episode_index"]) for it in items]),
         frame_index=np.array([int(it["frame_index"]) for it in items]),
         index=np.array([int(it["index"]) for it in items]),
         task=np.array([it["task"] for it in items]))
"""
)

WRITE_DRIVER = (
    SHIM
    + """
import json, sys, numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset
src = np.load(sys.argv[2])
fps = json.loads(sys.argv[3]) if len(sys.argv) > 3 else 10
features = {"observation.state": {"dtype": "float32", "shape": (3,), "names": None},
            "observation.images.front": {"dtype": "image", "shape": (32, 48, 3),
                                         "names": ["height", "width", "channel"]},
            "is_success": {"dtype": "bool", "shape": (1,), "names": None}}
ds = LeRobotDataset.create("local/theirs", fps=fps, root=sys.argv[1], features=features, use_videos=False)
starts = np.flatnonzero(np.r_[True, src["episode"][1:] != src["episode"][:-1]])
for s, e in zip(starts, list(starts[1:]) + [len(src["episode"])]):
    for i in range(s, e):
        ds.add_frame({"observation.state": src["state"][i], "observation.images.front": src["image"][i],
                      "is_success": src["success"][i:i + 1], "task": str(src["task"][i])})
    ds.save_episode()
ds.finalize()
"""
)


CHECK = SHIM + "import torch, pyarrow, numpy\nimport lerobot.datasets.lerobot_dataset\n"


def _site_dirs() -> list[str]:
    """The running interpreter's site directories (where its packages live), in sys.path order."""
    import site

    dirs = [p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))]
    dirs += [p for p in site.getsitepackages() if p not in dirs]
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if user and user not in dirs:
        dirs.append(user)
    return [d for d in dirs if os.path.isdir(d)]


def _cache_root() -> Path:
    return Path(os.environ.get("PORTABLE_CACHE_DIR") or Path.home() / ".cache" / "recap-portable")


def _helper_env() -> dict[str, str]:
    """The environment every helper run gets: offline, one thread, this interpreter's site dirs."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            "PYTHONNOUSERSITE": "1",
            "PORTABLE_PARENT_SITE": os.pathsep.join(_site_dirs()),
        }
    )
    return env


def _helper_works(python: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-c", CHECK], capture_output=True, text=True, timeout=300, env=_helper_env())


def _venv() -> Path:
    """The helper's interpreter: built (under a lock) unless a complete one passes the check import."""
    import fcntl
    import shutil

    base = os.path.realpath(sys.base_prefix)
    key = hashlib.sha256("\n".join([*PINS, sys.version, base]).encode()).hexdigest()[:12]
    root = _cache_root()
    root.mkdir(parents=True, exist_ok=True)
    venv = root / f"lerobot-venv-{key}"
    python = venv / "bin" / "python"
    with open(root / f"lerobot-venv-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / ".complete").is_file() and _helper_works(python).returncode == 0:
            return python
        shutil.rmtree(venv, ignore_errors=True)  # partial, or complete once but broken now: rebuild
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        proc = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", *PINS],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if proc.returncode != 0:
            pytest.fail(
                "building the lerobot helper venv failed: pip could not install the pins from the package "
                f"index (this test needs it; see the README):\n{proc.stderr[-2000:]}"
            )
        check = _helper_works(python)
        if check.returncode != 0:
            pytest.fail(f"the lerobot helper venv at {venv} does not import lerobot:\n{check.stderr[-3000:]}")
        (venv / ".complete").write_text("\n".join(PINS) + "\n")
        return python


def _run(python: Path, script: str, *args: str, home: Path) -> None:
    """Run a driver in the helper; lerobot's and datasets' caches go to `home` (a test temp folder)."""
    env = {**_helper_env(), "HF_HOME": str(home), "HF_DATASETS_CACHE": str(home / "datasets")}
    proc = subprocess.run(
        [str(python), "-c", textwrap.dedent(script), *args], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def _source(seed: int = 0):
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:32, 0:48]
    specs = [(0, 6, "pick the cube"), (1, 4, "push the cube"), (2, 5, "pick the cube")]
    eps = []
    for ep, n, task in specs:
        img = np.stack(
            [
                np.stack([(xx * 3 + i * 11 + ep) % 256, (yy * 5 + ep * 40) % 256, rng.integers(0, 256, (32, 48))], -1)
                for i in range(n)
            ]
        ).astype(np.uint8)
        eps.append(
            EpisodeData(
                episode_index=ep,
                task=task,
                frames={
                    "observation.state": rng.normal(size=(n, 3)).astype(np.float32),
                    "observation.images.front": img,
                    "is_success": np.arange(n) == n - 1,
                },
            )
        )
    return eps


FEATURES = {
    "observation.state": {"dtype": "float32", "shape": [3]},
    "observation.images.front": {"dtype": "image", "shape": [32, 48, 3]},
    "is_success": {"dtype": "bool", "shape": [1]},
}


def test_lerobot_loads_our_v30_dataset_frame_for_frame(tmp_path):
    python = _venv()
    eps = _source()
    root = write_dataset(tmp_path / "ours", eps, fps=10, features=FEATURES)
    _run(python, READ_DRIVER, str(root), str(tmp_path / "seen.npz"), home=tmp_path / "hf")
    seen = np.load(tmp_path / "seen.npz")
    np.testing.assert_array_equal(seen["state"], np.concatenate([e.frames["observation.state"] for e in eps]))
    np.testing.assert_array_equal(seen["image"], np.concatenate([e.frames["observation.images.front"] for e in eps]))
    np.testing.assert_array_equal(seen["success"], np.concatenate([e.frames["is_success"] for e in eps]))
    np.testing.assert_array_equal(seen["episode_index"], np.repeat([0, 1, 2], [6, 4, 5]))
    np.testing.assert_array_equal(seen["index"], np.arange(15))
    assert list(seen["task"]) == ["pick the cube"] * 6 + ["push the cube"] * 4 + ["pick the cube"] * 5


def test_we_read_a_dataset_lerobot_wrote_frame_for_frame(tmp_path):
    python = _venv()
    eps = _source(1)
    src = {
        "state": np.concatenate([e.frames["observation.state"] for e in eps]),
        "image": np.concatenate([e.frames["observation.images.front"] for e in eps]),
        "success": np.concatenate([e.frames["is_success"] for e in eps]),
        "episode": np.repeat([e.episode_index for e in eps], [e.length for e in eps]),
        "task": np.repeat([e.task for e in eps], [e.length for e in eps]),
    }
    np.savez(tmp_path / "src.npz", **src)
    _run(python, WRITE_DRIVER, str(tmp_path / "theirs"), str(tmp_path / "src.npz"), home=tmp_path / "hf")
    ds = open_dataset(tmp_path / "theirs")
    assert ds.info.codebase_version == "v3.0" and ds.num_frames == 15 and ds.num_episodes == 3
    rows = np.arange(ds.num_frames)[::-1]  # any order
    got = ds.read_frames(rows, ["observation.state", "observation.images.front", "is_success"])
    np.testing.assert_array_equal(got["observation.state"], src["state"][rows])
    np.testing.assert_array_equal(got["observation.images.front"], src["image"][rows])
    np.testing.assert_array_equal(got["is_success"].reshape(-1), src["success"][rows])
    table = ds.frame_table()
    np.testing.assert_array_equal(table.column("episode_index").to_numpy(), src["episode"])
    assert [ds.tasks[i] for i in table.column("task_index").to_pylist()] == list(src["task"])
    assert len(ds.fingerprint) == 64


def test_we_read_a_29_97_fps_dataset_lerobot_wrote_frame_for_frame(tmp_path):
    # audit56 E3: lerobot's create() takes and writes fps 29.97 (an NTSC camera's rate); we refused it (exit 40).
    # PNG images: lerobot 0.4.4 cannot encode a video at 29.97 (PyAV 15's add_stream refuses a float rate).
    python = _venv()
    eps = _source(4)
    src = {
        "state": np.concatenate([e.frames["observation.state"] for e in eps]),
        "image": np.concatenate([e.frames["observation.images.front"] for e in eps]),
        "success": np.concatenate([e.frames["is_success"] for e in eps]),
        "episode": np.repeat([e.episode_index for e in eps], [e.length for e in eps]),
        "task": np.repeat([e.task for e in eps], [e.length for e in eps]),
    }
    np.savez(tmp_path / "src.npz", **src)
    _run(python, WRITE_DRIVER, str(tmp_path / "theirs"), str(tmp_path / "src.npz"), "29.97", home=tmp_path / "hf")
    ds = open_dataset(tmp_path / "theirs")
    assert ds.info.fps == 29.97 and ds.num_frames == 15 and ds.num_episodes == 3
    rows = np.arange(ds.num_frames)[::-1]
    got = ds.read_frames(rows, ["observation.state", "observation.images.front", "frame_index", "timestamp"])
    np.testing.assert_array_equal(got["observation.state"], src["state"][rows])
    np.testing.assert_array_equal(got["observation.images.front"], src["image"][rows])
    frame = np.concatenate([np.arange(e.length) for e in eps])[rows]
    np.testing.assert_array_equal(got["frame_index"], frame)
    np.testing.assert_array_equal(got["timestamp"], (frame / 29.97).astype(np.float32))  # lerobot's frame_index/fps


STATE_2D_READ_DRIVER = (
    SHIM
    + """
import sys, numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset
ds = LeRobotDataset("local/ours", root=sys.argv[1])
np.save(sys.argv[2], np.stack([ds[i]["observation.state"].numpy() for i in range(len(ds))]))
"""
)

STATE_2D_WRITE_DRIVER = (
    SHIM
    + """
import sys, numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset
state = np.load(sys.argv[2])
features = {"observation.state": {"dtype": "float32", "shape": (2, 3), "names": None},
            "is_success": {"dtype": "bool", "shape": (1,), "names": None}}
ds = LeRobotDataset.create("local/theirs", fps=10, root=sys.argv[1], features=features, use_videos=False)
for s, e in [(0, 4), (4, 7)]:
    for i in range(s, e):
        ds.add_frame({"observation.state": state[i], "is_success": np.array([i == e - 1]), "task": "stack"})
    ds.save_episode()
ds.finalize()
"""
)

FEATURES_2D = {
    "observation.state": {"dtype": "float32", "shape": [2, 3]},
    "is_success": {"dtype": "bool", "shape": [1]},
}


def test_lerobot_loads_our_2d_feature_with_the_same_values(tmp_path):
    # audit 56 E2: a flat list of 6 values under info.json's shape [2, 3] failed lerobot's cast to Array2D
    python = _venv()
    state = np.random.default_rng(2).normal(size=(7, 2, 3)).astype(np.float32)
    eps = [
        EpisodeData(
            episode_index=i,
            task="stack",
            frames={"observation.state": state[s:e], "is_success": np.arange(e - s) == e - s - 1},
        )
        for i, (s, e) in enumerate([(0, 4), (4, 7)])
    ]
    root = write_dataset(tmp_path / "ours", eps, fps=10, features=FEATURES_2D)
    _run(python, STATE_2D_READ_DRIVER, str(root), str(tmp_path / "seen.npy"), home=tmp_path / "hf")
    seen = np.load(tmp_path / "seen.npy")
    assert seen.shape == (7, 2, 3)
    np.testing.assert_array_equal(seen, state)


def test_we_read_lerobots_2d_feature_frame_for_frame(tmp_path):
    # audit 56 E1: lerobot stores shape [2, 3] as list<list<float>>, which the value stage failed to reshape
    from reproduction.recap.value.data import read_state

    python = _venv()
    state = np.random.default_rng(3).normal(size=(7, 2, 3)).astype(np.float32)
    np.save(tmp_path / "src.npy", state)
    _run(python, STATE_2D_WRITE_DRIVER, str(tmp_path / "theirs"), str(tmp_path / "src.npy"), home=tmp_path / "hf")
    ds = open_dataset(tmp_path / "theirs")
    rows = np.arange(7)[::-1]
    np.testing.assert_array_equal(ds.read_frames(rows, ["observation.state"])["observation.state"], state[rows])
    np.testing.assert_array_equal(read_state(ds, ["observation.state"], None), state.reshape(7, 6))
