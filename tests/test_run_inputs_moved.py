"""A run whose datasets were copied to another path (another server, a restored bundle) is refused on --resume with
a message saying only their location changed; `--inputs-moved` resumes it, and a stage that differs otherwise is
refused as without the flag (audit52 T4)."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reproduction.digests import json_sha256
from reproduction.errors import StageKeyChangedError
from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec
from reproduction.run.lineage_check import verify_lineage
from reproduction.run.record import make_recorder
from reproduction.run.runner import RunOptions, read_state, run_recipe


@dataclass
class Entry:
    path: str = "???"
    type: str = "sft"


@dataclass
class MovedConfig:
    datasets: list[Entry] = field(default_factory=list)
    scale: int = 2


@dataclass
class Opened:
    root: Path
    fingerprint: str


def open_folders(config: MovedConfig) -> dict[str, Opened]:
    """Each dataset folder, named by its path (as GRPO names them), fingerprinted by its files' bytes."""
    out = {}
    for entry in config.datasets:
        root = Path(entry.path)
        files = {
            p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*")
            if p.is_file()
        }
        out[str(root)] = Opened(root, json_sha256(files))
    return out


def total_stage(ctx: StageContext) -> StageOutput:
    total = sum(len(p.read_bytes()) for d in ctx.inputs.values() for p in d.root.rglob("*") if p.is_file())
    out = ctx.out_dir / "total.json"
    out.write_text(json.dumps({"total": total * ctx.config.scale}))
    return StageOutput(files=[out])


def double_stage(ctx: StageContext) -> StageOutput:
    total = json.loads((ctx.run_dir / "total" / "total.json").read_text())["total"]
    out = ctx.out_dir / "double.json"
    out.write_text(json.dumps({"double": 2 * total}))
    return StageOutput(files=[out])


MOVED = Recipe(
    name="moved",
    open_inputs=f"{__name__}:open_folders",
    stages=(
        StageSpec(name="total", fn=f"{__name__}:total_stage", config=("datasets", "scale")),
        StageSpec(name="double", fn=f"{__name__}:double_stage", needs=("total",), config=("scale",)),
    ),
)


def _data(root: Path) -> Path:
    (root / "meta").mkdir(parents=True)
    (root / "meta" / "info.json").write_text('{"fps": 10}')
    (root / "episode_0.bin").write_bytes(bytes(range(32)))
    return root


def _run(run: Path, data: Path, *, scale: int = 2, **kw) -> list[tuple[str, str]]:
    config = MovedConfig(datasets=[Entry(path=str(data))], scale=scale)
    opts = RunOptions(recorder=make_recorder(None), **kw)
    return [(s.name, s.action) for s in run_recipe(MOVED, config, run, opts).stages]


def _outputs(run: Path) -> dict[str, bytes]:
    return {p.relative_to(run).as_posix(): p.read_bytes() for p in run.glob("*/*.json")}


@pytest.fixture
def moved(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(run folder, old data path, new data path): a complete run whose data was copied elsewhere, the old copy gone."""
    old = _data(tmp_path / "server1" / "data" / "sft")
    run = tmp_path / "run"
    assert _run(run, old) == [("total", "ran"), ("double", "ran")]
    new = tmp_path / "server2" / "bundle" / "data" / "sft"
    shutil.copytree(old, new)
    shutil.rmtree(tmp_path / "server1")
    return run, old, new


def test_without_the_flag_a_moved_run_is_refused_saying_only_the_location_changed(moved):
    run, old, new = moved
    with pytest.raises(StageKeyChangedError) as err:
        _run(run, new, resume=True)
    assert err.value.exit_code == 52
    assert str(err.value).splitlines()[0] == (
        f"stage total: only the location of its datasets changed (same fingerprints, same everything else): "
        f"{old} -> {new}"
    )
    assert "--inputs-moved" in err.value.hint
    assert f"config.datasets[0].path: {old} -> {new}" in err.value.changes or any(
        str(old) in c for c in err.value.changes
    )


def test_with_inputs_moved_every_stage_is_skipped_and_the_records_follow_the_data(moved):
    run, old, new = moved
    outputs = _outputs(run)
    assert _run(run, new, resume=True, inputs_moved=True) == [("total", "skipped"), ("double", "skipped")]
    assert _outputs(run) == outputs
    rec = read_state(run)["stages"]["total"]
    assert rec["key_parts"]["config"]["datasets"][0]["path"] == str(new)
    assert set(rec["key_parts"]["inputs"]) == {str(new)}
    assert rec["key"] == json_sha256(rec["key_parts"])
    assert rec["moved"] == [[str(old), str(new)]]
    assert verify_lineage(run).exit_code == 0  # the statement keeps the old path; the record notes the move
    assert _run(run, new, resume=True) == [("total", "skipped"), ("double", "skipped")]  # no flag needed now


def _refusal(run: Path, data: Path, **kw) -> str:
    with pytest.raises(StageKeyChangedError) as err:
        _run(run, data, resume=True, **kw)
    return f"{err.value}\nhint: {err.value.hint}"


def test_with_inputs_moved_a_changed_config_value_is_refused_as_without_it(moved):
    run, old, new = moved
    without = _refusal(run, new, scale=3)
    assert _refusal(run, new, scale=3, inputs_moved=True) == without
    assert without.splitlines()[0].startswith(
        f"stage total: its inputs changed since it ran: config.datasets[0].path: {old} -> {new}; config.scale: 2 -> 3; "
    )
    assert "..." not in without.splitlines()[0]


def test_with_inputs_moved_a_different_fingerprint_is_refused_as_without_it(moved):
    run, old, new = moved
    raw = bytearray((new / "episode_0.bin").read_bytes())
    raw[5] ^= 1
    (new / "episode_0.bin").write_bytes(bytes(raw))
    without = _refusal(run, new)
    assert _refusal(run, new, inputs_moved=True) == without
    assert "only the location" not in without
    assert f"inputs.{old}: " in without and " -> <absent>" in without
    assert read_state(run)["stages"]["total"]["key_parts"]["inputs"].keys() == {str(old)}


def test_with_inputs_moved_two_swapped_dataset_paths_are_refused(tmp_path):
    a, b = _data(tmp_path / "d" / "sft"), _data(tmp_path / "d" / "rl")
    (b / "episode_0.bin").write_bytes(bytes(range(8)))
    run = tmp_path / "run"
    config = MovedConfig(datasets=[Entry(path=str(a)), Entry(path=str(b), type="rl")])
    run_recipe(MOVED, config, run, RunOptions())
    swapped = MovedConfig(datasets=[Entry(path=str(b)), Entry(path=str(a), type="rl")])
    with pytest.raises(StageKeyChangedError) as err:
        run_recipe(MOVED, swapped, run, RunOptions(resume=True, inputs_moved=True))
    assert str(err.value).startswith(
        f"stage total: its inputs changed since it ran: config.datasets[0].path: {a} -> {b}; "
        f"config.datasets[1].path: {b} -> {a}"
    )


def test_portable_run_passes_inputs_moved_to_the_runner(monkeypatch, tmp_path):
    import argparse

    from reproduction.run import cli, runner
    from reproduction.run.cli_args import add_run_arguments

    p = argparse.ArgumentParser()
    add_run_arguments(p)
    seen = []
    monkeypatch.setattr(runner, "run_recipe", lambda recipe, config, run_dir, opts: seen.append(opts.inputs_moved))
    for argv in (["--output", "r", "--resume", "--inputs-moved"], ["--output", "r", "--resume"]):
        cli.execute(MOVED, MovedConfig(), tmp_path / "r", p.parse_args(argv))
    assert seen == [True, False]
