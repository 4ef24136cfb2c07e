#!/usr/bin/env bash
# Compile every Ascend kernel variant with the real Triton-Ascend frontend (no NPU needed): Triton IR ->
# Triton-Ascend's linalg/HIVM passes, failing on any rejected kernel, any discrete-mask fallback and any
# division in the Ascend path; stops before the device binary unless CANN's bishengir-compile is on PATH
# (then pass --bishengir). See frontend_compile.py for what is checked.
#
#   bash backends/ascend/scripts/frontend_compile.sh [--quick] [--keep DIR] [--json OUT] [-k FILTER]
#
# It makes (once) a separate venv with triton-ascend, which replaces upstream triton's `triton` module and
# so can never share the project's venv. AGOQ_TASCEND_VENV overrides its location.
set -euo pipefail
cd "$(dirname "$0")/../../.."
VENV=${AGOQ_TASCEND_VENV:-.venv-triton-ascend}
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import triton.backends.ascend" 2>/dev/null; then
  # triton-ascend ships Python 3.9-3.11 wheels only
  PY=${AGOQ_TASCEND_PYTHON:-$(command -v python3.11 || command -v python3.10 || command -v python3.9 || command -v python3)}
  "$PY" -m venv "$VENV"
  # triton-ascend 3.2 (a 54 MB wheel) + pybind11 and numpy, which it imports without declaring them. No torch:
  # neither the frontend nor the kernel sources import it (checked with torch made unimportable), so the venv
  # is ~260 MB and takes well under a minute to make.
  "$VENV/bin/python" -m pip install -q "triton-ascend==3.2.0" pybind11 numpy
fi
if "$VENV/bin/python" -m pip show triton >/dev/null 2>&1; then
  echo "frontend_compile.sh: upstream triton is installed in $VENV next to triton-ascend; remove the venv and rerun" >&2
  exit 2
fi
# TRITON_INTERPRET=1 (set for the CPU tests) would turn the kernels into interpreted functions: not compiled
exec env -u TRITON_INTERPRET "$VENV/bin/python" backends/ascend/scripts/frontend_compile.py "$@"
