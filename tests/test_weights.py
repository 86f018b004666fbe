"""Weight manifests: the schema, the shipped manifests, licenses, built (tiny) weights, pack and restore.

No network: Hub-sourced components here are pinned to local bytes by the test; pin/fetch against a
Hub-compatible server are in tests/test_weights_hub.py.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import jsonschema
import pytest
from bundlekit import QUIET, REPO, hub_manifest, run_cli

from reproduction.errors import IntegrityError, InvalidInputError
from reproduction.release.manifest import load_manifest, write_manifest
from reproduction.release.model_card import render_model_card
from reproduction.release.pack import pack_bundle
from reproduction.release.restore import restore_bundle
from reproduction.release.weights import check_bundle_weights, verify_bundle_weights, verify_weights
from reproduction.release.weights_manifest import (
    UNPINNED,
    WeightsManifest,
    canonical_sha256,
    load_license_index,
    load_weights_manifest,
)

MANIFESTS = sorted(p for p in (REPO / "weights_manifest").glob("*.json") if p.name != "schema.json")
SCHEMA = json.loads((REPO / "weights_manifest" / "schema.json").read_text())


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


UPSTREAM = {"model.safetensors": b"\x00weights" * 4096, "config.json": b'{"hidden_size": 8}\n'}


def write_json(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    return path


# -- schema and the shipped manifests ---------------------------------------------------------------


def test_schema_is_valid_and_every_shipped_manifest_follows_it_and_loads():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    names = {p.name for p in MANIFESTS}
    assert {"recap_value_siglip2_gemma3_270m.json", "pi05_base.json", "value_tiny.json", "policy_tiny.json"} <= names
    for path in MANIFESTS:
        data = json.loads(path.read_text())
        jsonschema.Draft202012Validator(SCHEMA).validate(data)
        manifest = load_weights_manifest(path)
        assert manifest.to_dict() == data, f"{path.name} does not round-trip through the reader"


def test_what_the_shipped_manifests_say():
    recap = load_weights_manifest(REPO / "weights_manifest" / "recap_value_siglip2_gemma3_270m.json")
    repos = {c.source["repo"]: c for c in recap.components}
    assert set(repos) == {"google/siglip2-so400m-patch14-224", "google/gemma-3-270m"}
    assert repos["google/gemma-3-270m"].license == {
        **repos["google/gemma-3-270m"].license,
        "id": "gemma",
        "gated": True,
    }
    assert recap.presets == ("recap",) and recap.fresh_prefixes == ("projector.", "value_head.")
    # nothing is invented: every commit, size and sha256 of the real manifests is explicitly unpinned
    assert all(c.source["commit"] == UNPINNED for c in recap.components)
    assert all(f.sha256 == UNPINNED and f.size == UNPINNED for _, f in recap.files())
    pi05 = load_weights_manifest(REPO / "weights_manifest" / "pi05_base.json")
    assert pi05.model == "policy" and pi05.presets == ("pi05",)
    policy = [c for c in pi05.components if c.source["repo"] == "lerobot/pi05_base"][0]
    assert {f.repo_path for f in policy.files} >= {"model.safetensors", "config.json"}
    for name, model in (("value_tiny.json", "value"), ("policy_tiny.json", "policy")):
        tiny = load_weights_manifest(REPO / "weights_manifest" / name)
        assert tiny.unpinned() == [] and tiny.components[0].kind == "built" and tiny.model == model
        assert tiny.presets == ("tiny",)
        assert tiny.components[0].model_config["sha256"] == canonical_sha256(tiny.components[0].source["config"])


def test_verify_reports_unpinned_fields_and_missing_files(tmp_path):
    path = REPO / "weights_manifest" / "recap_value_siglip2_gemma3_270m.json"
    report = verify_weights(load_weights_manifest(path), tmp_path)
    kinds = {p.kind for p in report.problems}
    assert kinds == {"unpinned", "missing"} and report.exit_code == 5
    text = report.summary()
    assert "components[1] language (google/gemma-3-270m): source.commit" in text
    assert "files[0].sha256 (gemma-3-270m/model.safetensors)" in text and "to-be-pinned" in text
    proc = run_cli("weights", "verify", str(path), str(tmp_path), "--json")
    assert proc.returncode == 5
    assert {p["kind"] for p in json.loads(proc.stdout)["problems"]} == {"unpinned", "missing"}


def test_verify_names_a_file_whose_bytes_differ(tmp_path):
    manifest_path = write_json(tmp_path / "m.json", hub_manifest(UPSTREAM))
    for name, data in UPSTREAM.items():
        (tmp_path / "w" / "up").mkdir(parents=True, exist_ok=True)
        (tmp_path / "w" / "up" / name).write_bytes(data)
    assert run_cli("weights", "verify", str(manifest_path), str(tmp_path / "w")).returncode == 0
    blob = tmp_path / "w" / "up" / "model.safetensors"
    blob.write_bytes(blob.read_bytes()[:-1] + b"!")
    proc = run_cli("weights", "verify", str(manifest_path), str(tmp_path / "w"))
    assert proc.returncode == 5
    assert "digest   up/model.safetensors: sha256" in proc.stdout


# -- manifest and license checks ----------------------------------------------------------------------


def test_an_unknown_license_id_is_an_error(tmp_path):
    path = write_json(tmp_path / "m.json", hub_manifest(UPSTREAM, license_id="wtfpl-9"))
    with pytest.raises(InvalidInputError, match=r"unknown license id 'wtfpl-9' \(known: apache-2.0, gemma, mit\)"):
        load_weights_manifest(path)
    path = write_json(
        tmp_path / "m2.json", hub_manifest(UPSTREAM, license_id="apache-2.0", license_file="MIT-LIBERO.txt")
    )
    with pytest.raises(InvalidInputError, match="holds license 'mit', not 'apache-2.0'"):
        load_weights_manifest(path)
    proc = run_cli("weights", "verify", str(path), str(tmp_path))
    assert proc.returncode == 4 and "error:" in proc.stderr


@pytest.mark.parametrize(
    ("edit", "message", "schema_too"),
    [
        (lambda m: m["components"][0]["files"][0].update(sha256="abc"), r"files\[0\].sha256", True),
        (lambda m: m["components"][0]["source"].update(commit="main"), r"source.commit", True),
        (lambda m: m["components"][0]["files"][0].update(path="../escape"), "not a clean relative path", True),
        (lambda m: m["components"][0]["files"][0].update(path="up/.portable/x"), "reserved for bookkeeping", True),
        (lambda m: m["components"][0]["files"][0].update(repo_path=".portable/lock"), "reserved for bookkeeping", True),
        (lambda m: m["components"][0]["files"][0].update(size=-1), r"files\[0\].size", True),
        (lambda m: m["components"][0]["source"].update(kind="ftp"), "is not 'hub' or 'built'", True),
        (lambda m: m.update(format_version=3), "version 3", True),
        (lambda m: m["components"][0].pop("key_mapping"), "key_mapping: missing", True),
        (lambda m: m.update(model="critic"), "is not 'value' or 'policy'", True),
        # rules JSON Schema cannot state; the reader enforces them
        (lambda m: m["components"][0]["model_config"].update(path="up/other.json"), "not one of the component", False),
        (lambda m: m["components"][0]["model_config"].update(sha256="1" * 64), "not the sha256 of up/config", False),
    ],
)
def test_malformed_manifests_name_the_field(tmp_path, edit, message, schema_too):
    data = hub_manifest(UPSTREAM)
    jsonschema.Draft202012Validator(SCHEMA).validate(data)
    edit(data)
    with pytest.raises(InvalidInputError, match=message):
        WeightsManifest.from_dict(data, path=tmp_path / "m.json")
    errors = list(jsonschema.Draft202012Validator(SCHEMA).iter_errors(data))
    assert bool(errors) == schema_too


def test_a_built_config_edited_after_pinning_is_refused():
    data = json.loads((REPO / "weights_manifest" / "value_tiny.json").read_text())
    data["components"][0]["source"]["config"]["num_bins"] = 101
    with pytest.raises(InvalidInputError, match="not the digest of source.config"):
        WeightsManifest.from_dict(data)


def test_pin_records_a_built_config_edited_since_its_last_pin(tmp_path):
    """What the refusal's hint says to do works: `weights pin` rebuilds and records the new digests."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from reproduction.release.weights_hub import pin_manifest

    data = json.loads((REPO / "weights_manifest" / "policy_tiny.json").read_text())
    old = data["components"][0]["files"][0]["sha256"]
    data["components"][0]["source"]["config"]["chunk"] = 8
    path = write_json(tmp_path / "policy_tiny.json", data)
    with pytest.raises(InvalidInputError, match="is not the digest of source.config"):
        load_weights_manifest(path)
    pin_manifest(path, ui=QUIET)
    comp = load_weights_manifest(path).components[0]
    assert comp.model_config["sha256"] == canonical_sha256(comp.source["config"])
    assert comp.files[0].sha256 not in (old, UNPINNED)


def test_license_index_covers_every_component_a_bundle_can_carry():
    index = load_license_index()
    assert set(index.components) >= {
        "recap-portable",
        "rlinf-recap",
        "siglip2",
        "gemma3",
        "pi05-openpi",
        "libero",
        "mujoco",
        "fetch-assets",
    }
    for name, entry in index.files.items():
        text = (index.root / name).read_text()
        assert len(text) > 500, name
        if entry["id"] == "apache-2.0":
            assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS" in text
        if entry["id"] == "mit":
            assert text.startswith(("MIT License", "The MIT License")) and "WITHOUT WARRANTY OF ANY KIND" in text
    gemma = index.files["Gemma-Terms-of-Use.md"]
    assert (
        gemma["gated"]
        and "accept" in gemma["accept"]
        and "https://ai.google.dev/gemma/terms" in (index.root / "Gemma-Terms-of-Use.md").read_text()
    )


# -- pack, restore, model card ------------------------------------------------------------------------


def _spec(tmp_path: Path, manifest_path: Path, *, source: str | None = "cache", extra: str = "") -> Path:
    (tmp_path / "src" / "configs").mkdir(parents=True, exist_ok=True)
    (tmp_path / "src" / "configs" / "run.json").write_text('{"seed": 0}\n')
    lines = [
        'name = "weights-test"',
        'root = "src"',
        'licenses = ["libero"]',
        "[[config]]",
        'source = "configs/run.json"',
        'dest = "config/run.json"',
        "[[weights]]",
        f'manifest = "{manifest_path}"',
    ]
    if source:
        lines.append(f'source = "{source}"')
    spec = tmp_path / "spec.toml"
    spec.write_text("\n".join(lines) + "\n" + extra)
    return spec


def _cache(tmp_path: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (tmp_path / "src" / "cache" / "up").mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / "cache" / "up" / name).write_bytes(data)


def test_pack_places_pinned_weights_and_exactly_their_licenses_and_restore_checks_them(tmp_path):
    manifest_path = write_json(
        tmp_path / "m.json", hub_manifest(UPSTREAM, license_id="gemma", license_file="Gemma-Terms-of-Use.md")
    )
    _cache(tmp_path, UPSTREAM)
    bundle = tmp_path / "bundle"
    manifest = pack_bundle(_spec(tmp_path, manifest_path), bundle, ui=QUIET)
    assert (bundle / "weights" / "up" / "model.safetensors").read_bytes() == UPSTREAM["model.safetensors"]
    assert sorted(p.name for p in (bundle / "LICENSES").iterdir()) == [
        "Apache-2.0.txt",  # this runner's
        "Gemma-Terms-of-Use.md",  # the manifest's
        "MIT-LIBERO.txt",  # the spec's `licenses`
        "index.json",
    ]
    assert manifest.metadata["weights"] == [
        {"name": "test-upstream", "manifest": "weights_manifest/m.json", "dest": "weights"}
    ]
    assert manifest.metadata["licenses"]["test-upstream/backbone"] == "LICENSES/Gemma-Terms-of-Use.md"
    card = render_model_card(manifest, bundle, repo_id="alice/b")
    assert "| test-upstream/backbone | Gemma Terms of Use (**gated**) | `LICENSES/Gemma-Terms-of-Use.md` |" in card
    assert "**Gemma Terms of Use is gated.** Log in to the Hugging Face Hub and accept" in card
    assert "| libero | MIT License (Lifelong Robot Learning, LIBERO) | `LICENSES/MIT-LIBERO.txt` |" in card
    assert "`weights_manifest/m.json` -> `weights/`" in card and "license: other" in card
    assert check_bundle_weights(bundle, manifest) == 2
    restore_bundle(bundle, ui=QUIET)
    assert verify_bundle_weights(bundle) == 2  # what run's preflight calls: the bytes on disk, rehashed
    # the bundle's own runner verifies its weights on a bare Python (stdlib only, its own LICENSES/index.json)
    bare = Path.home() / ".pyenv" / "versions" / "3.10.13" / "bin" / "python3"
    python = str(bare) if bare.exists() else sys.executable
    proc = run_cli(
        "weights",
        "verify",
        bundle / "weights_manifest" / "m.json",
        bundle / "weights",
        python=python,
        script=bundle / "reproduction" / "portable.py",
        env={"PYTHONPATH": "", "PYTHONNOUSERSITE": "1"},
    )
    assert proc.returncode == 0 and "2 of 2 files verified" in proc.stdout, proc.stderr

    config = bundle / "weights" / "up" / "config.json"
    config.write_bytes(b'{"hidden_size": 9}\n')  # edited after restore
    with pytest.raises(
        IntegrityError, match=r"weights/up/config.json: sha256 \w+, pinned \w+ \(pinned by weights_manifest/m.json\)"
    ):
        verify_bundle_weights(bundle)
    config.write_bytes(UPSTREAM["config.json"])

    # Someone swaps the weights and re-writes bundle.json to match: verify alone would pass; restore refuses.
    blob = bundle / "weights" / "up" / "model.safetensors"
    blob.write_bytes(b"other weights")
    files = [
        type(e)(path=e.path, size=blob.stat().st_size, sha256=_sha(blob.read_bytes()))
        if e.path.endswith(".safetensors")
        else e
        for e in manifest.files
    ]
    manifest.files = files
    (bundle / "bundle.json").unlink()
    write_manifest(bundle, manifest)
    with pytest.raises(
        IntegrityError, match=r"weights/up/model.safetensors: sha256 .* differs from weights_manifest/m.json"
    ):
        restore_bundle(bundle, ui=QUIET)
    proc = run_cli("restore", str(bundle))
    assert proc.returncode == 5 and "weights/up/model.safetensors" in proc.stderr


def test_pack_refuses_weights_that_differ_and_lists_every_missing_file(tmp_path):
    manifest_path = write_json(tmp_path / "m.json", hub_manifest(UPSTREAM))
    _cache(tmp_path, {"model.safetensors": b"not the pinned bytes", "config.json": UPSTREAM["config.json"]})
    with pytest.raises(IntegrityError, match=r"weights/up/model.safetensors: .* has 20 bytes, the manifest pins 32768"):
        pack_bundle(_spec(tmp_path, manifest_path), tmp_path / "bundle", ui=QUIET)
    (tmp_path / "src" / "cache" / "up" / "model.safetensors").write_bytes(b"\x01" * 32768)
    with pytest.raises(IntegrityError, match=r"weights/up/model.safetensors: .* has sha256 [0-9a-f]{64}, the manifest"):
        pack_bundle(_spec(tmp_path, manifest_path), tmp_path / "bundle", ui=QUIET)
    assert not (tmp_path / "bundle").exists()
    shutil.rmtree(tmp_path / "src" / "cache")
    proc = run_cli("pack", str(_spec(tmp_path, manifest_path)), "--out", str(tmp_path / "b2"), "--dry-run")
    assert proc.returncode == 3, proc.stderr
    assert "weights/up/model.safetensors: not found under" in proc.stdout
    assert "weights/up/config.json: not found under" in proc.stdout
    assert not (tmp_path / "b2").exists()


def test_a_spec_naming_an_unknown_license_component_is_refused(tmp_path):
    manifest_path = write_json(tmp_path / "m.json", hub_manifest(UPSTREAM))
    _cache(tmp_path, UPSTREAM)
    spec = _spec(tmp_path, manifest_path)
    spec.write_text(spec.read_text().replace('licenses = ["libero"]', 'licenses = ["libreoffice"]'))
    with pytest.raises(InvalidInputError, match="unknown component 'libreoffice'"):
        pack_bundle(spec, tmp_path / "bundle", ui=QUIET)


def test_dry_run_of_the_real_libero10_release_lists_exactly_what_is_missing(tmp_path):
    proc = run_cli(
        "pack", str(REPO / "bundle" / "libero10.toml"), "--out", str(tmp_path / "out"), "--dry-run", "--json"
    )
    assert proc.returncode == 3, proc.stderr
    plan = json.loads(proc.stdout)
    missing = "\n".join(plan["missing"])
    for what in ("runtime/python", "runtime/venv-cuda", "runtime/venv-ascend", "source/rlinf"):
        assert f"releases/libero10/{what} (get it from" in missing, what
    assert "torch-npu==2.13.0" in missing and "CANN" in missing
    for part in ("sft", "rollouts_train", "rollouts_eval"):
        assert (
            f"RECAP-Libero10-Task0-48succ-Data/{part} (get it from hf download RLinf/RECAP-Libero10-Task0-48succ-Data"
            in missing
        )
    weights = [m for m in plan["missing"] if m.startswith("weights/")]
    expected = [
        f"weights/{f.path}"
        for name in ("recap_value_siglip2_gemma3_270m.json", "pi05_base.json")
        for _, f in load_weights_manifest(REPO / "weights_manifest" / name).files()
    ]
    assert [w.split(":")[0] for w in weights] == expected
    assert all("not pinned (commit, size, sha256)" in w and "portable weights pin" in w for w in weights)
    assert len(plan["missing"]) == 7 + len(expected)
    include = "\n".join(plan["include"])
    assert "config config/libero10.yaml" in include and "weights_manifest/pi05_base.json" in include
    assert "LICENSES/Gemma-Terms-of-Use.md (GATED" in include and "LICENSES/MIT-LIBERO.txt for libero" in include
    assert not (tmp_path / "out").exists()
    text = run_cli("pack", str(REPO / "bundle" / "libero10.toml"), "--out", str(tmp_path / "out"), "--dry-run")
    assert text.returncode == 3 and f"missing on this machine ({len(plan['missing'])}):" in text.stdout


def test_the_libero10_config_carries_upstreams_defaults():
    import yaml

    config = yaml.safe_load((REPO / "bundle" / "libero10" / "config.yaml").read_text())
    assert set(config) == {"datasets", "returns", "value", "advantages", "policy", "eval"}  # `portable run`'s sections
    assert config["returns"] == {"gamma": 1.0, "failure_reward": -300.0, "tag": "fail300"}
    train = config["value"]["train"]
    assert (train["micro_batch"], train["global_batch"], train["lr"], train["warmup_steps"]) == (32, 256, 5e-5, 500)
    model = config["value"]["model"]
    assert model["value_lr"] == 1e-4 and config["advantages"]["positive_quantile"] == 0.3
    assert model["pretrained_manifest"] == "${BUNDLE}/weights_manifest/recap_value_siglip2_gemma3_270m.json"
    policy = config["policy"]
    assert (policy["model"]["condition_dropout"], policy["model"]["num_steps"], policy["model"]["chunk"]) == (
        0.1,
        5,
        10,
    )
    assert (policy["train"]["lr"], policy["train"]["global_batch"], policy["train"]["seed"]) == (1e-5, 512, 42)
    assert config["eval"]["guidance_scales"] == [1.0]


def test_the_libero10_config_loads_with_the_runs_own_schema_where_run_is_installed():
    """`run` reads the same keys for both bundles: once RECAP's config schema exists, it must accept this file."""
    config_mod = pytest.importorskip("reproduction.recipes.recap.config")
    if not hasattr(config_mod, "load_config"):
        pytest.skip("portable run's config loader is not in this build yet")
    config = config_mod.load_config([REPO / "bundle" / "libero10" / "config.yaml"], bundle=Path("/srv/bundle"))
    assert config.value.model.preset == "recap" and config.returns.failure_reward == -300.0


# -- built (tiny) weights ------------------------------------------------------------------------------


@pytest.mark.slow
def test_tiny_weights_build_deterministically_to_the_pinned_digest_and_load_strictly(tmp_path):
    torch = pytest.importorskip("torch")
    from reproduction.recap.value.model import ValueModelConfig, build_value_model
    from reproduction.recap.value.weights import load_pretrained
    from reproduction.release.weights_build import build_bytes

    path = REPO / "weights_manifest" / "value_tiny.json"
    manifest = load_weights_manifest(path)
    comp = manifest.components[0]
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    a = build_bytes(comp, tmp_path / "a" / "model.safetensors")
    assert torch.equal(torch.rand(3), before)  # building does not touch the caller's RNG
    b = build_bytes(comp, tmp_path / "b" / "model.safetensors")
    assert a == b == (comp.files[0].size, comp.files[0].sha256)
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()

    # `weights fetch` builds it (in-process here: a subprocess would import torch again); the CLI verifies
    # it; the value model loads it strictly through the manifest reader.
    from reproduction.release.weights_hub import fetch_weights, pin_manifest

    assert fetch_weights(manifest, tmp_path / "w", ui=QUIET).built == 1
    assert run_cli("weights", "verify", str(path), str(tmp_path / "w")).returncode == 0
    model = build_value_model(ValueModelConfig.from_dict(comp.source["config"]), seed=99)
    load_pretrained(model, path, tmp_path / "w")
    ref = build_value_model(ValueModelConfig.from_dict(comp.source["config"]), seed=0)
    assert all(torch.equal(x, y) for x, y in zip(model.state_dict().values(), ref.state_dict().values()))

    # pinning again changes nothing
    copy = tmp_path / "value_tiny.json"
    shutil.copyfile(path, copy)
    pin_manifest(copy, ui=QUIET)
    assert copy.read_text() == path.read_text()

    # a pin that does not match what this torch builds is refused, naming both versions
    data = json.loads(path.read_text())
    data["components"][0]["files"][0]["sha256"] = "f" * 64
    bad = load_weights_manifest(write_json(tmp_path / "bad.json", data))
    with pytest.raises(
        IntegrityError, match=r"value-tiny/model.safetensors: built bytes have sha256 .*pinned with .*2.13"
    ):
        fetch_weights(bad, tmp_path / "w2", ui=QUIET)
    assert not (tmp_path / "w2" / "value-tiny" / "model.safetensors").exists()


@pytest.mark.slow
def test_pack_builds_tiny_weights_named_by_a_manifest_and_restore_accepts_them(tmp_path):
    pytest.importorskip("torch")
    spec = _spec(tmp_path, REPO / "weights_manifest" / "value_tiny.json", source=None)
    manifest = pack_bundle(spec, tmp_path / "bundle", ui=QUIET)
    entry = manifest.file("weights/value-tiny/model.safetensors")
    pinned = load_weights_manifest(REPO / "weights_manifest" / "value_tiny.json").components[0].files[0]
    assert entry is not None and (entry.size, entry.sha256) == (pinned.size, pinned.sha256)
    assert sorted(p.name for p in (tmp_path / "bundle" / "LICENSES").iterdir()) == [
        "Apache-2.0.txt",
        "MIT-LIBERO.txt",
        "index.json",
    ]
    restore_bundle(tmp_path / "bundle", ui=QUIET)
    assert load_manifest(tmp_path / "bundle").metadata["weights"][0]["manifest"] == "weights_manifest/value_tiny.json"


def test_cli_pack_dry_run_on_a_complete_spec_exits_zero(tmp_path):
    manifest_path = write_json(tmp_path / "m.json", hub_manifest(UPSTREAM))
    _cache(tmp_path, UPSTREAM)
    proc = run_cli("pack", str(_spec(tmp_path, manifest_path)), "--out", str(tmp_path / "b"), "--dry-run")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "weights/up/model.safetensors <- " in proc.stdout and "sha256 matches" in proc.stdout
    assert "nothing is missing" in proc.stdout and not (tmp_path / "b").exists()


def toy_state(config: dict, seed: int) -> dict:
    """A builder for any model: `module:function(config, seed) -> state dict` (here this test module)."""
    import torch

    torch.manual_seed(seed)
    return {"proj.weight": torch.randn(config["rows"], 3), "proj.bias": torch.zeros(config["rows"])}


@pytest.mark.slow
def test_any_model_built_from_a_config_and_a_seed_is_pinned_by_its_digest(tmp_path):
    pytest.importorskip("torch")
    from reproduction.release.weights_hub import fetch_weights, pin_manifest

    data = json.loads((REPO / "weights_manifest" / "value_tiny.json").read_text())
    comp = data["components"][0]
    comp["source"] = {"kind": "built", "builder": f"{__name__}:toy_state", "seed": 3, "config": {"rows": 5}}
    comp["model_config"] = {"sha256": UNPINNED}
    comp["files"] = [{"path": "toy/model.safetensors", "size": UNPINNED, "sha256": UNPINNED}]
    data.update(name="toy-tiny", model="policy", presets=["tiny"])
    path = write_json(tmp_path / "toy.json", data)
    with pytest.raises(InvalidInputError, match="cannot fetch: 3 field"):
        fetch_weights(load_weights_manifest(path), tmp_path / "w", ui=QUIET)
    pinned = pin_manifest(path, ui=QUIET).components[0]
    assert pinned.files[0].sha256 != UNPINNED and pinned.source["built_with"]["torch"]
    assert pinned.model_config == {"sha256": canonical_sha256({"rows": 5})}
    assert fetch_weights(load_weights_manifest(path), tmp_path / "w", ui=QUIET).built == 1
    assert verify_weights(load_weights_manifest(path), tmp_path / "w").exit_code == 0
    first = (tmp_path / "w" / "toy" / "model.safetensors").read_bytes()
    (tmp_path / "w" / "toy" / "model.safetensors").unlink()
    fetch_weights(load_weights_manifest(path), tmp_path / "w", ui=QUIET)
    assert (tmp_path / "w" / "toy" / "model.safetensors").read_bytes() == first  # same config + seed, same bytes

    data = json.loads(path.read_text())
    data["components"][0]["source"]["seed"] = 4  # another seed: other bytes than the pin
    other = load_weights_manifest(write_json(tmp_path / "toy4.json", data))
    with pytest.raises(IntegrityError, match="toy/model.safetensors: built bytes have sha256"):
        fetch_weights(other, tmp_path / "w4", ui=QUIET)


BUILT = [p for p in MANIFESTS if any(c["source"]["kind"] == "built" for c in json.loads(p.read_text())["components"])]


@pytest.mark.slow
@pytest.mark.parametrize("path", BUILT, ids=[p.name for p in BUILT])
def test_every_built_manifest_builds_to_its_pin(tmp_path, path):
    """Covers every tiny preset's manifest (value now; the policy's once it is added): config + seed -> pinned bytes."""
    pytest.importorskip("torch")
    from reproduction.release.weights_hub import fetch_weights

    manifest = load_weights_manifest(path)
    assert manifest.unpinned() == [], f"{path.name}: pin it with `portable weights pin {path}`"
    fetch_weights(manifest, tmp_path, ui=QUIET)
    assert verify_weights(manifest, tmp_path).exit_code == 0


@pytest.mark.slow
def test_a_demo_can_pin_weights_it_builds_on_the_spot(tmp_path):
    """The demo's tiny models depend on a tokenizer trained in-process: it writes their manifest with
    `built_manifest`, packs it, and restore checks the bytes like any pinned upstream file."""
    pytest.importorskip("torch")
    from reproduction.recap.value.model import preset_config
    from reproduction.release.weights_build import built_manifest
    from reproduction.release.weights_manifest import write_weights_manifest

    manifest = built_manifest(
        name="demo-value",
        model="value",
        presets=("tiny",),
        builder="reproduction.recap.value.model:build_value_model",
        config_class="reproduction.recap.value.model:ValueModelConfig",
        config=preset_config("tiny", vocab_size=300).to_dict(),
        seed=7,
        path="value/model.safetensors",
        scratch=tmp_path / "src" / "cache",
    )
    assert manifest.unpinned() == []
    path = tmp_path / "demo_value.json"
    write_weights_manifest(path, manifest)
    jsonschema.Draft202012Validator(SCHEMA).validate(json.loads(path.read_text()))
    packed = pack_bundle(_spec(tmp_path, path), tmp_path / "bundle", ui=QUIET)
    assert packed.file("weights/value/model.safetensors").sha256 == manifest.components[0].files[0].sha256
    restore_bundle(tmp_path / "bundle", ui=QUIET)


# -- the demo bundle -------------------------------------------------------------------------------


def _demo_sources(root: Path) -> Path:
    """The folder `portable demo` generates, in miniature (pack reads bytes, not datasets)."""
    for rel, text in {
        "project/recap/__init__.py": '"""stand-in"""\n',
        "data/sft/meta/info.json": "{}\n",
        "data/rollout/meta/info.json": "{}\n",
        "evidence/eval_policy_reference.json": "{}\n",
        "configs/run.yaml": 'datasets:\n  - {path: "${BUNDLE}/data/sft", type: sft}\n',
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.slow
def test_the_demo_bundle_carries_its_tiny_weights_pinned_and_restore_refuses_other_bytes(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    spec = REPO / "bundle" / "demo.toml"
    bundle = tmp_path / "bundle"
    manifest = pack_bundle(spec, bundle, root=_demo_sources(tmp_path / "src"), ui=QUIET)
    pins = {
        name: load_weights_manifest(REPO / "weights_manifest" / f"{name}.json").components[0].files[0]
        for name in ("value_tiny", "policy_tiny")
    }
    for name, pin in pins.items():  # built from config + seed by pack, to the manifest's digest
        entry = manifest.file(f"weights/{pin.path}")
        assert entry is not None and (entry.size, entry.sha256) == (pin.size, pin.sha256), name
        assert (bundle / "weights_manifest" / f"{name}.json").is_file()
    assert [w["manifest"] for w in manifest.metadata["weights"]] == [
        "weights_manifest/value_tiny.json",
        "weights_manifest/policy_tiny.json",
    ]
    assert manifest.metadata["licenses"]["value-tiny/value-model"] == "LICENSES/Apache-2.0.txt"
    assert sorted(p.name for p in (bundle / "LICENSES").iterdir()) == ["Apache-2.0.txt", "index.json"]
    card = render_model_card(manifest, bundle, repo_id="alice/recap-demo")  # what publish writes as README.md
    assert "## Pinned weights" in card and "license: apache-2.0" in card
    assert "`weights_manifest/value_tiny.json` -> `weights/`" in card
    assert "`weights_manifest/policy_tiny.json` -> `weights/`" in card

    restored = tmp_path / "restored"
    shutil.copytree(bundle, restored)
    restore_bundle(restored, ui=QUIET)
    assert verify_bundle_weights(restored) == 2

    # A copy whose value weights were swapped in transit: restore refuses it, naming the file.
    tampered = tmp_path / "tampered"
    shutil.copytree(bundle, tampered)
    blob = tampered / "weights" / pins["value_tiny"].path
    data = bytearray(blob.read_bytes())
    data[-1] ^= 1
    blob.write_bytes(bytes(data))
    proc = run_cli("restore", str(tampered))
    assert proc.returncode == 5, proc.stderr
    assert proc.stderr.startswith("error: ") and f"digest   weights/{pins['value_tiny'].path}: " in proc.stderr

    # The same swap with bundle.json rewritten to match it: the weight manifest still refuses it.
    repinned = load_manifest(tampered)
    repinned.files = [
        type(e)(path=e.path, size=e.size, sha256=_sha(bytes(data)))
        if e.path == f"weights/{pins['value_tiny'].path}"
        else e
        for e in repinned.files
    ]
    (tampered / "bundle.json").unlink()
    write_manifest(tampered, repinned)
    with pytest.raises(IntegrityError, match=rf"weights/{pins['value_tiny'].path}: sha256 \w+ differs from "):
        restore_bundle(tampered, ui=QUIET)


@pytest.mark.slow
def test_the_tiny_manifests_are_the_demos_presets_and_its_run_initialises_from_them(tmp_path):
    """value_tiny/policy_tiny are exactly what the demo's stages build (vocab from the tokenizers they train on the
    demo's task string, sizes from the stage defaults), so the demo's run loads the bundled weights strictly and
    starts from the same numbers as the stages' own seed-0 init."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from reproduction.recap.policy.conditioning import KINDS, prompt_text
    from reproduction.recap.policy.config import PolicyConfig
    from reproduction.recap.policy.model import PolicyModelConfig, build_policy_model, tiny_config
    from reproduction.recap.tokenizer import train_tokenizer
    from reproduction.recap.value.model import preset_config
    from reproduction.recap.value.weights import load_pretrained
    from reproduction.recipes.recap.config import load_config
    from reproduction.recipes.recap.demo import CONFIGS, FULL, QUICK
    from reproduction.release.weights_build import build_component
    from reproduction.sim.tasks import get_task

    assert FULL.tasks == QUICK.tasks
    tasks = [get_task(t).language for t in FULL.tasks]
    value_vocab = len(train_tokenizer(tasks, tmp_path / "vt"))
    policy_vocab = len(train_tokenizer([prompt_text(t, k) for t in tasks for k in range(len(KINDS))], tmp_path / "pt"))
    value = load_weights_manifest(REPO / "weights_manifest" / "value_tiny.json").components[0]
    policy = load_weights_manifest(REPO / "weights_manifest" / "policy_tiny.json").components[0]
    for name in ("run.yaml", "quick.yaml"):
        config = load_config([CONFIGS / name], [], bundle=tmp_path / "bundle", run_dir=tmp_path / "run")
        vm, pm = config.value.model, config.policy.model
        assert (vm.pretrained_manifest, vm.weights_dir) == (
            str((tmp_path / "bundle" / "weights_manifest" / "value_tiny.json").resolve()),
            str((tmp_path / "bundle" / "weights").resolve()),
        ), name
        assert pm.pretrained_manifest == str((tmp_path / "bundle" / "weights_manifest" / "policy_tiny.json").resolve())
        assert (vm.model_seed, pm.model_seed) == (value.source["seed"], policy.source["seed"]), name
        mcfg = preset_config(vm.preset, vocab_size=value_vocab, cameras=tuple(vm.cameras))  # as the stage does
        mcfg.value_dropout = vm.value_dropout
        assert mcfg.to_dict() == value.source["config"], name
        pstage = PolicyConfig(**_plain(pm))
        pcfg = tiny_config(
            vocab_size=policy_vocab,
            state_dim=policy.source["config"]["state_dim"],  # the simulator's 11 + the goal's 3 (checked below)
            action_dim=4,
            chunk=pstage.chunk,
            cameras=tuple(pstage.cameras),
            image_size=pstage.image_size,
            width=pstage.width,
            prefix_layers=pstage.prefix_layers,
            expert_layers=pstage.expert_layers,
        )
        assert pcfg.to_dict() == policy.source["config"], name
    try:
        from reproduction.sim.env import STATE_DIM
    except ImportError:  # pragma: no cover - a build without the simulator
        STATE_DIM = 11
    assert policy.source["config"]["state_dim"] == STATE_DIM + 3

    # the policy loads its bundled weights strictly and then holds the seed-0 init the stage would have built
    build_component(policy, tmp_path / "weights")
    model = build_policy_model(PolicyModelConfig.from_dict(policy.source["config"]), seed=7)
    load_pretrained(model, REPO / "weights_manifest" / "policy_tiny.json", tmp_path / "weights")
    ref = build_policy_model(PolicyModelConfig.from_dict(policy.source["config"]), seed=0)
    assert model.state_dict().keys() == ref.state_dict().keys()
    assert all(torch.equal(x, y) for x, y in zip(model.state_dict().values(), ref.state_dict().values()))


def _plain(section) -> dict:
    from reproduction.run.config import to_plain

    return dict(to_plain(section))
