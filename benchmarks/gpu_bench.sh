#!/usr/bin/env bash
# The GPU benchmark in one command, from the repository root, with the package
# importable through PYTHONPATH (no install needed):
#
#     bash benchmarks/gpu_bench.sh [--pops 4096 16384 65536] [--reps 5]
#
# Prints the GPU, then one table (benchmarks/gpu_bench.py); a few minutes.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
PYTHON="${PYTHON:-python3}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PYTHON" -c "import jax; print('jax', jax.__version__, jax.devices())" || exit 1
"$PYTHON" benchmarks/gpu_bench.py "$@"
