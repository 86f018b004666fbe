"""LeRobot `meta/info.json`: the typed header of a dataset and the two on-disk layouts it names.

LeRobot v3.0 (lerobot >= 0.4; what `write_dataset` writes by default)::

    <root>/
      meta/info.json                                   this header (codebase_version "v3.0")
      meta/stats.json                                  per-feature mean/std/min/max/count
      meta/tasks.parquet                               task_index; the task string is the pandas index
      meta/episodes/chunk-000/file-000.parquet         one row per episode: episode_index, tasks, length,
                                                       data/chunk_index, data/file_index,
                                                       dataset_from_index, dataset_to_index,
                                                       videos/<key>/{chunk_index,file_index,from_timestamp,to_timestamp}
      data/chunk-000/file-000.parquet                  many episodes per file, rows in (episode, frame) order
      videos/<key>/chunk-000/file-000.mp4              many episodes per file, back to back in time

LeRobot v2.1 (RLinf's LIBERO data)::

    <root>/
      meta/info.json                                   codebase_version "v2.1"
      meta/episodes.jsonl                              {"episode_index", "tasks", "length"} per line
      meta/tasks.jsonl                                 {"task_index", "task"} per line
      meta/episodes_stats.jsonl                        per-episode stats
      data/chunk-000/episode_000000.parquet            one file per episode
      videos/chunk-000/<key>/episode_000000.mp4        one file per episode and camera

Per-frame columns always include `timestamp` (float32), `frame_index`, `episode_index`, `index`,
`task_index` (int64). Image features (`dtype: image`) are `struct<bytes: binary, path: string>`
columns holding PNG bytes; video features (`dtype: video`) live only in the mp4 files.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reproduction.errors import DatasetError, InputNotFoundError, UnsupportedFormatError

INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
SUPPORTED_VERSIONS = ("v2.1", "v3.0")
KEY_COLUMNS = ("episode_index", "frame_index", "index", "task_index", "timestamp")
"""The per-frame bookkeeping columns every LeRobot dataset has."""
DEFAULT_FEATURES: dict[str, dict[str, Any]] = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
V30_DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
V30_VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
V30_EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
V30_TASKS_PATH = "meta/tasks.parquet"
V21_DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
V21_VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
V21_EPISODES_PATH = "meta/episodes.jsonl"
V21_TASKS_PATH = "meta/tasks.jsonl"
V21_EPISODES_STATS_PATH = "meta/episodes_stats.jsonl"


@dataclass(kw_only=True, slots=True)
class DatasetInfo:
    """The fields of `meta/info.json` the project uses; `raw` keeps the whole document."""

    codebase_version: str
    """"v2.1" or "v3.0"."""
    fps: int | float
    """Frames per second of every episode: an int when whole (30, or 30.0 in the file), else a float (29.97, the
    NTSC camera rate lerobot 0.4.4's create() writes as is)."""
    features: dict[str, dict[str, Any]]
    """Feature name -> {"dtype", "shape", "names", ...} as LeRobot writes it."""
    robot_type: str | None = None
    total_episodes: int = 0
    total_frames: int = 0
    chunks_size: int = 1000
    data_path: str = V30_DATA_PATH
    video_path: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def video_keys(self) -> list[str]:
        return [k for k, ft in self.features.items() if ft.get("dtype") == "video"]

    @property
    def image_keys(self) -> list[str]:
        return [k for k, ft in self.features.items() if ft.get("dtype") == "image"]

    @property
    def camera_keys(self) -> list[str]:
        return [k for k, ft in self.features.items() if ft.get("dtype") in ("image", "video")]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.raw)


def feature_width(shape: Any) -> int | None:
    """Components of a feature of meta/info.json shape `shape`: [11] -> 11, [2, 3] -> 6; None for a shape that is no
    list of whole numbers (the reader names that one; width checks compare only widths they can read)."""
    if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) for n in shape):
        return None
    return math.prod(shape)


def load_info(root: Path) -> DatasetInfo:
    """Read and check `<root>/meta/info.json`; raises InputNotFoundError / UnsupportedFormatError."""
    path = Path(root) / INFO_PATH
    if not path.is_file():
        raise InputNotFoundError(
            f"{path}: no LeRobot info.json here",
            path=path,
            hint="pass the dataset root (the folder that holds meta/ and data/)",
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{path}: unreadable info.json ({exc})", path=path, hint=_INFO_HINT) from None
    return info_from_dict(raw, path=path)


def info_from_dict(raw: dict[str, Any], *, path: Path | None = None) -> DatasetInfo:
    """Validate an info.json document (version, fps, features, counts) into a DatasetInfo.

    Raises UnsupportedFormatError (exit 4) for another codebase_version and DatasetError (exit 40) naming the
    field for a document of another shape: no mapping, `features` not a mapping of mappings with a dtype, `fps`
    not a positive finite number (int or float; not a bool or a string), a count or `chunks_size` not a whole number."""
    where = path or "info.json"
    if not isinstance(raw, dict):
        raise DatasetError(
            f"{where}: the top level is a {type(raw).__name__}, not a mapping",
            path=path,
            hint=_INFO_HINT,
        )
    version = raw.get("codebase_version")
    if version not in SUPPORTED_VERSIONS:
        raise _version_error(where, raw, path)
    for key in ("fps", "features"):
        if key not in raw:
            raise DatasetError(f"{where}: missing field {key!r}", path=path, field=key, hint=_INFO_HINT)
    if not isinstance(raw["features"], dict) or not raw["features"]:
        raise DatasetError(
            f"{where}: `features` is {_shown(raw['features'])}, not a mapping of feature name to "
            "{dtype, shape, names}",
            path=path,
            field="features",
            hint=_INFO_HINT,
        )
    for name, ft in raw["features"].items():
        if not isinstance(ft, dict) or not isinstance(ft.get("dtype"), str):
            raise DatasetError(
                f"{where}: feature {name!r} is {_shown(ft)}, not a mapping with a `dtype` string",
                path=path,
                field=f"features.{name}",
                hint=_INFO_HINT,
            )
    features = {k: dict(v) for k, v in raw["features"].items()}
    fps = _rate(raw, "fps")
    if fps is None:
        raise DatasetError(
            f"{where}: fps is {_shown(raw['fps'])}, not a positive finite number of frames per second",
            path=path,
            field="fps",
            hint=_INFO_HINT,
        )
    counts = {key: _whole(raw, key) for key in ("total_episodes", "total_frames", "chunks_size")}
    for key, value in counts.items():
        if key in raw and (value is None or value < (1 if key == "chunks_size" else 0)):
            raise DatasetError(
                f"{where}: {key} is {_shown(raw[key])}, not a whole number"
                + (" >= 1" if key == "chunks_size" else " >= 0"),
                path=path,
                field=key,
                hint=_INFO_HINT,
            )
    for key in ("data_path", "video_path"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise DatasetError(
                f"{where}: {key} is {_shown(raw[key])}, not a path template string",
                path=path,
                field=key,
                hint=_INFO_HINT,
            )
    default_data = V30_DATA_PATH if version == "v3.0" else V21_DATA_PATH
    default_video = V30_VIDEO_PATH if version == "v3.0" else V21_VIDEO_PATH
    has_video = any(ft.get("dtype") == "video" for ft in features.values())
    return DatasetInfo(
        codebase_version=version,
        fps=fps,
        features=features,
        robot_type=raw.get("robot_type"),
        total_episodes=counts["total_episodes"] or 0,
        total_frames=counts["total_frames"] or 0,
        chunks_size=counts["chunks_size"] or 1000,
        data_path=raw.get("data_path") or default_data,
        video_path=(raw.get("video_path") or default_video) if has_video else raw.get("video_path"),
        raw=raw,
    )


def _version_error(where: Path | str, raw: dict[str, Any], path: Path | None) -> UnsupportedFormatError:
    """The refusal of a codebase_version this build does not read, with advice that fits the case: lerobot ships
    converters only forward (v2.0 -> v2.1 -> v3.0), so a newer version cannot be converted back (audit54 D2)."""
    supported = ", ".join(SUPPORTED_VERSIONS)
    if "codebase_version" not in raw:
        return UnsupportedFormatError(
            f"{where}: the codebase_version field is missing, so the layout is unknown (this tool reads {supported})",
            path=path,
            field="codebase_version",
            hint='add the "codebase_version" lerobot wrote the dataset with, or export the dataset again with lerobot',
        )
    version = raw["codebase_version"]
    parsed = _parse_version(version)
    newest = max(_parse_version(v) or (0, 0) for v in SUPPORTED_VERSIONS)
    if parsed is not None and parsed > newest:
        return UnsupportedFormatError(
            f"{where}: codebase_version {version!r} was written by a newer lerobot than this tool reads "
            f"(it reads {supported})",
            path=path,
            field="codebase_version",
            hint="write or export the dataset as v3.0 (or v2.1) with the lerobot version that made it, "
            "or upgrade recap-portable",
        )
    if parsed is not None and parsed in {_parse_version(v) for v in SUPPORTED_VERSIONS}:
        hint = f'lerobot spells it "v{parsed[0]}.{parsed[1]}": set codebase_version to that'
    elif parsed is not None:  # older: lerobot's own converters bring it forward
        hint = "convert the dataset to v3.0 with lerobot's converters (v2.0 -> v2.1 -> v3.0)"
    else:
        hint = 'set "codebase_version" to the version lerobot wrote the dataset with, e.g. "v3.0"'
    return UnsupportedFormatError(
        f"{where}: codebase_version {version!r} is not supported (supported: {supported})",
        path=path,
        field="codebase_version",
        hint=hint,
    )


def _parse_version(value: Any) -> tuple[int, int] | None:
    """(major, minor) of "v3.1" or "3.1" ("v4" is (4, 0)); None for anything else."""
    if not isinstance(value, str):
        return None
    parts = value.strip().removeprefix("v").split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() and p.isascii() for p in parts):
        return None
    return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0


_INFO_HINT = "meta/info.json is the header lerobot writes: fix the field, or export or convert the dataset again"


def _whole(raw: dict[str, Any], key: str) -> int | None:
    """raw[key] as an int when it is a whole number (30 or 30.0; not True, "30" or 29.97); None otherwise or absent."""
    value = raw.get(key)
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _rate(raw: dict[str, Any], key: str) -> int | float | None:
    """raw[key] as a positive rate: an int when whole (30 or 30.0), a float otherwise (29.97); None for 0, a negative,
    NaN, inf, a bool, a string or absent. Every use of fps works on the number (round(t * fps) finds a frame), so a
    fractional rate is read as exactly as a whole one (audit56 E3)."""
    whole = _whole(raw, key)
    if whole is not None:
        return whole if whole > 0 else None
    value = raw.get(key)
    if isinstance(value, float) and math.isfinite(value) and value > 0:
        return value
    return None


def _shown(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (str, int, float, list, dict, type(None))) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
