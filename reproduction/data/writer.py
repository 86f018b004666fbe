"""Write LeRobot datasets (v3.0 by default, v2.1 on request) from episodes held in numpy arrays.

The on-disk trees are documented in `reproduction.data.info`. The dataset is built in a sibling
`.<root name>.partial-<pid>` folder and renamed into place at the end, so `root` either does not exist
or is complete; a killed writer's folder is removed by the next write next to it. Camera features are
PNG bytes in the parquet (`image_storage="png"`, dtype image) or mp4 files (`image_storage="video"`,
dtype video; episodes back to back per file in v3.0, one file per episode in v2.1).

    write_dataset(root, episodes, fps=10, features={"observation.state": {"dtype": "float32", "shape": [3]},
                  "observation.images.front": {"dtype": "image", "shape": [64, 64, 3]}},
                  tasks=["pick the cube"])
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from reproduction.data.info import (
    DEFAULT_FEATURES,
    STATS_PATH,
    V21_DATA_PATH,
    V21_EPISODES_PATH,
    V21_EPISODES_STATS_PATH,
    V21_TASKS_PATH,
    V21_VIDEO_PATH,
    V30_DATA_PATH,
    V30_EPISODES_PATH,
    V30_TASKS_PATH,
    V30_VIDEO_PATH,
)
from reproduction.data.reader import column_to_numpy
from reproduction.errors import DatasetError, InvalidInputError
from reproduction.fsio import remove_orphaned_staging

ROW_GROUP_ROWS = 65536
PARTIAL_NAME = ".{stem}.partial-{pid}"
"""The sibling folder a dataset is built in before it is renamed into place; a killed writer's (SIGKILL, or a codec
that crashes the process) is removed by the next write_dataset next to it (fsio.remove_orphaned_staging)."""


@dataclass(kw_only=True, slots=True)
class EpisodeData:
    """One episode: per-feature arrays with the same first dimension (the frames)."""

    episode_index: int
    """0, 1, 2, ... in the order written (lerobot 0.4.4 loads no dataset whose ids skip a number; `write_dataset`'s
    `allow_id_gaps` lifts the rule, for tests of readers that must cope with such data)."""
    task: str
    """The episode's task string (its task_index is assigned by the writer)."""
    frames: dict[str, np.ndarray]
    """Feature name -> array (L, *shape); cameras uint8 (L, H, W, 3)."""
    timestamps: np.ndarray | None = None
    """Per-frame seconds; default frame_index / fps."""

    @property
    def length(self) -> int:
        return len(next(iter(self.frames.values())))


@dataclass(kw_only=True, slots=True)
class _Stats:
    """Running mean/std/min/max per numeric feature (what meta/stats.json holds)."""

    acc: dict[str, list] = field(default_factory=dict)

    def add(self, key: str, values: np.ndarray) -> None:
        v = values.reshape(len(values), -1).astype(np.float64)
        s = self.acc.setdefault(
            key,
            [0, np.zeros(v.shape[1]), np.zeros(v.shape[1]), np.full(v.shape[1], np.inf), np.full(v.shape[1], -np.inf)],
        )
        s[0] += len(v)
        s[1] += v.sum(0)
        s[2] += (v * v).sum(0)
        s[3] = np.minimum(s[3], v.min(0))
        s[4] = np.maximum(s[4], v.max(0))

    def to_dict(self) -> dict[str, Any]:
        out = {}
        for key, (n, s, ss, lo, hi) in self.acc.items():
            mean = s / max(n, 1)
            std = np.sqrt(np.maximum(ss / max(n, 1) - mean * mean, 0))
            out[key] = {
                "mean": mean.tolist(),
                "std": std.tolist(),
                "min": lo.tolist(),
                "max": hi.tolist(),
                "count": [n],
            }
        return out


def _arrow_type(dtype: str) -> pa.DataType:
    return {"bool": pa.bool_(), "string": pa.string()}.get(dtype) or pa.from_numpy_dtype(np.dtype(dtype))


def _nested_lists(values: np.ndarray, ft: dict) -> pa.Array:
    """A feature of shape (d1, d2, ...) as list<list<...>>, one level per dimension: lerobot 0.4.4
    stores it so (datasets' Array2D/3D types) and fails to cast one flat list of d1*d2*... values
    ("Unsupported cast from float to list")."""
    out: pa.Array = pa.array(values.reshape(-1), _arrow_type(ft["dtype"]))
    for d in reversed([int(d) for d in ft["shape"]]):
        out = pa.ListArray.from_arrays(pa.array(np.arange(0, len(out) + 1, d, dtype=np.int32)), out)
    return out


def _png(img: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(img, dtype=np.uint8)).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def _check_features(features: dict[str, dict], image_storage: str) -> dict[str, dict]:
    if image_storage not in ("png", "video"):
        raise InvalidInputError(f"image_storage {image_storage!r} is not 'png' or 'video'", field="image_storage")
    out = {}
    for key, ft in features.items():
        if key in DEFAULT_FEATURES:
            continue
        if "/" in key or "dtype" not in ft or "shape" not in ft:
            raise InvalidInputError(f"feature {key!r}: needs dtype and shape, and no '/' in its name", field=key)
        ft = {"dtype": ft["dtype"], "shape": list(ft["shape"]), "names": ft.get("names")}
        if ft["dtype"] in ("image", "video"):
            ft["dtype"] = "image" if image_storage == "png" else "video"
            ft["names"] = ft["names"] or ["height", "width", "channel"]
        out[key] = ft
    return {**out, **{k: dict(v) for k, v in DEFAULT_FEATURES.items()}}


def _episode_table(
    ep: EpisodeData, features: dict[str, dict], *, fps: int | float, task_index: int, start_index: int
) -> pa.Table:
    n = ep.length
    cols: dict[str, pa.Array] = {}
    for key, ft in features.items():
        if key in DEFAULT_FEATURES or ft["dtype"] == "video":
            continue
        if key not in ep.frames:
            raise DatasetError(f"episode {ep.episode_index}: feature {key!r} missing", field=key)
        values = np.asarray(ep.frames[key])
        if len(values) != n:
            raise DatasetError(
                f"episode {ep.episode_index}: feature {key!r} has {len(values)} frames, expected {n}", field=key
            )
        if ft["dtype"] == "image":
            cols[key] = pa.array(
                [{"bytes": _png(img), "path": None} for img in values],
                pa.struct([("bytes", pa.binary()), ("path", pa.string())]),
            )
        elif list(ft["shape"]) == [1]:
            cols[key] = pa.array(values.reshape(n), _arrow_type(ft["dtype"]))
        elif len(ft["shape"]) == 1:
            flat = pa.array(values.reshape(-1), _arrow_type(ft["dtype"]))
            cols[key] = pa.FixedSizeListArray.from_arrays(flat, int(ft["shape"][0]))
        else:
            cols[key] = _nested_lists(values, ft)
    ts = ep.timestamps if ep.timestamps is not None else np.arange(n) / fps
    cols["timestamp"] = pa.array(np.asarray(ts, dtype=np.float32))
    cols["frame_index"] = pa.array(np.arange(n, dtype=np.int64))
    cols["episode_index"] = pa.array(np.full(n, ep.episode_index, dtype=np.int64))
    cols["index"] = pa.array(np.arange(start_index, start_index + n, dtype=np.int64))
    cols["task_index"] = pa.array(np.full(n, task_index, dtype=np.int64))
    return pa.table(cols)


def _check_fps(fps: Any) -> int | float:
    """`fps` as the int or float info.json will hold (numpy scalars become Python ones, a float32 by its shortest
    decimal: np.float32(29.97) -> 29.97); InvalidInputError (exit 4) for a bool, a string, 0, a negative, NaN or inf."""
    if isinstance(fps, (int, np.integer)) and not isinstance(fps, (bool, np.bool_)):
        value: int | float = int(fps)
    elif isinstance(fps, (float, np.floating)):
        value = float(str(fps)) if isinstance(fps, np.floating) else float(fps)
    else:
        value = -1
    if not (math.isfinite(value) and value > 0):
        raise InvalidInputError(
            f"fps is {fps!r}, not a positive finite number of frames per second",
            field="fps",
            hint="pass the recording rate, e.g. fps=30 or fps=29.97",
        )
    return value


def _video_info(ft: dict, fps: int | float, codec: str) -> dict:
    h, w, c = ft["shape"]
    return {
        "video.height": h,
        "video.width": w,
        "video.codec": {"libx264": "h264", "libsvtav1": "av1"}.get(codec, codec),
        "video.pix_fmt": "yuv420p",
        "video.is_depth_map": False,
        "video.fps": fps,
        "video.channels": c,
        "has_audio": False,
    }


class _Common:
    """What both layouts share: task registry, running index, stats, the episode list."""

    def __init__(
        self,
        tmp: Path,
        *,
        fps: int | float,
        features: dict[str, dict],
        tasks: list[str] | None,
        codec: str,
        allow_id_gaps: bool = False,
    ) -> None:
        self.tmp, self.fps, self.features, self.codec = tmp, fps, features, codec
        self.allow_id_gaps = allow_id_gaps
        self.task_ids: dict[str, int] = {t: i for i, t in enumerate(dict.fromkeys(tasks or []))}
        self.stats = _Stats()
        self.index = 0
        self.episodes: list[dict[str, Any]] = []
        self.seen: set[int] = set()
        self.video_keys = [k for k, ft in features.items() if ft["dtype"] == "video"]
        self.extra_info: dict[str, Any] = {}

    def table_for(self, ep: EpisodeData) -> pa.Table:
        if ep.episode_index in self.seen or ep.episode_index < 0:
            raise DatasetError(f"episode_index {ep.episode_index} is negative or written twice", field="episode_index")
        want = len(self.seen)  # ids so far are 0..want-1, so a new id other than want leaves a gap
        if ep.episode_index != want and not self.allow_id_gaps:
            after = "comes first" if not want else f"follows {want - 1}"
            gap = f"id {want} is" if ep.episode_index == want + 1 else f"ids {want}..{ep.episode_index - 1} are"
            raise DatasetError(
                f"episode_index {ep.episode_index} {after}: {gap} missing; episodes are numbered 0..N-1 in the "
                "order written (lerobot 0.4.4 cannot load a dataset with gaps)",
                field="episode_index",
                hint="renumber the episodes 0, 1, 2, ... in the order they are written",
            )
        self.seen.add(ep.episode_index)
        task_index = self.task_ids.setdefault(ep.task, len(self.task_ids))
        table = _episode_table(ep, self.features, fps=self.fps, task_index=task_index, start_index=self.index)
        for key, ft in self.features.items():
            if ft["dtype"] not in ("image", "video", "string"):
                self.stats.add(
                    key,
                    column_to_numpy(table.column(key), ft, name=key).reshape(len(table), -1)
                    if list(ft["shape"]) != [1]
                    else table.column(key).to_numpy(),
                )
        self.index += ep.length
        return table

    def info(self, version: str, data_path: str, video_path: str | None, **extra: Any) -> dict[str, Any]:
        feats = {}
        for key, ft in self.features.items():
            feats[key] = dict(ft)
            if ft["dtype"] == "video":
                feats[key]["info"] = _video_info(ft, self.fps, self.codec)
        doc_keys = {"codebase_version", "robot_type", "total_episodes", "total_frames", "total_tasks", *extra}
        doc_keys |= {"fps", "splits", "data_path", "video_path", "features"}
        return {
            "codebase_version": version,
            "robot_type": extra.pop("robot_type", None),
            "total_episodes": len(self.episodes),
            "total_frames": self.index,
            "total_tasks": len(self.task_ids),
            **extra,
            "fps": self.fps,
            "splits": {"train": f"0:{len(self.episodes)}"},
            "data_path": data_path,
            "video_path": video_path if self.video_keys else None,
            "features": feats,
        } | {k: v for k, v in self.extra_info.items() if k not in doc_keys}

    def write_json(self, rel: str, doc: Any) -> None:
        path = self.tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=4, ensure_ascii=False), encoding="utf-8")


class _V30(_Common):
    def __init__(self, tmp: Path, *, data_file_mb: float, **kw: Any) -> None:
        super().__init__(tmp, **kw)
        self.chunk, self.file, self.limit = 0, 0, data_file_mb * 1e6
        self.writer: pq.ParquetWriter | None = None
        self.buffer: list[pa.Table] = []
        self.file_bytes = 0.0
        self.encoders: dict[str, Any] = {}

    def add(self, ep: EpisodeData) -> None:
        table = self.table_for(ep)
        if self.file_bytes and self.file_bytes + table.nbytes > self.limit:
            self._roll()
        self.file_bytes += table.nbytes
        self.buffer.append(table)
        if sum(t.num_rows for t in self.buffer) >= ROW_GROUP_ROWS:
            self._flush()
        rec = {
            "episode_index": ep.episode_index,
            "tasks": [ep.task],
            "length": ep.length,
            "data/chunk_index": self.chunk,
            "data/file_index": self.file,
            "dataset_from_index": self.index - ep.length,
            "dataset_to_index": self.index,
        }
        for key in self.video_keys:
            enc = self._encoder(key, ep.frames[key])
            rec[f"videos/{key}/chunk_index"], rec[f"videos/{key}/file_index"] = self.chunk, self.file
            rec[f"videos/{key}/from_timestamp"] = enc.frames_written / self.fps
            enc.write(np.asarray(ep.frames[key]))
            rec[f"videos/{key}/to_timestamp"] = enc.frames_written / self.fps
        rec["meta/episodes/chunk_index"], rec["meta/episodes/file_index"] = 0, 0
        self.episodes.append(rec)

    def _encoder(self, key: str, frames: np.ndarray) -> Any:
        from reproduction.data.video import VideoEncoder

        if key not in self.encoders:
            path = self.tmp / V30_VIDEO_PATH.format(video_key=key, chunk_index=self.chunk, file_index=self.file)
            h, w = np.asarray(frames).shape[1:3]
            self.encoders[key] = VideoEncoder(path, fps=self.fps, width=w, height=h, codec=self.codec)
        return self.encoders[key]

    def _flush(self) -> None:
        if not self.buffer:
            return
        table = pa.concat_tables(self.buffer)
        if self.writer is None:
            path = self.tmp / V30_DATA_PATH.format(chunk_index=self.chunk, file_index=self.file)
            path.parent.mkdir(parents=True, exist_ok=True)
            self.writer = pq.ParquetWriter(path, table.schema)
        self.writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
        self.buffer = []

    def _close_file(self) -> None:
        self._flush()
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        for enc in self.encoders.values():
            enc.close()
        self.encoders = {}

    def _roll(self) -> None:
        self._close_file()
        self.file_bytes = 0.0
        self.file += 1
        if self.file >= 1000:
            self.chunk, self.file = self.chunk + 1, 0

    def finish(self, robot_type: str | None) -> None:
        self._close_file()
        ep_table = pa.Table.from_pylist(self.episodes)
        ep_table = ep_table.set_column(
            ep_table.schema.get_field_index("tasks"),
            "tasks",
            pa.array([r["tasks"] for r in self.episodes], pa.list_(pa.string())),
        )
        path = self.tmp / V30_EPISODES_PATH.format(chunk_index=0, file_index=0)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(ep_table, path)
        pq.write_table(_tasks_table(self.task_ids), self.tmp / V30_TASKS_PATH)
        self.write_json(
            "meta/info.json",
            self.info(
                "v3.0",
                V30_DATA_PATH,
                V30_VIDEO_PATH,
                robot_type=robot_type,
                chunks_size=1000,
                data_files_size_in_mb=100,
                video_files_size_in_mb=200,
            ),
        )
        self.write_json(STATS_PATH, self.stats.to_dict())


class _V21(_Common):
    def add(self, ep: EpisodeData) -> None:
        from reproduction.data.video import VideoEncoder

        table = self.table_for(ep)
        chunk = ep.episode_index // 1000
        path = self.tmp / V21_DATA_PATH.format(episode_chunk=chunk, episode_index=ep.episode_index)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
        for key in self.video_keys:
            frames = np.asarray(ep.frames[key])
            enc = VideoEncoder(
                self.tmp / V21_VIDEO_PATH.format(episode_chunk=chunk, video_key=key, episode_index=ep.episode_index),
                fps=self.fps,
                width=frames.shape[2],
                height=frames.shape[1],
                codec=self.codec,
            )
            enc.write(frames)
            enc.close()
        self.episodes.append({"episode_index": ep.episode_index, "tasks": [ep.task], "length": ep.length})

    def finish(self, robot_type: str | None) -> None:
        lines = lambda rows: "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)  # noqa: E731
        (self.tmp / "meta").mkdir(parents=True, exist_ok=True)
        (self.tmp / V21_EPISODES_PATH).write_text(lines(self.episodes), encoding="utf-8")
        (self.tmp / V21_TASKS_PATH).write_text(
            lines({"task_index": i, "task": t} for t, i in self.task_ids.items()), encoding="utf-8"
        )
        (self.tmp / V21_EPISODES_STATS_PATH).write_text(
            lines({"episode_index": r["episode_index"], "stats": {}} for r in self.episodes), encoding="utf-8"
        )
        chunks = len({r["episode_index"] // 1000 for r in self.episodes})
        self.write_json(
            "meta/info.json",
            self.info(
                "v2.1",
                V21_DATA_PATH,
                V21_VIDEO_PATH,
                robot_type=robot_type,
                total_chunks=chunks,
                chunks_size=1000,
                total_videos=len(self.episodes) * len(self.video_keys),
            ),
        )
        self.write_json(STATS_PATH, self.stats.to_dict())


def _tasks_table(task_ids: dict[str, int]) -> pa.Table:
    """meta/tasks.parquet as pandas writes it: task_index column, task strings as the (unnamed) index."""
    items = sorted(task_ids.items(), key=lambda kv: kv[1])
    table = pa.table(
        {
            "task_index": pa.array([i for _, i in items], pa.int64()),
            "__index_level_0__": pa.array([t for t, _ in items], pa.string()),
        }
    )
    pandas_meta = {
        "index_columns": ["__index_level_0__"],
        "column_indexes": [
            {
                "name": None,
                "field_name": None,
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": {"encoding": "UTF-8"},
            }
        ],
        "columns": [
            {
                "name": "task_index",
                "field_name": "task_index",
                "pandas_type": "int64",
                "numpy_type": "int64",
                "metadata": None,
            },
            {
                "name": None,
                "field_name": "__index_level_0__",
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": None,
            },
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }
    return table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})


def write_dataset(
    root: Path | str,
    episodes: Iterable[EpisodeData],
    *,
    fps: int | float,
    features: dict[str, dict],
    version: str = "v3.0",
    image_storage: str = "png",
    tasks: list[str] | None = None,
    robot_type: str | None = None,
    video_codec: str = "libx264",
    data_file_mb: float = 100.0,
    overwrite: bool = False,
    extra_info: dict[str, Any] | None = None,
    allow_id_gaps: bool = False,
) -> Path:
    """Write `episodes` (streamed, one at a time) as a LeRobot dataset at `root`; returns `root`.

    `features` are the non-default features (name -> {"dtype", "shape"}); camera features use dtype
    "image" or "video" and are stored as `image_storage` says. `tasks` fixes task_index order (new
    tasks are appended in first-seen order). v3.0 starts a new data (and video) file when the
    current one passes `data_file_mb`. `video_codec`: libx264 (default) or libsvtav1 (lerobot's,
    frames of 32x32 or more); lerobot 0.4.4's v2.1 -> v3.0 converter fails to join short libx264
    episodes (its stream copy of B-frames), so write v2.1 meant for it with libsvtav1. `extra_info`
    adds keys to meta/info.json (how the data was made, e.g. a generator's settings); it cannot
    replace the layout's own keys. Episode ids must be 0..N-1 in the order written, as lerobot needs
    them; `allow_id_gaps` accepts any distinct non-negative ids (a dataset lerobot cannot load: for
    tests of readers that must cope with one). `fps` is written to info.json as given: an int stays an
    int (30), a float keeps its decimal (29.97, as lerobot writes an NTSC camera's rate); videos and
    timestamps use it exactly.
    Raises InvalidInputError for an fps that is not a positive finite number or if `root` exists (unless
    `overwrite`), and DatasetError for inconsistent episodes or ids; on any failure `root` is untouched.
    """
    root = Path(root)
    if version not in ("v3.0", "v2.1"):
        raise InvalidInputError(f"version {version!r} is not 'v3.0' or 'v2.1'", field="version")
    fps = _check_fps(fps)
    if root.exists() and not overwrite:
        raise InvalidInputError(f"{root}: already exists", path=root, hint="choose a new folder or pass overwrite=True")
    feats = _check_features(features, image_storage)
    for key, ft in feats.items():
        if ft["dtype"] == "video":
            from reproduction.data.video import check_frame_size

            check_frame_size(video_codec, ft["shape"][1], ft["shape"][0], f"{root}: {key}")
    if root.parent.is_dir():
        remove_orphaned_staging(root.parent, root.name, name=PARTIAL_NAME)  # a killed writer's (its finally never ran)
    tmp = root.parent / PARTIAL_NAME.format(stem=root.name, pid=os.getpid())
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        kw = dict(fps=fps, features=feats, tasks=tasks, codec=video_codec, allow_id_gaps=allow_id_gaps)
        state = _V30(tmp, data_file_mb=data_file_mb, **kw) if version == "v3.0" else _V21(tmp, **kw)
        state.extra_info = dict(extra_info or {})
        for ep in episodes:
            state.add(ep)
        if not state.episodes:
            raise DatasetError("no episodes to write", path=root)
        state.finish(robot_type)
        if root.exists():
            shutil.rmtree(root)
        os.replace(tmp, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root
