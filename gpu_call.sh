#!/usr/bin/env bash
# untracked: one device call, stages given as arguments; results under $OUT/<tag>, tarred at the end
set -u
base=$OUT; tag=$1; shift
mkdir -p "$base/$tag"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$base/card.txt"
git rev-parse --short HEAD 2>/dev/null | tee -a "$base/card.txt"
( export OUT=$base/$tag; bash benchmarks/gpu_session.sh "$@" ) 2>&1 | tee "$base/$tag/log.txt" | grep -vE '^\s*$' | tail -150
cd "$base" && find . -type f -size -3M | tar czf /tmp/all.tgz -T - && find . -mindepth 1 -delete && mv /tmp/all.tgz .
