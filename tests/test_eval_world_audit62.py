"""audit62 H1, M1: a policy dataset whose state or action the evaluation world cannot give (real-robot data: a
5-value state, a 2- or 6-dim action) is refused by RECAP's preflight (exit 4, before any stage trains), naming the
dataset, the width and what the world of eval.tasks gives; it used to train returns, value, advantages and policy
and then die at eval with exit 1 "internal error" (a bare ValueError in the export's `_state`), or be called
"trained for LIBERO". An export made elsewhere is refused by the eval stage with a typed error, also as not LIBERO's
where it does not fit LIBERO."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from reproduction.data.writer import EpisodeData, write_dataset
from reproduction.errors import ConfigError, SimError
from reproduction.recipes.recap.config import load_config

REPO = Path(__file__).resolve().parent.parent
ALL = ["returns", "value", "advantages", "policy", "eval", "compare"]
ONLY_TRAIN = "train the policy without eval and compare: portable run ... --stages returns,value,advantages,policy"


def _dataset(root: Path, *, state: int, action: int, goal: int = 0) -> Path:
    n = 4
    feats = {
        "observation.state": {"dtype": "float32", "shape": [state]},
        "action": {"dtype": "float32", "shape": [action]},
        "is_success": {"dtype": "bool", "shape": [1]},
    }
    frames = {
        "observation.state": np.zeros((n, state), np.float32),
        "action": np.zeros((n, action), np.float32),
        "is_success": np.zeros(n, bool),
    }
    if goal:
        feats["observation.goal"] = {"dtype": "float32", "shape": [goal]}
        frames["observation.goal"] = np.zeros((n, goal), np.float32)
    eps = [EpisodeData(episode_index=e, task="pick", frames=frames) for e in range(2)]
    return write_dataset(root, eps, fps=10, features=feats)


def _problems(tmp_path: Path, path: Path, *overrides: str, stages=ALL) -> list:
    from reproduction.recipes.recap.recipe import preflight

    config = load_config(None, [f"datasets=[{{path: {path}}}]", *overrides])
    found = preflight(config, tmp_path / "run", {}, stages)
    return [p for p in found if p.field == "eval.tasks"]


def test_a_state_fetch_does_not_give_is_refused_in_preflight_naming_dataset_widths_and_way_out(tmp_path):
    d = _dataset(tmp_path / "robot", state=5, action=4)
    (p,) = _problems(tmp_path, d)
    assert isinstance(p, ConfigError) and p.exit_code == 4
    assert p.message == (
        "eval.tasks: datasets[0].path (robot) would train the policy on a state of 5 values (observation.state 5) "
        "where Fetch gives 14 (observation.state 11 + observation.goal 3), so the Fetch tasks of eval.tasks "
        "(FetchPickAndPlace-v4) could not run it"
    )
    assert p.hint.startswith("use tasks of a world whose state and action the data match, or " + ONLY_TRAIN)
    # not refused when the run leaves eval out, as the hint says
    assert _problems(tmp_path, d, stages=["returns", "value", "advantages", "policy"]) == []


def test_an_action_width_of_neither_world_is_stated_as_it_is_not_as_libero(tmp_path):
    d = _dataset(tmp_path / "arm6", state=11, action=6, goal=3)
    (p,) = _problems(tmp_path, d)
    assert p.message == (
        "eval.tasks: datasets[0].path (arm6) would train the policy on a 6-dim action where Fetch takes 4, so the "
        "Fetch tasks of eval.tasks (FetchPickAndPlace-v4) could not run it"
    )
    assert "LIBERO" not in p.message + p.hint


def test_data_of_the_other_world_names_it_in_the_hint(tmp_path):
    lib = _dataset(tmp_path / "lib", state=8, action=7)
    (p,) = _problems(tmp_path, lib)
    assert "a 7-dim action where Fetch takes 4" in p.message
    assert p.hint.startswith("use LIBERO tasks, whose widths the data have (eval.tasks=[libero_10/0]")
    fetch = _dataset(tmp_path / "fetch", state=11, action=4, goal=3)
    assert _problems(tmp_path, fetch) == []  # the simulator's own widths: fine
    (q,) = [p for p in _problems(tmp_path, fetch, "eval.tasks=[libero_10/0]")]
    assert q.message == (
        "eval.tasks: datasets[0].path (fetch) would train the policy on a state of 14 values (observation.state 11 "
        "+ observation.goal 3) where LIBERO gives 8 (observation.state 8); and on a 4-dim action where LIBERO takes "
        "7, so the LIBERO tasks of eval.tasks (libero_10/0) could not run it"
    )
    assert q.hint.startswith("use Fetch tasks, whose widths the data have (eval.tasks=[FetchPickAndPlace-v4])")


def test_a_dataset_the_policy_does_not_read_is_not_asked(tmp_path):
    d = _dataset(tmp_path / "robot", state=5, action=4)
    fetch = _dataset(tmp_path / "fetch", state=11, action=4, goal=3)
    from reproduction.recipes.recap.recipe import preflight

    sets = f"[{{path: {fetch}}}, {{path: {d}, policy: false}}]"
    config = load_config(None, [f"datasets={sets}"])
    assert [p for p in preflight(config, tmp_path / "run", {}, ALL) if p.field == "eval.tasks"] == []


def test_portable_run_refuses_it_with_exit_4_before_anything_is_written(tmp_path):
    d = _dataset(tmp_path / "robot", state=5, action=4)
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "reproduction.portable", "run", "--output", str(out), f"datasets=[{{path: {d}}}]"]
        + [f"{s}.train.{k}=4" for s in ("value", "policy") for k in ("global_batch", "micro_batch")],  # 8 frames
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 4, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("error: eval.tasks: datasets[0].path (robot) would train the policy on a state of 5")
    assert lines[1].startswith("hint: use tasks of a world") and "--stages returns,value,advantages,policy" in lines[1]
    assert "Traceback" not in proc.stderr and not out.exists()


# -- the eval stage: an export made elsewhere -----------------------------------------------------------------


def _export(folder: Path, *, state: int, action: int) -> Path:
    from reproduction.recap.policy.config import EXPORT_FORMAT, EXPORT_META

    folder.mkdir(parents=True)
    meta = {
        "format_version": EXPORT_FORMAT,
        "mode": "recap",
        "preset": "tiny",
        "cameras": {},
        "tasks": ["pick"],
        "stats": {"state_mean": [0.0] * state, "action_mean": [0.0] * action},
    }
    (folder / EXPORT_META).write_text(json.dumps(meta))
    return folder


def _eval(tmp_path: Path, monkeypatch, export: Path) -> ConfigError:
    from reproduction.recipes.recap.policy import evaluate_exports
    from reproduction.sim import evaluate as fetch_eval

    def never(*a, **k):
        raise AssertionError("an evaluation started")

    monkeypatch.setattr(fetch_eval, "evaluate_many", never)
    cfg = load_config(overrides=["eval.tasks=[FetchPush-v4]", "eval.episodes_per_task=2", "policy.modes=[recap]"])
    with pytest.raises(ConfigError) as err:
        evaluate_exports(cfg, {"recap": (export, 2)}, tmp_path / "eval", tmp_path, evaluate_libero=never)
    assert err.value.exit_code == 4 and err.value.field == "eval.tasks"
    assert not (tmp_path / "evidence").exists()
    return err.value


def test_an_export_of_a_state_fetch_does_not_give_is_refused_before_any_env(tmp_path, monkeypatch):
    export = _export(tmp_path / "export", state=5, action=4)
    err = _eval(tmp_path, monkeypatch, export)
    assert err.message == (
        f"the recap policy export {export} cannot run on the Fetch tasks of eval.tasks (FetchPush-v4): it was "
        "trained on a state of 5 values where Fetch gives 14 (observation.state 11 + observation.goal 3) (LIBERO "
        "takes a 7-dim action and observes observation.state 8)"
    )
    assert "returns,value,advantages,policy" in err.hint


def test_a_2_dim_action_export_is_not_called_libero(tmp_path, monkeypatch):
    export = _export(tmp_path / "export", state=4, action=2)
    err = _eval(tmp_path, monkeypatch, export)
    assert "trained for LIBERO" not in err.message and "libero_10" not in err.hint
    assert "a 2-dim action where Fetch takes 4" in err.message and "LIBERO takes a 7-dim action" in err.message


def test_the_policy_call_itself_raises_a_sim_error_not_a_bare_value_error():
    from reproduction.recap.policy.export import GuidedPolicy

    policy = SimpleNamespace(meta={}, s_mean=np.zeros(5, np.float32))
    obs = {"task": ["pick"], "observation.state": np.zeros((1, 11)), "observation.goal": np.zeros((1, 3))}
    with pytest.raises(SimError) as err:
        GuidedPolicy._state(policy, obs)
    assert err.value.exit_code == 45
    assert err.value.message == (
        "the policy reads a state of 5 values, but the observations give observation.state + observation.goal: 14 "
        "values"
    )
    policy.meta = {"state_keys": ["observation.state"], "state_dims": [0, 20]}
    with pytest.raises(SimError, match="picks state index 20"):
        GuidedPolicy._state(policy, obs)


# -- GRPO: the SFT demonstrations against the worlds of rl.tasks and eval.tasks --------------------------------


def test_grpo_preflight_refuses_sft_data_the_rollout_world_cannot_serve(tmp_path):
    from reproduction.recipes.grpo.config import GrpoRunConfig
    from reproduction.recipes.grpo.preflight import preflight
    from reproduction.run.config import load_config as load_run_config

    config = REPO / "bundle" / "grpo" / "config.yaml"
    d = _dataset(tmp_path / "robot", state=5, action=4)
    cfg = load_run_config(
        [config], [f"sft.datasets=[{{path: {d}}}]"], bundle=tmp_path, run_dir=tmp_path / "run", schema=GrpoRunConfig
    )

    def found(stages):
        return [p for p in preflight(cfg, tmp_path / "run", {}, stages) if "tasks" in str(p.field)]

    (p,) = found(["sft", "rl", "eval", "compare"])  # one problem per dataset: the rollouts' world first
    assert (type(p), p.exit_code, p.field) == (ConfigError, 4, "rl.tasks")
    assert [q.field for q in found(["sft", "eval"])] == ["eval.tasks"]
    assert found(["sft"]) == []
    assert p.message.startswith(
        "rl.tasks: sft.datasets[0].path (robot) would train the policy on a state of 5 values (observation.state 5) "
        "where Fetch gives 14 (observation.state 11 + observation.goal 3), so the Fetch tasks of rl.tasks ("
    )
    assert "give SFT demonstrations with the state and action of that world" in p.hint


def test_grpo_hint_for_libero_data_names_the_config_layer_that_switches_the_world(tmp_path):
    """review62 S L2: the hint said `rl.tasks=[libero_10/0]`, which was refused twice more when followed (rl.reward,
    then rl and eval in different simulators); bundle/grpo/libero.yaml switches them all."""
    from reproduction.recipes.grpo.config import GrpoRunConfig
    from reproduction.recipes.grpo.preflight import preflight
    from reproduction.run.config import load_config as load_run_config

    d = _dataset(tmp_path / "robot", state=8, action=7)
    cfg = load_run_config(
        [REPO / "bundle" / "grpo" / "config.yaml"],
        [f"sft.datasets=[{{path: {d}}}]"],
        bundle=tmp_path,
        run_dir=tmp_path / "run",
        schema=GrpoRunConfig,
    )
    (p,) = [p for p in preflight(cfg, tmp_path / "run", {}, ["sft", "rl", "eval"]) if "tasks" in str(p.field)]
    assert p.hint.startswith(
        "use LIBERO tasks, whose widths the data have (--config bundle/grpo/libero.yaml over config.yaml; docs/grpo.md"
    ), p.hint
    assert "rl.tasks=[libero_10/0]" not in p.hint
