"""bench/gpu_truth.py's CPU smoke form, so the prepared GPU script cannot rot before a GPU is lent.

One run of `gpu_truth.py OUT --smoke` (all five parts, tiny presets, in child processes: ~40 s on 2
cores) serves the module; each test reads its printed lines and JSON files. Two cheap runs check the
failure paths: a part past its time limit is killed and recorded, and a part that raises is recorded
with its error instead of stopping the script.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "gpu_truth.py"
PARTS = ("jit", "value_bf16", "policy_pi05", "resume", "render")
KEYS = {"part", "ok", "figure", "unit", "device", "torch", "cuda", "details"}


def _run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("truth")
    proc = _run(str(out), "--smoke")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = {line.split(":", 1)[0]: line for line in proc.stdout.splitlines() if ":" in line}
    return out, lines, proc.stdout


def _load(out: Path, part: str) -> dict:
    return json.loads((out / f"{part}.json").read_text())


def test_every_part_prints_one_ok_line_and_writes_its_json(smoke):
    out, lines, stdout = smoke
    assert sorted(p.name for p in out.iterdir()) == sorted([f"{p}.json" for p in PARTS] + ["summary.json"])
    for part in PARTS:
        res = _load(out, part)
        assert KEYS <= set(res), (part, set(res))
        assert res["part"] == part and res["ok"] is True and "error" not in res, res
        assert res["device"] == "cpu" and res["cuda"] is None and res["smoke"] is True
        assert isinstance(res["figure"], (int, float)) and math.isfinite(res["figure"])
        assert re.match(rf"^{part}: ok \S+ {re.escape(res['unit'])}", lines[part]), lines[part]
    assert stdout.splitlines()[-1].startswith("gpu_truth: 5/5 parts ok in ")
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["parts"]) == list(PARTS) and all(v["ok"] for v in summary["parts"].values())


def test_jit_runs_portable_check_on_cpu_and_records_the_skip(smoke):
    out, lines, _ = smoke
    d = _load(out, "jit")["details"]
    assert d["command"] == "portable check --jit-smoke --device cpu --json" and d["exit"] == 0
    assert d["report"]["format"] == "recap-portable-check" and d["report"]["jit_smoke"] is True
    assert d["jit_row"]["status"] == "skip" and "needs a CUDA GPU" in d["jit_row"]["finding"]
    assert d["toolchain_row"]["status"] == "ok" and "C extension" in d["toolchain_row"]["finding"]


def test_value_bf16_trains_finite_steps_and_leaves_mfu_null_on_cpu(smoke):
    out, lines, _ = smoke
    res = _load(out, "value_bf16")
    d = res["details"]
    assert d["preset"] == "tiny" and d["micro_batch"] == 4 and len(d["losses"]) == d["steps"] == 4
    assert all(math.isfinite(x) for x in d["losses"])
    assert res["mfu"] is None and d["peak_tflops"] is None and "MFU n/a (no CUDA)" in lines["value_bf16"]
    f = d["flops"]
    expect = 6 * (
        (f["n_vision"] + f["n_projector"]) * f["image_tokens_per_sample"]
        + f["n_text_non_embedding"] * f["prefix_tokens_per_sample"]
    )
    assert f["flops_per_sample_6NT"] == pytest.approx(expect)
    # Half the samples carry the wrist camera: 1.5 images of 16 patches on average.
    assert f["image_tokens_per_sample"] == 24.0 and res["figure"] == d["samples_per_s"] > 0


def test_policy_pi05_runs_fwd_bwd_at_two_batches_and_one_guided_chunk(smoke):
    out, lines, _ = smoke
    res = _load(out, "policy_pi05")
    d = res["details"]
    assert [r["batch"] for r in d["fwd_bwd"]] == [1, 4] and d["largest_batch"] == 4 and d["oom_tries"] == []
    assert res["figure"] == d["fwd_bwd"][1]["tokens_per_s"]
    s = d["sampling"]
    assert s["forward_passes_per_chunk"] == 1 and s["batched_rows"] == 2 and s["guidance_scale"] == 1.5
    assert s["actions_shape"] == [1, 8, 4] and res["sample_latency_s"] == s["latency_s"] > 0
    assert "chunk latency" in lines["policy_pi05"]


def test_resume_after_sigkill_is_bit_identical_on_cpu(smoke):
    out, lines, _ = smoke
    res = _load(out, "resume")
    d = res["details"]
    assert res["identical"] is True and res["figure"] == 0.0 and "bit-identical" in lines["resume"]
    assert d["checkpoints_at_kill"] == [2] and d["resumed_from"] == 2 and d["steps_total"] == 4
    assert d["losses_resumed"] == d["losses_reference"] and len(d["losses_reference"]) == 4
    assert d["weights"]["identical"] is True and d["weights"]["tensors"] > 10


def test_render_measures_egl_and_a_cpu_renderer_and_says_why_libero_is_skipped(smoke):
    out, lines, _ = smoke
    res = _load(out, "render")
    d = res["details"]
    assert d["image_size"] == 64 and d["cameras"] == 2 and d["frames_per_backend"]["egl"] == 40
    egl = d["backends"]["egl"]
    assert egl["MUJOCO_GL"] == "egl" and res["figure"] == round(egl["fps"], 1) > 0
    assert d["cpu_reference"]["fps"] > 0 and res["cpu_fps"] == d["cpu_reference"]["fps"]
    for backend in ("osmesa", "egl_mesa_cpu"):  # each either measured or its failure recorded
        assert "fps" in d["backends"][backend] or d["backends"][backend]["error"]
    assert "skipped" in d["libero"]


def test_a_part_past_its_time_limit_is_killed_and_recorded(tmp_path):
    proc = _run(str(tmp_path), "--smoke", "--parts", "resume", "--budget-s", "6", timeout=90)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    res = _load(tmp_path, "resume")
    assert res["ok"] is False and res["error"].startswith("timed out after 6 s")
    assert "resume: FAIL - " in proc.stdout and "failed: resume" in proc.stdout.splitlines()[-1]
    assert not (tmp_path / "work").exists()


def test_a_part_that_raises_records_its_error(tmp_path):
    proc = _run(str(tmp_path), "--part", "bogus", timeout=60)
    assert proc.returncode == 0, proc.stderr
    res = _load(tmp_path, "bogus")
    assert res["ok"] is False and res["error"] == "KeyError: 'bogus'" and "Traceback" in res["details"]["traceback"]


def test_unknown_parts_are_refused_by_name(tmp_path):
    proc = _run(str(tmp_path), "--parts", "jit,nope", timeout=60)
    assert proc.returncode == 2 and "--parts: unknown part(s) ['nope']" in proc.stderr
    assert list(tmp_path.iterdir()) == []
