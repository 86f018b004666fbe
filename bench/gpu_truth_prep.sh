#!/usr/bin/env bash
# Here (no GPU needed), in the root of the checkout the device tool sends: fetch what the GPU machine
# lacks into ignored folders that `run`'s `carry` copies (docs/gpu.md). About 38 MiB of wheels (the
# simulator: mujoco, gymnasium, gymnasium-robotics and their missing needs, for Python 3.12 x86-64)
# and the GL loader .debs. Everything else the script imports is on the machine's image.
#
#     bash bench/gpu_truth_prep.sh          # then: carry [".whl", ".gl"]
set -euo pipefail
exclude="$(git rev-parse --git-common-dir)/info/exclude"  # git reads info/exclude there, worktrees too
mkdir -p "$(dirname "$exclude")"
for d in /.whl/ /.gl/; do grep -qxF "$d" "$exclude" 2>/dev/null || echo "$d" >>"$exclude"; done
mkdir -p .whl .gl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  mujoco==3.3.7 gymnasium==1.4.0 gymnasium-robotics==1.4.2 PyOpenGL==3.1.10 glfw==2.11.0 \
  Farama-Notifications==0.0.6 pettingzoo==1.27.0
if command -v apt-get >/dev/null; then
  mkdir -p /tmp/amd64/partial
  o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64)
  apt-get "${o[@]}" update -qq
  (cd .gl && apt-get "${o[@]}" download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
fi
du -sh .whl .gl
