#!/usr/bin/env bash
# Set up (if needed) and run every test CI runs, on CPU:
#   1. core, plugin and conformance tests against the reference backend;
#   2. the conformance suite against each plugin: cpu (compiled C++ codecs), and the Triton kernels of
#      cuda and ascend under TRITON_INTERPRET=1;
#   3. the real Triton-Ascend compiler frontend on the Ascend kernel variants (its own venv, ~30 s).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${AGOQ_VENV:-.venv}
# Test-only dependencies: the real integration packages (PEFT, Accelerate, torchao, torchtitan) and
# Hypothesis. torch is pinned in the same command so pip keeps the CPU build.
"$VENV/bin/python" -m pip install -q "torch==2.13.0" "hypothesis>=6.100" "peft>=0.21" "accelerate>=1.15" \
  "torchao>=0.18" "torchtitan==0.3.0" "pytest-xdist>=3.5"
# One pytest worker per core, at most 4 (each imports torch and transformers: ~1 GiB); AGOQ_TEST_WORKERS=0 runs
# in one process. The distributed tests bind ports the OS picks (agoq_core.testing.dist.free_port), not fixed
# ones, so two workers' process groups do not meet.
WORKERS=${AGOQ_TEST_WORKERS:-$(n=$(nproc); echo $(( n < 4 ? n : 4 )))}
PYTEST=("$VENV/bin/python" -m pytest -q -p no:cacheprovider -n "$WORKERS")
export TRITON_INTERPRET=1   # Triton kernels run on CPU tensors; must be set before any @triton.jit runs
export PYTHONHASHSEED=0
"${PYTEST[@]}" tests conformance_tests $(ls -d backends/*/tests 2>/dev/null) --agoq-backend reference
for b in cpu cuda ascend; do
  if [ -f "backends/$b/pyproject.toml" ]; then
    echo "== conformance suite on backend '$b' =="
    # AGOQ_ASCEND_INTERPRET=1: the ascend plugin's interpreter mode (Ascend launch geometry, CPU tensors)
    AGOQ_BACKEND=$b AGOQ_ASCEND_INTERPRET=1 "${PYTEST[@]}" conformance_tests --agoq-backend "$b"
  fi
done
# The Triton-Ascend frontend on every float32 kernel variant (no NPU needed): Triton IR -> linalg/HIVM, failing on
# a rejected kernel, a discrete-mask fallback, a division, FP8 types or a strided global-memory access
# (docs/backends/ascend.md §9). Its own venv (.venv-triton-ascend): triton-ascend replaces `triton`, and its wheels
# exist for Python 3.9-3.11 only.
if [ -f backends/ascend/scripts/frontend_compile.sh ]; then
  if command -v python3.11 >/dev/null || command -v python3.10 >/dev/null || command -v python3.9 >/dev/null \
     || python3 -c 'import sys; sys.exit(not (3, 9) <= sys.version_info[:2] <= (3, 11))'; then
    echo "== Triton-Ascend frontend (no NPU): every float32 kernel variant =="
    bash backends/ascend/scripts/frontend_compile.sh --quick
  else
    echo "== Triton-Ascend frontend: SKIPPED: no Python 3.9-3.11 here (triton-ascend ships no other wheels) =="
  fi
fi
