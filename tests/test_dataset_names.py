"""A dataset entry's name becomes a sidecar folder and its tag a file name (audit52 W3): a path ending in `..`, a
name with a separator or a tag that climbs is refused where the entry is made, exit 4, before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from reproduction.errors import ConfigError
from reproduction.recap.sources import DatasetSource
from reproduction.run.resolve import load_run_config

DEMO = Path(__file__).resolve().parent.parent / "bundle" / "demo" / "run.yaml"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"path": "/d/sft/.."}, "name"),
        ({"path": "/d/sft", "name": "a/b"}, "name"),
        ({"path": "/d/sft", "name": ".."}, "name"),
        ({"path": "/d/sft", "name": "a\0b"}, "name"),
        ({"path": "/d/sft", "tag": "x/../../ESCAPED"}, "tag"),
    ],
)
def test_an_entry_whose_name_or_tag_is_no_plain_component_is_refused(kwargs, field):
    with pytest.raises(ConfigError) as info:
        DatasetSource(**kwargs)
    assert info.value.exit_code == 4
    assert info.value.field == field


def test_folder_names_keep_their_own_characters():
    assert DatasetSource(path="/d/pick place+v2").name == "pick place+v2"
    assert DatasetSource(path="/d/sft/").name == "sft"


def test_the_run_config_refuses_a_dataset_path_ending_in_dotdot():
    with pytest.raises(ConfigError) as info:
        load_run_config([DEMO], ["datasets[0].path=/b/data/sft/.."], bundle=Path("/b"), run_dir=None)
    assert info.value.exit_code == 4
    assert info.value.message == (
        "command line: datasets[].path='/b/data/sft/..' does not end in a dataset folder's name"
    )
