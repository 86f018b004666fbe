"""audit56 F2: a dead --ray-address is refused only when a stage to run may use Ray workers, after the config and
preflight checks, within REACH_S even for a name that resolves slowly; a lost cluster is reported once; the
watchdog's record and error line are bounded, so it exits 58 whatever they do."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reproduction.errors import RayUnavailableError
from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec
from reproduction.train import ray_connect


@dataclass
class TrainSection:
    launcher: str = "ray"
    steps: int = 1


@dataclass
class RayToyConfig:
    train: TrainSection = field(default_factory=TrainSection)
    label: str = "x"


def write_stage(ctx: StageContext) -> StageOutput:
    out = ctx.out_dir / "done.txt"
    out.write_text("done\n")
    return StageOutput(files=[out])


RECIPE = Recipe(
    name="raytoy",
    config_schema=f"{__name__}:RayToyConfig",
    stages=(
        StageSpec(name="train", fn=f"{__name__}:write_stage", config=("train",)),
        StageSpec(name="compare", fn=f"{__name__}:write_stage", config=("label",)),
    ),
)


def _dead_address() -> tuple[socket.socket, str]:
    s = socket.socket()  # bound, never listening: a connect is refused
    s.bind(("127.0.0.1", 0))
    return s, f"127.0.0.1:{s.getsockname()[1]}"


def _portable(capsys, tmp_path: Path, *args: str) -> tuple[int, str]:
    from reproduction.portable import main

    (tmp_path / "run.yaml").write_text(f"recipe: {__name__}:RECIPE\n")
    capsys.readouterr()
    code = main(["-q", "run", "--config", str(tmp_path / "run.yaml"), "--output", str(tmp_path / "run"), *args])
    return code, capsys.readouterr().err


def test_a_dead_ray_address_does_not_stop_stages_that_use_no_ray(tmp_path, capsys):
    """`--stages compare` joins no cluster: it ran (exit 0), not exit 58 (audit56 F2, J2 follow-up)."""
    sock, address = _dead_address()
    with sock:
        code, err = _portable(capsys, tmp_path, "--stages", "compare", "--ray-address", address)
    assert (code, "cannot join" in err) == (0, False)
    assert (tmp_path / "run" / "compare" / "done.txt").read_text() == "done\n"


def test_a_dead_ray_address_is_refused_before_anything_runs_when_a_stage_uses_ray(tmp_path, capsys):
    sock, address = _dead_address()
    with sock:
        code, err = _portable(capsys, tmp_path, "--ray-address", address)
    assert code == 58 and not (tmp_path / "run").exists()
    assert f"error: cannot join the Ray cluster at {address}: nothing listens there (connection refused)" in err
    with sock:  # the train stage run in-process: no Ray stage left, nothing probed
        code, err = _portable(capsys, tmp_path, "--ray-address", address, "train.launcher=inprocess")
    assert (code, "cannot join" in err) == (0, False)


def test_a_bad_config_is_reported_before_the_dead_ray_address(tmp_path, capsys):
    sock, address = _dead_address()
    with sock:
        code, err = _portable(capsys, tmp_path, "--ray-address", address, "train.steps=many")
    assert code == 4 and "cannot join" not in err and "train.steps" in err


def test_which_stages_may_use_ray():
    plain = {"train": {"launcher": "ray"}, "eval": {"workers": 2, "reference": "r"}, "label": "x"}
    specs = {key: StageSpec(name="s", fn="m:f", config=(key,)) for key in ("train", "eval", "eval.reference", "label")}
    assert [k for k, s in specs.items() if ray_connect.may_use_ray([s], plain)] == ["train", "eval"]
    assert not ray_connect.may_use_ray([specs["train"]], {"train": {"launcher": "inprocess", "workers": 1}})


def test_the_probe_is_bounded_when_the_host_resolves_slowly(monkeypatch):
    """getaddrinfo has no timeout: a name whose resolution hangs held the probe past REACH_S."""
    release = threading.Event()

    def slow(*args, **kwargs):
        release.wait(10)
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    monkeypatch.setattr(ray_connect, "REACH_S", 0.3)
    t0 = time.monotonic()
    try:
        ray_connect.reachable("slow.example:6379")  # left to the bounded Ray probe, as a slow connect is
        took = time.monotonic() - t0
    finally:
        release.set()
    assert took < 1.5


def test_a_host_that_does_not_resolve_still_fails_at_once():
    with pytest.raises(RayUnavailableError, match="host 'no-such-host.invalid' does not resolve"):
        ray_connect.reachable("no-such-host.invalid:6379")
