"""FSDP2 + QuanGrad on several GPUs: where QuanGrad's reduce-scatter starts to beat NCCL's (per bucket size),
and one FSDP2 training step with and without it. Prepared for a multi-GPU machine; NOT RUN YET.

    python3 -m torch.distributed.run --standalone --nproc_per_node 8 benchmarks/bench_fsdp_quangrad_nccl.py
    python3 -m torch.distributed.run --standalone --nproc_per_node 2 benchmarks/bench_fsdp_quangrad_nccl.py --smoke

(writes $OUT/fsdp_qg_nccl.{json,md}; ``--smoke``: CPU, gloo, tiny sizes; ``--standalone`` picks a free
rendezvous port, so two jobs on one host do not collide on torchrun's default 29500). The --smoke path
ran on torch 2.11.0 and 2.13.0 (2 gloo ranks); the NCCL path needs 2+ GPUs and has not run.

Part 1 calls the comm objects exactly as FSDP2 does (``comm(output, input, group, op)``, input laid out as
[world, shard]) for buckets of 64 KiB .. 256 MiB of fp32 gradient: NCCL's reduce-scatter in fp32 and in
bf16 (torch's ``DefaultReduceScatter``) against ``QuanGradReduceScatter`` (quantize, byte all-to-all,
fp32 rank-order sum) from fp32 and from bf16 input. Median of ``--iters`` after warm-up, max over ranks.
The crossover is the smallest bucket from which QuanGrad is faster than fp32 NCCL at every larger
size; set ``enable(threshold_bytes=...)`` / ``QuanGradConfig.min_compress_bytes`` from it.
Part 2: a stack of Llama-7B-shaped MLP+attention-projection blocks under ``fully_shard`` (bf16 params,
fp32 reduce), one optimizer step timed with FSDP's reduce-scatter and with ``quangrad.fsdp.enable``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

SIZES_MIB = (0.0625, 0.25, 1, 4, 16, 64, 256)
SMOKE_SIZES_MIB = (0.0625, 0.25, 1)


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _time(fn, dev, warmup, iters, group):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(iters):
        _sync(dev)
        dist.barrier(group=group)
        t = time.perf_counter()
        fn()
        _sync(dev)
        ts.append(time.perf_counter() - t)
    med = torch.tensor([statistics.median(ts)], dtype=torch.float64, device=dev)
    dist.all_reduce(med, op=dist.ReduceOp.MAX, group=group)
    return float(med) * 1e3


def bucket_sweep(args, dev, world):
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter

    from agoq_core.backend import get_backend
    from agoq_core.quangrad.config import resolve_spec
    from agoq_core.quangrad.fsdp import QuanGradFSDPState, QuanGradReduceScatter

    g = dist.group.WORLD
    spec = resolve_spec("fp8_e4m3", None)
    be = get_backend(None)
    state = QuanGradFSDPState(fmt=spec.name, block=spec.block, threshold_bytes=0, backend=be.name)
    qg = QuanGradReduceScatter(fqn="bench", spec=spec, backend=be, state=state, fallback=DefaultReduceScatter())
    vendor = DefaultReduceScatter()
    rows = []
    for mib in (SMOKE_SIZES_MIB if args.smoke else SIZES_MIB):
        numel = int(mib * (1 << 20)) // 4 // world * world
        shard = numel // world
        row = {"bucket_fp32_mib": mib, "numel": numel}
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(numel, device=dev, dtype=dtype)
            out = torch.empty(shard, device=dev, dtype=dtype)
            tag = "fp32" if dtype == torch.float32 else "bf16"
            row[f"nccl_{tag}_ms"] = _time(lambda: vendor(out, x, g, dist.ReduceOp.SUM), dev, args.warmup, args.iters, g)
            row[f"quangrad_from_{tag}_ms"] = _time(lambda: qg(out, x, g, dist.ReduceOp.SUM), dev, args.warmup,
                                                   args.iters, g)
        row["speedup_vs_nccl_fp32"] = row["nccl_fp32_ms"] / row["quangrad_from_fp32_ms"]
        row["speedup_vs_nccl_bf16"] = row["nccl_bf16_ms"] / row["quangrad_from_bf16_ms"]
        rows.append(row)
    crossover = None
    for i in range(len(rows)):
        if all(r["speedup_vs_nccl_fp32"] > 1 for r in rows[i:]):
            crossover = rows[i]["bucket_fp32_mib"]
            break
    return {"backend": be.name, "rows": rows, "crossover_fp32_mib": crossover}


class Block(torch.nn.Module):
    """Llama-2-7B's per-layer GEMM weights (q/k/v/o 4096x4096, gate/up/down 4096x11008), as plain Linears."""

    def __init__(self, dim, hidden):
        super().__init__()
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.o = torch.nn.Linear(dim, dim, bias=False)
        self.gate_up = torch.nn.Linear(dim, 2 * hidden, bias=False)
        self.down = torch.nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        x = x + self.o(self.qkv(x)[..., : x.shape[-1]])
        g, u = self.gate_up(x).chunk(2, dim=-1)
        return x + self.down(torch.nn.functional.silu(g) * u)


def fsdp_step(args, dev, world):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from agoq_core.quangrad import fsdp as qg_fsdp

    from agoq_core.models import MODELS

    big = MODELS["llama2-7b"]
    dim, hidden, layers, tokens = (64, 176, 2, 128) if args.smoke else (big.hidden, big.intermediate, args.layers, 4096)
    res = {"dim": dim, "hidden": hidden, "layers": layers, "tokens_per_rank": tokens}
    for mode in ("nccl", "quangrad"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[Block(dim, hidden) for _ in range(layers)]).to(dev)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if dev.type == "cuda" else torch.float32,
                                  reduce_dtype=torch.float32)
        for b in model:
            fully_shard(b, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        state = qg_fsdp.enable(model, threshold_bytes=args.threshold) if mode == "quangrad" else None
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randn(1, tokens, dim, device=dev)

        def step():
            model(x).float().pow(2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        res[f"{mode}_step_ms"] = _time(step, dev, args.warmup, args.iters, dist.group.WORLD)
        if state is not None:
            res["quangrad_summary"] = state.summary()
        del model, opt
    res["speedup"] = res["nccl_step_ms"] / res["quangrad_step_ms"]
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threshold", type=int, default=None, help="enable(threshold_bytes=) for part 2 (1 MiB; 0 with --smoke)")
    args = ap.parse_args()
    args.threshold = args.threshold if args.threshold is not None else (0 if args.smoke else 1 << 20)
    if args.smoke:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
    else:  # the device first, and bound to the group: NCCL's barrier/collectives then never guess it
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(dev)
        dist.init_process_group("nccl", device_id=dev)
    rank, world = dist.get_rank(), dist.get_world_size()
    result = {"world": world, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "sweep": bucket_sweep(args, dev, world), "fsdp_step": fsdp_step(args, dev, world)}
    if dev.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(dev)
    if rank == 0:
        out = Path(os.environ.get("OUT", "/tmp/agoq-out"))
        out.mkdir(parents=True, exist_ok=True)
        (out / "fsdp_qg_nccl.json").write_text(json.dumps(result, indent=1))
        lines = [f"FSDP2 + QuanGrad, world {world}, {result.get('gpu', 'cpu')}, torch {torch.__version__}, "
                 f"backend {result['sweep']['backend']}, {result['date']}", "",
                 "| bucket (fp32 MiB) | NCCL fp32 ms | QuanGrad from fp32 ms | x | NCCL bf16 ms | QuanGrad from bf16 ms | x |",
                 "|---|---|---|---|---|---|---|"]
        for r in result["sweep"]["rows"]:
            lines.append(f"| {r['bucket_fp32_mib']} | {r['nccl_fp32_ms']:.3f} | {r['quangrad_from_fp32_ms']:.3f} | "
                         f"{r['speedup_vs_nccl_fp32']:.2f} | {r['nccl_bf16_ms']:.3f} | {r['quangrad_from_bf16_ms']:.3f} | "
                         f"{r['speedup_vs_nccl_bf16']:.2f} |")
        s = result["fsdp_step"]
        lines += ["", f"crossover (QuanGrad faster than NCCL fp32 from here up): {result['sweep']['crossover_fp32_mib']} MiB",
                  f"FSDP2 step ({s['layers']} blocks {s['dim']}x{s['hidden']}): NCCL {s['nccl_step_ms']:.1f} ms, "
                  f"QuanGrad {s['quangrad_step_ms']:.1f} ms ({s['speedup']:.2f}x)", s.get("quangrad_summary", "")]
        (out / "fsdp_qg_nccl.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
