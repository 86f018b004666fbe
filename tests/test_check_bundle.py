"""Bundle probes: not a bundle, not restored, moved since restore, disk too small; the restored
interpreter is the target."""

from __future__ import annotations

import os
import shutil
import sys

from reproduction.checks.report import collect_report
from reproduction.release.manifest import load_manifest
from tests.fixtures.checks.bundles import make_bundle, write_receipt
from tests.fixtures.checks.fakes import make_context


def _rows(report):
    return {r.name: r for r in report.results}


def _check(tmp_path, bundle, **kw):
    (tmp_path / "ctx").mkdir(exist_ok=True)
    return collect_report(bundle, ctx=make_context(tmp_path / "ctx", **kw))


def test_folder_without_bundle_json_fails_24(tmp_path):
    (tmp_path / "notabundle").mkdir()
    report = _check(tmp_path, tmp_path / "notabundle")
    row = _rows(report)["bundle"]
    assert row.failure == "bundle"
    assert (
        f"{tmp_path / 'notabundle'} is not a usable bundle: "
        f"{tmp_path / 'notabundle' / 'bundle.json'}: no bundle manifest" in row.finding
    )
    assert _rows(report)["hazard.placeholders"].finding == "the bundle could not be read"
    assert report.exit_code == 24


def test_missing_folder_fails_24(tmp_path):
    report = _check(tmp_path, tmp_path / "nowhere")
    assert _rows(report)["bundle"].finding == f"{tmp_path / 'nowhere'} is not a folder" and report.exit_code == 24


def test_unrestored_bundle_fails_24_naming_restore(tmp_path):
    bundle = make_bundle(tmp_path / "b", sources={"x.py": "print(1)\n"}, restored=False)
    report = _check(tmp_path, bundle)
    row = _rows(report)["bundle.restore"]
    assert row.finding == f"not restored: no receipt at {bundle / '.portable' / 'receipt.json'}"
    assert row.fix == f"run `portable restore {bundle}`"
    assert report.exit_code == 24


def test_moved_bundle_fails_24_until_restored_again(tmp_path):
    bundle = make_bundle(tmp_path / "b", sources={"x.py": "print(1)\n"}, restored=False)
    write_receipt(bundle, load_manifest(bundle), prefix_root=tmp_path / "old-place")
    report = _check(tmp_path, bundle)
    row = _rows(report)["bundle.restore"]
    assert row.failure == "bundle"
    assert f"source/upstream was relocated to {tmp_path / 'old-place' / 'source/upstream'}" in row.finding
    write_receipt(bundle, load_manifest(bundle))
    assert _rows(_check(tmp_path, bundle))["bundle.restore"].status == "ok"


def test_moving_a_bundle_without_prefixes_needs_no_restore(tmp_path):
    bundle = make_bundle(tmp_path / "b", runtime_python=True, restored=False)  # runtime layer without prefix files
    write_receipt(bundle, load_manifest(bundle), prefix_root=tmp_path / "old-place")
    assert _rows(_check(tmp_path, bundle))["bundle.restore"].status == "ok"


def test_receipt_module_absent_is_a_clear_warning(tmp_path, monkeypatch):
    bundle = make_bundle(tmp_path / "b", sources={"x.py": "print(1)\n"})
    monkeypatch.setitem(sys.modules, "reproduction.release.receipt", None)  # import now raises ImportError
    row = _rows(_check(tmp_path, bundle))["bundle.restore"]
    assert row.status == "warn" and row.finding.startswith("cannot read restore receipts in this version")


def test_not_enough_disk_for_the_run_fails_24(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    bundle = make_bundle(tmp_path / "b", metadata={"run_disk_bytes": free * 4})
    report = _check(tmp_path, bundle)
    row = _rows(report)["bundle.disk"]
    assert row.failure == "bundle" and "(metadata.run_disk_bytes)" in row.finding and "the run needs" in row.finding
    assert report.exit_code == 24


def test_disk_rule_defaults_to_twice_the_weights(tmp_path):
    bundle = make_bundle(tmp_path / "b")
    row = _rows(_check(tmp_path, bundle))["bundle.disk"]
    assert row.status == "ok" and row.details["need"] == 2 * 1024 + 1024**3
    assert "2 x weights (0.0 GiB) + 1 GiB" in row.finding


def test_restored_runtime_interpreter_is_the_target(tmp_path):
    bundle = make_bundle(tmp_path / "b", runtime_python=True, configs={"run.toml": "save_interval = 10\n"})
    report = _check(tmp_path, bundle)
    rows = _rows(report)
    assert report.python == str(bundle / "runtime/python/bin/python3")
    assert rows["toolchain"].status == "ok" and rows["toolchain"].details["python"] == report.python
    assert rows["bundle.restore"].status == "ok" and report.exit_code == 0
    assert os.path.islink(report.python)


def test_real_pack_and_restore_then_check(tmp_path):
    """The receipt restore really writes is what the check reads: unrestored -> 24, restored -> 0."""
    from reproduction.release.pack import pack_bundle
    from reproduction.release.restore import restore_bundle
    from reproduction.ui import UiOptions

    (tmp_path / "src/up").mkdir(parents=True)
    (tmp_path / "src/up/train.py").write_text("import torch\n")
    (tmp_path / "run.yaml").write_text("runner:\n  save_interval: 200\n  val_check_interval: 100\n")
    (tmp_path / "spec.toml").write_text(
        'name = "itest"\n[[layer]]\nsource = "src/up"\nkind = "source"\n'
        '[[config]]\nsource = "run.yaml"\ndest = "config/run.yaml"\n'
    )
    quiet = UiOptions(quiet=True, progress=False)
    pack_bundle(tmp_path / "spec.toml", tmp_path / "b", ui=quiet)
    report = _check(tmp_path, tmp_path / "b")
    assert _rows(report)["bundle.restore"].finding.startswith("not restored: no receipt at") and report.exit_code == 24
    restore_bundle(tmp_path / "b", ui=quiet)
    report = _check(tmp_path, tmp_path / "b")
    assert _rows(report)["bundle.restore"].status == "ok" and _rows(report)["hazard.intervals"].status == "ok"
    assert report.exit_code == 0


# -- value exports: read with the one reader stage 3 uses (reproduction/value_export.py) --------------

HEAD = {
    "format_version": 1,
    "return_range": {"return_min": -50.0, "return_max": 0.0},
    "num_bins": 201,
    "v_min": -1.0,
    "v_max": 0.0,
    "folds": 1,
}


def _with_export(tmp_path, head, *, where="weights/value/export", config=None):
    import json

    configs = {"run.yaml": config} if config else None
    bundle = make_bundle(tmp_path / "b", configs=configs)
    (bundle / where).mkdir(parents=True)
    (bundle / where / "value_head.json").write_text(json.dumps(head))
    return bundle


def test_a_value_export_a_config_names_is_validated(tmp_path):
    bundle = _with_export(tmp_path, HEAD, config="value:\n  export: ${BUNDLE}/weights/value/export\n")
    row = _rows(_check(tmp_path, bundle))["bundle.value_export"]
    assert row.status == "ok" and "config/run.yaml: value.export (201 bins, returns [-50, 0])" in row.finding


def test_a_bad_value_export_fails_24_naming_the_file_and_field(tmp_path):
    bad = {**HEAD, "return_range": {"return_min": -50.0}}
    bundle = _with_export(tmp_path, bad, config="value:\n  export: weights/value/export\n")
    report = _check(tmp_path, bundle)
    row = _rows(report)["bundle.value_export"]
    head = bundle / "weights/value/export/value_head.json"
    assert row.failure == "bundle" and report.exit_code == 24
    assert row.finding == (
        f"value export named by config/run.yaml: value.export: {head}: field return_range.return_max is None, "
        "not a finite number"
    )
    assert "\n" not in row.finding and row.details["field"] == "return_range.return_max"
    future = _with_export(tmp_path / "v2", {**HEAD, "format_version": 3}, config="v: weights/value/export\n")
    row = _rows(_check(tmp_path / "v2", future))["bundle.value_export"]
    assert row.failure == "bundle" and "format_version 3 is not one of [1, 2]" in row.finding


def test_no_value_export_no_row_and_unrelated_strings_are_ignored(tmp_path):
    bundle = make_bundle(tmp_path / "b", configs={"run.yaml": "a: ${BUNDLE}/data\nb: '${RUN}/x'\nc: [1, two]\n"})
    assert "bundle.value_export" not in _rows(_check(tmp_path, bundle))


def test_check_imports_no_pipeline_package():
    """The control plane reads the value export through the leaf module, never through recap (ARCHITECTURE)."""
    import subprocess

    code = (
        "import sys; import reproduction.checks.report, reproduction.checks.bundle, reproduction.value_export; "
        "bad = [m for m in sys.modules if m.split('.')[:2] in (['reproduction', p] for p in "
        "('recap', 'run', 'train', 'sim', 'data')) or m.split('.')[0] in ('torch', 'ray', 'pyarrow', 'numpy')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
