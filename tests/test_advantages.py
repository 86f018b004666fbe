"""Stage 3: N-step advantages against a plain per-frame loop; thresholds, sft rule, relabel, sharding."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reproduction.data.reader import open_dataset
from reproduction.data.writer import EpisodeData, write_dataset
from reproduction.errors import CheckpointError, DatasetError, FingerprintMismatchError
from reproduction.recap.advantages import (
    AdvantageConfig,
    DatasetArrays,
    compute_advantages,
    exact_percentile,
    load_dataset_arrays,
    load_return_range,
    nstep_advantages,
    relabel,
)
from reproduction.recap.normalize import ReturnRange
from reproduction.recap.returns import ReturnsConfig, compute_returns, episode_ends
from reproduction.recap.sharding import merge_values, plan_shards, shard_values_table


def reference_episode(G, r, V, N, gamma, discount_next_value, width):
    """Upstream's Phase 2 for one episode, frame by frame."""
    L = len(G)
    out = []
    for t in range(L):
        pad = t + N >= L
        k = min(N, L - t)
        v_next = 0.0 if pad else V[t + N]
        if gamma == 1.0:
            R = G[t] if pad else G[t] - G[t + N]
        else:
            R = sum(gamma**j * r[t + j] for j in range(k))
        g = gamma**k if discount_next_value else 1.0
        out.append((R / width + g * v_next - V[t], R, v_next, k))
    return out


def episode_data(lengths, successes, gamma, failure, rng):
    G, r, V = [], [], []
    for n, ok in zip(lengths, successes):
        rew = [-1.0] * (n - 1) + [0.0 if ok else failure]
        g, ret = 0.0, [0.0] * n
        for t in reversed(range(n)):
            g = rew[t] + gamma * g
            ret[t] = g
        G.append(ret), r.append(rew), V.append(list(rng.uniform(-1, 0, n)))
    return G, r, V


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=10),
    data=st.data(),
    N=st.integers(1, 12),
    gamma=st.sampled_from([1.0, 0.98, 0.9, 0.6]),
    discount=st.booleans(),
    seed=st.integers(0, 2**16),
    by_episode_end=st.booleans(),
)
def test_advantages_match_plain_loop(lengths, data, N, gamma, discount, seed, by_episode_end):
    successes = data.draw(st.lists(st.booleans(), min_size=len(lengths), max_size=len(lengths)))
    rng = np.random.default_rng(seed)
    G, r, V = episode_data(lengths, successes, gamma, -300.0, rng)
    rr = ReturnRange(return_min=-350.0, return_max=0.0)
    row_end = episode_ends(np.repeat(np.arange(len(lengths)) * 7 + 3, lengths))[1]  # non-contiguous ids
    # Either the per-row ends or only the per-episode ends (the fast path stage 3 uses).
    ends = {"episode_end": np.cumsum(lengths)} if by_episode_end else {}
    got = nstep_advantages(
        None if by_episode_end else row_end,
        np.concatenate(G),
        np.concatenate(r),
        np.concatenate(V),
        lookahead=N,
        gamma=gamma,
        discount_next_value=discount,
        return_range=rr,
        **ends,
    )
    want = [x for g_, r_, v_ in zip(G, r, V) for x in reference_episode(g_, r_, v_, N, gamma, discount, rr.width)]
    np.testing.assert_allclose(got["advantage_continuous"], [w[0] for w in want], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(got["reward_sum_raw"], [w[1] for w in want], rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(got["value_next"], [w[2] for w in want])
    np.testing.assert_array_equal(got["num_valid_rewards"], [w[3] for w in want])


@settings(max_examples=15, deadline=None)
@given(
    lengths=st.lists(st.integers(60, 140), min_size=1, max_size=4),
    N=st.integers(65, 150),
    gamma=st.sampled_from([0.99, 0.9]),
    seed=st.integers(0, 2**16),
)
def test_long_lookahead_uses_tails_and_matches_plain_loop(lengths, N, gamma, seed):
    successes = [bool(i % 2) for i in range(len(lengths))]
    G, r, V = episode_data(lengths, successes, gamma, -300.0, np.random.default_rng(seed))
    rr = ReturnRange(return_min=-350.0, return_max=0.0)
    row_end = episode_ends(np.repeat(np.arange(len(lengths)), lengths))[1]
    got = nstep_advantages(
        row_end,
        np.concatenate(G),
        np.concatenate(r),
        np.concatenate(V),
        lookahead=N,
        gamma=gamma,
        discount_next_value=True,
        return_range=rr,
    )
    want = [x for g_, r_, v_ in zip(G, r, V) for x in reference_episode(g_, r_, v_, N, gamma, True, rr.width)]
    np.testing.assert_allclose(got["reward_sum_raw"], [w[1] for w in want], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(got["advantage_continuous"], [w[0] for w in want], rtol=1e-9, atol=1e-9)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(65_536, 120_000),
    kind=st.sampled_from(["normal", "ties", "sorted", "reversed", "constant", "inf"]),
    q=st.floats(0.5, 99.5),
    seed=st.integers(0, 2**16),
)
def test_exact_percentile_is_numpy_percentile_bit_for_bit(n, kind, q, seed):
    rng = np.random.default_rng(seed)
    a = {
        "normal": lambda: rng.normal(size=n),
        "ties": lambda: rng.integers(0, 7, n).astype(float),
        "sorted": lambda: np.sort(rng.normal(size=n)),
        "reversed": lambda: np.sort(rng.normal(size=n))[::-1].copy(),
        "constant": lambda: np.full(n, -0.25),
        "inf": lambda: np.where(rng.random(n) < 0.1, -np.inf, rng.normal(size=n)),
    }[kind]()
    before = a.copy()
    with np.errstate(invalid="ignore"):  # -inf - -inf: numpy says nan, and so must we
        got, want = exact_percentile(a, q), np.percentile(a, q)
    assert got == want or (np.isnan(got) and np.isnan(want))
    np.testing.assert_array_equal(a, before)  # the input is not reordered


def test_exact_percentile_with_nan_is_nan():
    a = np.random.default_rng(0).normal(size=100_000)
    a[5] = np.nan
    assert np.isnan(exact_percentile(a, 70.0))


def test_shortcut_equals_general_case_at_gamma_one():
    rng = np.random.default_rng(0)
    G, r, V = episode_data([40, 7, 1], [True, False, True], 1.0, -300.0, rng)
    row_end = episode_ends(np.repeat([0, 1, 2], [40, 7, 1]))[1]
    args = dict(
        lookahead=5, gamma=1.0, discount_next_value=True, return_range=ReturnRange(return_min=-340, return_max=0)
    )
    a = nstep_advantages(row_end, np.concatenate(G), np.concatenate(r), np.concatenate(V), **args)
    b = nstep_advantages(
        row_end, np.concatenate(G), np.concatenate(r), np.concatenate(V), use_return_shortcut=False, **args
    )
    np.testing.assert_allclose(a["advantage_continuous"], b["advantage_continuous"], atol=1e-12)


def _arrays(name, kind, lengths, successes, rng, prompts=None):
    G, r, V = episode_data(lengths, successes, 1.0, -300.0, rng)
    ep = np.repeat(np.arange(len(lengths)), lengths)
    return DatasetArrays(
        name=name,
        dataset_type=kind,
        episode_index=ep,
        frame_index=np.concatenate([np.arange(n) for n in lengths]),
        returns=np.concatenate(G),
        rewards=np.concatenate(r),
        values=np.concatenate(V),
        prompts=np.asarray(prompts if prompts is not None else [f"task {e % 2}" for e in ep], dtype=object),
        fingerprints={"dataset": name * 4, "returns": "r" * 8},
    )


def test_global_threshold_across_datasets_and_sft_forced_positive(tmp_path):
    rng = np.random.default_rng(3)
    demo = _arrays("demo", "sft", [30, 25], [True, True], rng)
    roll = _arrays("roll", "rollout", [40, 35, 20], [True, False, False], rng)
    cfg = AdvantageConfig(lookahead=5, positive_quantile=0.3, tag="q30")
    report = compute_advantages(
        [demo, roll], cfg, ReturnRange(return_min=-340, return_max=0), out_dirs=[tmp_path / "demo", tmp_path / "roll"]
    )
    a_demo = pq.read_table(tmp_path / "demo" / "advantages_q30.parquet")
    a_roll = pq.read_table(tmp_path / "roll" / "advantages_q30.parquet")
    both = np.concatenate(
        [a_demo.column("advantage_continuous").to_numpy(), a_roll.column("advantage_continuous").to_numpy()]
    )
    tau = np.percentile(both, 70)
    assert report.thresholds == {"*": pytest.approx(tau)}
    assert a_demo.column("advantage").to_numpy().all()  # sft: forced positive
    np.testing.assert_array_equal(
        a_roll.column("advantage").to_numpy(), a_roll.column("advantage_continuous").to_numpy() >= tau
    )
    assert report.positive_fraction["demo"]["all"] == 1.0
    assert report.positive_fraction["roll"]["all"] == pytest.approx(a_roll.column("advantage").to_numpy().mean())
    assert a_roll.column_names == [
        "episode_index",
        "frame_index",
        "advantage_continuous",
        "return",
        "value_current",
        "value_next",
        "reward_sum",
        "reward_sum_raw",
        "num_valid_rewards",
        "dataset_name",
        "advantage",
    ]
    assert a_roll.schema.field("advantage_continuous").type == pa.float64()
    meta = json.loads(pq.read_schema(tmp_path / "roll" / "advantages_q30.parquet").metadata[b"recap_portable"])
    assert meta["dataset_fingerprint"] == "roll" * 4 and meta["returns_fingerprint"] == "r" * 8
    assert meta["return_range"] == {"return_min": -340.0, "return_max": 0.0}
    import yaml

    mix = yaml.safe_load((tmp_path / "roll" / "mixture_config.yaml").read_text())
    assert mix["tags"]["q30"]["unified_threshold"] == pytest.approx(tau) and mix["global_return_min"] == -340.0
    assert [d["name"] for d in mix["datasets"]] == ["demo", "roll"]


def test_per_task_threshold(tmp_path):
    rng = np.random.default_rng(5)
    roll = _arrays("roll", "rollout", [40, 35, 30, 20], [True, False, True, False], rng)
    cfg = AdvantageConfig(lookahead=3, positive_quantile=0.25, threshold_scope="per_task")
    report = compute_advantages([roll], cfg, ReturnRange(return_min=-340, return_max=0), out_dirs=[tmp_path / "o"])
    table = pq.read_table(tmp_path / "o" / "advantages.parquet")
    a = table.column("advantage_continuous").to_numpy()
    for task in ("task 0", "task 1"):
        sel = roll.prompts == task
        assert report.thresholds[task] == pytest.approx(np.percentile(a[sel], 75))
        np.testing.assert_array_equal(table.column("advantage").to_numpy()[sel], a[sel] >= np.percentile(a[sel], 75))


HEAD = {
    "format_version": 1,
    "return_range": {"return_min": -120.0, "return_max": 0.0},
    "num_bins": 201,
    "v_min": -1.0,
    "v_max": 0.0,
    "model_config": {},
    "fold": 0,
}


def test_return_range_comes_from_the_value_export_head(tmp_path):
    from reproduction.errors import InputNotFoundError, UnsupportedFormatError
    from reproduction.recap import advantages

    export = tmp_path / "model_0" / "export"
    export.mkdir(parents=True)
    (export / "value_head.json").write_text(json.dumps(HEAD))
    rr, fp = load_return_range(export)
    assert rr == ReturnRange(return_min=-120.0, return_max=0.0)
    assert fp == __import__("hashlib").sha256((export / "value_head.json").read_bytes()).hexdigest()
    with pytest.raises(InputNotFoundError, match=r"value checkpoint .*model_0 holds no value_head.json") as info:
        load_return_range(tmp_path / "model_0")  # the fold folder, not its export
    assert "model_<k>/export" in info.value.hint
    with pytest.raises(InputNotFoundError, match="does not exist"):
        load_return_range(tmp_path / "nowhere")
    no_v_max = {k: v for k, v in HEAD.items() if k != "v_max"}
    for doc, error, message in [
        ({**HEAD, "format_version": 3}, UnsupportedFormatError, r"format_version 3 is not one of \[1, 2\]"),
        ({**HEAD, "return_range": {"return_min": -120.0}}, CheckpointError, r"field return_range.return_max is None"),
        (
            {**HEAD, "return_range": {"return_min": "x", "return_max": 0}},
            CheckpointError,
            "return_range.return_min is 'x'",
        ),
        ({**HEAD, "return_range": {"return_min": 0.0, "return_max": 0.0}}, CheckpointError, "return range .* is empty"),
        (no_v_max, CheckpointError, "field v_max is missing"),
    ]:
        (export / "value_head.json").write_text(json.dumps(doc))
        with pytest.raises(error, match=message) as info:
            load_return_range(export)
        assert str(export / "value_head.json") in str(info.value)
    (export / "value_head.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="value_head.json: not JSON"):
        load_return_range(export)
    # the names mirror the value stage's writer (kept apart only so stage 3 does not import torch)
    from reproduction.recap.value.task import EXPORT_FORMAT, HEAD_NAME

    assert (advantages.VALUE_HEAD_NAME, advantages.VALUE_HEAD_FORMAT) == (HEAD_NAME, EXPORT_FORMAT)


def test_sharding_infers_every_frame_once_and_merges(tmp_path):
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 60, size=40)
    ep = np.repeat(np.sort(rng.choice(10_000, size=40, replace=False)), lengths)
    fr = np.concatenate([np.arange(n) for n in lengths])
    row_end = episode_ends(ep)[1]
    values = rng.uniform(-1, 0, ep.size)
    N = 8
    for world in (1, 2, 3, 7):
        plan = plan_shards(row_end, world, N)
        owned = np.zeros(ep.size, int)
        parts = []
        for shard in plan:
            calls = np.zeros(ep.size, int)
            np.add.at(calls, np.arange(shard.start, shard.infer_stop), 1)  # one forward per inferred frame
            assert calls.max(initial=0) <= 1
            owned[shard.owned] += 1
            local = values[shard.inferred]  # the shard's own inference
            idx = np.arange(shard.start, shard.stop)
            need = idx[idx + N < row_end[idx]] + N  # every V(t+N) an owned row needs is local
            assert (need < shard.infer_stop).all()
            assert shard.infer_stop <= max(shard.stop, row_end[shard.stop - 1] if shard.stop > shard.start else 0)
            parts.append(shard_values_table(ep, fr, local, shard))
        assert (owned == 1).all()
        merged = merge_values(parts[::-1])  # order of arrival does not matter
        np.testing.assert_array_equal(merged.column("value").to_numpy(), values)
    with pytest.raises(DatasetError, match="merging value shards: episode .* appears more than once") as info:
        merge_values([parts[0], parts[0]])
    assert info.value.hint == "two shards inferred the same frame"


FEATURES = {"observation.state": {"dtype": "float32", "shape": [2]}, "is_success": {"dtype": "bool", "shape": [1]}}


def _dataset(tmp_path, name, spec):
    rng = np.random.default_rng(11)
    eps = [
        EpisodeData(
            episode_index=e,
            task=f"task {e % 2}",
            frames={"observation.state": rng.normal(size=(n, 2)).astype(np.float32), "is_success": np.full(n, ok)},
        )
        for e, n, ok in spec
    ]
    return write_dataset(tmp_path / name, eps, fps=10, features=FEATURES, allow_id_gaps=True)  # ids as spec gives


def test_compute_then_relabel_both_modes(tmp_path):
    root = _dataset(tmp_path, "roll", [(1, 30, True), (4, 25, False), (6, 33, True)])
    run = tmp_path / "run"
    compute_returns([root], run, ReturnsConfig(dataset_type="rollout", tag="f300"))
    frames = open_dataset(root).frame_table(["episode_index", "frame_index"])
    rng = np.random.default_rng(0)
    values = frames.append_column("value", pa.array(rng.uniform(-1, 0, frames.num_rows)))
    pq.write_table(values.take(pa.array(rng.permutation(frames.num_rows))), tmp_path / "values.parquet")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "value_head.json").write_text(
        json.dumps({**HEAD, "return_range": {"return_min": -340.0, "return_max": 0.0}})
    )
    inputs = [load_dataset_arrays(root, run, tmp_path / "values.parquet", dataset_type="rollout", returns_tag="f300")]
    compute_advantages(
        inputs, AdvantageConfig(tag="n5", lookahead=5, returns_tag="f300"), ckpt, out_dirs=[run / "roll"]
    )
    first = pq.read_table(run / "roll" / "advantages_n5.parquet")
    assert abs(first.column("advantage").to_numpy().mean() - 0.3) < 0.02
    # threshold-only relabel keeps the continuous scores, changes the labels
    rel = relabel(
        [root], run, source_tag="n5", config=AdvantageConfig(tag="q50", positive_quantile=0.5), recompute=False, out=run
    )
    q50 = pq.read_table(run / "roll" / "advantages_q50.parquet")
    np.testing.assert_array_equal(
        q50.column("advantage_continuous").to_numpy(), first.column("advantage_continuous").to_numpy()
    )
    assert rel.thresholds["*"] == pytest.approx(np.median(first.column("advantage_continuous").to_numpy()))
    # recompute with the same N from stored values reproduces stage 3 exactly; a new N differs
    relabel(
        [root],
        run,
        source_tag="n5",
        config=AdvantageConfig(tag="again", lookahead=5, returns_tag="f300"),
        recompute=True,
        out=run,
    )
    again = pq.read_table(run / "roll" / "advantages_again.parquet")
    np.testing.assert_allclose(
        again.column("advantage_continuous").to_numpy(), first.column("advantage_continuous").to_numpy()
    )
    relabel(
        [root],
        run,
        source_tag="n5",
        config=AdvantageConfig(tag="n2", lookahead=2, returns_tag="f300"),
        recompute=True,
        out=run,
    )
    assert pq.read_table(run / "roll" / "advantages_n2.parquet").column("num_valid_rewards").to_numpy().max() == 2
    # sft rule survives relabel; data parquets are never rewritten
    before = sorted((p, p.stat().st_mtime_ns) for p in (root / "data").rglob("*.parquet"))
    relabel([root], run, source_tag="n5", config=AdvantageConfig(tag="sft"), recompute=False, out=run, types=["sft"])
    assert pq.read_table(run / "roll" / "advantages_sft.parquet").column("advantage").to_numpy().all()
    assert sorted((p, p.stat().st_mtime_ns) for p in (root / "data").rglob("*.parquet")) == before
    # a refiltered dataset under the same name is refused
    other = _dataset(tmp_path / "x", "roll", [(1, 30, True), (6, 33, True)])
    with pytest.raises(FingerprintMismatchError, match=open_dataset(other).fingerprint):
        relabel([other], run, source_tag="n5", config=AdvantageConfig(tag="z"), recompute=False, out=run)


def test_values_that_do_not_cover_the_sidecar_are_refused(tmp_path):
    root = _dataset(tmp_path, "roll", [(0, 5, True)])
    compute_returns([root], tmp_path / "run", ReturnsConfig(dataset_type="rollout"))
    from reproduction.recap.advantages import load_dataset_arrays

    short = pa.table({"episode_index": [0] * 4, "frame_index": [0, 1, 2, 3], "value": [0.0] * 4})
    with pytest.raises(DatasetError, match=r"frame \(0, 4\) has no value \(4 values, 5 frames\)"):
        load_dataset_arrays(root, tmp_path / "run", short, dataset_type="rollout", returns_tag=None)
    extra = pa.table({"episode_index": [0] * 6, "frame_index": [5, 0, 1, 2, 3, 4], "value": [0.0] * 6})
    with pytest.raises(DatasetError, match=r"value for unknown frame \(0, 5\) \(6 values, 5 frames\)"):
        load_dataset_arrays(root, tmp_path / "run", extra, dataset_type="rollout", returns_tag=None)
    other = pa.table({"episode_index": [0] * 4 + [3], "frame_index": [0, 1, 2, 3, 0], "value": [0.0] * 5})
    with pytest.raises(DatasetError, match=r"frame \(0, 4\) has no value"):
        load_dataset_arrays(root, tmp_path / "run", other, dataset_type="rollout", returns_tag=None)


def test_streamed_inputs_chunk_at_episode_ends_and_equal_the_in_memory_path(tmp_path):
    from reproduction.recap.advantage_inputs import DatasetArrays as Arrays
    from reproduction.recap.advantage_inputs import strings

    root = _dataset(tmp_path, "roll", [(1, 30, True), (4, 25, False), (6, 3, True), (9, 41, False), (12, 8, True)])
    run = tmp_path / "run"
    compute_returns([root], run, ReturnsConfig(dataset_type="rollout"))
    frames = open_dataset(root).frame_table(["episode_index", "frame_index"])
    rng = np.random.default_rng(2)
    values = frames.append_column("value", pa.array(rng.uniform(-1, 0, frames.num_rows)))
    pq.write_table(values.take(pa.array(rng.permutation(frames.num_rows))), tmp_path / "values.parquet")
    streamed = load_dataset_arrays(root, run, tmp_path / "values.parquet", dataset_type="rollout", returns_tag=None)
    streamed.chunk_rows = 20  # smaller than two of the episodes
    chunks = list(streamed.chunks())
    assert [c.num_rows for c in chunks] == [30, 25 + 3, 41, 8]  # whole episodes; a long one comes whole
    assert [np.unique(c.episode_index).tolist() for c in chunks] == [[1], [4, 6], [9], [12]]
    ret = pq.read_table(run / "roll" / "returns.parquet")
    whole = Arrays(
        name="roll",
        dataset_type="rollout",
        episode_index=ret.column("episode_index").to_numpy(),
        frame_index=ret.column("frame_index").to_numpy(),
        returns=ret.column("return").to_numpy().astype(float),
        rewards=ret.column("reward").to_numpy().astype(float),
        values=streamed.values,
        prompts=strings(ret.column("prompt")),
        fingerprints=streamed.fingerprints,
        returns_gamma=1.0,
    )
    np.testing.assert_array_equal(
        np.concatenate([c.values for c in chunks]),
        values.sort_by([("episode_index", "ascending"), ("frame_index", "ascending")]).column("value").to_numpy(),
    )
    cfg = AdvantageConfig(lookahead=7, threshold_scope="per_task", tag="s")
    rr = ReturnRange(return_min=-340, return_max=0)
    a = compute_advantages([streamed], cfg, rr, out_dirs=[tmp_path / "streamed"])
    b = compute_advantages([whole], cfg, rr, out_dirs=[tmp_path / "memory"])
    assert a.thresholds == b.thresholds and a.positive_fraction == b.positive_fraction
    ta, tb = (
        pq.read_table(tmp_path / "streamed" / "advantages_s.parquet"),
        pq.read_table(tmp_path / "memory" / "advantages_s.parquet"),
    )
    assert ta.equals(tb) and ta.num_rows == 107
    assert (
        pq.ParquetFile(tmp_path / "streamed" / "advantages_s.parquet").metadata.num_row_groups == 1
    )  # chunks gathered


def test_return_range_reads_what_the_value_stage_exports(tmp_path):
    from value_synth import CAMERA, write_value_dataset

    from reproduction.recap.value.data import ValueSource
    from reproduction.recap.value.task import ValueConfig, prepare_value_setup, write_export_extras

    runs = write_value_dataset(tmp_path / "ds", episodes=4, seed=2)
    config = ValueConfig(cameras={"base_0_rgb": CAMERA}, folds=2, fold_seed=1)
    sources = [ValueSource(path=str(tmp_path / "ds"), type="rollout", returns=str(runs))]
    setup = prepare_value_setup(config, tmp_path / "value", sources=sources)
    export = tmp_path / "value" / "model_1" / "export"
    export.mkdir(parents=True)
    write_export_extras(export, setup=setup, fold=1)  # value_head.json exactly as value training writes it
    rr, fp = load_return_range(export)
    assert rr == setup.return_range and rr.return_max == 0.0 and len(fp) == 64


def test_kept_and_streamed_second_pass_write_the_same_sidecar(tmp_path, monkeypatch):
    """Small inputs keep the first pass's chunks for the second; large ones are read twice: same file."""
    import reproduction.recap.advantages as adv

    root = _dataset(tmp_path, "roll", [(1, 30, True), (4, 25, False), (6, 3, True), (9, 41, False), (12, 8, True)])
    run = tmp_path / "run"
    compute_returns([root], run, ReturnsConfig(dataset_type="rollout"))
    frames = open_dataset(root).frame_table(["episode_index", "frame_index"])
    values = frames.append_column("value", pa.array(np.random.default_rng(3).uniform(-1, 0, frames.num_rows)))
    pq.write_table(values, tmp_path / "values.parquet")
    cfg = AdvantageConfig(lookahead=5, tag="k")
    rr = ReturnRange(return_min=-340, return_max=0)
    out = {}
    real = adv.nstep_advantages
    for name, keep_rows in (("kept", 1 << 21), ("streamed", 0)):
        monkeypatch.setattr(adv, "KEEP_ROWS", keep_rows)
        inputs = load_dataset_arrays(root, run, tmp_path / "values.parquet", dataset_type="rollout", returns_tag=None)
        inputs.chunk_rows = 20
        calls = []
        monkeypatch.setattr(adv, "nstep_advantages", lambda *a, **k: calls.append(1) or real(*a, **k))
        compute_advantages([inputs], cfg, rr, out_dirs=[tmp_path / name])
        out[name] = (pq.read_table(tmp_path / name / "advantages_k.parquet"), len(calls))
    assert out["kept"][0].equals(out["streamed"][0])
    assert out["streamed"][1] == 2 * out["kept"][1] == 8  # 4 chunks, computed once when kept
