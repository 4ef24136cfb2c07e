"""QuanGrad on one GPU: gradient memory of LLaMA-2-7B and the codec/collective kernel timings.

One command on the lent H200 (about 2-3 minutes):

    PYTHONPATH=.:backends/triton_common:backends/cuda python benchmarks/bench_quangrad_gpu.py

prints two tables and writes ``$OUT/bench_quangrad_gpu.json`` (or ``--json PATH``). ``--model tiny
--device cpu`` runs the same code on a tiny model on CPU (a smoke test; no GPU memory numbers).

1. Gradient memory, LLaMA-2-7B shapes (hidden 4096, 32 layers, FFN 11008, vocab 32000; 6.74e9 parameters),
   bf16 weights, random init, 2 micro-batches of 1 x ``--seq`` tokens, then one SGD step (no optimizer
   state, no master weights: only gradient storage differs between the three runs):
   * ``bf16_grads``   : plain autograd, bf16 ``.grad`` accumulated across micro-batches;
   * ``fp32_main_grads``: Megatron-style fp32 main gradients (a flat fp32 buffer; each bf16 ``.grad`` is
     added in by a post-accumulate-grad hook and freed) — what COAT/Megatron keep;
   * ``quangrad``     : QuanGradDDP (FP8 E4M3, block 256) on a 1-rank NCCL group.
   Measured with torch.cuda.memory_allocated / max_memory_allocated, relative to the memory held before
   the run (the weights): ``grad_bytes`` = allocated after the last backward (activations are freed by
   then, so this is the gradient storage), ``peak_bytes`` = peak over both micro-batches and the step.
2. Kernel timings on one GPU (CUDA events, median of 20 after warm-up) for a 2^25-element bucket
   (32 MiB of FP8 codes): quantize (bf16 in), dequantize (bf16 out), accumulate_ (bf16 gradient into the
   8-bit buffer), reduce_requantize of W = 2 and 8 received chunks (the per-rank reduce of an 8-rank
   all-reduce of that bucket), the pack/unpack copies, and QuanGrad's full protocol on a 1-rank NCCL
   group (local overhead only: no data leaves the GPU) next to NCCL's own 1-rank fp32 all-reduce.
   Effective bandwidth = bytes each kernel must read + write / time, against the H200's 4.8 TB/s.
3. The protocol simulated for 4 ranks through the chosen backend on the GPU, compared bit for bit (every
   payload byte, results, reduce-scatter shards) with the pure-torch reference on the same GPU.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the shared harness beside this script
import harness  # noqa: E402

from agoq_core.models import MODELS  # noqa: E402

HBM_TBPS = 4.8  # H200 peak HBM3e bandwidth


def _parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=list(MODELS), default="llama2-7b", help="a shape of agoq_core.models")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--bucket-log2", type=int, default=25, help="kernel timing bucket = 2**N elements")
    ap.add_argument("--backend", default="auto", help="'auto' (agoq_cuda if importable, else reference), 'cuda', 'reference'")
    harness.add_json_arg(ap, "bench_quangrad_gpu")
    return ap.parse_args(argv)


def _backend(name, device):
    """The codec backend, said out loud: the agoq_cuda plugin's Triton kernels, or the pure-torch reference."""
    from agoq_core.backend import get_backend

    if name in ("auto", "cuda") and device.type == "cuda":
        try:
            from agoq_cuda.backend import CudaBackend

            return CudaBackend.create(), "cuda (agoq_cuda Triton kernels)"
        except Exception as exc:  # noqa: BLE001 - reported, never silent
            if name == "cuda":
                raise
            note = f"reference (pure torch on {device.type}); agoq_cuda unavailable: {type(exc).__name__}: {exc}"
            print("NOTE:", note)
            return get_backend("reference"), note
    return get_backend("reference"), f"reference (pure torch on {device.type})"


def _init_dist(device):
    import torch.distributed as dist

    if dist.is_initialized():
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    if device.type == "cuda" and device.index is None:  # torch 2.11 wants an indexed device_id
        import torch
        device = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1,
                            device_id=device if device.type == "cuda" else None)


class _Mem:
    def __init__(self, device):
        import torch

        self.torch, self.dev = torch, device
        self.cuda = device.type == "cuda"

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize(self.dev)

    def allocated(self):
        return self.torch.cuda.memory_allocated(self.dev) if self.cuda else 0

    def peak(self):
        return self.torch.cuda.max_memory_allocated(self.dev) if self.cuda else 0

    def reset(self):
        gc.collect()
        if self.cuda:
            self.torch.cuda.empty_cache()
            self.torch.cuda.reset_peak_memory_stats(self.dev)


def _build_model(args, device):
    import torch
    from transformers import LlamaForCausalLM

    cfg = harness.hf_config(args.model, max_position_embeddings=max(args.seq, 128))
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # build in bf16 directly: no 27 GB fp32 copy on the way
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(prev)
    model.to(torch.bfloat16)
    return model, cfg


def memory_runs(args, device, be, backend_note):
    import torch

    from agoq_core.quangrad import QuanGradConfig, QuanGradDDP

    mem = _Mem(device)
    t0 = time.time()
    model, cfg = _build_model(args, device)
    n_params = sum(p.numel() for p in model.parameters())
    build_s = time.time() - t0
    g = torch.Generator(device="cpu").manual_seed(0)
    micro = [torch.randint(0, cfg.vocab_size, (1, args.seq), generator=g).to(device) for _ in range(2)]
    rows = {}
    for mode in ("bf16_grads", "fp32_main_grads", "quangrad"):
        for p in model.parameters():
            p.grad = None
        mem.reset()
        base = mem.allocated()
        hooks, qg, main = [], None, None
        if mode == "fp32_main_grads":
            main = torch.zeros(n_params, dtype=torch.float32, device=device)
            views, off = {}, 0
            for p in model.parameters():
                views[p] = main[off: off + p.numel()].view(p.shape)
                off += p.numel()

            def fold(p):
                views[p].add_(p.grad)
                p.grad = None
            hooks = [p.register_post_accumulate_grad_hook(fold) for p in model.parameters()]
        elif mode == "quangrad":
            qg = QuanGradDDP(model, lambda ps: torch.optim.SGD(ps, lr=1e-6),
                             config=QuanGradConfig(master_weights="off", min_compress_bytes=0, backend=be,
                                                   broadcast_params=False))
        fwd = qg if qg is not None else model
        t = time.time()
        for i, ids in enumerate(micro):
            ctx = qg.no_sync() if (qg is not None and i == 0) else _null()
            with ctx:
                fwd(input_ids=ids, labels=ids).loss.backward()
        mem.sync()
        grad_bytes = mem.allocated() - base
        peak_bwd = mem.peak() - base
        if qg is not None:
            rep = qg.step()
            assert not rep.skipped, rep
        else:
            with torch.no_grad():  # plain SGD, parameter by parameter (no optimizer temporaries)
                for p in model.parameters():
                    p.add_(views[p] if main is not None else p.grad, alpha=-1e-6)
        mem.sync()
        rows[mode] = {"grad_bytes": grad_bytes, "peak_backward_bytes": peak_bwd, "peak_bytes": mem.peak() - base,
                      "seconds": round(time.time() - t, 2)}
        if qg is not None:
            rows[mode]["storage_bytes_counted"] = qg.gradient_bytes
            rows[mode]["buckets"] = len(qg.layout.buckets)
            qg.remove_hooks()
        for h in hooks:
            h.remove()
        del qg, main, hooks
        for p in model.parameters():
            p.grad = None
    del model
    mem.reset()
    return {"model": args.model, "params": n_params, "seq": args.seq, "micro_batches": 2, "build_s": round(build_s, 1),
            "backend": backend_note, "rows": rows}


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _timer(device):
    import torch

    if device.type == "cuda":
        def run(fn, reps=20):
            return harness.cuda_median_ms(fn, reps)
    else:
        def run(fn, reps=3):
            fn()
            ts = []
            for _ in range(reps):
                t = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t) * 1e3)
            ts.sort()
            return ts[len(ts) // 2]
    return run


def kernel_timings(args, device, be, backend_note):
    import torch
    import torch.distributed as dist

    from agoq_core import api
    from agoq_core.formats.tensor import QuantizedTensor
    from agoq_core.quangrad import protocol as P
    from agoq_core.quangrad.collective import QuanGradOp
    from agoq_core.quangrad.config import resolve_spec

    spec = resolve_spec("fp8_e4m3", None)
    n = 1 << (args.bucket_log2 if device.type == "cuda" else 16)
    nb = n // spec.block
    timer = _timer(device)
    g = torch.randn(n, device=device).to(torch.bfloat16)
    q = api.quantize(g, spec, backend=be)
    out = {}

    def row(name, ms, nbytes):
        out[name] = {"ms": ms, "bytes": nbytes, "GBps": nbytes / ms / 1e6, "pct_hbm": 100 * nbytes / ms / 1e6 / (HBM_TBPS * 1e3)}

    row("quantize bf16->e4m3", timer(lambda: api.quantize(g, spec, backend=be)), 2 * n + n + 4 * nb)
    row("dequantize e4m3->bf16", timer(lambda: api.dequantize(q, torch.bfloat16, backend=be)), n + 4 * nb + 2 * n)
    qa = QuantizedTensor(q.codes.clone(), q.scales.clone(), q.shape, torch.float32, spec)
    row("accumulate_ (bf16 grad)", timer(lambda: api.accumulate_(qa, g, backend=be)), (n + 4 * nb) * 2 + 2 * n)
    for w in (2, 8):
        c = n // w
        codes = q.codes[: w * c].view(w, c).contiguous()
        scales = q.scales[: w * c // spec.block].view(w, c // spec.block).contiguous()
        row(f"reduce_requantize W={w} (chunk {c:,})",
            timer(lambda: api.reduce_requantize(codes, scales, spec, c, backend=be)), (w + 1) * (c + 4 * c // spec.block))
    plan8 = P.ChunkPlan.for_numel(n, 8, spec)
    send = P.pack_segments(q.codes, q.scales, plan8)
    row("pack segments W=8", timer(lambda: P.pack_segments(q.codes, q.scales, plan8, out=send)), 2 * (n + 4 * nb))
    cc, ss = q.codes.clone(), q.scales.clone()
    row("scatter segments W=8", timer(lambda: P.scatter_segments(send, plan8, cc, ss)), 2 * (n + 4 * nb))
    _init_dist(device)
    plan1 = P.ChunkPlan.for_numel(n, 1, spec)
    row("QuanGrad all-reduce, 1 rank (local cost)",
        timer(lambda: QuanGradOp(cc, ss, plan1, group=None, backend=be, sharded=False).run()), 0)
    xf = torch.randn(n, device=device)
    row("NCCL fp32 all-reduce, 1 rank", timer(lambda: dist.all_reduce(xf)), 0)
    return {"numel": n, "fmt": spec.name, "block": spec.block, "backend": backend_note, "rows": out}


def protocol_check(device, be, backend_note):
    """The simulated protocol (4 ranks, 3 formats, a size that does not divide 4 x 256) through the chosen
    backend against the pure-torch reference on the same device: payloads and results bit for bit."""
    import torch

    from agoq_core.backend import get_backend
    from agoq_core.quangrad import simulate_all_reduce, simulate_reduce_scatter

    ref = get_backend("reference")
    g = torch.Generator(device="cpu").manual_seed(1)
    ts = [(torch.randn(1_000_013, generator=g) * 10.0 ** torch.randint(-4, 2, (1,), generator=g)).to(device)
          for _ in range(4)]
    out = {}
    for fmt in ("fp8_e4m3", "fp8_e5m2", "int8"):
        a, b = simulate_all_reduce(ts, fmt, backend=be), simulate_all_reduce(ts, fmt, backend=ref)
        same = all(torch.equal(x.all_to_all, y.all_to_all) and torch.equal(x.all_gather, y.all_gather)
                   for x, y in zip(a.payloads, b.payloads))
        same = same and torch.equal(a.results[0].view(torch.uint8), b.results[0].view(torch.uint8))
        ra, rb = simulate_reduce_scatter(ts, fmt, backend=be), simulate_reduce_scatter(ts, fmt, backend=ref)
        same = same and all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(ra.shards, rb.shards))
        out[fmt] = bool(same)
    return {"backend": backend_note, "bit_identical_to_reference": out}


def main(argv=None) -> dict:
    args = _parse(argv)
    import torch

    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(torch.device(device).index or 0)  # torch 2.11 needs an index
    be, note = _backend(args.backend, device)
    _init_dist(device)
    t0 = time.time()
    mem = memory_runs(args, device, be, note)
    kern = kernel_timings(args, device, be, note)
    check = protocol_check(device, be, note)
    meta = harness.environment(device, wall_s=round(time.time() - t0, 1))
    meta["device"] = meta.get("gpu") or meta["cpu"]
    res = {"meta": meta, "memory": mem, "kernels": kern, "protocol_check": check}
    _print(res)
    harness.write_json(res, args.json, "bench_quangrad_gpu")
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    return res


def _print(res):
    m, mem, k = res["meta"], res["memory"], res["kernels"]
    gib = 1 << 30
    print(f"\nGradient memory: {mem['model']} ({mem['params']:,} parameters, bf16 weights), 2 micro-batches x "
          f"{mem['seq']} tokens, {m['device']}, backend {mem['backend']}")
    print(f"{'gradients':>16} {'grad GiB':>9} {'B/param':>8} {'vs fp32':>8} {'vs bf16':>8} {'peak GiB':>9} {'bwd peak':>9}")
    rows = mem["rows"]
    for name, r in rows.items():
        print(f"{name:>16} {r['grad_bytes'] / gib:9.2f} {r['grad_bytes'] / mem['params']:8.3f} "
              f"{r['grad_bytes'] / max(1, rows['fp32_main_grads']['grad_bytes']):8.3f} "
              f"{r['grad_bytes'] / max(1, rows['bf16_grads']['grad_bytes']):8.3f} {r['peak_bytes'] / gib:9.2f} "
              f"{r['peak_backward_bytes'] / gib:9.2f}")
    if "storage_bytes_counted" in rows["quangrad"]:
        print(f"  QuanGrad buffers counted: {rows['quangrad']['storage_bytes_counted'] / gib:.3f} GiB in "
              f"{rows['quangrad']['buckets']} buckets")
    print(f"\nKernels on one GPU, bucket of {k['numel']:,} elements ({k['fmt']}, block {k['block']}), backend {k['backend']}")
    print(f"{'op':>42} {'ms':>9} {'GB/s':>9} {'% HBM':>7}")
    for name, r in k["rows"].items():
        bw = f"{r['GBps']:9.1f} {r['pct_hbm']:7.1f}" if r["bytes"] else f"{'-':>9} {'-':>7}"
        print(f"{name:>42} {r['ms']:9.3f} {bw}")
    c = res["protocol_check"]
    print(f"\nProtocol (4 simulated ranks, 1,000,013 elements) through {c['backend']}: bit-identical to the "
          f"reference: {c['bit_identical_to_reference']}")


if __name__ == "__main__":
    main()
