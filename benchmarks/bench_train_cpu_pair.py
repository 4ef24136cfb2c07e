"""`agoq train`'s baseline and AGoQ arms (tiny model, CPU defaults) stepped alternately in one process.

    python benchmarks/bench_train_cpu_pair.py                    # 30 step pairs, 1 torch thread
    python benchmarks/bench_train_cpu_pair.py --steps 3 --smoke  # a quick check that it runs

A whole `agoq train` run times its arms one after the other, so on a shared machine a load change
between the arms moves the ratio more than a codec change does (docs/benchmarks.md §6). Here both arms
are built exactly as `agoq train` builds them (agoq_core.train.loop.make_arm, same model, data and
optimizer; default 1 micro-batch of 8 x 128 tokens per step) and step k of one arm runs next to step k
of the other (the order alternates), so both see the same load. Reported per arm: median and min wall and
CPU time per step after 3 warm-up steps (which compile the codecs), and the AGoQ/baseline tokens-per-
second ratio as the median of per-pair wall ratios and as the ratio of median CPU times (CPU time does
not count time-slicing by other processes). The AGoQ arm runs on whatever backend is selected
(AGOQ_BACKEND, default: cpu where installed).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30, help="timed step pairs (default 30)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: agoq train's choice on a busy 2-core machine)")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--smoke", action="store_true", help="model 'micro', for a quick check")
    args = ap.parse_args(argv)

    import torch
    from agoq_core.backend import get_backend
    from agoq_core.train.config import TrainConfig
    from agoq_core.train.data import load_corpus
    from agoq_core.train.loop import make_arm
    from agoq_core.train.models import build_model
    from agoq_core.train.runtime import init_runtime, shutdown

    cfg = TrainConfig(model="micro" if args.smoke else args.model, steps=max(300, args.steps + 3), eval_every=0,
                      eval_tokens=4096, threads=args.threads, progress=False, device="cpu")
    rt = init_runtime(cfg, 0, 1)
    corpus = load_corpus(seq_len=cfg.seq_len, eval_tokens=cfg.eval_tokens)
    arms = {}
    for name in ("baseline", "agoq"):
        model = build_model(cfg.model, vocab_size=corpus.vocab_size, seq_len=cfg.seq_len, seed=cfg.seed, device=rt.device)
        arms[name] = make_arm(name, model, rt, cfg)
        model.train()

    def one(arm, step: int) -> None:
        for k, b in enumerate(batches := corpus.step_batches(step, seed=cfg.seed, micro_batch=cfg.micro_batch,
                                                             grad_accum=cfg.grad_accum, dp=1, rank=0)):
            arm.forward_backward(b, scale=1.0 / cfg.grad_accum, last=k == len(batches) - 1)
        arm.step(cfg.lr)

    for s in range(3):
        for a in arms.values():
            one(a, s)
    wall = {n: [] for n in arms}
    cpu = {n: [] for n in arms}
    order = list(arms.items())
    for s in range(args.steps):
        for n, a in (order if s % 2 == 0 else order[::-1]):
            t0, c0 = time.perf_counter(), time.process_time()
            one(a, 3 + s)
            wall[n].append(time.perf_counter() - t0)
            cpu[n].append(time.process_time() - c0)
    for a in arms.values():
        a.close()
    shutdown(rt)

    med = lambda v: statistics.median(v) * 1e3  # noqa: E731
    print(f"model {cfg.model}, {cfg.tokens_per_step} tokens/step, {args.threads} thread(s), agoq backend "
          f"{get_backend().name}, torch {torch.__version__}, load average {os.getloadavg()[0]:.1f}")
    for n in arms:
        print(f"  {n:9s} wall median {med(wall[n]):7.1f} min {min(wall[n]) * 1e3:7.1f} | cpu median {med(cpu[n]):7.1f} "
              f"min {min(cpu[n]) * 1e3:7.1f} ms/step")
    pair = statistics.median(b / a for a, b in zip(wall["agoq"], wall["baseline"]))
    print(f"  AGoQ / baseline tokens/s: {pair:.3f} (median of {args.steps} per-pair wall ratios), "
          f"{med(cpu['baseline']) / med(cpu['agoq']):.3f} (median CPU times)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
