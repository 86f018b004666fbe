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
