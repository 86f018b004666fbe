"""Stage 1: vectorised returns against a plain per-frame loop; ordering, refusals, `portable run`, sidecars."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reproduction.data.reader import open_dataset
from reproduction.data.writer import EpisodeData, write_dataset
from reproduction.errors import DatasetError, FingerprintMismatchError, InputNotFoundError
from reproduction.recap.returns import (
    ReturnsConfig,
    compute_returns,
    compute_returns_table,
    discounted_reverse_cumsum,
    sort_frames,
    sorted_bounds,
)
from reproduction.recap.sidecars import read_returns, sidecar_meta, writer_options

FEATURES = {"observation.state": {"dtype": "float32", "shape": [2]}, "is_success": {"dtype": "bool", "shape": [1]}}


def reference_returns(lengths: dict[int, int], success: dict[int, bool], gamma: float, failure_reward: float):
    """Plain loops, as upstream: {(episode, frame): (return, reward)}."""
    out = {}
    for ep, length in lengths.items():
        rewards = []
        for t in range(length):
            if t < length - 1:
                rewards.append(-1.0)
            else:
                rewards.append(0.0 if success[ep] else failure_reward)
        g = 0.0
        for t in reversed(range(length)):
            g = rewards[t] + gamma * g
            out[(ep, t)] = (g, rewards[t])
    return out


def frames_table(lengths, success, rng, *, shuffle=True):
    ep = np.concatenate([np.full(n, e) for e, n in lengths.items()]).astype(np.int64)
    fr = np.concatenate([np.arange(n) for n in lengths.values()]).astype(np.int64)
    ok = np.concatenate([np.full(n, success[e]) for e, n in lengths.items()])
    order = rng.permutation(ep.size) if shuffle else np.arange(ep.size)
    return pa.table(
        {"episode_index": ep[order], "frame_index": fr[order], "is_success": ok[order], "task_index": (ep[order] % 3)}
    )


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=12),
    ids=st.lists(st.integers(0, 10_000), min_size=12, max_size=12, unique=True),
    successes=st.lists(st.booleans(), min_size=12, max_size=12),
    gamma=st.sampled_from([1.0, 0.99, 0.9, 0.5]),
    failure=st.sampled_from([-300.0, -50.0, -1.0]),
    kind=st.sampled_from(["sft", "rollout"]),
    seed=st.integers(0, 2**16),
)
def test_returns_match_plain_loop(lengths, ids, successes, gamma, failure, kind, seed):
    lens = {ids[i]: n for i, n in enumerate(lengths)}
    succ = {ids[i]: (successes[i] or kind == "sft") for i in range(len(lengths))}
    table = frames_table(
        lens, {e: successes[i] for i, e in enumerate(ids[: len(lengths)])}, np.random.default_rng(seed)
    )
    out = compute_returns_table(
        table, ReturnsConfig(gamma=gamma, failure_reward=failure, dataset_type=kind), tasks={0: "a", 1: "b", 2: "c"}
    )
    ref = reference_returns(lens, succ, gamma, failure)
    ep, fr = out.column("episode_index").to_numpy(), out.column("frame_index").to_numpy()
    assert list(zip(ep.tolist(), fr.tolist())) == sorted(ref)  # sorted by (episode, frame)
    np.testing.assert_allclose(out.column("return").to_numpy(), [ref[k][0] for k in sorted(ref)], rtol=1e-6, atol=1e-4)
    np.testing.assert_array_equal(out.column("reward").to_numpy(), [ref[k][1] for k in sorted(ref)])
    assert out.column("prompt").to_pylist() == [["a", "b", "c"][e % 3] for e in ep.tolist()]
    assert out.schema.field("return").type == pa.float32() and out.schema.field("episode_index").type == pa.int64()


def test_long_episode_small_gamma_is_stable():
    n = 5000
    rewards = np.full(n, -1.0)
    rewards[-1] = -300.0
    ends = np.full(n, n)
    got = discounted_reverse_cumsum(rewards, ends, 0.9)
    want, g = np.empty(n), 0.0
    for t in reversed(range(n)):
        g = rewards[t] + 0.9 * g
        want[t] = g
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert np.isfinite(got).all() and got[0] == pytest.approx(-10.0, abs=1e-9)


def test_sort_frames_says_none_for_sorted_rows_and_sorts_the_rest():
    ep = np.array([3, 3, 3, 8, 8, 20], np.int64)
    fr = np.array([0, 2, 9, 0, 1, 4], np.int64)  # non-contiguous ids and frames, sorted
    order, starts, ends = sorted_bounds(ep, fr)
    assert order is None and starts.tolist() == [0, 3, 5] and ends.tolist() == [3, 5, 6]
    assert sort_frames(ep[:1], fr[:1]) is None and sort_frames(ep[:0], fr[:0]) is None
    for e, f in [
        ([0, 0, 0], [0, 2, 1]),  # a frame goes back inside an episode
        ([1, 1, 0], [0, 1, 0]),  # episodes out of order
        ([0, 1, 0], [0, 0, 1]),
    ]:  # an episode split in two runs
        e, f = np.array(e, np.int64), np.array(f, np.int64)
        order, starts, ends = sorted_bounds(e, f)
        keys = list(zip(e[order].tolist(), f[order].tolist()))
        assert keys == sorted(zip(e.tolist(), f.tolist()))
        assert np.array_equal(np.diff(np.concatenate([starts, [e.size]])) > 0, np.ones(starts.size, bool))
        assert (e[order][starts] != np.concatenate([[-1], e[order][starts[:-1]]])).all() and ends[-1] == e.size
    with pytest.raises(DatasetError, match="episode 0 frame 1 appears more than once"):
        sort_frames(np.array([0, 0, 1], np.int64), np.array([1, 1, 0], np.int64))  # sorted-looking duplicate


def test_duplicate_frames_and_missing_success_are_refused():
    dup = pa.table({"episode_index": [0, 0], "frame_index": [1, 1], "is_success": [True, True]})
    with pytest.raises(DatasetError, match="episode 0 frame 1 appears more than once"):
        compute_returns_table(dup, ReturnsConfig())
    no_success = pa.table({"episode_index": [0, 0], "frame_index": [0, 1]})
    with pytest.raises(DatasetError, match="rollout data needs an is_success column") as info:
        compute_returns_table(no_success, ReturnsConfig(dataset_type="rollout"))
    assert info.value.exit_code == 40 and "datasets[].type" in info.value.hint
    assert "sft counts every episode as a success, failed ones too" in info.value.hint  # audit46 data F3
    assert "derives it from next.reward" in info.value.hint
    sft = compute_returns_table(no_success, ReturnsConfig(dataset_type="sft"))
    assert sft.column("return").to_pylist() == [-1.0, 0.0]
    assert sft.column("prompt").to_pylist() == ["perform the task"] * 2


def _episodes(spec):
    rng = np.random.default_rng(1)
    for ep, n, ok in spec:
        yield EpisodeData(
            episode_index=ep,
            task=f"task {ep % 2}",
            frames={"observation.state": rng.normal(size=(n, 2)).astype(np.float32), "is_success": np.full(n, ok)},
        )


def _portable_run(out, *overrides):
    """`portable run --stages returns --output OUT key=value ...` in a subprocess."""
    cmd = [sys.executable, "-m", "reproduction.portable", "run", "--stages", "returns", "--output", str(out)]
    return subprocess.run(cmd + list(overrides), capture_output=True, text=True, timeout=120)


def test_portable_run_writes_rlinf_sidecar_and_refuses_a_refiltered_dataset(tmp_path):
    spec = [(2, 5, True), (7, 3, False), (9, 4, True)]
    root = write_dataset(tmp_path / "libero", _episodes(spec), fps=10, features=FEATURES, allow_id_gaps=True)
    out = tmp_path / "out"
    run = out / "returns"
    proc = _portable_run(
        out, f"datasets=[{{path: {root}, type: rollout}}]", "returns.tag=fail300", "returns.failure_reward=-300"
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "run.json").read_text())["stages"]["returns"]["summary"]
    assert report["libero"]["frames"] == 12 and report["libero"]["return_min"] == -302.0
    path = run / "libero" / "returns_fail300.parquet"
    table = pq.read_table(path)
    assert table.column_names == ["episode_index", "frame_index", "return", "reward", "prompt"]
    assert table.column("return").to_pylist()[:5] == [-4.0, -3.0, -2.0, -1.0, 0.0]
    assert table.column("return").to_pylist()[5:8] == [-302.0, -301.0, -300.0]
    meta = sidecar_meta(path)
    ds = open_dataset(root)
    assert meta["dataset_fingerprint"] == ds.fingerprint and meta["params"]["failure_reward"] == -300.0
    assert json.loads((run / "libero" / "stats.json").read_text())["reward"]["min"] == -300.0
    assert not (root / "meta" / "returns_fail300.parquet").exists()  # the dataset stays untouched
    # The same sidecar against a refiltered dataset (episode 7 dropped) is refused, naming both fingerprints.
    refiltered = write_dataset(
        tmp_path / "refiltered",
        _episodes([s for s in spec if s[0] != 7]),
        fps=10,
        features=FEATURES,
        allow_id_gaps=True,
    )
    other = open_dataset(refiltered).fingerprint
    with pytest.raises(FingerprintMismatchError) as info:
        read_returns(run, "fail300", expect_fingerprint=other, dataset_name="libero")
    assert ds.fingerprint in str(info.value) and other in str(info.value) and info.value.exit_code == 41
    with pytest.raises(InputNotFoundError, match="present: returns_fail300.parquet"):
        read_returns(run, "wrongtag", expect_fingerprint=ds.fingerprint, dataset_name="libero")
    ok = read_returns(run, "fail300", expect_fingerprint=ds.fingerprint, dataset_name="libero")
    assert ok.num_rows == 12


def test_portable_run_refuses_rollout_without_success_column(tmp_path):
    feats = {"observation.state": {"dtype": "float32", "shape": [2]}}
    eps = [EpisodeData(episode_index=0, task="t", frames={"observation.state": np.zeros((3, 2), np.float32)})]
    root = write_dataset(tmp_path / "demo", eps, fps=10, features=feats)
    proc = _portable_run(tmp_path / "out", f"datasets=[{{path: {root}, type: rollout}}]")
    assert proc.returncode == 40
    # audit46 data F3: the hint says what sft would do to failed episodes, and how to add the column instead.
    assert [line for line in proc.stderr.splitlines() if line.startswith(("error:", "hint:"))] == [
        f"error: {root}: rollout data needs an is_success column, and there is none",
        'hint: add an is_success column, each frame\'s outcome (README.md, "Rollout datasets: is_success", derives '
        "it from next.reward in a few lines), or set the dataset's type: sft (datasets[].type) if every episode is a "
        "successful demonstration: sft counts every episode as a success, failed ones too",
    ]
    assert not (tmp_path / "out" / "returns" / "demo" / "returns.parquet").exists()


FLOAT_FLAG = {"observation.state": {"dtype": "float32", "shape": [2]}, "is_success": {"dtype": "float32", "shape": [1]}}


def _float_flags(tmp_path, failed_last):
    """Episodes 0 (success 1.0), 1 (4 frames, last frame `failed_last`), 2 (0.0), is_success float32 as lerobot
    writes a float flag."""
    eps = []
    for e, (n, last) in enumerate([(3, 1.0), (4, failed_last), (2, 0.0)]):
        flags = np.zeros(n, np.float32)
        flags[-1] = last
        eps.append(
            EpisodeData(
                episode_index=e,
                task="t",
                frames={"observation.state": np.zeros((n, 2), np.float32), "is_success": flags},
            )
        )
    return write_dataset(tmp_path / "float_flags", eps, fps=10, features=FLOAT_FLAG)


def test_portable_run_refuses_a_nan_success_flag(tmp_path):
    """audit46 data F1: bool(nan) is True, so a NaN (a float column's missing value) was read as a success."""
    root = _float_flags(tmp_path, np.nan)
    proc = _portable_run(tmp_path / "out", f"datasets=[{{path: {root}, type: rollout}}]")
    assert proc.returncode == 40, proc.stderr
    assert proc.stderr.splitlines() == [
        f"error: {root}: is_success has 1 NaN values (the first at episode 1 frame 3)",
        "hint: every frame of a rollout dataset says whether its episode succeeded (true/1 or false/0; the last frame "
        "is the outcome): fix is_success, or set the dataset's type to sft if every episode is a successful "
        "demonstration (datasets[].type)",
    ]
    assert not (tmp_path / "out" / "returns" / "float_flags" / "returns.parquet").exists()


def test_success_flags_are_bool_or_zero_one():
    """audit46 data F1: 0/1 in any numeric type (or one-element lists) is read; 0.5, 2, NaN, other types refused."""
    keys = {"episode_index": [4, 4, 3, 3], "frame_index": [0, 1, 0, 1]}  # unsorted: the first bad frame is 3/1
    rollout = ReturnsConfig(dataset_type="rollout")
    good = [
        pa.array([0, 1, 0, 0], pa.int64()),
        pa.array([0.0, 1.0, 0.0, 0.0], pa.float32()),
        pa.array([[False], [True], [False], [False]], pa.list_(pa.bool_())),
        pa.array([[0.0], [1.0], [0.0], [0.0]], pa.list_(pa.float64(), 1)),
    ]
    for col in good:
        table = compute_returns_table(pa.table({**keys, "is_success": col}), rollout)
        assert table.column("reward").to_pylist() == [-1.0, -300.0, -1.0, 0.0], col.type
    bad = [
        (
            pa.array([0.0, 0.5, 0.0, 0.5], pa.float32()),
            "is_success has 2 values other than 0 and 1 (the first: 0.5 at episode 3 frame 1)",
        ),
        (
            pa.array([0, 1, 0, 2], pa.int64()),
            "is_success has 1 values other than 0 and 1 (the first: 2 at episode 3 frame 1)",
        ),
        (pa.array([np.nan, 1.0, 0.0, 0.0]), "is_success has 1 NaN values (the first at episode 4 frame 0)"),
        (
            pa.array([[0.0], [1.0], [0.0], [np.nan]], pa.list_(pa.float32())),
            "is_success has 1 NaN values (the first at episode 3 frame 1)",
        ),
        (
            pa.array([[False], [True], [False, True], [True]], pa.list_(pa.bool_())),
            "is_success holds 2 values at episode 3 frame 0; one per frame expected",
        ),
        (pa.array(["no", "yes", "no", "no"]), "is_success is string; bool or 0/1 expected"),
    ]
    for col, message in bad:
        with pytest.raises(DatasetError) as info:
            compute_returns_table(pa.table({**keys, "is_success": col}), rollout, source="ds")
        assert str(info.value) == f"ds: {message}" and info.value.exit_code == 40
    sft = compute_returns_table(pa.table({**keys, "is_success": bad[0][0]}), ReturnsConfig(dataset_type="sft"))
    assert sft.column("reward").to_pylist() == [-1.0, 0.0, -1.0, 0.0]  # sft reads no flag


def test_in_dataset_mode_writes_meta_for_rlinf(tmp_path):
    root = write_dataset(tmp_path / "ds", _episodes([(0, 4, True)]), fps=10, features=FEATURES)
    before = (root / "meta" / "info.json").read_bytes()
    compute_returns([root], None, ReturnsConfig(tag=None), in_dataset=True)
    assert (root / "meta" / "returns.parquet").is_file()
    stats = json.loads((root / "meta" / "stats.json").read_text())
    assert stats["return"]["min"] == -3.0 and "observation.state" in stats  # read-modify-write keeps the rest
    assert (root / "meta" / "info.json").read_bytes() == before  # upstream's phantom features are not added


def _split_data_file(root, groups):
    """Rewrite a one-file v3.0 dataset's rows as one data file per group of episode ids."""
    data = sorted((root / "data").rglob("*.parquet"))
    table = pa.concat_tables([pq.read_table(p) for p in data])
    for p in data:
        p.unlink()
    ep = table.column("episode_index").to_numpy()
    for i, group in enumerate(groups):
        pq.write_table(
            table.filter(pa.array(np.isin(ep, group))), root / "data" / "chunk-000" / f"file-{i:03d}.parquet"
        )


def test_returns_stream_file_by_file_and_equal_the_whole_table(tmp_path, monkeypatch):
    import reproduction.recap.returns as returns_mod

    spec = [(e, n, e % 3 != 0) for e, n in zip(range(0, 24, 2), [5, 9, 1, 14, 3, 8, 2, 11, 6, 4, 7, 10])]
    root = write_dataset(tmp_path / "multi", _episodes(spec), fps=10, features=FEATURES, allow_id_gaps=True)
    _split_data_file(root, [[0, 2, 4], [6, 8], [10, 12, 14, 16], [18, 20, 22]])  # increasing ranges
    whole = compute_returns_table(
        open_dataset(root).frame_table(["episode_index", "frame_index", "task_index", "is_success"]),
        ReturnsConfig(dataset_type="rollout"),
        tasks=open_dataset(root).tasks,
    )
    seen = []
    real = returns_mod.compute_returns_table
    monkeypatch.setattr(
        returns_mod, "compute_returns_table", lambda t, *a, **k: seen.append(t.num_rows) or real(t, *a, **k)
    )
    monkeypatch.setattr(returns_mod, "STREAM_ROWS", 16)  # batches of whole files, about 16 rows each
    [result] = compute_returns([root], tmp_path / "run", ReturnsConfig(dataset_type="rollout"))
    assert seen == [5 + 9 + 1 + 14 + 3, 8 + 2 + 11 + 6, 4 + 7 + 10]  # whole data files, each read once
    assert pq.ParquetFile(result.sidecar).metadata.num_row_groups == 1  # small batches coalesce on write
    streamed = pq.read_table(result.sidecar)
    assert streamed.cast(whole.schema).equals(whole)
    meta = sidecar_meta(result.sidecar)
    assert meta["num_frames"] == whole.num_rows == result.num_frames
    assert meta["stats"]["return"]["min"] == float(whole.column("return").to_numpy().min())
    assert meta["stats"] == result.stats
    # the digests computed beside the stream (on their own thread) give the fingerprint a cold full read gives
    monkeypatch.setenv("PORTABLE_CACHE_DIR", str(tmp_path / "cold-cache"))
    assert meta["dataset_fingerprint"] == result.fingerprint == open_dataset(root).fingerprint


def test_sidecar_prompts_are_written_as_dictionary_pages_and_read_back_as_plain_strings(tmp_path):
    spec = [(0, 4, True), (1, 3, False), (2, 5, True)]
    root = write_dataset(tmp_path / "ds", _episodes(spec), fps=10, features=FEATURES)
    frames = open_dataset(root).frame_table(["episode_index", "frame_index", "task_index", "is_success"])
    in_memory = compute_returns_table(frames, ReturnsConfig(), tasks=open_dataset(root).tasks)
    assert pa.types.is_dictionary(in_memory.schema.field("prompt").type)  # codes, not a copy a row
    [result] = compute_returns([root], tmp_path / "run", ReturnsConfig())
    parquet = pq.ParquetFile(result.sidecar)
    kv = parquet.metadata.metadata
    assert b"ARROW:schema" not in kv and json.loads(kv[b"recap_portable"])["kind"] == "returns"
    prompt = parquet.schema.column(4)
    assert (prompt.name, prompt.physical_type, prompt.logical_type.type) == ("prompt", "BYTE_ARRAY", "STRING")
    assert "RLE_DICTIONARY" in parquet.metadata.row_group(0).column(4).encodings
    table = pq.read_table(result.sidecar)
    assert [str(f.type) for f in table.schema] == ["int64", "int64", "float", "float", "string"]
    assert table.column("prompt").to_pylist() == in_memory.column("prompt").to_pylist()
    assert table.column("prompt").to_pylist() == ["task 0"] * 4 + ["task 1"] * 3 + ["task 0"] * 5
    assert table.schema.metadata[b"recap_portable"] == kv[b"recap_portable"]  # readers see it as before
    with pytest.raises(TypeError, match="'when' is timestamp"):  # no Arrow schema stored: such a type would change
        writer_options(pa.schema([("episode_index", pa.int64()), ("when", pa.timestamp("ns", tz="UTC"))]))


def test_returns_fall_back_to_one_sort_when_files_interleave_episodes(tmp_path, monkeypatch):
    import reproduction.recap.returns as returns_mod

    spec = [(e, n, True) for e, n in zip(range(6), [4, 6, 3, 5, 2, 7])]
    root = write_dataset(tmp_path / "mixed", _episodes(spec), fps=10, features=FEATURES)
    _split_data_file(root, [[0, 2, 4], [1, 3, 5]])  # episode 1 sits between file 0's episodes
    seen = []
    real = returns_mod.compute_returns_table
    monkeypatch.setattr(
        returns_mod, "compute_returns_table", lambda t, *a, **k: seen.append(t.num_rows) or real(t, *a, **k)
    )
    [result] = compute_returns([root], tmp_path / "run", ReturnsConfig())
    assert seen == [27]
    table = pq.read_table(result.sidecar)
    assert table.column("episode_index").to_pylist() == sorted(table.column("episode_index").to_pylist())
    assert table.column("return").to_pylist()[:4] == [-3.0, -2.0, -1.0, 0.0]


def test_a_failing_chunk_leaves_no_sidecar(tmp_path):
    spec = [(0, 4, True), (1, 3, False)]
    root = write_dataset(tmp_path / "bad", _episodes(spec), fps=10, features=FEATURES)
    _split_data_file(root, [[0], [1]])
    second = root / "data" / "chunk-000" / "file-001.parquet"
    t = pq.read_table(second)
    pq.write_table(
        t.set_column(t.schema.get_field_index("is_success"), "is_success", pa.array([True, None, False], pa.bool_())),
        second,
    )
    with pytest.raises(DatasetError, match="is_success has 1 missing values"):
        compute_returns([root], tmp_path / "run", ReturnsConfig(dataset_type="rollout"))
    assert not list((tmp_path / "run").rglob("*.parquet"))  # neither the sidecar nor a temporary file
