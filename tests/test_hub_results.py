"""Evaluation results the Hub can show: `publish` writes the evidence into the model card's model-index (counts
and Wilson intervals kept in `args`), and `portable compare hub:OWNER/NAME ACTUAL.json` reads them back through
the local Hub server (tests/hubserver.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from evidence_fixtures import PICK, make_evidence
from hubserver import HubServer, make_bundle, portable_cmd, portable_env

from reproduction.errors import InvalidInputError
from reproduction.release.model_card import card_model_index
from reproduction.run.card_evidence import evidence_from_card

TOKEN = "hf_portableHubResults_51c2"


def test_model_index_round_trips_through_the_hub(tmp_path: Path) -> None:
    reference = make_evidence(name="reference run", recap=(1800, 2000), bc=(1000, 2000))
    files = {
        "evidence/eval_policy_1000.json": json.dumps(reference).encode(),
        "LICENSES/Apache-2.0.txt": b"Apache License 2.0\n",
        "reproduction/__init__.py": b"",
    }
    bundle = make_bundle(tmp_path / "bundle", files)
    hub = HubServer(tmp_path / "hub", tokens={TOKEN: ("alice", "write")}).start()
    try:
        env = portable_env(hub, tmp_path / "hfhome", token=TOKEN)
        run = lambda *a: subprocess.run(portable_cmd(*a), env=env, capture_output=True, text=True, timeout=120)  # noqa: E731
        pub = run("publish", str(bundle), "--repo", "alice/recap-results")
        assert pub.returncode == 0, pub.stderr
        card = hub.blob_path(hub.files_at("model/alice/recap-results")["README.md"]).read_text()
        index = card_model_index(card)
        results = index[0]["results"]
        assert index[0]["name"] == "test-bundle" and len(results) == 4  # 2 policies x 2 tasks
        pick = next(r for r in results if r["policy"]["label"] == "recap" and r["dataset"]["name"] == PICK)
        once = next(m for m in pick["metrics"] if m["type"] == "success_once")
        assert once["value"] == 0.9 and once["args"]["successes"] == 900 and once["args"]["episodes"] == 1000
        assert once["args"]["wilson95"] == reference["tasks"][PICK]["success_once"]["wilson95"]
        # Read back: the same counts as the evidence file, so the comparison is the file's (unpaired).
        back = evidence_from_card(card)
        assert back["metrics"]["success_once"] == reference["metrics"]["success_once"]
        assert (
            back["baselines"][0]["tasks"][PICK]["success_at_end"]
            == reference["baselines"][0]["tasks"][PICK]["success_at_end"]
        )
        (tmp_path / "same.json").write_text(json.dumps(make_evidence(recap=(1800, 2000), bc=(1000, 2000))))
        (tmp_path / "drop.json").write_text(json.dumps(make_evidence(recap=(1500, 2000), bc=(1000, 2000))))
        same = run("compare", "hub:alice/recap-results", str(tmp_path / "same.json"), "--json")
        assert same.returncode == 0, same.stderr
        doc = json.loads(same.stdout)
        assert doc["verdict"] == "reproduced" and doc["reference"] == "reference run" and len(doc["rows"]) == 12
        assert run("compare", "hub:alice/recap-results", str(tmp_path / "drop.json")).returncode == 60
        (tmp_path / "card.md").write_text(card)
        assert run("compare", str(tmp_path / "card.md"), str(tmp_path / "same.json")).returncode == 0
        (tmp_path / "plain.md").write_text("# no header\n")
        plain = run("compare", str(tmp_path / "plain.md"), str(tmp_path / "same.json"))
        assert plain.returncode == 4 and "no recap-portable results in its model-index" in plain.stderr
    finally:
        hub.stop()


def _card(results: list) -> str:
    return "---\nmodel-index: " + json.dumps([{"name": "x", "results": results}]) + "\n---\n"


def _result(successes, episodes) -> dict:
    args = {"successes": successes, "episodes": episodes}
    return {
        "policy": {"label": "recap", "mode": "recap", "guidance_scale": 1.0},
        "dataset": {"name": PICK},
        "metrics": [{"type": "success_once", "value": 0.5, "args": args}],
    }


@pytest.mark.parametrize(
    ("results", "words"),
    [
        ([_result(150, 100)], f"recap/{PICK} success_once is 150 of 100 episodes, not a success count"),
        ([_result("90", 100)], "success_once is '90' of 100 episodes"),
        ([_result(-5, 100)], "success_once is -5 of 100 episodes"),
        ([_result(True, 100)], "success_once is True of 100 episodes"),
        (["not a mapping"], "its model-index is not of the shape recap-portable publishes (AttributeError"),
        ([{**_result(5, 10), "metrics": {"a": 1}}], "its model-index is not of the shape"),
    ],
)
def test_a_hand_edited_model_index_is_invalid_input_naming_the_card(results, words):
    """A card's counts went through int() (`"90"` read as 90, 89.5 as 89) and an impossible count reached
    count_metric's plain ValueError (exit 1); a list where a mapping goes was an AttributeError (exit 1)."""
    with pytest.raises(InvalidInputError) as err:
        evidence_from_card(_card(results), where="card.md")
    assert err.value.exit_code == 4 and str(err.value).startswith("card.md") and words in str(err.value)
