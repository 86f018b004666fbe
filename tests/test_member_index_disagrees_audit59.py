"""audit59 A2: a member index (pinned, so verify passes) that does not describe its archive (a member listed
twice, another left out) was refused as "member 'b' changed since it was validated" with the hint "the archive
changed during restore; run restore again", which fails the same way for ever. The error now says the index and
the archive disagree, naming what the index lists there, and the hint says what to do when a rerun fails too.
audit59 A6: `portable run BUNDLE` called a FIFO bundle.json one that "does not exist"."""

from __future__ import annotations

import json
import os

import pytest
from bundlekit import QUIET
from test_archive_safety import _packed_with_index, _repin

from reproduction.errors import InvalidInputError, UnsafeArchiveError
from reproduction.release.extract import DISAGREE_HINT
from reproduction.release.restore import restore_bundle


@pytest.mark.parametrize("edit", ["twice", "dropped"])
def test_an_index_that_does_not_describe_its_archive_is_named_as_such(tmp_path, edit):
    bundle = _packed_with_index(tmp_path)
    index = bundle / "runtime" / "rt.members.json"
    data = json.loads(index.read_text())
    files = [i for i, m in enumerate(data["members"]) if m[1] == "file"]
    first, second = files[0], files[1]
    if edit == "twice":  # the first file listed again in place of the second
        data["members"][second] = data["members"][first]
    else:  # the second file left out
        del data["members"][second]
    index.write_text(json.dumps(data))
    _repin(bundle, "runtime/rt.members.json")
    if edit == "twice":  # audit60 A5: a path listed twice is refused when the index is read, as in bundle.json
        with pytest.raises(InvalidInputError, match=f"^runtime/rt.members.json: '{data['members'][first][0]}' is l"):
            restore_bundle(bundle, ui=QUIET)
        assert not (bundle / "runtime" / "rt").exists()
        return
    for _ in range(2):  # the same answer every time: no concurrent change to blame
        with pytest.raises(UnsafeArchiveError) as info:
            restore_bundle(bundle, ui=QUIET)
        message = str(info.value)
        assert message.startswith("runtime/rt.tar.zst: "), message
        assert "is not what its member index lists next (" in message, message
        assert "the index and the archive disagree" in message, message
        assert info.value.hint == DISAGREE_HINT
    assert not (bundle / "runtime" / "rt").exists()


def test_run_says_a_fifo_bundle_json_is_not_a_regular_file(tmp_path, capsys):
    from test_run_bundle_inputs import _pack, _run

    bundle = _pack(tmp_path, "fifo", layer=False)
    manifest = bundle / "bundle.json"
    manifest.unlink()
    os.mkfifo(manifest)
    rc, err = _run(bundle, tmp_path / "out", capsys)
    assert rc == 3, err
    assert err.splitlines()[0] == (
        f"error: bundle {bundle} has no readable manifest: {manifest} is not a regular file (a FIFO, a socket or a "
        "device), so nothing it holds can be checked"
    )
