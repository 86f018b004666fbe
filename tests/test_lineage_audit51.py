"""`portable lineage RUN --verify` after audit51 G: wrongly typed statement fields (G8), run.json missing (G13), the
statements checked against run.json's stage records (G1, G2), paths out of the run and links (G5, G3), where a
missing bundle material was looked for (G4), and stale stages named (G12)."""

from __future__ import annotations

import json
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
