#!/usr/bin/env bash
# Set up a virtual environment for AGoQ from scratch on a CPU machine (idempotent).
#   bash scripts/setup.sh            -> .venv with agoq, its plugins and the conformance suite
# torch is pinned IN THE SAME pip command as everything that depends on it: otherwise pip may pull a
# CUDA build of several GB. 2.13.0 is the CPU build CI uses; any torch>=2.4 works for the library.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${AGOQ_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip setuptools wheel
# Third-party dependencies first (pinned torch + triton matching the GPU machine's 3.6.0).
"$VENV/bin/python" -m pip install -q \
  "torch==2.13.0" "triton==3.6.0" "pluggy>=1.5" "numpy>=1.24" "pytest>=8" \
  "transformers>=4.46" "tokenizers>=0.20" "matplotlib>=3.7" "tqdm>=4.66" "rich>=13" "bitsandbytes>=0.45"
# Our distributions, editable, without build isolation (setuptools is already in the venv).
pkgs=(-e . -e conformance_tests -e tests/plugins/dummy_backend)
for p in backends/triton_common backends/cuda backends/ascend backends/cpu; do
  [ -f "$p/pyproject.toml" ] && pkgs+=(-e "$p")
done
"$VENV/bin/python" -m pip install -q --no-build-isolation "torch==2.13.0" "${pkgs[@]}"
"$VENV/bin/python" -c "import agoq_core, agoq_conformance; print('agoq', agoq_core.__version__, 'ready in', '$VENV')"
