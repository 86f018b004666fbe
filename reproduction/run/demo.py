"""`portable demo`: the embedded default, end to end. For now: the bundle round trip only.

Generates a tiny release (a source layer, weight-like and data-like files, a config holding
absolute paths), packs it with bundle/demo.toml, restores it in a different folder, verifies it,
and says where it is. The RECAP stages join here once they are built. Needs no torch.

    <workdir>/
      src/          generated sources: project/ weights/ data/ configs/
      bundle/       the packed bundle
      restored/recap-demo/   the same bundle copied elsewhere and restored there
"""

from __future__ import annotations

import json
import shutil
import struct
import time
from pathlib import Path

from reproduction.release.pack import pack_bundle
from reproduction.release.restore import restore_bundle
from reproduction.release.verify import verify_or_raise
from reproduction.ui import UiOptions, human_bytes, say

SPEC = Path(__file__).resolve().parent.parent.parent / "bundle" / "demo.toml"
FALLBACK_SPEC = """\
name = "recap-demo"
description = "The embedded default: a tiny RECAP release bundle built on this machine"
root = "."
entry_config = "config/demo.json"
[[layer]]
source = "project"
kind = "source"
name = "recap-demo"
exclude = ["__pycache__", "*.pyc", ".git"]
[[file]]
source = "weights"
dest = "weights"
[[file]]
source = "data"
dest = "data"
[[config]]
source = "configs/demo.json"
dest = "config/demo.json"
"""


def _safetensors(tensors: dict[str, tuple[str, list[int], bytes]]) -> bytes:
    """A valid .safetensors file built with the stdlib: 8-byte header length, JSON header, raw data."""
    header, offset, blobs = {}, 0, []
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def generate_sources(src: Path) -> None:
    """Write the demo's sources: deterministic bytes, so two demos pack identical bundles."""
    project = src / "project"
    (project / "recap_demo").mkdir(parents=True)
    (project / "recap_demo" / "__init__.py").write_text(
        '"""The demo release\'s project snapshot."""\nVERSION = "0.1"\n'
    )
    (project / "recap_demo" / "stages.py").write_text("STAGES = ('returns', 'value', 'advantages', 'policy')\n")
    (project / "README.md").write_text("# recap-demo\nA tiny release used by `portable demo`.\n")
    weights = src / "weights"
    (weights / "value").mkdir(parents=True)
    ramp = struct.pack("<256f", *[i / 256 for i in range(256)])
    (weights / "value" / "model.safetensors").write_bytes(
        _safetensors({"head.weight": ("F32", [16, 16], ramp), "head.bias": ("F32", [16], ramp[:64])})
    )
    (weights / "value" / "tokenizer.json").write_text(
        json.dumps({"model": {"type": "BPE", "vocab": {"<pad>": 0, "a": 1}}})
    )
    data = src / "data" / "fetch_pick"
    (data / "meta").mkdir(parents=True)
    (data / "meta" / "info.json").write_text(json.dumps({"codebase_version": "v3.0", "fps": 25, "total_episodes": 2}))
    (data / "data" / "chunk-000").mkdir(parents=True)
    (data / "data" / "chunk-000" / "file-000.parquet").write_bytes(b"PAR1" + bytes(range(256)) * 8 + b"PAR1")
    configs = src / "configs"
    configs.mkdir()
    (configs / "demo.json").write_text(
        json.dumps(
            {
                "dataset": str(data),
                "value_checkpoint": str(weights / "value" / "model.safetensors"),
                "tokenizer": str(weights / "value"),
                "code": str(project),
                "seed": 0,
            },
            indent=1,
        )
        + "\n"
    )


def run_demo(workdir: Path | None, *, ui: UiOptions | None = None) -> int:
    """Build, pack, restore elsewhere and verify the demo bundle under `workdir` (default: ./runs/demo-<time>).

    Prints the restored bundle's path on stdout; returns 0. Raises the release errors (exit codes
    of reproduction/errors.py) if any step fails, e.g. WriteFailedError when the disk is full.
    """
    workdir = Path(workdir or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")).absolute()
    if workdir.exists() and any(workdir.iterdir()):
        from reproduction.errors import InvalidInputError

        raise InvalidInputError(
            f"{workdir} already exists and is not empty",
            path=workdir,
            field="--workdir",
            hint="pass a new folder with --workdir, or leave it out for a fresh one under ./runs",
        )
    src = workdir / "src"
    generate_sources(src)
    spec = SPEC if SPEC.is_file() else src / "demo.toml"
    if spec != SPEC:
        spec.write_text(FALLBACK_SPEC, encoding="utf-8")
    started = time.perf_counter()
    manifest = pack_bundle(spec, workdir / "bundle", root=src, ui=ui)
    say(
        f"packed {manifest.name}: {len(manifest.files)} files, {human_bytes(manifest.total_size)} "
        f"-> {workdir / 'bundle'}",
        options=ui,
    )
    restored = workdir / "restored" / manifest.name
    shutil.copytree(workdir / "bundle", restored, symlinks=True)
    report = restore_bundle(restored, ui=ui)
    say(report.summary(), options=ui)
    verified = verify_or_raise(restored, ui=ui, manifest=manifest)
    say(verified.summary(), options=ui)
    config = (restored / "config" / "demo.json").read_text(encoding="utf-8")
    say(f"config/demo.json refers to the bundle as ${{BUNDLE}}: {'${BUNDLE}/data/fetch_pick' in config}", options=ui)
    say(f"round trip done in {time.perf_counter() - started:.1f}s; the restored bundle is at {restored}", options=ui)
    say(
        "stages 1-3 run as modules for now (python -m reproduction.recap.returns / .value / .advantages); "
        "`portable run`, the policy stage and the simulator are not built yet in this version of recap-portable, "
        "so the demo stops after the bundle round trip",
        options=ui,
    )
    print(restored)
    return 0
