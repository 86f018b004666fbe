"""Value-SFT samples: sidecar targets joined by id (fingerprint checked), mixtures, augmentation, collate."""

from __future__ import annotations

import shutil

import numpy as np
import pyarrow as pa
import pytest
import torch
from value_synth import CAMERA, write_value_dataset

from reproduction.errors import DatasetError, FingerprintMismatchError
from reproduction.recap.normalize import ReturnRange
from reproduction.recap.value.data import (
    ValueCollator,
    ValueFrames,
    ValueSource,
    augment_sample,
    load_source,
    mixture_table,
    return_range_of,
    to_pixels,
)

CAMS = {"base_0_rgb": CAMERA, "left_wrist_0_rgb": "observation.images.wrist"}


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    root = tmp_path_factory.mktemp("vdata")
    runs = write_value_dataset(root / "ds", episodes=6, seed=1)
    return root / "ds", runs


def _source(synth, **kw) -> ValueSource:
    return ValueSource(**{"path": str(synth[0]), "type": "rollout", "returns": str(synth[1]), **kw})


def test_targets_are_the_sidecar_returns_joined_by_episode_and_frame(synth):
    from reproduction.data.reader import open_dataset
    from reproduction.recap.sidecars import read_returns

    frames = load_source(_source(synth))
    ds = open_dataset(synth[0])
    sidecar = read_returns(synth[1], None, expect_fingerprint=ds.fingerprint, dataset_name="ds").to_pydict()
    expected = {(e, f): r for e, f, r in zip(sidecar["episode_index"], sidecar["frame_index"], sidecar["return"])}
    assert len(frames) == ds.num_frames == len(expected)
    assert sorted(set(frames.episode.tolist())) == [1, 3, 5, 7, 9, 11]  # non-contiguous ids
    for e, f, g in zip(frames.episode, frames.frame, frames.returns):
        assert g == pytest.approx(expected[(int(e), int(f))])
    rr = return_range_of([frames])
    assert rr.return_max == 0.0 and rr.return_min == min(expected.values())
    data = ValueFrames([frames], cameras=CAMS, image_size=64, return_range=rr)
    s = data[7]
    assert s["target"] == pytest.approx(float(rr.to_value(expected[(s["episode_index"], s["frame_index"])])))
    assert set(s["images"]) == {"base_0_rgb"} and s["images"]["base_0_rgb"].shape == (3, 64, 64)
    assert s["prompt"] in (
        "Task: push the red block to the green goal.",
        "Task: move the red cube onto the green marker.",
    )


def test_episode_filter_keeps_only_those_episodes(synth):
    frames = load_source(_source(synth), episodes=np.array([3, 9]))
    assert set(frames.episode.tolist()) == {3, 9}
    full = load_source(_source(synth))
    assert len(frames) == int(np.isin(full.episode, [3, 9]).sum())


def test_a_sidecar_from_another_dataset_version_is_refused(synth, tmp_path):
    from reproduction.data.reader import open_dataset

    other = tmp_path / "ds"
    shutil.copytree(synth[0], other)
    write_value_dataset(tmp_path / "changed", episodes=5, seed=1, runs=tmp_path / "unused")
    shutil.rmtree(other)
    shutil.copytree(tmp_path / "changed", other)  # same folder name, refiltered content
    with pytest.raises(FingerprintMismatchError) as err:
        load_source(ValueSource(path=str(other), type="rollout", returns=str(synth[1])))
    assert open_dataset(other).fingerprint in str(err.value) and err.value.exit_code == 41


def test_a_frame_without_a_return_is_named(synth, tmp_path):
    from reproduction.recap.sidecars import sidecar_meta, write_sidecar

    src = synth[1] / "ds" / "returns.parquet"
    table = pa.parquet.read_table(src)
    keep = np.ones(table.num_rows, bool)
    keep[4] = False
    missing = (table.column("episode_index")[4].as_py(), table.column("frame_index")[4].as_py())
    meta = {k: v for k, v in sidecar_meta(src).items() if k != "format"}
    write_sidecar(tmp_path / "r" / "ds" / "returns.parquet", table.filter(pa.array(keep)), meta)
    with pytest.raises(DatasetError, match=f"episode {missing[0]} frame {missing[1]} has no return"):
        load_source(_source(synth, returns=str(tmp_path / "r")))


def test_mixture_table_is_deterministic_covers_every_row_and_follows_weights():
    ids, idx = mixture_table([10, 40], [1.0, 1.0], balance_weights=False, seed=3)
    again = mixture_table([10, 40], [1.0, 1.0], balance_weights=False, seed=3)
    assert np.array_equal(ids, again[0]) and np.array_equal(idx, again[1])
    assert np.bincount(ids).tolist() == [40, 40]  # equal shares: the small set is cycled 4 times
    assert all(np.bincount(idx[ids == 0], minlength=10) == 4) and set(idx[ids == 1].tolist()) == set(range(40))
    ids, idx = mixture_table([10, 40], [1.0, 1.0], balance_weights=True)
    assert np.bincount(ids).tolist() == [10, 40]  # shares by size: each row once
    ids, idx = mixture_table([10, 40], [3.0, 1.0], balance_weights=True)
    counts = np.bincount(ids)
    assert counts.tolist() == [30, 40] and all(np.bincount(idx[ids == 0]) == 3)  # weight 3 -> 3 passes
    with pytest.raises(DatasetError, match="a dataset has no frames"):
        mixture_table([0, 5], [1.0, 1.0])


def test_augmentation_is_per_sample_deterministic_and_leaves_wrist_geometry_alone():
    gen = torch.Generator().manual_seed(0)
    img = torch.rand(3, 64, 64, generator=gen) * 2 - 1
    sample = {"images": {"base_0_rgb": img.clone(), "left_wrist_0_rgb": img.clone()}, "prompt": "p", "target": -0.5}
    a = augment_sample(sample, np.random.default_rng(7))
    b = augment_sample(sample, np.random.default_rng(7))
    c = augment_sample(sample, np.random.default_rng(8))
    assert torch.equal(a["images"]["base_0_rgb"], b["images"]["base_0_rgb"])
    assert not torch.equal(a["images"]["base_0_rgb"], c["images"]["base_0_rgb"])
    assert torch.equal(sample["images"]["base_0_rgb"], img)  # input untouched
    assert a["target"] == -0.5 and a["prompt"] == "p"
    # wrist: colour only, so a constant image stays constant (no crop/rotation blur at edges)
    flat = {"images": {"left_wrist_0_rgb": torch.full((3, 64, 64), 0.2)}, "prompt": "p", "target": 0.0}
    w = augment_sample(flat, np.random.default_rng(1))["images"]["left_wrist_0_rgb"]
    assert float(w.std()) < 1e-6
    for x in (a["images"]["base_0_rgb"], w):
        assert float(x.min()) >= -1.0 and float(x.max()) <= 1.0


def test_to_pixels_scales_and_pads_non_square_images():
    img = np.full((32, 64, 3), 255, dtype=np.uint8)
    x = to_pixels(img, 64)
    assert x.shape == (3, 64, 64)
    assert (
        torch.allclose(x[:, 16:48], torch.ones(3, 32, 64))
        and torch.all(x[:, :16] == -1.0)
        and torch.all(x[:, 48:] == -1.0)
    )
    assert torch.equal(to_pixels(np.zeros((8, 8, 3), np.uint8), 8), torch.full((3, 8, 8), -1.0))


def test_collate_masks_absent_cameras_and_pads_prompts_to_the_longest(tmp_path):
    from reproduction.recap.tokenizer import train_tokenizer

    tok = train_tokenizer(["a b c d e f", "x"], tmp_path / "tok")
    img = torch.zeros(3, 8, 8)
    samples = [
        {
            "images": {"base_0_rgb": img},
            "prompt": "Task: a b c d e f.",
            "target": -0.1,
            "episode_index": 3,
            "frame_index": 0,
            "source": 0,
        },
        {
            "images": {"base_0_rgb": img + 1, "left_wrist_0_rgb": img},
            "prompt": "Task: x.",
            "target": -0.9,
            "episode_index": 5,
            "frame_index": 2,
            "source": 1,
        },
    ]
    batch = ValueCollator(tokenizer=tok, slots=("base_0_rgb", "left_wrist_0_rgb"), image_size=8)(samples)
    assert batch["image_masks"]["left_wrist_0_rgb"].tolist() == [False, True]
    assert (
        batch["images"]["left_wrist_0_rgb"].shape == (2, 3, 8, 8)
        and float(batch["images"]["left_wrist_0_rgb"][0].abs().sum()) == 0
    )
    n0 = len(tok("Task: a b c d e f.")["input_ids"])
    assert batch["input_ids"].shape == (2, n0) and batch["attention_mask"].sum(1).tolist() == [
        n0,
        len(tok("Task: x.")["input_ids"]),
    ]
    assert batch["target"].tolist() == pytest.approx([-0.1, -0.9]) and batch["episode_index"].tolist() == [3, 5]


def test_return_range_rejects_an_empty_training_set(synth):
    frames = load_source(_source(synth), episodes=np.array([999]))
    with pytest.raises(DatasetError, match="hold no frames"):
        return_range_of([frames])
    assert isinstance(return_range_of([load_source(_source(synth))]), ReturnRange)


def test_a_two_dataset_mixture_draws_every_row_of_both(synth):
    a = load_source(_source(synth, name="a", weight=1.0))
    b = load_source(_source(synth, name="b", weight=2.0), episodes=np.array([1, 3]))
    data = ValueFrames([a, b], cameras=CAMS, image_size=64, return_range=return_range_of([a, b]), seed=4)
    ids, idx = data.table
    assert len(data) == ids.size and set(idx[ids == 0].tolist()) == set(range(len(a)))
    assert np.bincount(idx[ids == 1]).tolist() == [2] * len(b)  # weight 2 x size share -> every row twice
    s = data[int(np.flatnonzero(ids == 1)[0])]
    assert s["source"] == 1 and s["episode_index"] in (1, 3)
