"""The spec hints point at a format every install has (audit63 misc 3): they said "bundle/demo.toml shows the
format", and a pip-installed user has no bundle/ folder. `portable pack --help` now shows the format (every key
a spec may have), and each spec hint names it, on one line. In-process through `portable.main`; fast."""

from __future__ import annotations

import pytest

from reproduction.portable import main
from reproduction.release.spec import FILE_KEYS, LAYER_KEYS, SPEC_KEYS, WEIGHTS_KEYS

TABLES = {"layer": "[[layer]]", "file": "[[file]]", "config": "[[config]]", "paths": "[paths]"}
TABLES["weights"] = "[[weights]]"


def test_pack_help_shows_every_key_of_the_spec(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    with pytest.raises(SystemExit) as done:
        main(["pack", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "spec format (SPEC.toml" in text
    lines = [line.split("#")[0].strip() for line in text.splitlines()]
    for key in SPEC_KEYS:
        assert TABLES.get(key, f"{key} =") in text, key
    for key in {*LAYER_KEYS, *FILE_KEYS, *WEIGHTS_KEYS} - {"origin"}:  # origin: said in words below the example
        assert any(line.startswith(f"{key} =") for line in lines), key
    assert 'origin = "..."' in text


def _pack(spec, tmp_path, capsys) -> tuple[int, list[str]]:
    code = main(["pack", str(spec), "--out", str(tmp_path / "b")])
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(
    ("text", "code", "hint"),
    [
        (None, 3, "hint: name a bundle spec (TOML); `portable pack --help` shows the format"),
        ("name = [\n", 4, "hint: fix the TOML syntax there (`portable pack --help` shows the format)"),
        ('name = "n"\nlayer = [3]\n', 4, "hint: fix the spec (`portable pack --help` shows the format)"),
        (
            'name = "n"\nbogus = 1\n',
            4,
            "hint: the keys of the top level are name, description, root, entry_config, layer, file, config, paths, "
            "weights, licenses (`portable pack --help` shows the format)",
        ),
    ],
    ids=["missing", "bad-toml", "not-a-table", "unknown-key"],
)
def test_spec_hints_name_pack_help_not_a_checkout_file(tmp_path, capsys, text, code, hint):
    spec = tmp_path / "spec.toml"
    if text is not None:
        spec.write_text(text)
    got, err = _pack(spec, tmp_path, capsys)
    assert got == code
    assert len(err) == 2 and err[0].startswith(f"error: {spec}") and err[1] == hint
    assert "bundle/demo.toml" not in "\n".join(err)
    assert not (tmp_path / "b").exists()
