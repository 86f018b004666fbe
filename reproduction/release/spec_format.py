"""The bundle spec's format as `portable pack --help` shows it (stdlib only: `portable --help` imports this)."""

from __future__ import annotations

FORMAT = """\
spec format (SPEC.toml: every key a spec may have; values are examples):
name = "demo"                      # bundle name
description = "..."                # optional, copied into bundle.json metadata
root = "."                         # folder that relative `source` paths start from (default: the spec's folder)
entry_config = "config/run.json"   # optional: the config `portable run` uses, relative to the bundle

[[layer]]                          # a folder packed as <target>.tar.zst, extracted by restore
source = "src/recap"               # the folder to pack
kind = "source"                    # "source" or "runtime"
name = "recap"                     # default: the source folder's name
target = "source/recap"            # default: "<kind>/<name>"
exclude = ["__pycache__", "*.pyc"] # globs; without '/' they match any name, with '/' the relative path
relocatable = false                # runtime layers built at an absolute prefix: record where it occurs
build_prefix = "/opt/py"           # default: the source folder's absolute path
order = 0                          # extraction order (default: the layer's place in the spec)

[[file]]                           # plain files (weights, data, evidence): a file or a whole folder
source = "weights"
dest = "weights"
exclude = []

[[config]]                         # like [[file]], but absolute paths inside become ${BUNDLE}/...
source = "configs/run.json"
dest = "config/run.json"

[paths]                            # extra absolute prefixes to write as ${BUNDLE}/<value> in configs
"/home/me/recap" = "source/recap"

[[weights]]                        # pinned weights (`portable weights`): files land in <dest>/<file path>
manifest = "../manifests/value_tiny.json"   # relative to the spec's folder
source = "weights-cache"           # optional: a folder holding the files (else: built ones are built)
dest = "weights"                   # default "weights"

licenses = ["libero", "mujoco"]    # components (LICENSES/index.json) whose licenses the bundle carries
                                   # besides its weights' and this runner's

A [[file]] / [[config]] / [[layer]] may say `origin = "..."`: where to get a missing source (shown by
`portable pack --dry-run`). A key not shown here is refused (exit 4, naming it), as are a name that is not one
path component and a target or dest under bundle.json, .portable/, reproduction/ or runs/.
The repository checkout's bundle/demo.toml is a real spec."""
"""Every key of a spec, with what it means: spec.py's SPEC_KEYS, LAYER_KEYS, FILE_KEYS and WEIGHTS_KEYS."""
