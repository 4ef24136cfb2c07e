#!/usr/bin/env bash
# The GPU convergence study (docs/convergence.md): llama-1b body on WikiText-2, one `agoq train` process
# per group of arms, the groups run concurrently on the one GPU (loss curves only: the tokens/s of
# concurrent processes are not speed measurements). Everything lands in $OUT/runs-<seed>.tar.gz.
#   bash benchmarks/gpu_convergence.sh SEED [SECONDS]
set -u
source "$(dirname "$0")/gpu_env.sh"
OUT=${OUT:-/tmp/agoq-out}; mkdir -p "$OUT"
SEED=$1; SECS=${2:-560}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a "$OUT/gpu.txt"
COMMON=(--model llama-1b --device cuda --seq-len 2048 --micro-batch 4 --steps 300 --lr 6e-4 --eval-every 50
        --eval-tokens 65536 --seed "$SEED" --out-dir "$OUT/runs" --no-progress --json)
groups=("" "--no-baseline --no-agoq --ablation uniform4-attn,int8-everywhere"
        "--no-baseline --no-agoq --ablation laaq-only,quangrad-only")
i=0
for g in "${groups[@]}"; do
  # shellcheck disable=SC2086
  timeout "$SECS" python3 -m agoq_core.cli.main train "${COMMON[@]}" --run-name "s$SEED-g$i" $g \
    > "$OUT/s$SEED-g$i.json" 2> "$OUT/s$SEED-g$i.log" &
  i=$((i + 1))
done
wait
tail -n 5 "$OUT"/s"$SEED"-g*.log
tar czf "$OUT/runs-$SEED.tar.gz" -C "$OUT" runs && rm -rf "$OUT/runs"
for f in "$OUT"/s"$SEED"-g*.json; do echo "== $f"; head -c 1500 "$f"; echo; done
