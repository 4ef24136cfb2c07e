#!/usr/bin/env bash
# One device call, several benchmarks: each stage gets its own time limit and writes into $OUT.
#   bash benchmarks/gpu_session.sh STAGE[:SECONDS] ...
# Stages: conformance, laaq, quangrad, laaq-fusion, fusion, codecs, torchtitan, equal-memory, equal-memory-m,
# layer-profile-64k, layer-profile-qc32k, policy-80, longest, laaq-16k, layer-profile-fp8, float8-m, float8-80, float8-ce, liger, layer-profile-fp8-64k, float8-80-64k, float8-64k, cells, integrations, grad-error, mx-probe, fusion-elementwise, train-split, kernel-tests, host,
# dequant-tiles, norm-fusion, train-split-c, train-profile, train-profile-c, layer-host, train-alone, ab-codecs, swiglu-ab, maxnreg, layer-profile, ncu-norm,
# norm-prefetch16, absmax, qg-profile, nvfp4-norm-probe, layer-profile-128k, packed-ab, norm-words-ab. Runs the repo in place via PYTHONPATH (the GPU machine has torch + triton preinstalled and no network).
set -u
source "$(dirname "$0")/gpu_env.sh"
OUT=${OUT:-/tmp/agoq-out}; mkdir -p "$OUT"
# Wheels the GPU image lacks (torchtitan and its small deps, torchao) travel in .whl (docs/integrations.md).
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
# the card's short name for report files (cuda-h100.json, cuda-h200.json, ...)
GPU_TAG=$(head -1 "$OUT/gpu.txt" | grep -oiE 'GH200|H100|H200|H20|A100|B200|B100|L40S' | head -1 | tr 'A-Z' 'a-z')
export GPU_TAG=${GPU_TAG:-gpu}
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a "$OUT/gpu.txt"
for spec in "$@"; do
  stage=${spec%%:*}; secs=${spec#*:}; [ "$secs" = "$spec" ] && secs=300
  echo "=== $stage (limit ${secs}s) ==="
  case $stage in
    # pytest -n 16 compiles the Triton cache in parallel first; the report run then takes seconds.
    conformance) cmd=(bash -c 'python3 -m pytest -q -n 16 -p no:cacheprovider conformance_tests --agoq-backend cuda | tail -8; python3 -m agoq_core.cli.main conformance run --backend cuda --report "$OUT/cuda-$GPU_TAG.json"') ;;
    laaq)        cmd=(python3 benchmarks/bench_laaq.py --budget-s $((secs - 40))) ;;
    quangrad)    cmd=(python3 benchmarks/bench_quangrad_gpu.py) ;;
    laaq-fusion) cmd=(bash -c 'for f in 0 1; do echo "AGOQ_FUSION=$f"; AGOQ_FUSION=$f python3 benchmarks/bench_laaq.py --methods laaq --seqs 16384 --ladder-methods "" --steps 3 --json "$OUT/bench_laaq_fusion$f.json" | grep -E "tok/s|^laaq "; done') ;;
    fusion)      cmd=(python3 benchmarks/bench_fusion.py) ;;
    # issue 17: host us per eager accumulate_/quantize_into call, launcher normal path vs fast path (~20 s)
    host)        cmd=(python3 benchmarks/bench_host.py) ;;
    # issue 17: dequantize with the 16-lane tile off and on for every format, 1 GiB (picks agoq_cuda.launch.VEC16_DEFAULTS)
    # TILE_FORMATS (space-separated): only these formats
    dequant-tiles) cmd=(python3 benchmarks/bench_codecs.py --sizes-mib 1024 --no-sweep --bucket-log2 0 --compile-formats --norm-tokens 0 --dequant-tiles both --deadline-s $((secs - 30)) --json "$OUT/bench_codecs_tiles.json" ${TILE_FORMATS:+--formats $TILE_FORMATS}) ;;
    # the fused RMSNorm + quantize against the compiled norm + codec pair, 16K x 4096, the 4-bit formats (~60 s)
    norm-fusion) cmd=(python3 benchmarks/bench_codecs.py --formats ${NORM_FORMATS:-int4 nf4 fp4_e2m1 mxfp4 nvfp4} --sizes-mib 1024 --no-sweep \
                      --bucket-log2 0 --compile-formats --deadline-s $((secs - 20)) --json "$OUT/bench_codecs_norm.json") ;;
    codecs)      cmd=(python3 benchmarks/bench_codecs.py --sizes-mib 1024 --no-sweep --deadline-s $((secs - 30))) ;;
    torchtitan)  cmd=(python3 benchmarks/bench_torchtitan.py --budget-s $((secs - 30))) ;;  # needs .whl (docs/integrations.md)
    equal-memory) cmd=(python3 benchmarks/bench_equal_memory.py --quick --budget-s $((secs - 70))) ;;  # torchao wheel in .whl; 290 s: layer profile + 3 cells
    # issue 18: the --quick cells (policy-m whole device and 80 GiB cap, SAC / full / partial checkpointing compiled
    # at 80 GiB) planned from the 2026-12-01 H200 per-layer profile instead of profiling again (~90 s saved), plus
    # the 64K one if layer-profile-64k ran first in the same session
    equal-memory-m) lc=docs/bench/h200-2026-12-01-s2/equal-memory/bench_layer_profile.json
                    [ -f "$OUT/bench_layer_profile_64k.json" ] && lc="$lc,$OUT/bench_layer_profile_64k.json"
                    cmd=(python3 benchmarks/bench_equal_memory.py --quick --cell-timeout-s 240 --budget-s $((secs - 170)) \
                         --layer-costs "$lc") ;;
    # one layer at 64K, the options an 80 GiB plan picks from (no kernel profile, 1 rep): policy-m's 64K costs
    layer-profile-64k) cmd=(python3 benchmarks/bench_layer_profile.py --seqs 64K \
                            --methods bf16-c,laaq-c:nf4,qckpt-c:nf4,ckpt-c,qckpt-c:int8,laaq-c:int8 \
                            --no-profile --reps 1 --warmup 1 --budget-s $((secs - 40)) --json "$OUT/bench_layer_profile_64k.json") ;;
    # compiled quantized checkpointing (the layer compiled inside the wrapper) and compiled full checkpointing at 32K
    layer-profile-qc32k) cmd=(python3 benchmarks/bench_layer_profile.py --seqs 32K --methods qckpt-c:nf4,qckpt-c:int8,ckpt-c \
                            --no-profile --reps 2 --warmup 1 --budget-s $((secs - 30)) --json "$OUT/bench_layer_profile_qc32k.json") ;;
    # policy-m under 80 GiB at 32K and 64K, planned from every per-layer profile this session measured
    policy-80) lc=docs/bench/h200-2026-12-01-s2/equal-memory/bench_layer_profile.json
               for f in "$OUT/bench_layer_profile_qc32k.json" "$OUT/bench_layer_profile_64k.json"; do [ -f "$f" ] && lc="$lc,$f"; done
               cmd=(python3 benchmarks/bench_equal_memory.py --configs policy-m --cap-gib 80 --seqs 32K,64K --cell-timeout-s $((secs - 20)) \
                    --layer-costs "$lc" --json "$OUT/bench_equal_memory_policy80.json") ;;
    # LAAQ with float8 GEMMs against compiled float8 + SAC (issue 18's bar): one layer at 32K (the float8 options a
    # plan picks from), then the whole model: float8 + the fastest checkpointing that fits, LAAQ with float8 GEMMs, and
    # the budget policy planned from the float8 costs (policy-m-fp8), 2 untimed steps each (~8 minutes in all)
    layer-profile-fp8) cmd=(python3 benchmarks/bench_layer_profile.py --seqs 32K \
                            --methods fp8-sac-c,fp8-laaq-c:nf4,fp8-bf16-c,fp8-ckpt-c,fp8-qckpt-c:nf4 \
                            --no-profile --reps 2 --warmup 1 --budget-s $((secs - 30)) --json "$OUT/bench_layer_profile_fp8.json") ;;
    float8-m) cmd=(python3 benchmarks/bench_equal_memory.py --configs fp8-c,laaq-fp8-c,policy-m-fp8 --caps 0 --seqs 32K \
                   --steps 3 --warmup 2 --cell-timeout-s $(( (secs - 10) / 3 )) --layer-costs "$OUT/bench_layer_profile_fp8.json" \
                   --json "$OUT/bench_equal_memory_fp8.json") ;;
    # the strongest float8 alternative (float8 + the chunked loss, fastest of none/sac/partial/ckpt, partial planned from
    # the measured fp8 costs) and the float8 budget policy with QuanGrad's FP8 gradients, under 80 GiB at 32K; the
    # float8 profile of this session if layer-profile-fp8 ran, else the 2026-12-02 one
    float8-80) lc=docs/bench/h200-2026-12-02-s3/bench_layer_profile_fp8.json
               [ -f "$OUT/bench_layer_profile_fp8.json" ] && lc="$OUT/bench_layer_profile_fp8.json"
               cmd=(python3 benchmarks/bench_equal_memory.py --configs policy-m-fp8-qg,fp8-ce-c --caps 80 --seqs 32K \
                    --steps 3 --warmup 2 --cell-timeout-s $((secs - 20)) --layer-costs "$lc" --json "$OUT/bench_equal_memory_fp8_80qg.json") ;;
    # the float8 options at 64K (one layer each), then the 64K cells under 80 GiB planned from them: the strongest
    # float8 alternative against the float8 budget policy with and without QuanGrad's FP8 gradients
    layer-profile-fp8-64k) cmd=(python3 benchmarks/bench_layer_profile.py --seqs 64K \
                            --methods fp8-laaq-c:nf4,fp8-bf16-c,fp8-ckpt-c,fp8-qckpt-c:nf4 \
                            --no-profile --reps 1 --warmup 1 --budget-s $((secs - 30)) --json "$OUT/bench_layer_profile_fp8_64k.json") ;;
    # issue 18: one layer at 128K, the options the 128K budget plans pick (bf16 and float8; no kernel profile, 1 rep).
    # The 128K plans scaled from 32K costs under-predicted the peak by 1.5-5.7% on an H100 (docs/benchmarks.md §5.12);
    # then: CELLS_COSTS=<the two default profiles>,$OUT/bench_layer_profile_128k.json CELLS_CONFIGS=policy-m,policy-m-fp8
    # CELLS_SEQS=128K ... cells
    layer-profile-128k) cmd=(python3 benchmarks/bench_layer_profile.py --seqs 128K \
                             --methods qckpt-c:nf4,ckpt-c,bf16-c,fp8-qckpt-c:nf4,fp8-ckpt-c,fp8-bf16-c \
                             --no-profile --reps 1 --warmup 1 --budget-s $((secs - 30)) --json "$OUT/bench_layer_profile_128k.json") ;;
    float8-80-64k) cmd=(python3 benchmarks/bench_equal_memory.py --configs policy-m-fp8,policy-m-fp8-qg,fp8-ce-c --caps 80 \
                        --seqs 64K --steps 2 --warmup 1 --cell-timeout-s $(( (secs - 10) / 3 )) \
                        --layer-costs "${FP8_64K_COSTS:-$OUT/bench_layer_profile_fp8_64k.json}" --json "$OUT/bench_equal_memory_fp8_80_64k.json") ;;
    # the same two at 64K on the whole device (plain does not fit there either): the float8 budget policy against the
    # strongest float8 alternative; FP8_64K_COSTS: a bench_layer_profile_fp8_64k.json from an earlier call
    float8-64k) lc=${FP8_64K_COSTS:-$OUT/bench_layer_profile_fp8_64k.json}
                cmd=(python3 benchmarks/bench_equal_memory.py --configs policy-m-fp8,fp8-ce-c --caps 0 \
                     --seqs 64K --steps 2 --warmup 1 --cell-timeout-s $(( (secs - 10) / 2 )) \
                     --layer-costs "$lc" --json "$OUT/bench_equal_memory_fp8_64k.json") ;;
    # any per-layer profile (issue 18: what the time goes to, per layer, at a cell's length), e.g. the float8 options at
    # 16K: LP_SEQS=16K LP_METHODS=fp8-sac-c,fp8-laaq-c:nf4,fp8-bf16-c,fp8-ckpt-c; LP_ARGS adds options (--no-profile)
    layer-profile) cmd=(python3 benchmarks/bench_layer_profile.py --seqs "${LP_SEQS:?set LP_SEQS}" --methods "${LP_METHODS:?set LP_METHODS}" \
                        --reps 2 --warmup 1 --budget-s $((secs - 30)) ${LP_ARGS:-} --json "$OUT/bench_layer_profile_custom.json") ;;
    # any slice of the equal-memory matrix (issue 18), e.g. the rows not measured yet:
    #   CELLS_CONFIGS=plain-c,fp8-ce-c,laaq-c,policy-m-fp8 CELLS_SEQS=8K CELLS_CAPS=0,80 bash gpu_session.sh cells:560
    # CELLS_COSTS: per-layer profiles for the policy-m* rows (default: the H200's 32K bf16 and float8 ones: policy-m
    # plans from the bf16 options, policy-m-fp8 from the float8 ones; with the float8 one alone policy-m fell back to
    # analytic eager costs, 2026-12-07 s17; since s19 with the compiled recomputation options qckpt-c/ckpt-c at 32K:
    # without them policy-m recomputed layers eagerly, docs/benchmarks.md §5.13); CELLS_STEPS (2), CELLS_WARMUP (2);
    # CELLS_CELL_TIMEOUT (240 s per process; a 128K step takes 47-58 s on an H100, so 128K cells need more)
    cells) if [ "$secs" -le 60 ]; then echo "cells needs a limit above 60 s (its --budget-s is the limit - 60): got $secs"; continue; fi
           cmd=(python3 benchmarks/bench_equal_memory.py --configs "${CELLS_CONFIGS:?set CELLS_CONFIGS}" \
                --caps "${CELLS_CAPS:-0}" --seqs "${CELLS_SEQS:?set CELLS_SEQS}" --steps "${CELLS_STEPS:-2}" --warmup "${CELLS_WARMUP:-2}" \
                --cell-timeout-s "${CELLS_CELL_TIMEOUT:-240}" --budget-s $((secs - 60)) \
                --layer-costs "${CELLS_COSTS:-docs/bench/h200-2026-12-01-s2/equal-memory/bench_layer_profile.json,docs/bench/h200-2026-12-02-s2/policy-80/bench_layer_profile_qc32k.json,docs/bench/h200-2026-12-02-s3/bench_layer_profile_fp8.json}" \
                --json "$OUT/bench_equal_memory_cells.json") ;;
    # issue 18: where FP8 gradients' 0.03-0.18 s per step goes (docs/benchmarks.md §5.9-§5.11): the float8 policy with
    # and without QuanGrad's FP8 buffers at 32K; the timed steps (QG_STEPS, default 2) record forward / backward /
    # optimizer ms from CUDA events (phases_ms, printed), then one profiled step each (kernel groups, top_kernels; the
    # profiler's host cost skews the arms, §5.11); QG_NONFINITE=apply: QuanGrad without its check before the step
    qg-profile) mkdir -p "$OUT/prof"
                cmd=(env AGOQ_BENCH_PROFILE="$OUT/prof" python3 benchmarks/bench_equal_memory.py --configs policy-m-fp8-qg,policy-m-fp8 \
                     --caps 0 --seqs 32K --steps ${QG_STEPS:-2} --warmup 2 --qg-nonfinite ${QG_NONFINITE:-raise} --cell-timeout-s $(( (secs - 10) / 2 )) \
                     --layer-costs "${CELLS_COSTS:-docs/bench/h100-2026-12-06-s11/cells-16k/bench_layer_profile_custom.json}" \
                     --json "$OUT/bench_equal_memory_qgprof.json") ;;
    float8-ce) cmd=(python3 benchmarks/bench_equal_memory.py --configs fp8-ce-c --caps 0 --seqs 32K \
                    --steps 3 --warmup 2 --cell-timeout-s $((secs - 10)) --json "$OUT/bench_equal_memory_fp8ce.json") ;;
    # Liger-Kernel (RMSNorm, SwiGLU, RoPE, fused linear CE) + the fastest checkpointing that fits, 32K, both budgets
    # (needs the liger_kernel wheel in .whl: docs/integrations.md)
    liger) cmd=(python3 benchmarks/bench_equal_memory.py --configs liger --caps 0,80 --seqs 32K --steps 3 --warmup 2 \
                --cell-timeout-s $(( (secs - 10) / 2 )) --json "$OUT/bench_equal_memory_liger.json") ;;
    # issue 17's 7B goal with both sides compiled: plain vs LAAQ (nf4, chunked loss) at 16K, whole device, 3 steps;
    # LAAQ16K_EXTRA=laaq-hf-c adds LAAQ with plain's loss (HF's: LAAQ's own cost, one variable changed)
    laaq-16k) n=2; [ -n "${LAAQ16K_EXTRA:-}" ] && n=3
              cmd=(python3 benchmarks/bench_equal_memory.py --configs plain-c,laaq-c${LAAQ16K_EXTRA:+,$LAAQ16K_EXTRA} --caps 0 --seqs 16K --steps ${LAAQ16K_STEPS:-3} \
                   --cell-timeout-s $(( (secs - 10) / n )) --json "$OUT/bench_equal_memory_16k.json") ;;
    # the longest-sequence pair: every layer qckpt-c:nf4 at 320K vs compiled full checkpointing + chunked loss at 256K
    longest) cmd=(python3 benchmarks/bench_equal_memory.py --longest --cell-timeout-s 370 --json "$OUT/bench_equal_memory_longest.json") ;;
    integrations) cmd=(python3 benchmarks/bench_integrations.py) ;;   # CUDA autocast, eager vs compiled LAAQ
    grad-error)  cmd=(python3 benchmarks/bench_grad_error.py --budget-s $((secs - 40))) ;;  # LAAQ gradient error, 7B shapes
    mx-probe)    cmd=(python3 benchmarks/gpu_mx_reduce_probe.py) ;;
    # the GPU-only arithmetic (hardware fp8, flush-to-zero ops, the FMA quotient) checked bit for bit on the device
    kernel-tests) cmd=(python3 -m pytest -q -n 16 -p no:cacheprovider backends/cuda/tests/test_kernels_bitexact.py backends/cuda/tests/test_vec16.py backends/cuda/tests/test_mx_kernels.py backends/cuda/tests/test_fast_launch.py backends/cuda/tests/test_vec16_choice.py backends/cuda/tests/test_fused_norm.py backends/cuda/tests/test_fused_swiglu.py) ;;
    fusion-elementwise) cmd=(bash -c 'python3 benchmarks/bench_fusion_elementwise.py && python3 -m pytest -q -p no:cacheprovider conformance_tests -k fused_elementwise --agoq-backend cuda | tail -3') ;;
    # agoq train on llama-1b, 2K x 4, 40 steps: baseline vs agoq vs each half (docs/benchmarks.md §9); AGOQ_FUSION from the caller
    # the same, every arm's decoder layers compiled with Inductor (agoq train --compile; issue 17's end-to-end goal)
    train-split-c) cmd=(python3 -m agoq_core.cli.main train --device cuda --model llama-1b --seq-len 2048 --micro-batch 4 --steps 40 --eval-every 0 --eval-tokens 16384 --ablation laaq-only,quangrad-only --compile inductor --out-dir "$OUT/runs-c") ;;
    # where an agoq train step's time goes per arm (synced phases + kernel groups; benchmarks/profile_train.py)
    train-profile)   cmd=(python3 benchmarks/profile_train.py --json "$OUT/profile_train.json") ;;
    train-profile-c) cmd=(python3 benchmarks/profile_train.py --compile inductor --json "$OUT/profile_train_c.json") ;;
    # then each arm's median step against the baseline's (benchmarks/train_step_stats.py); TRAIN_REPEAT=N runs it N times,
    # TRAIN_VARIANTS='|--gc-every 10' cycles the repeats through these extra agoq train options ('|'-separated)
    train-split) cmd=(bash -c 'IFS="|" read -ra V <<< "${TRAIN_VARIANTS:-}|"; [ ${#V[@]} -eq 0 ] && V=(""); for i in $(seq ${TRAIN_REPEAT:-1}); do d="$OUT/runs/$i"; v=${V[$(( (i - 1) % ${#V[@]} ))]}; echo "== run $i: extra options: ${v:-none}"; python3 -m agoq_core.cli.main train --device cuda --model llama-1b --seq-len 2048 --micro-batch 4 --steps 40 --eval-every 0 --eval-tokens 16384 --ablation laaq-only,quangrad-only --out-dir "$d" $v | grep -vE "step/s|s/step"; python3 benchmarks/train_step_stats.py "$d"/*/ --json "$OUT/train_steps_$i.json"; done') ;;
    # LAAQ's host time per step (llama-1b body, 2 layers): 256 tokens (host-bound), the same unfused, and 8K tokens (~40 s)
    layer-host) cmd=(bash -c 'python3 benchmarks/profile_layer_host.py --top 45; AGOQ_FUSION=0 python3 benchmarks/profile_layer_host.py --json "$OUT/profile_layer_host_unfused.json" | sed -n 1,14p; python3 benchmarks/profile_layer_host.py --tokens 8192 --json "$OUT/profile_layer_host_8k.json" | sed -n 1,14p') ;;
    # train-split's arms each in a process of its own (agoq, baseline, agoq, baseline + laaq-only): no arm runs after another (~130 s)
    train-alone) cmd=(bash -c 'T="python3 -m agoq_core.cli.main train --device cuda --model llama-1b --seq-len 2048 --micro-batch 4 --steps 40 --eval-every 0 --eval-tokens 16384"; i=0; for a in "--no-baseline" "--no-agoq" "--no-baseline" "--no-agoq --ablation laaq-only"; do i=$((i+1)); d="$OUT/alone/$i"; $T $a --out-dir "$d" > /dev/null 2>&1; echo "== $a"; python3 benchmarks/train_step_stats.py "$d"/*/ | tail -1; done') ;;
    # interleaved A/B of the codec kernels and the fused norm: this tree, the base (.ab_base/ from
    # benchmarks/ab_prepare.sh REV, carried), this tree, the base, each in its own PYTHONPATH; AB_FORMATS (space-separated)
    # picks the formats, AB_ARGS replaces bench_codecs.py's size options (AB_ARGS=--tiny: a CPU check in the interpreter)
    ab-codecs) cmd=(bash -c '[ -f .ab_base/REVISION ] || { echo "no .ab_base: run benchmarks/ab_prepare.sh REV and carry .ab_base"; exit 2; }
                 echo "base: $(cat .ab_base/REVISION)"; root=$PWD; i=0
                 for tag in new base new base; do i=$((i+1)); d=$root; [ $tag = base ] && d=$root/.ab_base; echo "== $i: $tag"
                   (cd "$d" && export PYTHONPATH= && source benchmarks/gpu_env.sh && python3 benchmarks/bench_codecs.py \
                      --formats ${AB_FORMATS:-int4 nf4 fp4_e2m1 mxfp4} ${AB_ARGS:---sizes-mib 1024 --no-sweep --bucket-log2 0 --compile-formats --deadline-s 100} \
                      --json "$OUT/ab_${i}_$tag.json" | grep -E "^(quantize|dequantize) |rmsnorm|copy of" | cut -c1-160); done') ;;
    # the packed absmax (AGOQ_CUDA_PACKED_MAX, twenty-second session) off / on / off / on in one tree: the 1 GiB
    # quantize rows and the fused norm of AB_FORMATS (default nf4 fp4_e2m1 mxfp4 int8), each run bit-checked
    packed-ab) cmd=(env secs=$secs bash -c 'i=0; for v in 0 1 0 1; do i=$((i+1)); echo "== $i: AGOQ_CUDA_PACKED_MAX=$v"
                 AGOQ_CUDA_PACKED_MAX=$v python3 benchmarks/bench_codecs.py --formats ${AB_FORMATS:-nf4 fp4_e2m1 mxfp4 int8} \
                   ${AB_ARGS:---sizes-mib 1024 --no-sweep --bucket-log2 0 --compile-formats --deadline-s $(( (secs - 20) / 4 ))} \
                   --json "$OUT/packed_${i}_$v.json" | grep -E "^quantize |rmsnorm|copy of|bit-exact" | cut -c1-160; done') ;;
    # the fused SiLU&Mul kernels on both tiles with the packed forms (AGOQ_CUDA_PACKED_MAX: the forward's MAX16, and
    # the backward's paired rounding where AGOQ_CUDA_BACKWARD_PAIRED names the format) off / on / off / on, AB_FORMATS
    # (default nf4), each run bit-checked (~40 s on an H100)
    swiglu-ab) cmd=(bash -c 'i=0; for v in 0 1 0 1; do i=$((i+1)); echo "== $i: AGOQ_CUDA_PACKED_MAX=$v"
                 AGOQ_CUDA_PACKED_MAX=$v python3 benchmarks/bench_swiglu_tiles.py --formats ${AB_FORMATS:-nf4} ${AB_ARGS:-} \
                   --json "$OUT/swiglu_${i}_$v.json" | tail -12; done') ;;
    # int4's prefetching fused norm on the 16-lane tile holding the next row as bf16 words (73 registers; 64 capped,
    # no spill) against the int16 view (64), AGOQ_CUDA_PACKED_MAX=1, interleaved twice (~2 min; twenty-third session)
    norm-words-ab) cmd=(bash -c 'i=0; for w in none int4 none int4; do i=$((i+1)); echo "== $i: AGOQ_CUDA_NORM_PREFETCH_WORDS=$w"
                 AGOQ_CUDA_PACKED_MAX=1 AGOQ_CUDA_NORM_PREFETCH_WORDS=$w python3 benchmarks/sweep_norm_geometry.py --formats int4 \
                   --tiles vec16 --prefetch 1 --warps 8 --programs-per-sm 8 --maxnreg auto rmsnorm_quant:int4:vec16=64 \
                   ${AB_ARGS:-} --json "$OUT/norm_words_${i}_$w.json" | tail -4; done') ;;
    # Nsight Compute on the fused RMSNorm + quantize, this tree then the base (.ab_base/, benchmarks/ab_prepare.sh),
    # for NCU_FORMATS (default mxfp4 fp4_e2m1): pipe utilisation, warp stalls, issue (the mxfp4 fused norm's 8%)
    ncu-norm) cmd=(bash -c 'for tree in new base; do d=$PWD; [ $tree = base ] && d=$PWD/.ab_base; [ -d "$d" ] || continue
                   for f in ${NCU_FORMATS:-mxfp4 fp4_e2m1}; do echo "== $tree $f"
                     (cd "$d" && export PYTHONPATH= && source benchmarks/gpu_env.sh && ncu --clock-control none -k regex:rmsnorm_quant \
                       --launch-skip 3 --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis \
                       --section WarpStateStats --section Occupancy --section InstructionStats \
                       python3 $OLDPWD/benchmarks/run_fused_norm.py --format $f) > "$OUT/ncu_${tree}_$f.txt" 2>&1
                     grep -E "Duration|Issue Slots Busy|Executed Ipc A|Pipe|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued" "$OUT/ncu_${tree}_$f.txt" | head -40
                   done; done') ;;
    # the fused norm's next-row prefetch on the 16-lane tile (nf4's default tile; NORM_PREFETCH[True] is empty until
    # this is timed), against no prefetch, default geometry, the 4-bit formats (~1 min)
    norm-prefetch16) cmd=(python3 benchmarks/sweep_norm_geometry.py --formats nf4 int4 fp4_e2m1 mxfp4 --tiles vec16 generic \
                          --prefetch 0 1 --warps 8 --programs-per-sm 8 --json "$OUT/sweep_norm_prefetch16.json") ;;
    # the fused kernels' register caps timed: AGOQ_CUDA_MAXNREG auto / off / candidates, interleaved, same bits (~60 s)
    maxnreg) cmd=(python3 benchmarks/bench_maxnreg.py --json "$OUT/bench_maxnreg.json") ;;
    # NVFP4's tensor-scale pass (absmax_kernel) over rows x warps x programs at 1 GiB, beside the whole quantize (~1-2 min)
    absmax) cmd=(python3 benchmarks/bench_absmax.py --json "$OUT/bench_absmax.json") ;;
    # the fused NVFP4 norm's 207 -> 371 us between two H100 runs of 2026-12-07: tensor-scale pass, fused norm (eager and
    # CUDA graph) and codec quantize with each partials launch, and a profile of five fused calls (~1 min)
    nvfp4-norm-probe) cmd=(python3 benchmarks/probe_nvfp4_norm.py) ;;
    *) echo "unknown stage $stage"; continue ;;
  esac
  start=$(date +%s)
  timeout "$secs" "${cmd[@]}" 2>&1 | tee "$OUT/$stage.log" | tail -60
  echo "=== $stage: exit ${PIPESTATUS[0]} after $(( $(date +%s) - start ))s ==="
done
