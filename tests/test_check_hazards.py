"""Each hazard triggers on a real input (fake packages on PYTHONPATH, bundle files), with its message and exit code."""

from __future__ import annotations

import json
from pathlib import Path

import numpy
import pytest

from reproduction.checks import configs
from reproduction.checks.report import collect_report
from tests.fixtures.checks.bundles import make_bundle
from tests.fixtures.checks.fakes import FIXTURES, fake_package, make_context

GOOD_YAML = """\
runner:
  save_interval: 200
  val_check_interval: 100
actor:
  micro_batch_size: 4
  global_batch_size: 64
cluster:
  num_nodes: 2
  num_gpus_per_node: 8
data:
  path: ${BUNDLE}/data/libero_10
"""


def _rows(report):
    return {r.name: r for r in report.results}


def _check(tmp_path, bundle=None, env=None, **kw):
    return collect_report(bundle, ctx=make_context(tmp_path / "ctx", env=env, **kw))


@pytest.fixture(autouse=True)
def _ctx_dir(tmp_path):
    (tmp_path / "ctx").mkdir()


def test_real_numpy_is_2_here():
    assert int(numpy.__version__.split(".")[0]) >= 2


def test_fake_tensorflow_next_to_numpy2_fails_23(tmp_path):
    fake_package(tmp_path / "site", "tensorflow")
    report = _check(tmp_path, env={"PYTHONPATH": str(tmp_path / "site")})
    row = _rows(report)["hazard.tensorflow"]
    assert row.status == "fail" and row.failure == "hazard"
    assert row.finding.startswith(
        f"TensorFlow (unknown version) at {tmp_path / 'site' / 'tensorflow' / '__init__.py'} "
        f"importable next to NumPy {numpy.__version__}"
    )
    assert "pip uninstall tensorflow" in row.fix
    assert report.exit_code == 23


def test_old_tensorflow_version_fails_and_numpy2_built_one_warns(tmp_path):
    fake_package(tmp_path / "old", "tensorflow", "2.15.1")
    row = _rows(_check(tmp_path, env={"PYTHONPATH": str(tmp_path / "old")}))["hazard.tensorflow"]
    assert row.status == "fail" and "TensorFlow 2.15.1" in row.finding
    fake_package(tmp_path / "new", "tensorflow", "2.18.0")
    report = _check(tmp_path, env={"PYTHONPATH": str(tmp_path / "new")})
    assert _rows(report)["hazard.tensorflow"].status == "warn" and report.exit_code == 0


def test_torch_npu_without_cann_fails_23(tmp_path):
    fake_package(tmp_path / "site", "torch_npu", "2.13.0")
    report = _check(tmp_path, env={"PYTHONPATH": str(tmp_path / "site")})
    row = _rows(report)["hazard.torch_npu"]
    assert row.failure == "hazard"
    assert "plain `import torch` fails (Failed to load the backend extension: torch_npu)" in row.finding
    assert report.exit_code == 23
    # With a CANN toolkit present, the same install is fine.
    info = tmp_path / "ctx" / "Ascend" / "ascend-toolkit" / "latest" / "x86_64-linux" / "ascend_toolkit_install.info"
    info.parent.mkdir(parents=True)
    info.write_text((FIXTURES / "ascend_toolkit_install.info").read_text())
    assert _rows(_check(tmp_path, env={"PYTHONPATH": str(tmp_path / "site")}))["hazard.torch_npu"].status == "ok"


def test_transfer_to_npu_in_sources_fails_23_with_file_and_line(tmp_path):
    src = "import torch\nimport torch_npu\nfrom torch_npu.contrib import transfer_to_npu  # noqa\n"
    bundle = make_bundle(
        tmp_path / "b",
        sources={"rlinf/train.py": src, "rlinf/ok.py": "# transfer_to_npu is banned\n"},
        configs={"run.yaml": GOOD_YAML},
    )
    report = _check(tmp_path, bundle)
    row = _rows(report)["hazard.transfer_to_npu"]
    assert row.failure == "hazard"
    assert f"transfer_to_npu used in 1 place(s): {bundle / 'source/upstream/rlinf/train.py'}:3" in row.finding
    assert _rows(report)["bundle.restore"].status == "ok"
    assert report.exit_code == 23


def test_transfer_to_npu_in_a_config_is_found(tmp_path):
    bundle = make_bundle(
        tmp_path / "b", configs={"npu.yaml": "runtime:\n  patches: [torch_npu.contrib.transfer_to_npu]\n"}
    )
    row = _rows(_check(tmp_path, bundle))["hazard.transfer_to_npu"]
    assert row.status == "fail" and "config/npu.yaml:2" in row.finding


def test_hub_online_with_local_datasets_warns(tmp_path):
    bundle = make_bundle(tmp_path / "b", data=True, configs={"run.yaml": GOOD_YAML})
    report = collect_report(bundle, ctx=_online_ctx(tmp_path))
    row = _rows(report)["hazard.hub_offline"]
    assert (
        row.status == "warn"
        and "HF_HUB_OFFLINE unset" in row.finding
        and row.fix == "export HF_HUB_OFFLINE=1 before the run"
    )
    assert report.exit_code == 0
    assert _rows(_check(tmp_path, bundle))["hazard.hub_offline"].status == "ok"


def _online_ctx(tmp_path):
    ctx = make_context(tmp_path / "ctx")
    ctx.env.pop("HF_HUB_OFFLINE")
    return ctx


def test_path_to_placeholder_fails_23(tmp_path):
    text = GOOD_YAML.replace("${BUNDLE}/data/libero_10", "/path/to/libero_10")
    bundle = make_bundle(tmp_path / "b", configs={"run.yaml": text})
    report = _check(tmp_path, bundle)
    row = _rows(report)["hazard.placeholders"]
    assert row.failure == "hazard" and f"{bundle / 'config/run.yaml'}:11" in row.finding
    assert report.exit_code == 23


@pytest.mark.parametrize(
    "name,text",
    [
        ("run.yaml", GOOD_YAML.replace("save_interval: 200", "save_interval: 250")),
        ("run.toml", "[runner]\nsave_interval = 250\nval_check_interval = 100\n"),
        ("run.json", json.dumps({"runner": {"save_interval": 250, "val_check_interval": 100}})),
    ],
)
def test_save_interval_not_multiple_of_val_fails_23(tmp_path, name, text):
    bundle = make_bundle(tmp_path / "b", configs={name: text})
    report = _check(tmp_path, bundle)
    row = _rows(report)["hazard.intervals"]
    assert row.failure == "hazard"
    assert row.finding == f"config/{name}: runner.save_interval=250 is not a multiple of runner.val_check_interval=100"
    assert report.exit_code == 23


def test_batch_not_dividing_across_workers_fails_23(tmp_path):
    bad = GOOD_YAML.replace("global_batch_size: 64", "global_batch_size: 48")  # 48 % (4 x 16) != 0
    bundle = make_bundle(
        tmp_path / "b",
        configs={"run.yaml": bad, "w.toml": "workers = 3\nmicro_batch_size = 2\nglobal_batch_size = 8\n"},
    )
    report = _check(tmp_path, bundle)
    row = _rows(report)["hazard.batch"]
    assert row.failure == "hazard"
    assert (
        "config/run.yaml: actor.global_batch_size=48 does not divide into actor.micro_batch_size=4 x 16 workers "
        "(cluster.num_nodes x cluster.num_gpus_per_node)"
    ) in row.finding
    assert (
        "config/w.toml: global_batch_size=8 does not divide into micro_batch_size=2 x 3 workers (workers)"
        in row.finding
    )
    assert report.exit_code == 23


OWN_YAML = """\
value:
  train: {world_size: 8, micro_batch: 32, global_batch: 256, eval_interval: 500, save_interval: 3000}
policy:
  train: {world_size: 8, micro_batch: 32, global_batch: 384, eval_interval: 400, save_interval: 3000}
sft:
  train: {micro_batch: 3, global_batch: 8}
rl: {eval_every: 10, save_every: 25}
"""


def test_recap_portables_own_config_keys_are_checked(tmp_path):
    """Before: only RLinf's keys were read, so a recap-portable run config (value.train, policy.train, sft.train, rl)
    passed as "consistent in 0 config(s)" whatever it held."""
    bundle = make_bundle(tmp_path / "b", configs={"run.yaml": OWN_YAML})
    rows = _rows(report := _check(tmp_path, bundle))
    assert rows["hazard.intervals"].finding == (
        "config/run.yaml: policy.train.save_interval=3000 is not a multiple of policy.train.eval_interval=400; "
        "config/run.yaml: rl.save_every=25 is not a multiple of rl.eval_every=10"
    )
    assert rows["hazard.batch"].finding == (
        "config/run.yaml: policy.train.global_batch=384 does not divide into policy.train.micro_batch=32 x 8 workers "
        "(policy.train.world_size); config/run.yaml: sft.train.global_batch=8 does not divide into "
        "sft.train.micro_batch=3 x 1 workers (no sft.train.world_size: 1)"
    )
    assert rows["hazard.batch"].failure == "hazard" and report.exit_code == 23


@pytest.mark.parametrize("name", ["grpo", "libero10"])
def test_the_shipped_run_configs_pass_and_are_read(tmp_path, name):
    text = (Path(__file__).resolve().parent.parent / "bundle" / name / "config.yaml").read_text()
    rows = _rows(_check(tmp_path, make_bundle(tmp_path / "b", configs={"run.yaml": text})))
    assert rows["hazard.intervals"].finding == "save/val intervals consistent in 1 config(s)"
    assert rows["hazard.batch"].finding == "batch sizes divide across workers in 1 config(s)"


def test_good_configs_pass_every_hazard(tmp_path):
    bundle = make_bundle(tmp_path / "b", configs={"run.yaml": GOOD_YAML, "bad.yaml": "runner: [unclosed\n"}, sources={})
    report = _check(tmp_path, bundle)
    rows = _rows(report)
    for name in (
        "hazard.transfer_to_npu",
        "hazard.placeholders",
        "hazard.intervals",
        "hazard.batch",
        "hazard.tensorflow",
    ):
        assert rows[name].status == "ok", rows[name]
    assert "in 1 config(s); not read: bad.yaml (malformed" in rows["hazard.intervals"].finding
    assert report.exit_code == 0


def test_config_lookup_skips_interpolations():
    data = {"runner": {"save_interval": "${oc.env:SAVE}", "val_check_interval": 10}, "save_interval": 30}
    assert configs.first_int(data, configs.SAVE_KEYS) == ("save_interval", 30)
    assert configs.worker_count({"cluster": {"num_gpus_per_node": 8}}) == ("cluster.num_gpus_per_node", 8)
    assert configs.worker_count({}) is None
