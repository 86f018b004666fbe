"""Hold labels in stage 3, label quality by kind of frame, and the value model's state input."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from reproduction.errors import ConfigError, InvalidInputError
from reproduction.recap.advantages import AdvantageConfig, DatasetArrays, compute_advantages
from reproduction.recap.labels import dataset_label_report, hold_frames, label_quality, spearman
from reproduction.recap.normalize import ReturnRange

RR = ReturnRange(return_min=-100.0, return_max=0.0)


def test_hold_frames_start_at_first_success_only_in_successful_episodes():
    ep = np.array([0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3])
    ok = np.array([0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 1, 1], bool)
    # ep 0 ends in success: hold from its first success (frame 1) on, even through a lapse.
    # ep 1 touched the goal and left (last row False): nothing holds. ep 2 never succeeded.
    want = [0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1]
    np.testing.assert_array_equal(hold_frames(ep, ok), np.array(want, bool))
    assert hold_frames(np.zeros(0, np.int64), np.zeros(0, bool)).size == 0


def test_flags_that_bool_would_misread_are_refused(tmp_path):
    """audit46 data F1: bool(nan) and bool(0.5) are True; hold labels and label quality take 0/1 or bool only, and
    frame_flags refuses a dataset's NaN flag, naming the frame."""
    from reproduction.data.reader import open_dataset
    from reproduction.data.writer import EpisodeData, write_dataset
    from reproduction.errors import DatasetError
    from reproduction.recap.labels import frame_flags

    ep = np.array([0, 0, 1, 1])
    np.testing.assert_array_equal(hold_frames(ep, np.array([0, 1, 0, 0.0])), [False, True, False, False])
    for flags in (np.array([0, 1, 0, np.nan]), np.array([0, 1, 0, 0.5])):
        with pytest.raises(ValueError, match="^is_success flags must be bool or 0/1; NaN and other values are no"):
            hold_frames(ep, flags)
        with pytest.raises(ValueError, match="^is_success flags must be bool or 0/1"):
            label_quality(np.ones(4, bool), ep, flags, None)
    flag = np.array([0, 0, np.nan], np.float32)
    feats = {"is_success": {"dtype": "float32", "shape": [1]}}
    root = write_dataset(
        tmp_path / "ds", [EpisodeData(episode_index=0, task="t", frames={"is_success": flag})], fps=10, features=feats
    )
    with pytest.raises(DatasetError) as info:
        frame_flags(open_dataset(root), np.zeros(3, np.int64), np.arange(3))
    assert str(info.value) == f"{root}: is_success has 1 NaN values (the first at episode 0 frame 2)"
    assert info.value.exit_code == 40


def _episodes(rng, lengths, success_at):
    """Rows of episodes with -1 rewards; success_at[e] = first success frame (None = failed)."""
    ep = np.repeat(np.arange(len(lengths)), lengths)
    fr = np.concatenate([np.arange(n) for n in lengths])
    ok = np.array([s is not None and f >= s for e, f in zip(ep, fr) for s in [success_at[e]]])
    G = np.concatenate(
        [-(n - 1 - np.arange(n)) + (0.0 if s is not None else -50.0) for n, s in zip(lengths, success_at)]
    )
    r = np.full(ep.size, -1.0)
    return ep, fr, ok, G, r, rng.uniform(-1, 0, ep.size)


def _roll(rng, hold=None):
    ep, fr, ok, G, r, V = _episodes(rng, [30, 30, 30, 30], [10, None, 20, 5])
    arr = DatasetArrays(
        name="roll",
        dataset_type="rollout",
        episode_index=ep,
        frame_index=fr,
        returns=G,
        rewards=r,
        values=V,
        prompts=np.asarray(["pick"] * ep.size, dtype=object),
        fingerprints={"dataset": "f" * 8},
        hold=hold_frames(ep, ok) if hold is None else hold,
    )
    return arr, ok


@pytest.mark.parametrize("scope", ["global", "per_task"])
def test_hold_labels_are_positive_and_left_out_of_the_threshold(tmp_path, scope):
    arr, _ = _roll(np.random.default_rng(0))
    held = arr.hold.copy()
    assert 0 < held.sum() < held.size
    on = AdvantageConfig(lookahead=5, positive_quantile=0.3, tag="h", hold_labels=True, threshold_scope=scope)
    report = compute_advantages([arr], on, RR, out_dirs=[tmp_path / "on"])
    t = pq.read_table(tmp_path / "on" / "advantages_h.parquet")
    a = t.column("advantage_continuous").to_numpy()
    lab = t.column("advantage").to_numpy()
    tau = np.percentile(a[~held], 70)  # the threshold ignores the hold frames
    assert next(iter(report.thresholds.values())) == pytest.approx(tau)
    assert lab[held].all()
    np.testing.assert_array_equal(lab[~held], a[~held] >= tau)
    assert report.positive_fraction["roll"]["all"] == pytest.approx(lab.mean())


def test_hold_labels_off_is_upstreams_rule_even_with_hold_frames_given(tmp_path):
    arr, _ = _roll(np.random.default_rng(1))
    off = AdvantageConfig(lookahead=5, positive_quantile=0.3, tag="x")
    assert off.hold_labels is False  # the default is upstream's behaviour
    report = compute_advantages([arr], off, RR, out_dirs=[tmp_path / "off"])
    t = pq.read_table(tmp_path / "off" / "advantages_x.parquet")
    a = t.column("advantage_continuous").to_numpy()
    assert report.thresholds == {"*": pytest.approx(np.percentile(a, 70))}
    np.testing.assert_array_equal(t.column("advantage").to_numpy(), a >= np.percentile(a, 70))


def test_all_hold_frames_is_refused(tmp_path):
    arr, _ = _roll(np.random.default_rng(2), hold=np.ones(120, bool))
    cfg = AdvantageConfig(lookahead=5, tag="h", hold_labels=True)
    with pytest.raises(Exception, match="every frame is a hold frame"):
        compute_advantages([arr], cfg, RR, out_dirs=[tmp_path / "x"])


def test_label_quality_counts_each_kind_of_frame():
    ep = np.repeat([0, 1, 2], 4)
    ok = np.array([0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1], bool)
    harm = np.array([0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], bool)
    labels = np.array([1, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1], bool)
    q = label_quality(labels, ep, ok, harm)
    # successful: ep 0 (hold 2,3) and ep 2 (hold 11); failed: ep 1. harm frames: 1 and 8.
    assert q["frames"] == {"failed": 4, "hold": 3, "harm": 2, "clean": 3}
    assert q["positive_rate"]["harm"] == 0.0
    assert q["positive_rate"]["clean"] == 1.0  # clean frames: 0, 9, 10
    assert q["positive_rate"]["failed"] == pytest.approx(1 / 4)
    assert q["harm_minus_clean"] == pytest.approx(-1.0)
    no_harm = label_quality(labels, ep, ok, None)
    assert "harm" not in no_harm["frames"] and no_harm["harm_minus_clean"] is None


def test_spearman_averages_ties_and_handles_degenerate_input():
    x = np.array([1.0, 2.0, 2.0, 3.0, 5.0])
    y = np.array([2.0, 1.0, 4.0, 4.0, 9.0])
    ranks_x, ranks_y = [0, 1.5, 1.5, 3, 4], [1, 0, 2.5, 2.5, 4]  # ties share their mean rank
    assert spearman(x, y) == pytest.approx(np.corrcoef(ranks_x, ranks_y)[0, 1])
    assert spearman(np.ones(4), np.arange(4.0)) is None and spearman(np.ones(1), np.ones(1)) is None


def test_dataset_label_report_has_per_fold_spearman():
    ep = np.repeat([0, 1], 5)
    t = pa.table(
        {
            "episode_index": ep,
            "advantage": np.array([1, 0, 1, 0, 1, 0, 0, 1, 1, 1], bool),
            "value_current": np.r_[np.arange(5.0), -np.arange(5.0)],
            "return": np.r_[np.arange(5.0), np.arange(5.0)],
        }
    )
    doc = dataset_label_report(t, None, None, fold=ep)
    assert doc["value_spearman_per_fold"] == {"0": pytest.approx(1.0), "1": pytest.approx(-1.0)}
    assert "positive_rate" not in doc


# -- the value model's state input --------------------------------------------------------------------


def _batch(b=3, state_dim=None):
    gen = torch.Generator().manual_seed(0)
    out = dict(
        images={"base_0_rgb": torch.rand(b, 3, 64, 64, generator=gen) * 2 - 1},
        image_masks={"base_0_rgb": torch.ones(b, dtype=torch.bool)},
        input_ids=torch.randint(4, 100, (b, 5), generator=gen),
        attention_mask=torch.ones(b, 5, dtype=torch.bool),
    )
    if state_dim:
        out["state"] = torch.randn(b, state_dim, generator=gen)
    return out


def test_value_model_reads_its_state_token_and_normalises_it():
    from reproduction.recap.value.model import ValueModelConfig, build_value_model, preset_config

    cfg = preset_config("tiny", vocab_size=100)
    cfg.state_dim, cfg.state_mean, cfg.state_std = 3, (1.0, 2.0, 3.0), (2.0, 2.0, 2.0)
    cfg = ValueModelConfig.from_dict(cfg.to_dict())  # survives the export's JSON round trip
    assert cfg.state_mean == (1.0, 2.0, 3.0)
    model = build_value_model(cfg, seed=0).eval()
    batch = _batch(state_dim=3)
    with torch.no_grad():
        a = model(**batch)
        moved = dict(batch, state=batch["state"] + torch.tensor([0.0, 0.0, 5.0]))
        b = model(**moved)
    assert a.shape == (3, 201) and not torch.allclose(a, b)  # the value depends on the state
    assert "state_proj.weight" in model.state_dict() and "state_mean" not in model.state_dict()
    with pytest.raises(InvalidInputError, match=r"state of shape \(B, 3\)"):
        model(**_batch())
    plain = build_value_model(preset_config("tiny", vocab_size=100), seed=0)
    assert not any(k.startswith("state_") for k in plain.state_dict())  # upstream's layout, unchanged
    with pytest.raises(InvalidInputError, match="has none"):
        plain(**_batch(state_dim=3))
    with pytest.raises(ConfigError, match="state_std"):
        ValueModelConfig.from_dict({**cfg.to_dict(), "state_std": [1.0, 0.0, 1.0]})
    with pytest.raises(ConfigError, match="state_mean has 2 entries"):
        ValueModelConfig.from_dict({**cfg.to_dict(), "state_mean": [1.0, 0.0]})


def test_recap_preset_keeps_no_state_input():
    from reproduction.recap.value.model import preset_config

    assert preset_config("recap").state_dim == 0


def test_value_stage_config_checks_state_dims():
    from reproduction.recap.value.config import ValueConfig

    ok = ValueConfig(state_keys=["observation.state"], state_dims=[0, 1, 2])
    assert ok.state_dims == [0, 1, 2]
    with pytest.raises(ConfigError, match="state_dims"):
        ValueConfig(state_dims=[0])  # no state_keys
    with pytest.raises(ConfigError, match="state_dims"):
        ValueConfig(state_keys=["s"], state_dims=[1, 1])


def _state_dataset(tmp_path):
    from reproduction.data.writer import EpisodeData, write_dataset
    from reproduction.recap.returns import ReturnsConfig, compute_returns

    eps = []
    for e, (n, ok) in enumerate([(6, True), (5, False), (7, True)]):
        state = np.stack([np.arange(n) + 10 * e, -np.arange(n), np.full(n, e)], axis=1).astype(np.float32)
        success = np.zeros(n, bool)
        success[n - 3 :] = ok
        frames = {
            "observation.state": state,
            "observation.goal": np.full((n, 2), e, np.float32),
            "is_success": success,
            "sim.harm": np.arange(n) == 1,
        }
        eps.append(EpisodeData(episode_index=e, task="pick", frames=frames))
    features = {
        "observation.state": {"dtype": "float32", "shape": [3]},
        "observation.goal": {"dtype": "float32", "shape": [2]},
        "is_success": {"dtype": "bool", "shape": [1]},
        "sim.harm": {"dtype": "bool", "shape": [1]},
    }
    root = write_dataset(tmp_path / "ds", eps, fps=10, features=features)
    compute_returns([tmp_path / "ds"], tmp_path / "r", ReturnsConfig(failure_reward=-50.0, dataset_type="rollout"))
    return tmp_path / "ds", tmp_path / "r", root


def test_value_frames_carry_the_selected_state_components_and_flags_align(tmp_path):
    from reproduction.data.reader import open_dataset
    from reproduction.errors import DatasetError
    from reproduction.recap.labels import frame_flags
    from reproduction.recap.value.data import ValueFrames, ValueSource, load_source, read_state, state_stats

    path, returns, _ = _state_dataset(tmp_path)
    src = ValueSource(path=str(path), type="rollout", returns=str(returns))
    keys = ["observation.state", "observation.goal"]
    frames = load_source(src, state_keys=keys, state_dims=[0, 3], episodes=np.array([0, 2]))
    assert frames.state.shape == (13, 2)
    np.testing.assert_array_equal(frames.state[:6, 0], np.arange(6))  # state[0] of episode 0
    np.testing.assert_array_equal(frames.state[6:, 1], np.full(7, 2.0))  # goal[0] of episode 2
    mean, std = state_stats([frames])
    assert len(mean) == 2 and min(std) >= 1e-2
    vf = ValueFrames([frames], cameras={"base_0_rgb": "observation.images.none"}, image_size=64, return_range=RR)
    sample = vf[7]
    assert sample["images"] == {} and sample["state"].tolist() == frames.state[7].tolist()
    assert load_source(src).state is None  # no state_keys: upstream's samples
    ds = open_dataset(path)
    rows = read_state(ds, keys, None, np.array([6, 0]))
    assert rows.shape == (2, 5) and rows[0, 0] == 10.0 and rows[1, 0] == 0.0  # rows in the order given
    with pytest.raises(DatasetError, match="observation.velocity"):
        read_state(ds, ["observation.velocity"], None)
    with pytest.raises(DatasetError, match="state_dims"):
        read_state(ds, keys, [5])
    ep = np.repeat([0, 1, 2], [6, 5, 7])
    fr = np.concatenate([np.arange(6), np.arange(5), np.arange(7)])
    ok, harm = frame_flags(ds, ep, fr)
    assert ok.sum() == 6 and harm.sum() == 3 and harm[1] and harm[7]
    with pytest.raises(DatasetError, match="differ"):
        frame_flags(ds, ep[:-1], fr[:-1])
