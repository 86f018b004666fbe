"""audit56 F2: a dead --ray-address is refused only when a stage to run may use Ray workers, after the config and
preflight checks, within REACH_S even for a name that resolves slowly; a lost cluster is reported once; the
watchdog's record and error line are bounded, so it exits 58 whatever they do."""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reproduction.errors import RayUnavailableError
from reproduction.recipe import Recipe, StageContext, StageOutput, StageSpec
from reproduction.train import launcher, ray_connect


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


def _lost_watch() -> launcher.ClusterWatch:
    def refusing(host: str, port: int, timeout: float) -> None:
        raise ConnectionRefusedError(111, "Connection refused")

    watch = launcher.ClusterWatch(
        "127.0.0.1:6379", address="127.0.0.1:6379", what="w", every_s=0.01, lost_after_s=0.0, connect=refusing
    )
    time.sleep(0.02)
    watch.probe()
    assert watch.lost
    return watch


def test_the_main_thread_does_not_report_a_loss_the_watchdog_claimed():
    """Both claiming at once: the watchdog won, so the main thread's check() waits for the process to end instead of
    raising the error a second time (two `error:` lines and two records)."""
    watch = _lost_watch()
    assert watch.claim()  # the watchdog's
    raised: list[BaseException] = []

    def main_thread() -> None:
        try:
            watch.check()
        except RayUnavailableError as exc:
            raised.append(exc)

    thread = threading.Thread(target=main_thread, daemon=True)
    thread.start()
    thread.join(0.5)
    assert raised == [] and thread.is_alive()  # not reported here
    watch.ended.set()  # the real end exits the process; a test's returns
    thread.join(5)
    assert raised == [watch.error]
    assert not watch.claim()  # claimed once


def test_the_main_threads_claim_is_its_own_and_the_watchdog_then_does_not_claim():
    watch = _lost_watch()
    with pytest.raises(RayUnavailableError):
        watch.check()
    with pytest.raises(RayUnavailableError):  # again, at once: its own claim
        watch.check()
    assert watch.claimed_by == "main" and not watch.claim()


def test_the_watchdogs_record_and_line_are_bounded_and_it_exits_58_anyway(monkeypatch):
    """A record stuck on a hung disk or a held lock kept a process whose cluster was gone alive."""
    monkeypatch.setattr(launcher, "END_BOUND_S", 0.3, raising=False)
    stuck = threading.Event()
    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", exits.append)
    error = RayUnavailableError("lost the Ray cluster at 127.0.0.1:1 while w ran", address="127.0.0.1:1")
    t0 = time.monotonic()
    try:
        with ray_connect.on_cluster_lost(lambda exc: stuck.wait(5)):
            launcher._end_process(error)
        took = time.monotonic() - t0
    finally:
        stuck.set()
    assert exits == [58] and took < 2


def _dual_stack(monkeypatch, port: int) -> None:
    """getaddrinfo answering ::1 then 127.0.0.1 for `localhost`, as on hosts whose /etc/hosts maps `::1 localhost`
    (or a head name with AAAA and A records)."""

    def dual(host, port_, *args, **kwargs):
        assert (host, port_) == ("localhost", port)
        return [
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", port, 0, 0)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
        ]

    monkeypatch.setattr(socket, "getaddrinfo", dual)


def test_every_resolved_address_is_tried_before_nothing_listens(monkeypatch):
    """audit56 R3: only the first address (::1) was tried; a head listening on IPv4 only was refused, exit 58."""
    with socket.socket(socket.AF_INET) as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        _dual_stack(monkeypatch, port)
        ray_connect.reachable(f"localhost:{port}")  # the IPv4 address answers: no error


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this host: ::1 cannot refuse")
def test_nothing_listens_only_when_every_resolved_address_refuses(monkeypatch):
    sock, _ = _dead_address()
    with sock:
        port = sock.getsockname()[1]
        _dual_stack(monkeypatch, port)
        with pytest.raises(RayUnavailableError) as caught:
            ray_connect.reachable(f"localhost:{port}")
    assert (
        caught.value.message
        == f"cannot join the Ray cluster at localhost:{port}: nothing listens there (connection refused)"
    )


REPO = Path(__file__).resolve().parent.parent


def _uses_ray(config_file: str, recipe: Recipe, stages: tuple[str, ...], overrides: list[str]) -> bool:
    from reproduction.run.config import to_plain
    from reproduction.run.resolve import load_run_config

    config = load_run_config([REPO / "bundle" / config_file], overrides, bundle=Path("/b"), run_dir=None)[2]
    return ray_connect.may_use_ray([recipe.stage(n) for n in stages], to_plain(config), config)


def test_the_probe_asks_recaps_stages_what_their_code_hands_ray_for():
    """audit56 R4: the advantages stage joins Ray for value.infer.workers > 1, a key it does not declare (missed: a
    dead head was found after value trained); eval's workers are a process pool (probed: a dead head stopped it)."""
    from reproduction.recipes.recap import recipe as recap

    off = ["value.train.launcher=inprocess", "policy.train.launcher=inprocess", "value.infer.workers=1"]
    cases = {
        ("advantages",): ["value.infer.workers=8"],
        ("value", "advantages", "policy"): ["value.infer.workers=8"],
        ("eval", "compare"): ["eval.workers=4"],
        ("returns", "value", "advantages", "policy", "eval", "compare"): ["eval.workers=4"],
        ("value",): ["value.train.launcher=ray"],
        ("policy",): ["policy.train.launcher=ray"],
    }
    found = [_uses_ray("demo/run.yaml", recap.RECAP, names, off + more) for names, more in cases.items()]
    assert found == [True, True, False, False, True, True]
    # the one predicate: what the StageSpec declares is what the stage function hands ctx.ray_for
    declared = {s.name: s.uses_ray for s in recap.RECAP.stages}
    assert declared == {
        "returns": recap.no_ray,
        "value": recap.value_uses_ray,
        "advantages": recap.advantages_uses_ray,
        "policy": recap.policy_uses_ray,
        "eval": recap.no_ray,
        "compare": recap.no_ray,
    }


def test_the_probe_asks_grpos_stages_what_their_code_hands_ray_for():
    from reproduction.recipes.grpo import recipe as grpo

    assert _uses_ray("grpo/config.yaml", grpo.GRPO, ("sft",), ["sft.train.launcher=ray"])
    assert not _uses_ray("grpo/config.yaml", grpo.GRPO, ("sft",), ["sft.train.launcher=ray", "sft.export=/x"])
    assert _uses_ray("grpo/config.yaml", grpo.GRPO, ("rl",), ["rl.launcher=ray"])
    assert not _uses_ray("grpo/config.yaml", grpo.GRPO, ("eval", "compare"), ["eval.workers=4"])
    assert [s.uses_ray for s in grpo.GRPO.stages] == [grpo.sft_uses_ray, grpo.rl_uses_ray, grpo.no_ray, grpo.no_ray]


def _label_is_ray(config: RayToyConfig) -> bool:
    return config.label == "ray"


DECLARED = Recipe(
    name="raytoy-declared",
    config_schema=f"{__name__}:RayToyConfig",
    stages=(StageSpec(name="train", fn=f"{__name__}:write_stage", config=("train",), uses_ray=_label_is_ray),),
)


def test_the_runner_probes_by_the_stages_predicate_not_its_config_keys(tmp_path, capsys):
    """train.launcher is ray but the stage's predicate says no Ray: it runs with the head down; and the reverse."""
    from reproduction.portable import main

    sock, address = _dead_address()
    (tmp_path / "run.yaml").write_text(f"recipe: {__name__}:DECLARED\n")
    argv = ["-q", "run", "--config", str(tmp_path / "run.yaml"), "--ray-address", address]
    with sock:
        assert main([*argv, "--output", str(tmp_path / "a")]) == 0
        assert main([*argv, "--output", str(tmp_path / "b"), "label=ray", "train.launcher=inprocess"]) == 58
    assert "nothing listens there" in capsys.readouterr().err and not (tmp_path / "b").exists()


def test_a_uses_ray_that_is_not_callable_is_refused():
    from reproduction.errors import ConfigError

    with pytest.raises(ConfigError, match="stage s's uses_ray is 'yes', not callable") as caught:
        Recipe(name="r", stages=(StageSpec(name="s", fn="m:f", uses_ray="yes"),))
    assert (caught.value.exit_code, caught.value.field) == (4, "stages.s.uses_ray")
