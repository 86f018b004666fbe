"""Stage 4 end to end on CPU: training through the core, bit-identical resume, export + load_policy, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from reproduction.errors import CheckpointError, DatasetError, FingerprintMismatchError, GuidanceScaleError
from reproduction.recap.policy.config import PolicyConfig
from reproduction.recap.policy.data import PolicySource, build_arrays, open_policy_input
from reproduction.recap.policy.export import PolicyFactory, load_policy
from reproduction.recap.policy.task import train_policy
from reproduction.train.config import TrainConfig
from tests.policy_synth import CAMERA, TASK, write_labels, write_policy_dataset


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("policy")
    ds = write_policy_dataset(root / "rollouts", episodes=12, length=10)
    adv = write_labels(ds, root / "adv", tag="t")
    demos = write_policy_dataset(root / "demos", episodes=4, length=10, seed=3, success=False)
    return {"ds": ds, "adv": adv, "demos": demos, "root": root}


def _inputs(data, *, need_labels=True):
    src = PolicySource(path=str(data["ds"]), type="rollout", advantages=str(data["adv"]), tag="t")
    demo = PolicySource(path=str(data["demos"]), type="sft")
    return [open_policy_input(src, need_labels=need_labels), open_policy_input(demo, need_labels=False)]


def _config(steps: int, mode: str = "recap", **over) -> dict:
    """train_policy's config, mode and train (keywords)."""
    train = TrainConfig(max_steps=steps, global_batch=8, micro_batch=4, launcher="inprocess", lr=1e-3, save_interval=3)
    return {"config": PolicyConfig(**{"condition_dropout": 0.3, **over}), "mode": mode, "train": train}


def test_labels_join_by_episode_and_frame_and_sft_is_positive(data):
    rollouts, demos = _inputs(data)
    assert rollouts.labels.tolist() == (((rollouts.episode - 2) // 3) % 2 == 0).tolist()
    arrays, summary = build_arrays([rollouts, demos], mode="recap", chunk=4, hold_labels=False)
    assert arrays.label[arrays.source == 1].all()
    assert summary["datasets"]["rollouts"]["successful_episodes"] == 6
    # chunks stay inside their episode: the last frame repeats its own action
    last = np.flatnonzero((arrays.source == 0) & (arrays.frame == 9))
    assert (arrays.chunk[last] == arrays.chunk[last][:, :1]).all()
    filtered, _ = build_arrays([rollouts, demos], mode="filtered_bc", chunk=4)
    assert len(filtered) == 6 * 10 + 4 * 10


def test_a_missing_label_and_a_rollout_without_is_success_are_one_line_errors(data, tmp_path):
    adv = write_labels(data["ds"], tmp_path / "adv", tag="t", drop=3)
    src = PolicySource(path=str(data["ds"]), type="rollout", advantages=str(adv), tag="t")
    with pytest.raises(DatasetError, match=r"episode 35 frame 7 has no advantage label .* 3 frames unlabelled") as e:
        open_policy_input(src, need_labels=True)
    assert e.value.exit_code == 40 and "\n" not in str(e.value)
    bad = PolicySource(path=str(data["demos"]), type="rollout")
    with pytest.raises(DatasetError, match="has no is_success column") as e:
        open_policy_input(bad, need_labels=False)
    assert e.value.exit_code == 40 and e.value.hint.endswith("sft counts every episode as a success, failed ones too")


def test_a_sidecar_of_another_dataset_version_is_refused(data, tmp_path):
    other = write_policy_dataset(tmp_path / "rollouts", episodes=12, length=10, seed=9)
    src = PolicySource(path=str(other), type="rollout", advantages=str(data["adv"]), tag="t")
    with pytest.raises(FingerprintMismatchError):
        open_policy_input(src, need_labels=True)


@pytest.mark.slow
def test_training_resumes_bit_identically_and_the_export_loads(data, tmp_path):
    straight = train_policy(_inputs(data), out_dir=tmp_path / "a", **_config(6))
    train_policy(_inputs(data), out_dir=tmp_path / "b", **_config(3))
    resumed = train_policy(_inputs(data), out_dir=tmp_path / "b", **_config(6), resume=True)
    assert resumed.resumed_from == 3 and straight.step == resumed.step == 6
    from safetensors.torch import load_file

    a = load_file(str(straight.export_dir / "model.safetensors"))
    b = load_file(str(resumed.export_dir / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rec = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    rec_b = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["metrics"]["loss"] for r in rec if r.get("split") == "train"}
    losses_b = {r["step"]: r["metrics"]["loss"] for r in rec_b if r.get("split") == "train"}
    assert losses == losses_b and len(losses) == 6

    meta = json.loads((straight.export_dir / "policy.json").read_text())
    assert meta["mode"] == "recap" and meta["preset"] == "tiny" and meta["chunk"] == 4
    rollouts = _inputs(data)[0]
    obs = {
        "observation.state": rollouts.state[:5, :5],
        "observation.goal": rollouts.state[:5, 5:],
        "task": [TASK] * 5,
    }
    pol = load_policy(straight.export_dir, guidance_scale=2.0)
    out = pol(obs)
    assert out.shape == (5, 4, 4) and out.dtype == np.float32 and np.isfinite(out).all()
    assert pol.forward_passes == 1  # conditional + unconditional in one batched pass
    # the action depends on the observation only: not on batch neighbours or the call order
    again = pol({k: v[2:4] for k, v in obs.items()})
    assert np.allclose(again, out[2:4], atol=1e-5)
    w1 = PolicyFactory(str(straight.export_dir), guidance_scale=1.0)()
    assert not w1.uses_guidance and w1(obs).shape == (5, 4, 4)


@pytest.mark.slow
def test_guidance_uses_one_batched_expert_pass_and_w1_skips_the_unconditional_half(data, tmp_path, monkeypatch):
    res = train_policy(_inputs(data), out_dir=tmp_path / "g", **_config(2))
    rollouts = _inputs(data)[0]
    obs = {"observation.state": rollouts.state[:3, :5], "observation.goal": rollouts.state[:3, 5:], "task": [TASK] * 3}
    for w, rows in ((1.0, 3), (0.0, 6), (2.5, 6)):
        pol = load_policy(res.export_dir, guidance_scale=w, num_steps=4)
        seen = []
        real = pol.model.velocity
        monkeypatch.setattr(pol.model, "velocity", lambda c, x, t, real=real: seen.append(x.shape[0]) or real(c, x, t))
        pol(obs)
        assert seen == [rows] * 4  # one expert call per Euler step, 2B rows when guiding
    # the guided velocity is (1 - w) v_uncond + w v_cond of the two halves
    pol = load_policy(res.export_dir, guidance_scale=2.5, num_steps=1)
    batch = pol.batch(obs, [1, 1, 1, 0, 0, 0])
    with torch.no_grad():
        cache = pol.model.prefix_cache(*pol.model.encode_prefix(batch), batch["state"])
        noise = pol.noise(pol._state(obs))
        v = pol.model.velocity(cache, torch.cat([noise, noise]), torch.ones(6))
    want = noise - (-1.5 * v[3:] + 2.5 * v[:3])
    got = (pol(obs) - pol.a_mean) / pol.a_std
    assert np.allclose(got, want.numpy(), atol=1e-5)


def test_bad_guidance_and_another_preset_are_refused_before_loading(data, tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    (export / "policy.json").write_text(json.dumps({"format_version": 1, "mode": "recap", "preset": "tiny"}))
    with pytest.raises(GuidanceScaleError, match="below 0") as e:
        load_policy(export, guidance_scale=-0.5)
    assert e.value.exit_code == 53
    with pytest.raises(CheckpointError, match="a 'tiny' policy export, but the config asks for preset 'pi05'"):
        load_policy(export, guidance_scale=1.0, expect_preset="pi05")
    (export / "policy.json").write_text(json.dumps({"format_version": 1, "mode": "bc", "preset": "tiny"}))
    with pytest.raises(GuidanceScaleError, match="no advantage conditioning"):
        load_policy(export, guidance_scale=2.0)


@pytest.mark.slow
def test_resume_refuses_another_preset_or_mode_and_writes_nothing(data, tmp_path):
    out = tmp_path / "r"
    train_policy(_inputs(data), out_dir=out, **_config(3))
    before = (out / "policy_setup.json").read_bytes()
    with pytest.raises(CheckpointError, match="mode 'recap' -> 'bc'"):
        train_policy(_inputs(data), out_dir=out, **_config(6, mode="bc"), resume=True)
    with pytest.raises(CheckpointError, match="already holds checkpoints"):
        train_policy(_inputs(data), out_dir=out, **_config(6))
    assert (out / "policy_setup.json").read_bytes() == before


@pytest.mark.slow
def test_the_image_path_trains_and_samples(tmp_path):
    ds = write_policy_dataset(tmp_path / "cams", episodes=4, length=6, camera=True)
    inp = open_policy_input(PolicySource(path=str(ds), type="rollout"), need_labels=False)
    cfg = _config(2, mode="bc", cameras={"agentview": CAMERA}, image_size=32)
    res = train_policy([inp], out_dir=tmp_path / "run", **cfg)
    assert np.isfinite(res.train_metrics["loss"])
    pol = load_policy(res.export_dir, guidance_scale=1.0)
    obs = {
        "observation.state": inp.state[:2, :5],
        "observation.goal": inp.state[:2, 5:],
        CAMERA: np.zeros((2, 32, 32, 3), np.uint8),
        "task": [TASK] * 2,
    }
    assert pol(obs).shape == (2, 4, 4)


def test_a_camera_policy_is_evaluated_on_fetch_with_its_cameras_and_refuses_blind_observations(tmp_path, monkeypatch):
    """The Fetch evaluation renders the cameras the export reads, at its resolution (it rendered none, and the policy
    masked the missing frames: a camera policy was evaluated blind); a policy given no frame refuses."""
    from reproduction.errors import ConfigError
    from reproduction.recipes.recap.config import load_config
    from reproduction.recipes.recap.policy import evaluate_exports
    from reproduction.sim.evaluate import EvalConfig
    from reproduction.sim.generate import GenConfig, generate_dataset

    ds = tmp_path / "fetch"  # Fetch's own observations (state 11 + goal 3) with the agentview camera at 32 px
    gen = GenConfig(kind="sft", tasks=("FetchPush-v4",), episodes_per_task=2, cameras=("agentview",), image_size=32)
    generate_dataset(gen, ds)
    inp = open_policy_input(PolicySource(path=str(ds), type="sft"), need_labels=False)
    run = tmp_path / "run"
    cfg = _config(2, mode="bc", cameras={"agentview": CAMERA}, image_size=32)
    res = train_policy([inp], out_dir=run / "policy" / "bc", **cfg)
    pol = load_policy(res.export_dir, guidance_scale=1.0)
    obs = {"observation.state": inp.state[:2, :11], "observation.goal": inp.state[:2, 11:], "task": [TASK] * 2}
    with pytest.raises(
        ConfigError, match=r"reads camera\(s\) observation.images.agentview, which the observations lack"
    ):
        pol(obs)
    import reproduction.sim.evaluate as sim_evaluate

    seen: list[EvalConfig] = []
    real_many = sim_evaluate.evaluate_many

    def evaluate_many(jobs, ui=None, killed_hint=None):
        seen.extend(job.config for job in jobs)
        return real_many(jobs, ui=ui, killed_hint=killed_hint)

    config = load_config(
        overrides=["eval.tasks=[FetchPush-v4]", "eval.episodes_per_task=2", "eval.videos=0", "policy.modes=[bc]"]
    )
    monkeypatch.setattr(sim_evaluate, "evaluate_many", evaluate_many)
    out = evaluate_exports(config, {"bc": (res.export_dir, 2)}, run / "eval", run)
    assert [(c.cameras, c.image_size) for c in seen] == [(("agentview",), 32)]
    assert out.summary["results"]["bc"]["tasks"]["FetchPush-v4"]["episodes"] == 2


def test_the_eval_stage_executes_the_configs_execute_steps_not_the_exports(tmp_path, monkeypatch):
    """audit62 K (fixer): policy.model.execute_steps keys the eval stage (same_outputs() for the policy stage), so
    the evaluation runs the config's value; it ran the export's policy.json value, the one the policy stage trained
    with, so `--restart-stage eval policy.model.execute_steps=1` recorded 1 and executed 2."""
    import reproduction.sim.evaluate as sim_evaluate
    from reproduction.recipes.recap.config import load_config
    from reproduction.recipes.recap.policy import evaluate_exports
    from reproduction.sim.generate import GenConfig, generate_dataset

    ds = tmp_path / "fetch"
    generate_dataset(GenConfig(kind="sft", tasks=("FetchPush-v4",), episodes_per_task=2, cameras=()), ds)
    inp = open_policy_input(PolicySource(path=str(ds), type="sft"), need_labels=False)
    run = tmp_path / "run"
    res = train_policy([inp], out_dir=run / "policy" / "bc", **_config(1, mode="bc", execute_steps=2))
    assert json.loads((res.export_dir / "policy.json").read_text())["execute_steps"] == 2
    seen = []
    real_many = sim_evaluate.evaluate_many

    def evaluate_many(jobs, ui=None, killed_hint=None):
        seen.extend(job.config.execute_steps for job in jobs)
        return real_many(jobs, ui=ui, killed_hint=killed_hint)

    monkeypatch.setattr(sim_evaluate, "evaluate_many", evaluate_many)
    over = ["eval.tasks=[FetchPush-v4]", "eval.episodes_per_task=1", "eval.videos=0", "policy.modes=[bc]"]
    config = load_config(overrides=[*over, "policy.model.execute_steps=1"])
    evaluate_exports(config, {"bc": (res.export_dir, 1)}, run / "eval", run)
    assert seen == [1]
    # `portable eval --checkpoint` (eval_cmd) runs an export as its policy.json says, as at fc528c2 (review62 S M1:
    # an export trained with 4 was evaluated with the run config's default 2, and the override was refused)
    evaluate_exports(config, {"bc": (res.export_dir, 1)}, run / "eval2", run, export_execute_steps=True)
    assert seen == [1, 2]
