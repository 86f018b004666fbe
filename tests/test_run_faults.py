"""Bad inputs to `portable run`: each a one-line error (plus a hint), a documented exit code, nothing half-written.

The list (BAD_INPUTS) is the suite's record of what is refused and how. Exit codes: 3 not found,
4 invalid config, 5 a bundle's weights differ from their pinned manifest, 40 dataset, 52 a stage's
inputs or outputs changed since it completed, 55 the run folder cannot be used as asked, 56 several
preflight problems at once.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from reproduction.portable import main

FEATURES = {"observation.state": {"dtype": "float32", "shape": [2]}, "is_success": {"dtype": "bool", "shape": [1]}}


def _dataset(root: Path, *, success: bool = True, episodes: int = 3) -> Path:
    from reproduction.data.writer import EpisodeData, write_dataset

    rng = np.random.default_rng(0)
    eps = []
    for e in range(episodes):
        frames = {"observation.state": rng.normal(size=(4, 2)).astype(np.float32)}
        if success:
            frames["is_success"] = np.full(4, e % 2 == 0)
        eps.append(EpisodeData(episode_index=e, task="t", frames=frames))
    feats = FEATURES if success else {"observation.state": FEATURES["observation.state"]}
    return write_dataset(root, eps, fps=10, features=feats)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A valid dataset, a valid config, and a run whose stage 1 completed."""
    root = tmp_path_factory.mktemp("faults")
    ds = _dataset(root / "data" / "roll")
    cfg = root / "run.yaml"
    # batches the 12 frames fill (the defaults, 32 and 64, are refused in preflight: audit65_E M1)
    fit = "train: {global_batch: 4, micro_batch: 4}"
    cfg.write_text(f"datasets:\n  - {{path: {ds}, type: rollout}}\nvalue: {{{fit}}}\npolicy: {{{fit}}}\n")
    done = root / "done"
    assert main(["-q", "run", "--config", str(cfg), "--output", str(done), "--stages", "returns"]) == 0
    return root, ds, cfg, done


def _yaml(root: Path, text: str) -> str:
    path = root / f"c{abs(hash(text))}.yaml"
    path.write_text(text)
    return str(path)


def _run(out: Path, *args: str) -> list[str]:
    return ["run", "--output", str(out), "--stages", "returns", *args]


# (name, argv builder (world, out) -> argv, exit code, words in the error line)
BAD_INPUTS = [
    ("bad YAML", lambda w, o: _run(o, "--config", _yaml(w[0], "datasets: [unclosed\n")), 4, "not valid YAML"),
    ("YAML list", lambda w, o: _run(o, "--config", _yaml(w[0], "- a\n- b\n")), 4, "top level is not a mapping"),
    ("YAML string", lambda w, o: _run(o, "--config", _yaml(w[0], "hello\n")), 4, "top level is not a mapping"),
    ("unknown key in file", lambda w, o: _run(o, "--config", _yaml(w[0], "retruns: {}\n")), 4, "`retruns`"),
    ("unknown key override", lambda w, o: _run(o, "--config", str(w[2]), "value.trian.lr=1"), 4, "`value.trian`"),
    ("wrong type override", lambda w, o: _run(o, "--config", str(w[2]), "value.train.max_steps=ten"), 4, "max_steps"),
    (
        "wrong type in file",
        lambda w, o: _run(o, "--config", _yaml(w[0], "value: {model: {folds: many}}\n")),
        4,
        "value.model.folds",
    ),
    ("missing config file", lambda w, o: _run(o, "--config", str(w[0] / "nope.yaml")), 3, "does not exist"),
    ("bundle is not a folder", lambda w, o: ["run", str(w[2]), "--output", str(o)], 3, "is not a folder"),
    ("missing bundle", lambda w, o: ["run", str(w[0] / "nobundle"), "--output", str(o)], 3, "does not exist"),
    ("no datasets", lambda w, o: _run(o, "datasets=[]"), 4, "names no dataset"),
    ("no bundle, no config", lambda w, o: _run(o), 2, "no BUNDLE and no --config"),  # audit51 I2
    ("missing dataset", lambda w, o: _run(o, f"datasets=[{{path: {w[0]}/nope}}]"), 3, "does not exist"),
    ("empty dataset folder", lambda w, o: _run(o, f"datasets=[{{path: {_empty(w[0])}}}]"), 3, "info.json"),
    ("dataset without data files", lambda w, o: _run(o, f"datasets=[{{path: {_no_data(w)}}}]"), 40, "no parquet"),
    ("placeholder path", lambda w, o: _run(o, "datasets=[{path: /path/to/data}]"), 4, "/path/to/ placeholder"),
    ("bad dataset type", lambda w, o: _run(o, f"datasets=[{{path: {w[1]}, type: demo}}]"), 4, "'demo' is not sft"),
    (
        "duplicate dataset names",
        lambda w, o: _run(o, f"datasets=[{{path: {w[1]}}}, {{path: {w[1]}}}]"),
        4,
        "folder name 'roll'",
    ),
    ("lookahead 0", lambda w, o: _run(o, "--config", str(w[2]), "advantages.lookahead=0"), 4, "advantages.lookahead=0"),
    (
        "folds 0",
        lambda w, o: _run(o, "--config", str(w[2]), "value.model.folds=0"),
        4,
        "value.model.folds=0 must be >= 1",
    ),
    (
        "batch does not divide",
        lambda w, o: _run(o, "--config", str(w[2]), "value.train.global_batch=12", "value.train.micro_batch=8"),
        4,
        "not divisible",
    ),
    (
        "intervals incompatible",
        lambda w, o: _run(o, "--config", str(w[2]), "value.train.eval_interval=3", "value.train.save_interval=4"),
        4,
        "value.train.save_interval=4 is not a multiple of value.train.eval_interval=3",
    ),
    (
        "quantile out of range",
        lambda w, o: _run(o, "--config", str(w[2]), "advantages.positive_quantile=1.5"),
        4,
        "advantages.positive_quantile=1.5 is outside (0, 1)",
    ),
    ("gamma 0", lambda w, o: _run(o, "--config", str(w[2]), "returns.gamma=0"), 4, "returns.gamma=0.0 is outside"),
    (
        "NaN failure reward",
        lambda w, o: _run(o, "--config", str(w[2]), "returns.failure_reward=nan"),
        4,
        "returns.failure_reward=nan is not a finite number",
    ),
    ("not enough disk", lambda w, o: _run(o, "--config", str(w[2]), "min_free_gb=1e12"), 4, "GiB free"),
    (
        "missing tokenizer",
        lambda w, o: _run(o, "--config", str(w[2]), f"value.model.tokenizer={w[0]}/tok"),
        3,
        "value.model.tokenizer",
    ),
    ("target step 0", lambda w, o: _run(o, "--config", str(w[2]), "--target-step", "0"), 2, "--target-step 0"),
    (
        "unknown stage",
        lambda w, o: ["run", "--output", str(o), "--config", str(w[2]), "--stages", "retrns"],
        4,
        "no stage 'retrns'",
    ),
    ("output is a file", lambda w, o: _run(w[2], "--config", str(w[2])), 55, "is a file"),
    ("output holds other files", lambda w, o: _run(_busy(w[0]), "--config", str(w[2])), 55, "holds no run.json"),
    ("run exists, no --resume", lambda w, o: _run(w[3], "--config", str(w[2])), 55, "already holds a run"),
    (
        "upstream stage not run",
        lambda w, o: ["run", "--output", str(o), "--config", str(w[2]), "--stages", "advantages"],
        55,
        "needs stages returns, value, which have not completed",
    ),
    (
        "rollout without is_success",
        lambda w, o: _run(o, f"datasets=[{{path: {_no_success(w[0])}, type: rollout}}]"),
        40,
        "needs an is_success column",
    ),
    (
        "changed config on resume",
        lambda w, o: _run(_copy(w, o), "--config", str(w[2]), "--resume", "returns.failure_reward=-10"),
        52,
        "config.returns.failure_reward",
    ),
    (
        "stale sidecar on resume",
        lambda w, o: _run(_stale(w, o), "--config", str(w[2]), "--resume"),
        52,
        "returns.parquet was modified",
    ),
    ("NaN written into returns", lambda w, o: _run(_nan(w, o), "--config", str(w[2]), "--resume"), 52, "was modified"),
    (
        "policy on data without actions",
        lambda w, o: ["run", "--output", str(o), "--config", str(w[2])],
        40,
        "has no action, which the policy stage trains on",
    ),
    (
        "bundle weights differ from their manifest",
        lambda w, o: ["run", str(_tampered_weights(w)), "--output", str(o), "--stages", "returns"],
        5,
        "bundle weights: 1 weights file(s) of",
    ),
    (
        "several problems at once",
        lambda w, o: _run(o, f"datasets=[{{path: {w[0]}/a}}, {{path: /path/to/b}}]"),
        56,
        "preflight found 2 problems",
    ),
]


def _empty(root: Path) -> Path:
    (root / "empty").mkdir(exist_ok=True)
    return root / "empty"


def _no_data(w) -> Path:
    dst = w[0] / "nodata"
    if not dst.exists():
        shutil.copytree(w[1], dst)
        shutil.rmtree(dst / "data")
    return dst


def _no_success(root: Path) -> Path:
    path = root / "nosuccess"
    return path if path.exists() else _dataset(path, success=False)


def _busy(root: Path) -> Path:
    (root / "busy").mkdir(exist_ok=True)
    (root / "busy" / "notes.txt").write_text("mine")
    return root / "busy"


def _tampered_weights(w) -> Path:
    """A packed bundle (its run config, the dataset, pinned weights) whose weights file was replaced after packing."""
    from bundlekit import QUIET, hub_manifest

    from reproduction.release.pack import pack_bundle

    bundle = w[0] / "wbundle"
    if bundle.exists():
        return bundle
    files = {"model.safetensors": b"\x00weights" * 512, "config.json": b'{"hidden_size": 8}\n'}
    src = w[0] / "wsrc"
    (src / "cache" / "up").mkdir(parents=True)
    for name, data in files.items():
        (src / "cache" / "up" / name).write_bytes(data)
    (src / "m.json").write_text(json.dumps(hub_manifest(files)))
    (src / "run.yaml").write_text('datasets:\n  - {path: "${BUNDLE}/data/roll", type: rollout}\n')
    spec = src / "spec.toml"
    spec.write_text(
        f'name = "w"\nroot = "."\nentry_config = "config/run.yaml"\n[[file]]\nsource = "{w[1]}"\ndest = "data/roll"\n'
        '[[config]]\nsource = "run.yaml"\ndest = "config/run.yaml"\n'
        '[[weights]]\nmanifest = "m.json"\nsource = "cache"\n'
    )
    pack_bundle(spec, bundle, ui=QUIET)
    blob = bundle / "weights" / "up" / "model.safetensors"
    blob.write_bytes(blob.read_bytes()[:-1] + b"!")  # same size, other bytes
    return bundle


def _copy(w, out: Path) -> Path:
    shutil.copytree(w[3], out)
    return out


def _stale(w, out: Path) -> Path:
    _copy(w, out)
    sidecar = out / "returns" / "roll" / "returns.parquet"
    sidecar.write_bytes(sidecar.read_bytes()[:-3] + b"xyz")
    return out


def _nan(w, out: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    _copy(w, out)
    path = out / "returns" / "roll" / "returns.parquet"
    t = pq.read_table(path)
    ret = t.column("return").to_numpy().copy()
    ret[0] = np.nan
    pq.write_table(t.set_column(t.column_names.index("return"), "return", pa.array(ret)), path)
    return out


def test_the_list_has_thirty_distinct_cases():
    assert len(BAD_INPUTS) >= 30 and len({b[0] for b in BAD_INPUTS}) == len(BAD_INPUTS)


def _snapshot(paths: list[Path]) -> dict[str, bytes]:
    out = {}
    for root in paths:
        if root.is_dir():
            out.update({str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()})
        elif root.is_file():
            out[str(root)] = root.read_bytes()
    return out


@pytest.mark.parametrize("name, argv, code, words", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_one_line_and_a_documented_code(world, tmp_path, capsys, name, argv, code, words):
    out = tmp_path / "out"
    args = argv(world, out)
    target = Path(args[args.index("--output") + 1])
    before = _snapshot([target, world[3]])
    capsys.readouterr()
    rc = main(args)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == code, err
    assert lines and lines[0].startswith("error: ") and words in lines[0], err
    assert len(lines) <= 2 and (len(lines) == 1 or lines[1].startswith("hint: ")), err
    assert "Traceback" not in err
    after = _snapshot([target, world[3]])
    if target == out and not (out / "run.json").exists():
        assert not out.exists() or not any(out.rglob("*.parquet")), "half-written outputs"
    elif code != 40:
        changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
        assert not changed, f"{name} changed {sorted(changed)}"
    if (out / "run.json").exists():  # a stage failed mid-run: recorded as failed, no outputs claimed
        stages = json.loads((out / "run.json").read_text())["stages"]
        assert all(s["status"] == "failed" and "outputs" not in s for s in stages.values()) or code == 52
