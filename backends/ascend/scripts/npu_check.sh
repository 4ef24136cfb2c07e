#!/usr/bin/env bash
# One command for a person with an Ascend NPU (Atlas A2/A3 or Ascend 950). Installs nothing; run it from an
# AGoQ checkout in the venv set up as docs/backends/ascend.md §1 says (CANN's set_env.sh sourced).
#
#   bash backends/ascend/scripts/npu_check.sh [OUTDIR]          (default OUTDIR: npu-check-<date>)
#
# 1. the environment probe (agoq backends) and versions (torch, torch_npu, triton-ascend, CANN, SoC);
# 2. the ascend plugin's tests that need no NPU (fakes + interpreter are skipped here: they ran in CI);
# 3. `agoq conformance run --backend ascend` on the NPU -> OUTDIR/ascend.json (+ the start-up self-test);
# 4. `agoq conformance compare` of that report with the committed CUDA (H200) and reference reports;
# 5. with 2+ NPUs: a 3-step QuanGrad run on HCCL (hccl_quangrad_step.py) -> OUTDIR/hccl.json.
# Then send OUTDIR (a summary is in OUTDIR/SUMMARY.txt). Exit status 0 iff every step passed.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${1:-npu-check-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
PY=${PYTHON:-python}
status=0
step() { echo "== $*" | tee -a "$OUT/SUMMARY.txt"; }
record() { local rc=$1 what=$2; if [ "$rc" -eq 0 ]; then echo "   ok: $what" | tee -a "$OUT/SUMMARY.txt";
  else echo "   FAILED ($rc): $what" | tee -a "$OUT/SUMMARY.txt"; status=1; fi; }

unset TRITON_INTERPRET AGOQ_ASCEND_INTERPRET   # real NPU mode
export AGOQ_BACKEND=ascend

step "1. environment"
{
  "$PY" -c "import sys, torch; print('python', sys.version.split()[0]); print('torch', torch.__version__)"
  "$PY" -c "import torch_npu, torch; print('torch_npu', torch_npu.__version__); print('npu count', torch.npu.device_count()); print('soc', torch.npu.get_soc_version(), torch.npu.get_device_name(0))"
  "$PY" -c "import torch_npu; print('CANN', torch_npu.npu.utils.get_cann_version())" 2>/dev/null || true
  "$PY" -m pip show triton-ascend 2>/dev/null | head -2
  command -v bishengir-compile || echo "bishengir-compile: not on PATH"
  npu-smi info 2>/dev/null | head -20 || echo "npu-smi: not available (fine in a container)"
  agoq backends 2>&1
} > "$OUT/environment.txt" 2>&1
record $? "environment (environment.txt)"

step "2. plugin tests (no NPU needed; kernel-interpreter tests skip on an NPU machine)"
"$PY" -m pytest -q -p no:cacheprovider backends/ascend/tests > "$OUT/plugin-tests.txt" 2>&1
record $? "backends/ascend/tests (plugin-tests.txt)"

step "3. conformance on the NPU (the backend's start-up self-test runs first)"
agoq conformance run --backend ascend --report "$OUT/ascend.json" > "$OUT/conformance.txt" 2>&1
record $? "agoq conformance run --backend ascend (ascend.json, conformance.txt)"

step "4. compare with the committed reports"
for ref in docs/conformance/cuda-h200.json docs/conformance/reference-cpu.json; do
  if [ -f "$OUT/ascend.json" ] && [ -f "$ref" ]; then
    agoq conformance compare "$ref" "$OUT/ascend.json" > "$OUT/compare-$(basename "$ref" .json).txt" 2>&1
    record $? "agoq conformance compare $ref (compare-$(basename "$ref" .json).txt)"
  fi
done

step "5. QuanGrad on HCCL"
n=$("$PY" -c "import torch_npu, torch; print(torch.npu.device_count())" 2>/dev/null || echo 0)
if [ "${n:-0}" -ge 2 ]; then
  AGOQ_NPU_CHECK_OUT="$OUT/hccl.json" "$PY" -m torch.distributed.run --nproc_per_node 2 \
    backends/ascend/scripts/hccl_quangrad_step.py > "$OUT/hccl.txt" 2>&1
  record $? "3 QuanGrad steps on 2 NPUs over HCCL (hccl.json.rank*, hccl.txt)"
else
  echo "   skipped: fewer than 2 NPUs visible" | tee -a "$OUT/SUMMARY.txt"
fi

echo "== done: send $OUT (SUMMARY.txt lists each step); exit $status" | tee -a "$OUT/SUMMARY.txt"
exit $status
