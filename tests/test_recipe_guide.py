"""docs/recipes.md's example recipe, as the page writes it, through `portable run`: run, resume, kill -9 during its
training stage and resume to the same bytes, --target-step, a refused changed input, a same_outputs field that does
not change keys, lineage."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from recipe_cli import recipe_env, run_portable

REPO = Path(__file__).resolve().parent.parent
GUIDE = REPO / "docs" / "recipes.md"


def _block(marker: str) -> str:
    """The fenced block right after `<!-- recipe-example:MARKER -->` in the guide."""
    found = re.search(rf"<!-- recipe-example:{marker} -->\n```\w+\n(.*?)\n```", GUIDE.read_text(), re.S)
    assert found, f"docs/recipes.md lost its {marker} block"
    return found.group(1) + "\n"


@pytest.fixture
def guide(tmp_path):
    (tmp_path / "myrecipe.py").write_text(_block("module"))
    (tmp_path / "my.yaml").write_text(_block("config"))
    (tmp_path / "data.txt").write_text("some data\n")
    return tmp_path


def portable(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return run_portable(cwd, *args)


def actions(proc: subprocess.CompletedProcess) -> list[str]:
    assert proc.returncode == 0, proc.stderr
    return [s["action"] for s in json.loads(proc.stdout)["stages"]]


def test_the_guides_recipe_runs_resumes_continues_and_refuses_as_the_page_says(guide):
    run = ["--config", "my.yaml", "--output", "runs/a"]
    assert actions(portable(guide, "run", *run, "--json")) == ["ran", "ran"]
    score = json.loads((guide / "runs/a/score/score.json").read_text())["score"]
    w = 0.0
    for _ in range(6):
        w += 0.5 * (len("some data\n") - w)
    assert score == round(w, 6)
    assert actions(portable(guide, "run", *run, "--resume", "--json")) == ["skipped", "skipped"]
    # a field declared same_outputs() is not in the stage key: --resume does not refuse it
    assert actions(portable(guide, "run", *run, "--resume", "--json", "train.pause_s=0.01")) == ["skipped", "skipped"]

    changed = portable(guide, "run", *run, "--resume", "train.lr=0.25")
    assert changed.returncode == 52, changed.stderr
    assert "stage train: its inputs changed since it ran: config.train.lr: 0.5 -> 0.25" in changed.stderr

    assert actions(portable(guide, "run", *run, "--target-step", "9", "--json")) == ["continued", "ran"]
    state = json.loads((guide / "runs/a/run.json").read_text())["stages"]["train"]
    assert (state["step"], state["resumed_from"]) == (9, 6)
    verify = portable(guide, "lineage", "runs/a", "--verify")
    assert verify.returncode == 0, verify.stderr
    # the opened input's file (DataFile.path) is a material of train's statement: an edit to it fails --verify
    statement = json.loads((guide / "runs/a/lineage/train.intoto.json").read_text())
    deps = statement["predicate"]["buildDefinition"]["resolvedDependencies"]
    assert [d["annotations"]["role"] for d in deps if d["name"].endswith("data.txt")] == ["dataset"]
    (guide / "data.txt").write_text("other data\n")
    verify = portable(guide, "lineage", "runs/a", "--verify")
    assert verify.returncode == 14 and "data.txt (dataset of train.intoto.json)" in verify.stderr, verify.stderr


def test_the_guides_recipe_killed_during_training_resumes_to_the_same_bytes(guide):
    done = portable(guide, "run", "--config", "my.yaml", "--output", "runs/whole")
    assert done.returncode == 0, done.stderr
    slow = subprocess.Popen(
        [sys.executable, "-m", "reproduction.portable", "run", "--config", "my.yaml", "--output", "runs/k"]
        + ["train.pause_s=0.5"],
        env=recipe_env(guide),
        cwd=guide,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    checkpoint = guide / "runs/k/train/checkpoint.json"
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            if checkpoint.is_file() and json.loads(checkpoint.read_text())["step"] >= 2:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the slow run wrote no second checkpoint in 60 s")
    finally:
        slow.send_signal(signal.SIGKILL)
        slow.wait(timeout=30)
    killed_at = json.loads(checkpoint.read_text())["step"]
    assert 2 <= killed_at < 6
    assert json.loads((guide / "runs/k/run.json").read_text())["stages"]["train"]["status"] == "running"

    resumed = portable(guide, "run", "--config", "my.yaml", "--output", "runs/k", "--resume", "--json")
    assert actions(resumed) == ["continued", "ran"]
    assert json.loads((guide / "runs/k/run.json").read_text())["stages"]["train"]["resumed_from"] == killed_at
    for rel in ("train/weights.json", "score/score.json"):
        assert (guide / "runs/k" / rel).read_bytes() == (guide / "runs/whole" / rel).read_bytes(), rel
