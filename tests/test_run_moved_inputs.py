"""A run whose data moved to another path (another server, a restored bundle) resumes: a dataset keys by its name and
content fingerprint, not where it lives (audit52 T4)."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reproduction.config_fields import output_free_keys, same_outputs
from reproduction.digests import json_sha256
from reproduction.errors import StageKeyChangedError
from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec
from reproduction.run.runner import RunOptions, read_state, run_recipe
from reproduction.run.stage_keys import comparable_parts, describe_changes


@dataclass
class Entry:
    path: str = field(default="???", metadata=same_outputs())  # as the recipes' dataset entries declare it
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
    """Each dataset folder, fingerprinted by its files' bytes, named by its place in the config (as GRPO names them)."""
    out = {}
    for i, entry in enumerate(config.datasets):
        root = Path(entry.path)
        files = {
            p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*")
            if p.is_file()
        }
        out[f"datasets[{i}]"] = Opened(root, json_sha256(files))
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


def _run(run: Path, data: Path, **kw) -> list[tuple[str, str]]:
    config = MovedConfig(datasets=[Entry(path=str(data))])
    return [(s.name, s.action) for s in run_recipe(MOVED, config, run, RunOptions(**kw)).stages]


def _outputs(run: Path) -> dict[str, bytes]:
    return {p.relative_to(run).as_posix(): p.read_bytes() for p in run.rglob("*.json") if p.name != "run.json"}


def test_a_run_whose_data_was_copied_elsewhere_resumes_skipping_every_stage(tmp_path):
    data = _data(tmp_path / "server1" / "data" / "sft")
    run = tmp_path / "run"
    assert _run(run, data) == [("total", "ran"), ("double", "ran")]
    stages, outputs = read_state(run)["stages"], _outputs(run)
    moved = tmp_path / "server2" / "bundle" / "data" / "sft"
    shutil.copytree(data, moved)
    shutil.rmtree(tmp_path / "server1")  # the old location is gone, as on another server
    assert _run(run, moved, resume=True) == [("total", "skipped"), ("double", "skipped")]
    assert read_state(run)["stages"] == stages  # the same keys: nothing re-recorded
    assert _outputs(run) == outputs
    assert "path" not in json.dumps(stages["total"]["key_parts"]["config"])
    assert set(stages["total"]["key_parts"]["inputs"]) == {"datasets[0]"}


def test_one_changed_byte_at_the_new_path_is_an_input_change_named_by_the_input(tmp_path):
    data = _data(tmp_path / "a" / "sft")
    run = tmp_path / "run"
    _run(run, data)
    before = read_state(run)["stages"]["total"]["key_parts"]["inputs"]["datasets[0]"]
    moved = tmp_path / "b" / "sft"
    shutil.copytree(data, moved)
    raw = bytearray((moved / "episode_0.bin").read_bytes())
    raw[5] ^= 1
    (moved / "episode_0.bin").write_bytes(bytes(raw))
    with pytest.raises(StageKeyChangedError) as err:
        _run(run, moved, resume=True)
    assert err.value.exit_code == 52
    after = open_folders(MovedConfig(datasets=[Entry(path=str(moved))]))["datasets[0]"].fingerprint
    assert after != before
    assert err.value.changes == [f"inputs.datasets[0]: {before[:16]}... -> {after[:16]}..."]
    assert "path" not in str(err.value)  # the move itself is no change to name


def test_a_record_that_keyed_the_path_is_reused_at_the_new_path(tmp_path):
    """A run.json written before audit52 T4 (the path in the stage key's config, the input named by its path) resumes
    at another path with the same bytes: the recorded parts are compared as today's code keys them."""
    data = _data(tmp_path / "a" / "sft")
    run = tmp_path / "run"
    _run(run, data)
    state = json.loads((run / "run.json").read_text())
    rec = state["stages"]["total"]
    parts = rec["key_parts"]
    parts["config"]["datasets"][0]["path"] = str(data)  # as the old code keyed it
    parts["inputs"] = {str(data): parts["inputs"]["datasets[0]"]}  # GRPO named inputs by path
    rec["key"] = json_sha256(parts)
    state["stages"]["double"]["key"] = "stale"  # its own key form did not change; make sure it is recomputed
    (run / "run.json").write_text(json.dumps(state))
    moved = tmp_path / "b" / "sft"
    shutil.copytree(data, moved)
    assert _run(run, moved, resume=True)[0] == ("total", "skipped")
    assert read_state(run)["stages"]["total"]["key_parts"]["inputs"] == {"datasets[0]": parts["inputs"][str(data)]}


def test_the_recipes_dataset_paths_are_out_of_the_stage_keys_and_grpo_names_inputs_by_place():
    from reproduction.recipes.grpo.config import GrpoRunConfig, SftDataset, SftSection
    from reproduction.recipes.grpo.stages import input_paths
    from reproduction.recipes.recap.config import DatasetConfig, RunConfig

    recap = RunConfig(datasets=[DatasetConfig(path="/x/sft", type="sft"), DatasetConfig(path="/x/rollout")])
    assert {"datasets.0.path", "datasets.1.path"} <= set(output_free_keys(recap))
    grpo = GrpoRunConfig(sft=SftSection(datasets=[SftDataset(path="/x/sft"), SftDataset(path="/y/sft")]))
    grpo.rl.cotrain_dataset = "/x/real"
    assert {"sft.datasets.0.path", "sft.datasets.1.path", "rl.cotrain_dataset"} <= set(output_free_keys(grpo))
    assert input_paths(grpo) == {
        "sft.datasets[0]": "/x/sft",
        "sft.datasets[1]": "/y/sft",
        "rl.cotrain_dataset": "/x/real",
    }


def test_a_changed_list_entry_is_named_by_its_index_and_field_not_cut_short():
    old = {"config": {"datasets": [{"path": "/p/" + "a" * 90, "type": "sft"}, {"path": "/q", "type": "sft"}]}}
    new = {"config": {"datasets": [{"path": "/p/" + "a" * 90, "type": "sft"}, {"path": "/q", "type": "rollout"}]}}
    assert describe_changes(old, new) == ["config.datasets[1].type: sft -> rollout"]
    spec = MOVED.stages[0]
    recorded = {"config": {"datasets": [{"path": "/old", "type": "sft"}], "scale": 2}, "inputs": {"/old": "f"}}
    today = {"config": {"datasets": [{"type": "sft"}], "scale": 2}, "inputs": {"datasets[0]": "f"}}
    config = {"datasets": [{"path": "/old", "type": "sft"}]}
    assert comparable_parts(spec, recorded, today, ["datasets.0.path"], config) == today
