#!/usr/bin/env bash
# The benchmark table on one GPU machine that already has JAX's CUDA build.
# Installs nothing and needs no network: the core library imports without
# optional packages.  Pure-Python wheels it may lack (equinox, jaxtyping,
# absl-py, chex) can be carried along and put on PYTHONPATH.  Runs in well
# under 8 minutes; the report is also written to benchmarks/gpu_report.json.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="${PWD}${PYTHONPATH:+:${PYTHONPATH}}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
python - <<'PY'
import jax
print("devices:", jax.devices())
PY
# Every comparison column (SciPy solves, the published NumPy/SciPy method) is
# measured in this same run on this machine's CPU.
timeout 470 python benchmarks/run.py --batches 1,64,1024,8192 --json benchmarks/gpu_report.json
