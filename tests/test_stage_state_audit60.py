"""A stage's process state and its inputs' fingerprints (audit60_B B1, B3). B1: a stage's os.chdir and os.environ
changes reached every later stage of the invocation (and the input fingerprints keyed after it), so a stage redone
alone by `--resume --restart-stage` wrote other bytes under the same key; now both end with the stage, also when it
raises. B3: an input whose `.fingerprint` (docs/recipes.md's DataFile) reads a path that is not there was exit 1
"code of yours" with the stage being keyed unrecorded; now exit 3 naming the stage, the input, the config key and
the path, and the stage is recorded failed. A tiny out-of-tree recipe defined here, run through `portable run` in
this process."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec


@dataclass(kw_only=True)
class Misc:
    fail: bool = False
    """setup raises after changing the process state."""


@dataclass(kw_only=True)
class StateConfig:
    RUN: str = ""
    data: str = "data.txt"
    misc: Misc = field(default_factory=Misc)


@dataclass
class DataFile:
    path: Path

    @property
    def fingerprint(self) -> str:  # as docs/recipes.md's example: reads the file
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


def open_inputs(config: StateConfig) -> dict[str, DataFile]:
    return {"data": DataFile(Path(config.data))}


def setup(ctx: StageContext) -> StageOutput:
    os.chdir(ctx.out_dir)  # then returns its file by a relative path: still recorded
    os.environ["LAB60_LEAK"] = "from-setup"
    os.environ["OMP_NUM_THREADS"] = "7"
    Path("marker.txt").write_text("ok")
    if ctx.config.misc.fail:
        raise RuntimeError("setup failed after its chdir")
    return StageOutput(files=["marker.txt"], summary={})


def probe(ctx: StageContext) -> StageOutput:
    seen = {"cwd": os.getcwd(), "leak": os.environ.get("LAB60_LEAK"), "omp": os.environ.get("OMP_NUM_THREADS")}
    (ctx.out_dir / "probe.json").write_text(json.dumps(seen))
    return StageOutput(files=[ctx.out_dir / "probe.json"], summary={})


def train(ctx: StageContext) -> StageOutput:
    text = ctx.inputs["data"].path.read_text()
    (ctx.out_dir / "weights.json").write_text(json.dumps({"n": len(text)}))
    return StageOutput(files=[ctx.out_dir / "weights.json"], summary={})


RECIPE = Recipe(
    name="state60",
    config_schema=f"{__name__}:StateConfig",
    open_inputs=f"{__name__}:open_inputs",
    stages=(
        StageSpec(name="setup", fn=f"{__name__}:setup", config=("misc",), inputs=False),
        StageSpec(name="probe", fn=f"{__name__}:probe", needs=("setup",), inputs=False),
        StageSpec(name="train", fn=f"{__name__}:train"),
    ),
)


def _portable(capsys, tmp_path: Path, *args: str) -> tuple[int, list[str]]:
    from reproduction.portable import main

    config = tmp_path / "state60.yaml"
    config.write_text(f"recipe: {__name__}:RECIPE\n")
    capsys.readouterr()
    code = main(["-q", "run", "--config", str(config), *args])
    return code, capsys.readouterr().err.splitlines()


def _stages(run: Path) -> dict[str, tuple[str, str | None]]:
    recorded = json.loads((run / "run.json").read_text())["stages"]
    return {name: (rec["status"], rec.get("error")) for name, rec in recorded.items()}


def test_a_stages_chdir_and_environment_end_with_it(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("LAB60_LEAK", raising=False)
    (tmp_path / "data.txt").write_text("abc")  # `data: data.txt`, relative: fingerprinted after setup's chdir
    run = tmp_path / "run"
    assert _portable(capsys, tmp_path, "--output", str(run)) == (0, [])
    assert _stages(run) == {"setup": ("complete", None), "probe": ("complete", None), "train": ("complete", None)}
    assert json.loads((run / "run.json").read_text())["stages"]["setup"]["outputs"].keys() == {"marker.txt"}
    first = (run / "probe" / "probe.json").read_bytes()
    assert json.loads(first) == {"cwd": str(tmp_path), "leak": None, "omp": "1"}
    assert (os.getcwd(), os.environ.get("LAB60_LEAK"), os.environ["OMP_NUM_THREADS"]) == (str(tmp_path), None, "1")
    # the stage redone alone writes the bytes the uninterrupted run wrote (it wrote cwd "/.../run/setup" before)
    args = ("--output", str(run), "--resume", "--restart-stage", "probe", "--stages", "probe")
    assert _portable(capsys, tmp_path, *args) == (0, [])
    assert (run / "probe" / "probe.json").read_bytes() == first


def test_a_stage_that_raises_leaves_the_process_state_as_it_was(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("LAB60_LEAK", raising=False)
    code, err = _portable(capsys, tmp_path, "--output", str(tmp_path / "run"), "misc.fail=true")
    assert code == 1 and err[0] == "error: RuntimeError: setup failed after its chdir"
    assert (os.getcwd(), os.environ.get("LAB60_LEAK"), os.environ["OMP_NUM_THREADS"]) == (str(tmp_path), None, "1")


def test_an_input_path_that_is_not_there_is_exit_3_and_the_stage_recorded_failed(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    nope = tmp_path / "nope.txt"
    run = tmp_path / "run"
    code, err = _portable(capsys, tmp_path, "--output", str(run), f"data={nope}")
    line = (
        f"stage train: opened input 'data' cannot be fingerprinted: No such file or directory: '{nope}' "
        "(config key data)"
    )
    assert (code, err) == (
        3,
        [f"error: {line}", "hint: set data to an existing path, then `portable run ... --resume` runs stage train"],
    )
    assert _stages(run) == {
        "setup": ("complete", None),
        "probe": ("complete", None),
        "train": ("failed", f"InputNotFoundError: {line}"),
    }
    nope.write_text("abc")  # the fix the hint names: --resume runs train only
    assert _portable(capsys, tmp_path, "--output", str(run), "--resume", f"data={nope}") == (0, [])
    assert _stages(run)["train"] == ("complete", None)
