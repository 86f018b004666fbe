"""`portable lineage RUN --verify` after audit51 G: wrongly typed statement fields (G8), run.json missing (G13), the
statements checked against run.json's stage records (G1, G2), paths out of the run and links (G5, G3), where a
missing bundle material was looked for (G4), and stale stages named (G12)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from evidence_fixtures import make_run

from reproduction.errors import InvalidInputError
from reproduction.run.lineage_check import lineage_chain, verify_lineage

POLICY = "lineage/policy.intoto.json"


def _edit(run: Path, rel: str, change) -> None:
    path = run / rel
    doc = json.loads(path.read_text())
    doc = change(doc) or doc
    path.write_text(json.dumps(doc))


def _set(path: str, value):
    """A change setting a field of a statement given as "a.b[0].c" (keys and list indices)."""

    def change(doc):
        node, parts = doc, path.replace("[", ".").replace("]", "").split(".")
        for part in parts[:-1]:
            node = node[int(part)] if part.isdigit() else node[part]
        last = parts[-1]
        node[int(last) if last.isdigit() else last] = value

    return change


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        (
            "predicate.buildDefinition.internalParameters.resumed_from",
            10,
            "predicate.buildDefinition.internalParameters.resumed_from is 10, not an object",
        ),
        ("predicate.runDetails.metadata.startedOn", 5, "predicate.runDetails.metadata.startedOn is 5, not a string"),
        ("subject[0].annotations", "x", 'subject[0].annotations is "x", not an object'),
        (
            "predicate.buildDefinition.internalParameters",
            [],
            "predicate.buildDefinition.internalParameters is [], not an object",
        ),
        ("subject[0].digest.sha256", 5, "subject[0].digest.sha256 is 5, not 64 lowercase hex digits"),
        (
            "predicate.buildDefinition.resolvedDependencies[0].annotations.path",
            7,
            "predicate.buildDefinition.resolvedDependencies[0].annotations.path is 7, not a string",
        ),
    ],
)
def test_a_field_of_the_wrong_type_is_exit_4_naming_file_and_field(tmp_path, field, value, said):
    """G8: these gave `internal error: AttributeError ...` (exit 1) from the chain and from verify."""
    fake = make_run(tmp_path)
    _edit(fake.run, POLICY, _set(field, value))
    for read in (lineage_chain, verify_lineage):
        with pytest.raises(InvalidInputError) as err:
            read(fake.run)
        assert err.value.exit_code == 4
        assert str(err.value) == f"{fake.run / POLICY}: {said}"
        assert "rerun the stage" in err.value.hint


def test_run_json_missing_or_unreadable_is_a_problem_not_verified(tmp_path):
    """G13: with run.json gone, deleting the last stages' statements still printed "lineage verified", exit 0."""
    fake = make_run(tmp_path)
    (fake.run / "lineage/eval.intoto.json").unlink()
    (fake.run / "run.json").unlink()
    report = verify_lineage(fake.run)
    assert report.exit_code == 11
    assert [str(p) for p in report.problems] == [
        "missing: run.json (not there): which stages are complete cannot be told, so a deleted statement would go "
        "unnoticed; only the statements there were checked"
    ]
    assert "lineage verified" not in report.summary()
    (fake.run / "run.json").write_text("{")
    assert [p.actual for p in verify_lineage(fake.run).problems] == ["unreadable: JSONDecodeError"]
    (fake.run / "run.json").write_text('{"stages": []}')
    assert [p.actual for p in verify_lineage(fake.run).problems] == ["unreadable: no `stages` object"]


def test_a_statement_of_no_stage_in_run_json_is_named(tmp_path):
    """G2: a copied statement was counted among those that match."""
    fake = make_run(tmp_path)
    lineage = fake.run / "lineage"
    (lineage / "zzz.intoto.json").write_bytes((lineage / "eval.intoto.json").read_bytes())
    report = verify_lineage(fake.run)
    assert report.exit_code == 14
    assert [str(p) for p in report.problems] == ["unrecorded: lineage/zzz.intoto.json (run.json has no stage 'zzz')"]


def test_a_run_path_out_of_the_run_folder_is_refused_unhashed(tmp_path, monkeypatch):
    """G5: "../../../../etc/hostname" was hashed (exit 14), "/proc/self" gave a message naming no file (exit 3)."""
    import reproduction.run.lineage_check as check

    fake = make_run(tmp_path)
    hashed = []
    monkeypatch.setattr(check, "sha256_file", lambda p: hashed.append(p) or "0" * 64)
    for bad in ("../../outside.txt", "/etc/hostname", "policy/../../x"):
        _edit(fake.run, POLICY, _set("subject[0].annotations.path", bad))
        with pytest.raises(InvalidInputError) as err:
            verify_lineage(fake.run)
        assert (
            str(err.value)
            == f'{fake.run / POLICY}: subject[0].annotations.path is "{bad}", not a path inside the run folder'
        )
    assert hashed == []


def test_an_os_error_while_hashing_names_the_path_and_the_statement(tmp_path, monkeypatch):
    import reproduction.run.lineage_check as check

    fake = make_run(tmp_path)

    def refuse(path):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(check, "sha256_file", refuse)
    with pytest.raises(Exception) as err:
        verify_lineage(fake.run)
    assert err.value.exit_code == 3
    assert str(err.value).startswith(f"cannot read {fake.run / 'returns/meta/returns_sft.parquet'}, ")
    assert "(subject of returns.intoto.json)" in str(err.value)


def test_a_pinned_output_now_a_link_is_a_problem_not_followed(tmp_path):
    """G3: a pinned file or folder swapped for a link (same bytes, even outside the run) verified."""
    fake = make_run(tmp_path)
    outside = tmp_path / "outside.json"
    outside.write_bytes(fake.evidence.read_bytes())
    fake.evidence.unlink()
    fake.evidence.symlink_to(outside)
    report = verify_lineage(fake.run)
    assert report.exit_code == 14
    assert [str(p) for p in report.problems] == [
        f"link: evidence/eval_policy_4.json (subject of eval.intoto.json: evidence/eval_policy_4.json -> {outside}; "
        "recording a stage refuses an output that links out)"
    ]
    folder = fake.run / "policy/recap/export"
    folder.rename(tmp_path / "export")
    folder.symlink_to(tmp_path / "export")
    kinds = {(p.kind, p.path) for p in verify_lineage(fake.run).problems}
    assert ("link", "policy/recap/export/model.safetensors") in kinds


def test_a_missing_bundle_material_names_where_it_was_looked_for(tmp_path):
    """G4: a moved bundle gave "missing: bundle.json" lines naming no absolute path and no hint."""
    fake = make_run(tmp_path)
    fake.bundle.rename(tmp_path / "moved")
    report = verify_lineage(fake.run)
    assert report.exit_code == 11
    manifest = [str(p) for p in report.problems if p.path == "bundle.json"]
    assert manifest[0].startswith("missing: bundle.json (bundle_manifest of returns.intoto.json; expected sha256:")
    assert manifest[0].endswith(f"; looked for at {fake.bundle / 'bundle.json'})")
    assert report.notes == [
        f"hint: the bundle these statements read is not at {fake.bundle} (or lacks those files); restore or copy "
        "the bundle back to that folder and verify again"
    ]
    assert report.summary().endswith(report.notes[0])


# -- G1 / G12 on real runs of a two-stage recipe (tests/test_recipe_protocol.py's, a second each) -------------------


def _two_stage_run(tmp_path, cfg=None):
    from test_recipe_protocol import Cfg, recipe, spec

    from reproduction.run.record import make_recorder
    from reproduction.run.runner import RunOptions, run_recipe

    two = recipe(spec(), spec("second", needs=("first",), config=("mode",)))
    run = tmp_path / "run"

    def again(config=None, **kw):
        return run_recipe(two, config or cfg or Cfg(), run, RunOptions(recorder=make_recorder(None), **kw))

    again()
    return run, again


def test_a_statement_disagreeing_with_its_stage_record_differs(tmp_path):
    """G1: a statement's status or config edited after the fact verified (exit 0)."""
    run, _ = _two_stage_run(tmp_path)
    assert verify_lineage(run).problems == []
    first, second = "lineage/first.intoto.json", "lineage/second.intoto.json"
    _edit(run, first, _set("predicate.buildDefinition.internalParameters.status", "failed"))
    _edit(run, first, _set("predicate.buildDefinition.externalParameters.config.train.lr", 0.9))
    # second's key leaves train out: its config is checked by the digest run.json keeps of it
    _edit(run, second, _set("predicate.buildDefinition.externalParameters.config.train.lr", 0.9))
    report = verify_lineage(run)
    assert report.exit_code == 14
    sha = json.loads((run / "run.json").read_text())["stages"]["second"]["lineage"]["config_sha256"]
    assert [str(p) for p in report.problems] == [
        "differs: lineage/first.intoto.json (its status is 'failed'; run.json records stage first complete)",
        "differs: lineage/first.intoto.json (config train.lr is 0.9; run.json's record of stage first (key_parts) "
        "has 0.5)",
        "differs: lineage/second.intoto.json (its config is not the one run.json's record of stage second was run "
        f"with (stages.second.lineage.config_sha256 {sha[:12]}))",
    ]
    # ... and run.json's record edited instead (its top-level `config` is the latest invocation's: not compared)
    run2, _ = _two_stage_run(tmp_path / "b")
    doc = json.loads((run2 / "run.json").read_text())
    doc["stages"]["first"]["key_parts"]["config"]["train"]["lr"] = 0.25
    (run2 / "run.json").write_text(json.dumps(doc))
    assert [str(p) for p in verify_lineage(run2).problems] == [
        "differs: lineage/first.intoto.json (config train.lr is 0.5; run.json's record of stage first (key_parts) "
        "has 0.25)"
    ]


def test_untampered_resumed_restarted_and_stale_runs_verify_as_before(tmp_path):
    """The record and the statement of a stage are written together, so resumes, restarts with another config and
    stages left stale by `--stages` never disagree; a stale stage's differing upstream outputs say why (G12)."""
    from test_recipe_protocol import Cfg, Train

    run, again = _two_stage_run(tmp_path)
    again(resume=True)
    assert verify_lineage(run).problems == []
    again(Cfg(train=Train(lr=0.7)), resume=True, restart=["first"])  # both redone with another config
    assert verify_lineage(run).problems == []
    again(Cfg(train=Train(lr=0.9)), resume=True, restart=["first"], stages=["first"])  # second left stale
    report = verify_lineage(run)
    assert report.exit_code == 14
    assert {(p.kind, p.what, p.statement) for p in report.problems} == {
        ("digest", "upstream_output", "second.intoto.json")
    }
    assert report.notes == ["note: second is stale since first changed after it ran; `portable run --resume` redoes it"]
    assert report.summary().endswith(report.notes[0])
    again(Cfg(train=Train(lr=0.9)), resume=True)
    assert verify_lineage(run).problems == []


def test_a_changed_key_that_does_not_change_outputs_still_verifies(tmp_path):
    """A stage skipped after a key declared not to change outputs changed keeps the statement of the invocation
    that ran it, while run.json's config is the new one: not a disagreement."""
    from dataclasses import dataclass, field

    from reproduction.config_fields import same_outputs

    @dataclass(kw_only=True, slots=True)
    class FreeTrain:
        lr: float = 0.5
        log_every: int = field(default=1, metadata=same_outputs())

    @dataclass(kw_only=True, slots=True)
    class FreeCfg:
        train: FreeTrain = field(default_factory=FreeTrain)
        mode: str = "ok"

    run, again = _two_stage_run(tmp_path, FreeCfg())
    report = again(FreeCfg(train=FreeTrain(log_every=5)), resume=True)
    assert [s.action for s in report.stages] == ["skipped", "skipped"]
    assert json.loads((run / "run.json").read_text())["config"]["train"]["log_every"] == 5
    statement = json.loads((run / "lineage/first.intoto.json").read_text())
    assert statement["predicate"]["buildDefinition"]["externalParameters"]["config"]["train"]["log_every"] == 1
    assert verify_lineage(run).problems == []


@dataclass(kw_only=True, slots=True)
class _StepsTrain:
    steps: int = 3
    lr: float = 0.5


@dataclass(kw_only=True, slots=True)
class _StepsCfg:
    train: _StepsTrain = field(default_factory=_StepsTrain)


def _steps_stage(ctx):
    from reproduction.recipe import StageOutput

    out = ctx.out_dir / "out.txt"
    out.write_text(f"trained {ctx.config.train.steps}\n")
    return StageOutput(files=[out], step=ctx.config.train.steps)


def test_a_stage_that_lists_its_training_key_itself_verifies(tmp_path):
    """audit51 review R2: a stage whose config names its training key itself (config=("train.steps", ...)) has
    that key blanked (null) in run.json's key_parts, since --target-step raises it; verify compared the null with
    the statement's value and called the untampered run `differs` (exit 14)."""
    from reproduction.recipe import Recipe, StageSpec
    from reproduction.run.record import make_recorder
    from reproduction.run.runner import RunOptions, run_recipe

    stage = StageSpec(
        name="first", fn=f"{__name__}:_steps_stage", config=("train.steps", "train.lr"), inputs=False,
        training="train.steps",
    )  # fmt: skip
    run = tmp_path / "run"
    run_recipe(Recipe(name="steps", stages=(stage,)), _StepsCfg(), run, RunOptions(recorder=make_recorder(None)))
    assert json.loads((run / "run.json").read_text())["stages"]["first"]["key_parts"]["config"]["train.steps"] is None
    assert verify_lineage(run).problems == []
    _edit(run, "lineage/first.intoto.json", _set("predicate.buildDefinition.externalParameters.config.train.lr", 0.9))
    assert [str(p) for p in verify_lineage(run).problems] == [
        "differs: lineage/first.intoto.json (config train.lr is 0.9; run.json's record of stage first (key_parts) "
        "has 0.5)"
    ]
