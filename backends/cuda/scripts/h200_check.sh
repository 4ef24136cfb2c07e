#!/usr/bin/env bash
# One call on the lent H200: kernel tests on CUDA tensors, the conformance report, the codec benchmark.
# Runs the checkout through PYTHONPATH (no pip there); entry points come from a tiny dist-info folder.
#   bash backends/cuda/scripts/h200_check.sh [bench deadline seconds]
# Writes $OUT/{pytest.log,conformance.log,cuda-h200.json,bench.log,bench_codecs.json}.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/agoq-out}; mkdir -p "$OUT"
EP=/tmp/agoq-ep
mk() {  # name version [entry points]
  local d="$EP/${1//-/_}-$2.dist-info"; mkdir -p "$d"
  printf 'Metadata-Version: 2.1\nName: %s\nVersion: %s\n' "$1" "$2" > "$d/METADATA"
  [ -n "${3:-}" ] && printf '%b' "$3" > "$d/entry_points.txt"
}
mk agoq 0.1.0; mk agoq-conformance 0.1.0; mk agoq-triton-kernels 0.1.0
mk agoq-cuda 0.1.0 '[agoq.backends]\ncuda = agoq_cuda.plugin\n'
export PYTHONPATH=$PWD:$PWD/conformance_tests:$PWD/backends/triton_common:$PWD/backends/cuda:$EP
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET AGOQ_BACKEND
nvidia-smi -L; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
python3 -m agoq_core.cli.main backends
t0=$(date +%s)
# 1. bit-exact tests on CUDA tensors (+ the conformance cases as pytest, which also fills the Triton cache)
timeout 180 python3 -m pytest -n 16 -q -p no:cacheprovider backends/triton_common/tests backends/cuda/tests --ignore=backends/cuda/tests/fusion \
  conformance_tests --agoq-backend cuda > "$OUT/pytest.log" 2>&1; echo "pytest rc=$? ($(( $(date +%s) - t0 )) s)"
tail -n 15 "$OUT/pytest.log"
# 2. the conformance report (single process; compiled kernels come from the cache)
timeout 90 python3 -m agoq_core.cli.main conformance run --backend cuda --report "$OUT/cuda-h200.json" -q \
  > "$OUT/conformance.log" 2>&1; echo "conformance rc=$? ($(( $(date +%s) - t0 )) s)"; tail -n 5 "$OUT/conformance.log"
# 3. the benchmark
timeout 300 python3 benchmarks/bench_codecs.py --deadline-s "${1:-170}" > "$OUT/bench.log" 2>&1
echo "bench rc=$? ($(( $(date +%s) - t0 )) s)"; grep -v Warning "$OUT/bench.log" | tail -n 90
