#!/usr/bin/env bash
# Prepare an interleaved A/B of the kernels on the GPU machine: export the code of git revision REV (the base) into
# .ab_base/ (git-ignored; ~11 MB: no docs), to travel with the device tool's carry next to this tree:
#   bash benchmarks/ab_prepare.sh 546629f
#   device run, carry [".whl", ".ab_base"]:  AB_FORMATS="int4 nf4 fp4_e2m1 mxfp4" bash benchmarks/gpu_session.sh ab-codecs:300
# The GPU machine's copy of .git may be stale, so the base is exported here, not checked out there.
set -euo pipefail
cd "$(dirname "$0")/.."
REV=${1:?usage: bash benchmarks/ab_prepare.sh REV}
git rev-parse --verify -q "$REV^{commit}" >/dev/null || { echo "ab_prepare.sh: no commit $REV" >&2; exit 2; }
rm -rf .ab_base && mkdir -p .ab_base
git archive "$(git rev-parse "$REV")" agoq_core backends benchmarks conformance_tests | tar -x -C .ab_base
git rev-parse "$REV" > .ab_base/REVISION
echo "ab_prepare.sh: .ab_base/ holds $(cat .ab_base/REVISION) ($(du -sh .ab_base | cut -f1))"
