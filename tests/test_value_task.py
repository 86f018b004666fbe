"""Value task wiring: config checks, param groups, whole-set evaluation, exports and stage-3 inference."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from value_synth import CAMERA, write_value_dataset

from reproduction.errors import CheckpointError, ConfigError
from reproduction.recap.value.data import ValueSource
from reproduction.recap.value.infer import (
    infer_dataset,
    infer_shard,
    load_value_export,
    open_value_stage,
    sorted_frames,
)
from reproduction.recap.value.loss import expected_value, spearman, value_loss
from reproduction.recap.value.model import ValueModelConfig, build_value_model, preset_config
from reproduction.recap.value.task import (
    ValueConfig,
    check_value_sources,
    make_value_task,
    prepare_value_setup,
    split_stage,
    value_param_groups,
    write_export_extras,
)
from reproduction.train.task import EvalContext

CAMS = {"base_0_rgb": CAMERA, "left_wrist_0_rgb": "observation.images.wrist"}


def stage_main(argv: list[str]) -> int:
    """The stage functions behind `portable run` (train_value, infer_values) driven as the removed
    module CLI drove them, with portable's error rendering: these tests keep their argv tables and
    check the functions' errors, exit codes and summaries (the run itself: tests/test_run_*.py)."""
    import argparse
    import sys

    from reproduction.data.reader import open_dataset
    from reproduction.errors import PortableError
    from reproduction.recap.value.stage import infer_values, train_value
    from reproduction.train.config import TrainConfig

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    t = sub.add_parser("train")
    t.add_argument("--config")
    t.add_argument("--out")
    t.add_argument("--resume", action="store_true")
    i = sub.add_parser("infer")
    for flag in ("--stage", "--dataset", "--out", "--ray-address"):
        i.add_argument(flag)
    i.add_argument("--device", default="auto")
    i.add_argument("--workers", type=int, default=1)
    i.add_argument("--batch-size", type=int, default=64)
    a = parser.parse_args(argv)
    try:
        if a.command == "infer":
            summary = infer_values(
                open_value_stage(Path(a.stage), device=a.device),
                open_dataset(Path(a.dataset)),
                Path(a.out),
                workers=a.workers,
                batch_size=a.batch_size,
                ray_address=a.ray_address,
            )
        else:
            doc = json.loads(Path(a.config).read_text())
            config, sources, eval_sources = split_stage(doc["value"])
            train = TrainConfig.from_dict(doc["train"])
            summary = train_value(
                config, train, Path(a.out), sources=sources, eval_sources=eval_sources, resume=a.resume
            ).summary()
    except PortableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps(summary, indent=1, sort_keys=True))
    return 0


def _write_stage(value_dir: Path, config: ValueConfig, sources: list[ValueSource]):
    """prepare_value_setup + untrained exports written exactly as the trainer's export does."""
    from safetensors.torch import save_file

    setup = prepare_value_setup(config, value_dir, sources=sources)
    for k in range(config.folds):
        model = build_value_model(ValueModelConfig.from_dict(setup.model_config), seed=k)
        export = value_dir / f"model_{k}" / "export"
        export.mkdir(parents=True)
        save_file({n: t.contiguous() for n, t in model.state_dict().items()}, str(export / "model.safetensors"))
        write_export_extras(export, setup=setup, fold=k)
    return setup


@pytest.fixture(scope="module")
def stage_dir(tmp_path_factory):
    """A 2-fold value stage (value/) and a 1-fold one (value1/) trained on `ds`, plus `unseen`, a
    dataset neither trained on, and `changed/ds`, the same dataset name with two more episodes."""
    root = tmp_path_factory.mktemp("vtask")
    runs = write_value_dataset(root / "ds", episodes=8, seed=2)
    sources = [ValueSource(path=str(root / "ds"), type="rollout", returns=str(runs))]
    config = ValueConfig(cameras=CAMS, folds=2, fold_seed=1)
    _write_stage(root / "value", config, sources)
    _write_stage(root / "value1", ValueConfig.from_dict({**config.to_dict(), "folds": 1}), sources)
    write_value_dataset(root / "unseen", episodes=7, seed=7, runs=root / "returns_unseen")
    write_value_dataset(root / "changed" / "ds", episodes=10, seed=2, runs=root / "returns_changed")
    return root


def test_stage_config_rules_name_their_fields():
    src = ValueSource(path="/x/ds")
    with pytest.raises(ConfigError, match="return_min=.* and return_max=.*: set both, or neither"):
        ValueConfig(return_min=-3.0)
    with pytest.raises(ConfigError, match="preset='recap' needs `tokenizer`"):
        ValueConfig(preset="recap")
    with pytest.raises(ConfigError, match="names .* are not unique"):
        check_value_sources([src], [ValueSource(path="/y/ds")])
    with pytest.raises(ConfigError, match="no training datasets"):
        check_value_sources([])
    with pytest.raises(ConfigError, match="unknown fields \\['fold'\\]"):
        ValueConfig.from_dict({"fold": 2})
    with pytest.raises(ConfigError, match="unknown fields \\['train'\\]"):  # datasets are the stage's arguments
        ValueConfig.from_dict({"train": [{"path": "/x/ds"}]})
    with pytest.raises(ConfigError, match="type 'expert' is not sft or rollout"):
        ValueSource(path="/x/ds", type="expert")
    cfg = ValueConfig(folds=3)
    assert ValueConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))).to_dict() == cfg.to_dict()


def test_param_groups_put_exactly_the_head_at_value_lr():
    model = build_value_model(preset_config("tiny", vocab_size=300))
    head, rest = value_param_groups(model, value_lr=3e-4)
    names = {id(p): n for n, p in model.named_parameters()}
    assert head["lr"] == 3e-4 and "lr" not in rest
    assert sorted(names[id(p)] for p in head["params"]) == [
        "value_head.proj.bias",
        "value_head.proj.weight",
        "value_head.query",
    ]
    assert len(head["params"]) + len(rest["params"]) == len(list(model.parameters()))


def test_export_holds_range_bins_and_config_and_loads_strictly(stage_dir):
    setup = json.loads((stage_dir / "value" / "value_setup.json").read_text())
    vm = load_value_export(stage_dir / "value" / "model_1" / "export")
    assert vm.head["return_range"] == setup["return_range"] and vm.head["return_range"]["return_max"] == 0.0
    assert (vm.head["num_bins"], vm.head["v_min"], vm.head["v_max"], vm.head["fold"], vm.head["folds"]) == (
        201,
        -1.0,
        0.0,
        1,
        2,
    )
    assert vm.head["model_config"] == setup["model_config"] and vm.cameras == CAMS
    assert vm.return_range.return_min == setup["return_range"]["return_min"]
    bad = stage_dir / "bad_export"
    import shutil

    shutil.copytree(stage_dir / "value" / "model_0" / "export", bad)
    head = json.loads((bad / "value_head.json").read_text())
    head["model_config"]["text"]["vocab_size"] += 7
    (bad / "value_head.json").write_text(json.dumps(head))
    with pytest.raises(CheckpointError, match=r"language.embed_tokens.weight \(\d+, 64\) != \(\d+, 64\)"):
        load_value_export(bad)


def test_evaluate_uses_the_whole_set_and_every_rank_runs_the_same_forwards(stage_dir):
    task = make_value_task(0, 1, setup_path=str(stage_dir / "value" / "value_setup.json"), fold=0)
    model = task.model.eval()
    sets = task.evaluate.keywords["sets"]
    assert list(sets) == ["ds.heldout"]
    data = sets["ds.heldout"]
    plan = json.loads((stage_dir / "value" / "crossfit.json").read_text())
    held = sorted(int(e) for e, f in plan["assignment"]["ds"].items() if f == 0)
    assert sorted({data[i]["episode_index"] for i in range(len(data))}) == held
    calls = []
    model.register_forward_hook(lambda m, a, kw, out: calls.append(out.shape[0]), with_kwargs=True)
    ctx = EvalContext(rank=0, world_size=1, device=torch.device("cpu"), step=0, all_gather=lambda a: a)
    with torch.no_grad():
        got = task.evaluate.func(model, ctx, **{**task.evaluate.keywords, "micro_batch": 7})
        full = task.collate([data[i] for i in range(len(data))])
        logits = model(
            images=full["images"],
            image_masks=full["image_masks"],
            input_ids=full["input_ids"],
            attention_mask=full["attention_mask"],
        )
    pred = expected_value(logits, v_min=-1.0, v_max=0.0).numpy()
    assert got["ds.heldout/num_frames"] == len(data) and sum(calls[:-1]) == len(data)
    assert got["ds.heldout/value_spearman"] == pytest.approx(spearman(pred, full["target"].numpy()), abs=1e-6)
    assert got["ds.heldout/loss"] == pytest.approx(
        float(value_loss(logits, full["target"], v_min=-1.0, v_max=0.0)), rel=1e-5
    )
    assert got["value_spearman"] == got["ds.heldout/value_spearman"]
    counts = []
    for rank in (0, 1):  # uneven shards: both ranks still run ceil(ceil(n/2)/mb) forwards
        calls.clear()
        ctx = EvalContext(rank=rank, world_size=2, device=torch.device("cpu"), step=0, all_gather=lambda a: a)
        with torch.no_grad():
            task.evaluate.func(model, ctx, **{**task.evaluate.keywords, "micro_batch": 4})
        counts.append(len(calls))
    assert counts[0] == counts[1] == -(-(-(-len(data) // 2)) // 4)


def _count_forwards(monkeypatch) -> Counter:
    """Frames each fold's model runs forward, for every model a value stage loads from now on (fold -> frames)."""
    from reproduction.recap.value import infer as value_infer

    counts: Counter = Counter()
    real = value_infer.load_value_export

    def spy(folder, **kwargs):
        vm = real(folder, **kwargs)
        k = int(Path(folder).parent.name.removeprefix("model_"))
        vm.model.register_forward_hook(
            lambda m, a, kw, out, k=k: counts.update({k: kw["input_ids"].shape[0]}), with_kwargs=True
        )
        return vm

    monkeypatch.setattr(value_infer, "load_value_export", spy)
    return counts


def test_inference_runs_each_frame_once_through_the_model_that_did_not_train_on_it(stage_dir, monkeypatch):
    from reproduction.data.reader import open_dataset
    from reproduction.recap.sharding import plan_shards

    opened = open_value_stage(stage_dir / "value")
    models, plan = opened.models, opened.plan
    seen: list[Counter] = [Counter(), Counter()]
    for k, vm in enumerate(models):
        vm.model.register_forward_hook(
            lambda m, a, kw, out, k=k: seen[k].update(kw["input_ids"].shape[:1]), with_kwargs=True
        )
    ds = open_dataset(stage_dir / "ds")
    rows, ep, fr = sorted_frames(ds)
    row_end = np.searchsorted(ep, ep, side="right")
    shards = plan_shards(row_end, 3, 4)
    tables = [infer_shard(models, plan, ds, s, batch_size=5, frames=(rows, ep, fr)) for s in shards]
    inferred = sum(s.infer_stop - s.start for s in shards)
    assert sum(t.num_rows for t in tables) == inferred > ds.num_frames  # lookahead rows are inferred by two shards
    for k in range(2):  # frames counted per model: exactly the frames of its held-out episodes, once per shard
        expect = sum(int(np.isin(ep[s.start : s.infer_stop], plan.heldout_episodes(k, "ds")).sum()) for s in shards)
        assert sum(n * c for n, c in seen[k].items()) == expect and max(seen[k]) <= 5
    frames_per_model = _count_forwards(monkeypatch)
    merged = infer_dataset(open_value_stage(stage_dir / "value"), ds, world_size=3, batch_size=5)
    for k in range(2):  # the merged path: exactly one forward per frame (no lookahead rows)
        assert frames_per_model[k] == int(np.isin(ep, plan.heldout_episodes(k, "ds")).sum())
    assert sum(frames_per_model.values()) == ds.num_frames
    single = infer_dataset(open_value_stage(stage_dir / "value"), ds, world_size=1, batch_size=64)
    assert (
        merged.column("episode_index").to_pylist() == ep.tolist()
        and merged.column("frame_index").to_pylist() == fr.tolist()
    )
    np.testing.assert_allclose(merged.column("value").to_numpy(), single.column("value").to_numpy(), atol=1e-6)
    vals = merged.column("value").to_numpy()
    assert np.all((vals >= -1) & (vals <= 0)) and not np.isnan(vals).any()


def test_inference_values_are_bit_identical_for_any_number_of_workers(stage_dir):
    """Batches are cut at fixed global chunks (shards start on multiples of the batch size), so the
    values do not depend on how many workers split the frames: equal bit for bit, not to 1e-6."""
    from reproduction.data.reader import open_dataset
    from reproduction.recap.sharding import plan_shards

    stage, ds = open_value_stage(stage_dir / "value"), open_dataset(stage_dir / "ds")
    runs = {w: infer_dataset(stage, ds, world_size=w, batch_size=5) for w in (1, 2, 3)}
    for w in (2, 3):
        assert runs[w].equals(runs[1]), w
    row_end = np.arange(1, 24)  # any rows: shard starts fall on multiples of `align`
    for world in (1, 2, 3, 5):
        shards = plan_shards(row_end, world, 0, align=5)
        assert [s.start % 5 for s in shards] == [0] * world and shards[-1].stop == 23
        assert all(a.stop == b.start for a, b in zip(shards, shards[1:]))


def test_stage_three_opens_the_value_stage_once_for_every_dataset(stage_dir, tmp_path, monkeypatch):
    """Stage 3 opens the value stage once (each fold's head read once, each fold's model loaded once) and
    passes it to the inference of every dataset: two datasets, two heads read, two models loaded."""
    from reproduction import value_export
    from reproduction.data.reader import open_dataset
    from reproduction.recap.value import infer as value_infer
    from reproduction.recap.value.stage import infer_values

    heads, loads = [], []
    real_head, real_load = value_export.read_value_head, value_infer.load_value_export
    monkeypatch.setattr(value_export, "read_value_head", lambda folder: heads.append(folder) or real_head(folder))
    monkeypatch.setattr(
        value_infer, "load_value_export", lambda folder, **kw: loads.append(folder) or real_load(folder, **kw)
    )
    stage = open_value_stage(stage_dir / "value")
    assert loads == []  # opening reads the plan and the heads; the models load on first use
    for name in ("ds", "unseen"):
        summary = infer_values(stage, open_dataset(stage_dir / name), tmp_path / f"{name}.parquet", batch_size=8)
        assert summary["frames"] == open_dataset(stage_dir / name).num_frames
    exports = [stage_dir / "value" / f"model_{k}" / "export" for k in (0, 1)]
    assert [Path(f) for f in heads] == exports and [Path(f) for f in loads] == exports


@pytest.mark.parametrize("stage_name, folds", [("value1", 1), ("value", 2)])
def test_infer_values_labels_a_dataset_the_models_never_trained_on(
    stage_dir, tmp_path, monkeypatch, capsys, stage_name, folds
):
    """Upstream's flow (train on one dataset, label another): every model is held out for it, each
    episode goes to one model, each frame gets one forward, and the summary says who labelled what."""
    import pyarrow.parquet as pq

    from reproduction.data.reader import open_dataset
    from reproduction.recap.value.crossfit import split_folds
    from reproduction.recap.value.infer import infer_rows

    frames_per_model = _count_forwards(monkeypatch)
    out = tmp_path / "values.parquet"
    rc = stage_main(
        [
            "infer",
            "--stage",
            str(stage_dir / stage_name),
            "--dataset",
            str(stage_dir / "unseen"),
            "--out",
            str(out),
            "--workers",
            "1",
            "--batch-size",
            "5",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    ds = open_dataset(stage_dir / "unseen")
    rows, ep, fr = sorted_frames(ds)
    table = pq.read_table(out)
    assert (
        table.column("episode_index").to_pylist() == ep.tolist()
        and table.column("frame_index").to_pylist() == fr.tolist()
    )
    opened = open_value_stage(stage_dir / stage_name)
    models, plan = opened.models, opened.plan
    which = plan.models_for("unseen", ep)
    expect = np.bincount(which, minlength=folds).tolist()
    assert summary["frames"] == ds.num_frames and summary["frames_per_model"] == expect
    assert summary["dataset_in_fold_plan"] is False
    assert [frames_per_model[k] for k in range(folds)] == expect and sum(expect) == ds.num_frames  # one forward each
    if folds == 2:
        assert min(expect) > 0  # both held-out models share the work
    for k in range(folds):  # each frame's value is its labelling model's
        alone = infer_rows([models[k]], split_folds({}, folds=1), ds, "unseen", rows[which == k])
        np.testing.assert_allclose(table.column("value").to_numpy()[which == k], alone, atol=1e-6)


def test_infer_values_refuses_an_episode_the_fold_plan_split_without(stage_dir, tmp_path, capsys):
    """`changed/ds` is the training dataset's name with two more episodes: no model is known to be held out."""

    out = tmp_path / "values.parquet"
    rc = stage_main(
        [
            "infer",
            "--stage",
            str(stage_dir / "value"),
            "--dataset",
            str(stage_dir / "changed" / "ds"),
            "--out",
            str(out),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 40 and err.startswith("error: cross-fitting: episode 17 of dataset 'ds' is not in the fold plan\n")
    assert "hint: the dataset changed after the value models were trained; retrain stage 2" in err
    assert not out.exists() and not list(tmp_path.iterdir())  # nothing half-written


@pytest.mark.parametrize(
    "device, words",
    [
        ("tpu", "device='tpu' is not one of cpu, cuda, npu, auto"),
        ("cuda", "device='cuda', but `portable check`'s cuda probe fails"),  # no GPU on this machine
    ],
)
def test_infer_values_refuses_a_device_it_cannot_use_before_loading_anything(
    stage_dir, tmp_path, capsys, device, words
):

    out = tmp_path / "values.parquet"
    rc = stage_main(
        [
            "infer",
            "--stage",
            str(stage_dir / "value"),
            "--dataset",
            str(stage_dir / "ds"),
            "--out",
            str(out),
            "--device",
            device,
        ]
    )
    err = capsys.readouterr().err
    assert rc == 4 and err.startswith(f"error: {words}")
    assert not list(tmp_path.iterdir())  # nothing written


def test_value_training_resumes_to_identical_weights(stage_dir, tmp_path):
    """Augmentation and the data order come from (seed, epoch, position): stop at 3 + resume == 6 straight."""
    import functools

    from safetensors.torch import load_file

    from reproduction.train.api import train
    from reproduction.train.config import TrainConfig

    make = functools.partial(make_value_task, setup_path=str(stage_dir / "value" / "value_setup.json"), fold=1)

    def cfg(steps: int) -> TrainConfig:
        return TrainConfig(
            max_steps=steps,
            global_batch=8,
            micro_batch=4,
            launcher="inprocess",
            device="cpu",
            lr=1e-3,
            save_interval=3,
            eval_interval=3,
            log_interval=1,
        )

    straight = train(make, cfg(6), out_dir=tmp_path / "a", resume=False)
    train(make, cfg(3), out_dir=tmp_path / "b", resume=False)
    resumed = train(make, cfg(6), out_dir=tmp_path / "b", resume=True)
    assert resumed.resumed_from == 3 and straight.step == resumed.step == 6
    a = load_file(str(straight.export_dir / "model.safetensors"))
    b = load_file(str(resumed.export_dir / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert straight.train_metrics["loss"] == resumed.train_metrics["loss"]
    assert straight.eval_metrics["ds.heldout/value_spearman"] == resumed.eval_metrics["ds.heldout/value_spearman"]
    assert (resumed.export_dir / "value_head.json").is_file() and (
        resumed.export_dir / "tokenizer" / "tokenizer.json"
    ).is_file()


def test_pretrained_manifest_initialises_the_backbones_inside_the_task(stage_dir, tmp_path):
    """make_value_task loads the manifest's files (keys renamed from upstream's layout) strictly."""
    from safetensors.torch import save_file

    setup = json.loads((stage_dir / "value" / "value_setup.json").read_text())
    src = build_value_model(ValueModelConfig.from_dict(setup["model_config"]), seed=9)
    sd = src.state_dict()
    (tmp_path / "w").mkdir()
    save_file(
        {"vision_model." + k[7:]: v.contiguous() for k, v in sd.items() if k.startswith("vision.")},
        str(tmp_path / "w" / "siglip.safetensors"),
    )
    save_file(
        {"model." + k[9:]: v.contiguous() for k, v in sd.items() if k.startswith("language.")},
        str(tmp_path / "w" / "gemma.safetensors"),
    )
    manifest = json.loads(Path("weights_manifest/recap_value_siglip2_gemma3_270m.json").read_text())
    manifest["components"][0]["files"][0]["path"] = "siglip.safetensors"
    manifest["components"][1]["files"][0]["path"] = "gemma.safetensors"
    (tmp_path / "m.json").write_text(json.dumps(manifest))
    setup["stage"].update(
        pretrained_manifest=str(tmp_path / "m.json"), weights_dir=str(tmp_path / "w"), allow_unpinned=True
    )
    (tmp_path / "setup.json").write_text(json.dumps(setup))
    task = make_value_task(0, 1, setup_path=str(tmp_path / "setup.json"), fold=0)
    got = task.model.state_dict()
    assert torch.equal(
        got["language.layers.0.self_attn.q_proj.weight"], sd["language.layers.0.self_attn.q_proj.weight"]
    )
    assert torch.equal(got["vision.embeddings.patch_embedding.weight"], sd["vision.embeddings.patch_embedding.weight"])
    assert not torch.equal(got["value_head.proj.weight"], sd["value_head.proj.weight"])  # fresh head


def test_a_bundle_tokenizer_is_used_as_is_and_sizes_the_embedding(stage_dir, tmp_path):
    from reproduction.recap.tokenizer import train_tokenizer

    bundle_tok = tmp_path / "bundle_tokenizer"
    tok = train_tokenizer(["a completely different vocabulary source", "zebra"], bundle_tok, vocab_size=300)
    config, sources, _ = split_stage(
        {**json.loads((stage_dir / "value" / "value_setup.json").read_text())["stage"], "tokenizer": str(bundle_tok)}
    )
    setup = prepare_value_setup(config, tmp_path / "value", sources=sources)
    copied = json.loads((tmp_path / "value" / "tokenizer" / "tokenizer.json").read_text())
    assert copied["model"]["vocab"] == json.loads((bundle_tok / "tokenizer.json").read_text())["model"]["vocab"]
    assert setup.model_config["text"]["vocab_size"] == len(tok)


def test_the_recap_preset_keeps_the_checkpoints_vocab_size_and_tiny_sizes_from_the_tokenizer(stage_dir, tmp_path):
    """Gemma3's tokenizer has specials past the checkpoint's 262,144 embedding rows; len(tok) must not size recap."""
    from reproduction.recap.tokenizer import train_tokenizer

    tok = train_tokenizer(["a bundle tokenizer"], tmp_path / "tok", vocab_size=300)
    base = json.loads((stage_dir / "value" / "value_setup.json").read_text())["stage"]
    config, sources, _ = split_stage({**base, "preset": "recap", "tokenizer": str(tmp_path / "tok")})
    recap = prepare_value_setup(config, tmp_path / "recap", sources=sources)
    assert recap.model_config["text"]["vocab_size"] == 262_144 != len(tok)
    assert recap.model_config["text"]["hidden_size"] == 640 and recap.model_config["vision"]["hidden_size"] == 1152
    config, sources, _ = split_stage({**base, "tokenizer": str(tmp_path / "tok")})
    tiny = prepare_value_setup(config, tmp_path / "tiny", sources=sources)
    assert tiny.model_config["text"]["vocab_size"] == len(tok)


def _expected_bad_id(tokenizer, prompt: str, vocab_size: int) -> tuple[int, str]:
    ids = tokenizer([prompt], add_special_tokens=True)["input_ids"][0]
    assert max(ids) >= vocab_size  # the fixture really does overflow
    return max(ids), tokenizer.convert_ids_to_tokens(max(ids))


def test_a_token_id_past_the_embedding_is_a_one_line_error_naming_tokenizer_id_and_vocab(stage_dir, tmp_path, capsys):
    """Training, evaluation and inference batches all go through the guard (not an IndexError in the embedding)."""
    setup = json.loads((stage_dir / "value" / "value_setup.json").read_text())
    setup["model_config"]["text"]["vocab_size"] = 200  # smaller than the tokenizer's len
    (tmp_path / "setup.json").write_text(json.dumps(setup))
    task = make_value_task(0, 1, setup_path=str(tmp_path / "setup.json"), fold=0)
    assert (
        len(task.collate.tokenizer) > 200 and task.evaluate.keywords["collate"] is task.collate
    )  # eval is guarded too
    sample = task.train_dataset[0]
    bad, token = _expected_bad_id(task.collate.tokenizer, sample["prompt"], 200)
    tok_file = Path(setup["tokenizer_dir"]) / "tokenizer.json"
    with pytest.raises(ConfigError) as err:
        task.collate([sample])
    assert str(err.value) == (
        f"tokenizer {tok_file}: a prompt encodes to token id {bad} ({token!r}), "
        "outside the value model's vocab_size 200"
    )
    assert err.value.exit_code == 4 and "\n" not in str(err.value)

    # inference: an export whose embedding is smaller than its tokenizer, through the CLI
    import shutil

    from safetensors.torch import save_file

    stage = tmp_path / "stage"
    shutil.copytree(stage_dir / "value1", stage)
    export = stage / "model_0" / "export"
    head = json.loads((export / "value_head.json").read_text())
    head["model_config"]["text"]["vocab_size"] = 200
    (export / "value_head.json").write_text(json.dumps(head))
    model = build_value_model(ValueModelConfig.from_dict(head["model_config"]), seed=0)
    save_file({n: t.contiguous() for n, t in model.state_dict().items()}, str(export / "model.safetensors"))
    rc = stage_main(
        ["infer", "--stage", str(stage), "--dataset", str(stage_dir / "ds"), "--out", str(tmp_path / "v.parquet")]
    )
    assert rc == 4 and not (tmp_path / "v.parquet").exists()
    err_text = capsys.readouterr().err
    first = err_text.splitlines()[0]
    assert first.startswith(
        f"error: tokenizer {export / 'tokenizer' / 'tokenizer.json'}: a prompt encodes to token id "
    )
    assert first.endswith("outside the value model's vocab_size 200")


def test_resume_refuses_a_changed_value_setup_and_continues_an_unchanged_one(stage_dir, tmp_path, capsys):
    """Return range, folds, tokenizer: each named in a one-line CheckpointError (exit 50), nothing overwritten."""
    from reproduction.recap.tokenizer import train_tokenizer

    value = {
        "train": [{"path": str(stage_dir / "ds"), "type": "rollout", "returns": str(stage_dir / "returns")}],
        "cameras": CAMS,
        "augment": False,
    }
    train_cfg = {
        "max_steps": 2,
        "global_batch": 4,
        "micro_batch": 4,
        "launcher": "inprocess",
        "device": "cpu",
        "lr": 1e-3,
    }
    out = tmp_path / "value"

    def run(value_over: dict, *, steps: int = 2, resume: bool = True) -> tuple[int, str, str]:
        cfg = tmp_path / "value.json"
        cfg.write_text(json.dumps({"value": {**value, **value_over}, "train": {**train_cfg, "max_steps": steps}}))
        rc = stage_main(["train", "--config", str(cfg), "--out", str(out)] + (["--resume"] if resume else []))
        got = capsys.readouterr()
        return rc, got.out, got.err

    rc, stdout, _ = run({}, resume=False)
    assert rc == 0 and json.loads(stdout)["models"][0]["step"] == 2
    before = {
        p: p.read_bytes()
        for p in [out / "value_setup.json", out / "crossfit.json", out / "tokenizer" / "tokenizer.json"]
    }
    old_range = json.loads(before[out / "value_setup.json"])["return_range"]

    rc, stdout, err = run({"return_min": -123.0, "return_max": 0.0})
    assert (
        rc == 50
        and stdout == ""
        and err.splitlines()[0]
        == (
            f"error: cannot resume {out}: the value setup changed since its checkpoints were written "
            f"(return_range {{'return_min': {old_range['return_min']}, 'return_max': {old_range['return_max']}}} -> "
            "{'return_min': -123.0, 'return_max': 0.0})"
        )
    )
    rc, _, err = run({"folds": 2})
    assert rc == 50 and err.splitlines()[0].endswith("(folds 1 -> 2)")
    train_tokenizer(["some other words entirely"], tmp_path / "tok", vocab_size=280)
    rc, _, err = run({"tokenizer": str(tmp_path / "tok")})
    assert rc == 50 and "tokenizer tokenizer.json sha256 " in err and "model_config.text.vocab_size " in err
    rc, _, err = run({}, resume=False)
    assert rc == 50 and err.startswith(
        f"error: {out / 'model_0' / 'checkpoints'} already holds checkpoints and resume is off"
    )
    assert {p: p.read_bytes() for p in before} == before  # every refusal left the setup it guards untouched
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []  # no staging left behind

    rc, stdout, err = run({"eval_micro_batch": 7}, steps=3)  # eval-only settings may change
    assert rc == 0, err
    assert json.loads(stdout)["models"][0]["step"] == 3 and "resumed from step 2" in err


def test_setup_changes_names_bins_and_fold_plan_moves(stage_dir):
    from reproduction.recap.value.crossfit import split_folds
    from reproduction.recap.value.task import read_setup, setup_changes

    old = read_setup(stage_dir / "value" / "value_setup.json")
    tok = stage_dir / "value" / "tokenizer"
    new = read_setup(stage_dir / "value" / "value_setup.json")
    assert setup_changes(old, new, old_tokenizer=tok, new_tokenizer=tok) == []
    new.model_config = {**new.model_config, "num_bins": 101, "v_min": -2.0}
    new.plan = split_folds({"ds": np.arange(1, 16, 2)[:-1]}, folds=2, seed=old.plan.seed)
    assert setup_changes(old, new, old_tokenizer=tok, new_tokenizer=tok) == [
        "model_config.num_bins 201 -> 101",
        "model_config.v_min -1.0 -> -2.0",
        "fold_plan: the episodes of ['ds'] differ",
    ]


def _infer_args(stage_dir: Path, out: Path, workers: int, *extra: str) -> list[str]:
    return [
        "infer",
        "--stage",
        str(stage_dir / "value"),
        "--dataset",
        str(stage_dir / "ds"),
        "--out",
        str(out),
        "--batch-size",
        "5",
        "--device",
        "cpu",
        "--workers",
        str(workers),
        *extra,
    ]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_infer_values_runs_the_shards_on_ray_workers_with_the_in_process_values(
    stage_dir, ray_address, tmp_path, monkeypatch, capsys
):
    """--workers 2: two Ray workers infer their owned rows (the driver runs no forward); the parquet
    equals --workers 1's: the same keys, bit-identical values, fingerprint metadata, frames per model."""
    import pyarrow.parquet as pq
    import ray

    forwards = _count_forwards(monkeypatch)  # spies on this process's models only
    one, two = tmp_path / "one.parquet", tmp_path / "two.parquet"
    assert stage_main(_infer_args(stage_dir, one, 1)) == 0
    alone = json.loads(capsys.readouterr().out)
    in_driver = sum(forwards.values())
    assert in_driver == alone["frames"] > 0
    rc = stage_main(_infer_args(stage_dir, two, 2, "--ray-address", ray_address))
    got = capsys.readouterr()
    assert rc == 0, got.err
    shared = json.loads(got.out)
    assert sum(forwards.values()) == in_driver  # no forward in the driver: the workers ran them all
    assert ray.is_initialized()  # a cluster it joined is left running
    a, b = pq.read_table(one), pq.read_table(two)
    for key in ("episode_index", "frame_index"):
        assert b.column(key).to_pylist() == a.column(key).to_pylist()
    np.testing.assert_array_equal(b.column("value").to_numpy(), a.column("value").to_numpy())  # bit for bit
    fp = b"recap_portable.dataset_fingerprint"
    assert b.schema.metadata[fp] == a.schema.metadata[fp] == alone["dataset_fingerprint"].encode()
    assert b.schema == a.schema
    for key in ("frames", "frames_per_model", "dataset_fingerprint", "dataset_in_fold_plan"):
        assert shared[key] == alone[key], key
    assert shared["value_mean"] == pytest.approx(alone["value_mean"], abs=1e-6)
    assert min(alone["frames_per_model"]) > 0  # both fold models labelled frames


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "fault, words",
    [
        (
            "raise",
            "error: value inference shard 1 raised RuntimeError: injected failure in value inference shard 1",
        ),
        ("die", "error: value inference shard 1 died: WorkerCrashedError: "),
    ],
)
def test_a_failing_inference_worker_is_exit_51_and_writes_nothing(
    stage_dir, ray_address, tmp_path, monkeypatch, capsys, fault, words
):
    from value_synth import FaultyShardTask

    from reproduction.recap.value import infer

    # the seam: the worker body run_tasks ships to each Ray worker (module-level, so picklable by reference)
    monkeypatch.setattr(infer, "infer_job", FaultyShardTask(fault, 1))
    out = tmp_path / "values.parquet"
    rc = stage_main(_infer_args(stage_dir, out, 2, "--ray-address", ray_address))
    got = capsys.readouterr()
    lines = got.err.splitlines()
    # stdout: no summary. Ray's driver prints the raylet's own "a worker died" notice on stdout,
    # from a background thread (ray._private.worker.listen_error_messages), so only the raise case is empty
    assert rc == 51 and '"frames"' not in got.out and (fault == "die" or got.out == "")
    assert lines[0].startswith(words) and len(lines) == 2 and lines[1].startswith("hint: "), got.err
    assert not out.exists() and list(tmp_path.iterdir()) == []  # nothing half-written


def test_an_inference_worker_refuses_a_dataset_other_than_the_planned_one(stage_dir):
    """A worker opens the dataset by path; a copy that differs from the driver's (edited meanwhile,
    another node's copy) is a FingerprintMismatchError naming both fingerprints, before any model loads."""
    import dataclasses

    from reproduction.data.reader import open_dataset
    from reproduction.errors import FingerprintMismatchError
    from reproduction.recap.sharding import Shard
    from reproduction.recap.value.infer import ShardJob, infer_job
    from reproduction.train.device import resolve

    planned = open_dataset(stage_dir / "changed" / "ds").fingerprint
    job = ShardJob(
        stage_dir=str(stage_dir / "value"),
        dataset_root=str(stage_dir / "ds"),
        fingerprint=planned,
        shard=Shard(rank=0, start=0, stop=4, infer_stop=4),
        spec=resolve("cpu"),
        batch_size=4,
    )
    actual = open_dataset(stage_dir / "ds").fingerprint
    with pytest.raises(FingerprintMismatchError) as info:
        infer_job(job)
    assert str(info.value) == (
        f"{stage_dir / 'ds'}: fingerprint {actual} on this worker, {planned} when stage 3 planned its shards"
    )
    assert info.value.exit_code == 41
    table = infer_job(dataclasses.replace(job, fingerprint=actual))  # the right copy: only its owned rows
    _, ep, fr = sorted_frames(open_dataset(stage_dir / "ds"))
    assert table.column_names == ["episode_index", "frame_index", "value"]
    assert table.column("episode_index").to_pylist() == ep[:4].tolist()
    assert table.column("frame_index").to_pylist() == fr[:4].tolist()
