"""A disk that fills while a run writes: exit 8 (WriteFailedError) naming the path and the space needed, and
nothing half-written that `--resume` would trust. Each writer runs on a small tmpfs (skipped, with the
reason, where one cannot be mounted: not root, no mount namespace)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

from reproduction.errors import WriteFailedError
from reproduction.train import checkpoint
from reproduction.ui import human_bytes


@contextlib.contextmanager
def _tmpfs(root: Path, size_kb: int):
    """A tmpfs of `size_kb` KiB mounted at root/<random>, unmounted at the end."""
    where = root / f"fs-{uuid.uuid4().hex[:8]}"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(where)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}); needs root")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _model(width: int):
    torch.manual_seed(0)
    model = torch.nn.Linear(width, width)
    optim = torch.optim.Adam(model.parameters())
    model(torch.randn(2, width)).sum().backward()
    optim.step()
    return model, optim


def _save(root: Path, step: int, model, optim):
    return checkpoint.save(
        root,
        step,
        model,
        optim,
        config_digest="d",
        resume_key={},
        data_cursor={},
        trainer={},
        canary_loss=0.0,
        keep_last=3,
    )


def test_a_checkpoint_that_does_not_fit_is_exit_8_and_leaves_the_last_complete_one(tmp_path):
    model, optim = _model(64)  # 16 KiB of weights, 49 KiB with Adam's two moments; 107 KiB on disk
    with _tmpfs(tmp_path, 160) as fs:
        root = fs / "checkpoints"
        _save(root, 1, model, optim)
        assert checkpoint.complete_steps(root) == [1]
        with pytest.raises(WriteFailedError) as caught:
            _save(root, 2, model, optim)
        err = caught.value
        assert err.exit_code == 8
        assert str(err).startswith(f"cannot write checkpoint step 2: the disk is full at {root}/step_2.partial (")
        first = sum(p.stat().st_size for p in (root / "step_1").iterdir())
        assert err.need == first and f"it needs about {human_bytes(first)}, " in str(err), str(err)
        assert err.free < first and str(err).endswith(f"{human_bytes(err.free)} were free)")
        assert "--resume" in err.hint and "\n" not in str(err)
        assert sorted(p.name for p in root.iterdir()) == ["LATEST", "step_1"]  # no step_2.partial, no step_2
        manifest = checkpoint.read_manifest(root / "step_1")
        assert checkpoint.verify_files(root / "step_1", manifest) == []


def test_an_export_that_does_not_fit_is_exit_8_and_keeps_the_previous_export(tmp_path):
    small, _ = _model(16)
    big, _ = _model(128)  # 64.5 KiB of fp32 weights
    with _tmpfs(tmp_path, 48) as fs:
        out = checkpoint.export(small, fs / "export", model_config={"w": 16}, train_config={})
        before = (out / "model.safetensors").read_bytes()
        with pytest.raises(WriteFailedError) as caught:
            checkpoint.export(big, fs / "export", model_config={"w": 128}, train_config={})
        assert str(caught.value).startswith(f"cannot write the model export {fs}/export: the disk is full at ")
        assert "it needs about 64.5 KiB" in str(caught.value)
        assert sorted(p.name for p in fs.iterdir()) == ["export"]  # no export.partial
        assert (fs / "export" / "model.safetensors").read_bytes() == before
        assert json.loads((fs / "export" / "model_config.json").read_text()) == {"w": 16}


def test_a_full_disk_in_a_worker_comes_back_as_exit_8_not_a_worker_bug():
    import errno

    from reproduction.train.launcher import _task_body

    def fills(_payload):
        raise OSError(errno.ENOSPC, "No space left on device", "/run/x/returns.parquet")

    outcome = _task_body(fills, None)
    with pytest.raises(WriteFailedError, match=r"^cannot write a file of the run: the disk is full at /run/x/returns"):
        outcome.unwrap()

    def bug(_payload):
        raise OSError(errno.EIO, "I/O error")

    with pytest.raises(OSError):  # anything else is still a worker failure, reported with its traceback
        _task_body(bug, None)


def _roll(root: Path) -> Path:
    from reproduction.data.writer import EpisodeData, write_dataset

    rng = np.random.default_rng(0)
    feats = {"observation.state": {"dtype": "float32", "shape": [2]}, "is_success": {"dtype": "bool", "shape": [1]}}
    eps = [
        EpisodeData(
            episode_index=e,
            task="t",
            frames={"observation.state": rng.normal(size=(4, 2)).astype(np.float32), "is_success": np.full(4, e % 2)},
        )
        for e in range(40)
    ]
    return write_dataset(root, eps, fps=10, features=feats)


def test_a_full_run_folder_is_one_line_exit_8_and_resume_completes_after_making_room(tmp_path, capsys):
    """Run folders of 4, 8, ... 20 KiB: each run stops at another writer (the returns sidecar, its stats,
    run.json, the lineage statement); every one is exit 8 naming the file, and after making room
    `--resume` completes with the outputs of a clean run."""
    from reproduction.portable import main

    ds = _roll(tmp_path / "data" / "roll")
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"datasets:\n  - {{path: {ds}, type: rollout}}\nmin_free_gb: 0\n")
    clean = tmp_path / "clean"
    assert main(["-q", "run", "--config", str(cfg), "--output", str(clean), "--stages", "returns"]) == 0
    want = json.loads((clean / "run.json").read_text())["stages"]["returns"]["outputs"]
    hit = set()
    for size_kb in (4, 8, 12, 16, 20):
        with _tmpfs(tmp_path, size_kb) as fs:
            out = fs / "out"
            capsys.readouterr()
            rc = main(["-q", "run", "--config", str(cfg), "--output", str(out), "--stages", "returns"])
            err = capsys.readouterr().err
            lines = err.strip().splitlines()
            assert rc == 8, err
            assert lines[0].startswith(f"error: cannot write a file: the disk is full at {out}/"), err
            assert lines[0].endswith(" were free)") and lines[1].startswith("hint: free ") and len(lines) == 2, err
            hit.add(lines[0].split(f"{out}/", 1)[1].split(" ", 1)[0])
            assert not [p for p in fs.rglob("*") if p.name.endswith((".tmp", ".partial"))]  # no temp file left
            if (out / "run.json").exists():
                state = json.loads((out / "run.json").read_text())
                assert state["stages"]["returns"]["status"] != "complete"  # nothing is claimed
            else:  # the very first write failed: nothing else was written either
                assert not [
                    p for p in out.rglob("*") if p.is_file() and p.name != ".lock"
                ]  # the run folder's lock only
            subprocess.run(["mount", "-o", "remount,size=1m", str(fs)], check=True)
            again = ["-q", "run", "--config", str(cfg), "--output", str(out), "--stages", "returns", "--resume"]
            assert main(again) == 0, capsys.readouterr().err
            got = json.loads((out / "run.json").read_text())["stages"]["returns"]
            assert got["status"] == "complete"
            assert {k: v[2] for k, v in got["outputs"].items()} == {k: v[2] for k, v in want.items()}
    assert "run.json" in hit and len(hit) >= 3, hit


def _cli_error(monkeypatch, capsys, tmp_path: Path, body) -> tuple[int, list[str]]:
    """`portable run` whose work is `body()`: the exit code and stderr lines the CLI gives for what it raises."""
    from reproduction import portable

    monkeypatch.setattr("reproduction.run.cli.cmd_run", lambda args: body())
    capsys.readouterr()
    rc = portable.main(["run", "--output", str(tmp_path / "unused")])
    return rc, capsys.readouterr().err.strip().splitlines()


def test_evidence_that_does_not_fit_is_one_line_exit_8_and_keeps_the_previous_file(tmp_path, monkeypatch, capsys):
    from reproduction.run.evidence import write_evidence

    with _tmpfs(tmp_path, 32) as fs:
        path = fs / "run" / "evidence" / "eval_policy_2.json"
        write_evidence(path, {"metrics": {}})
        before = path.read_bytes()
        rc, lines = _cli_error(monkeypatch, capsys, tmp_path, lambda: write_evidence(path, {"pad": "x" * 65536}))
        assert rc == 8, lines
        assert lines[0].startswith(f"error: cannot write a file: the disk is full at {path} (it needs about 64"), lines
        assert lines[0].endswith(" were free)") and lines[1].startswith("hint: free ") and len(lines) == 2, lines
        assert path.read_bytes() == before  # the old evidence, whole
        assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file beside it


def test_an_evaluation_video_that_does_not_fit_is_one_line_exit_8_and_leaves_no_part(tmp_path, monkeypatch, capsys):
    from reproduction.sim.evaluate import EvalConfig, _Collect

    task = "FetchPickAndPlace-v4"
    episode = {"episode": 0, "reset_seed": 0, "success_once": True, "success_at_end": True, "mp4": b"\0" * 65536}
    with _tmpfs(tmp_path, 32) as fs:
        collect = _Collect(EvalConfig(tasks=(task,), episodes_per_task=1, videos=1))
        rc, lines = _cli_error(monkeypatch, capsys, tmp_path, lambda: collect.add({"task": task}, [episode], fs))
        assert rc == 8, lines
        assert lines[0].startswith(f"error: cannot write a file: the disk is full at {fs}/videos/"), lines
        assert "(it needs about 64.0 KiB, " in lines[0] and len(lines) == 2, lines
        assert list((fs / "videos").iterdir()) == []  # the half-written temp was removed
