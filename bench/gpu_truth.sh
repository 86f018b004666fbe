#!/usr/bin/env bash
# On the lent GPU machine, from the repo root (docs/gpu.md): unpack the carried GL loaders and
# wheels, then run every part of bench/gpu_truth.py into OUT_DIR (default $OUT/truth, else /tmp/gpu_truth).
#
#     bash bench/gpu_truth.sh [OUT_DIR] [more gpu_truth.py options, e.g. --parts jit,render]
set -u
out="${1:-${OUT:-/tmp}/truth}"
shift || true
if compgen -G ".gl/*.deb" >/dev/null; then
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
export PYTHONUNBUFFERED=1
exec python3 bench/gpu_truth.py "$out" "$@"
