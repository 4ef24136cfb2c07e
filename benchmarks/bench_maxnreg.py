"""Register caps of the fused kernels, timed: the fused RMSNorm + quantize and the fused SiLU&Mul forward and
backward under each AGOQ_CUDA_MAXNREG setting, interleaved in one process (setting A, B, C, then A, B, C again),
with a bit-for-bit check that every setting writes the same outputs (a cap changes registers, never results).

    source benchmarks/gpu_env.sh && python benchmarks/bench_maxnreg.py          # GPU, ~60 s
    python benchmarks/bench_maxnreg.py --smoke                                  # CPU, interpreter: checks the script

Settings (``--settings``, AGOQ_CUDA_MAXNREG values; agoq_cuda.launch.parse_maxnreg): ``auto`` (the shipped table,
agoq_cuda.launch.MAXNREG), ``off`` (no cap) and candidates not yet in the table. Shapes: the norm at 16384 x 4096
(bench_codecs.py's fused-norm row), SiLU&Mul at llama-1b's 8192 x 8192 and LLaMA-2-7B's 4096 x 11008; bf16; each
op's default tile and variant. Writes ``$OUT/bench_maxnreg.json`` (or ``--json``) and a table to stdout; exits 1
if any setting changed a bit.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

CANDIDATES = "rmsnorm_quant:int6:generic=64,silu_mul_backward:nf4:vec16=64"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU through the Triton interpreter")
    ap.add_argument("--settings", nargs="+", default=["auto", "off", CANDIDATES],
                    help="AGOQ_CUDA_MAXNREG values to compare (the first is the reference of the ratios)")
    ap.add_argument("--norm-formats", nargs="*", default=["fp4_e2m1", "mxfp4", "int6", "nf4", "int4"])
    ap.add_argument("--swiglu-formats", nargs="*", default=["nf4", "int4"])
    ap.add_argument("--rounds", type=int, default=2, help="passes over the settings, interleaved")
    ap.add_argument("--iters", type=int, default=30)
    harness.add_json_arg(ap, "bench_maxnreg")
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    from agoq_core.formats.spec import get_format
    from agoq_cuda import fused_norm, fused_swiglu as fs
    from agoq_cuda.launch import parse_maxnreg

    for s in args.settings:
        parse_maxnreg(s)  # a typo fails here, before any timing
    dev = torch.device("cpu" if args.smoke else "cuda")
    iters = 2 if args.smoke else args.iters

    def timed(fn) -> float:
        """Median ms of the kernel: on the GPU Triton's do_bench (calls queued, the L2 flushed between them, so the
        host's launch cost stays out: the first version timed one call per event pair, host included, and an
        unchanged 0.2 ms kernel read 0.96 ms once); wall time in the interpreter (--smoke)."""
        if dev.type == "cuda":
            return harness.kernel_median_ms(fn, rep_ms=max(20, 2 * iters), warmup_ms=10)
        fn()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) * 1e3 / iters

    gen = torch.Generator(device="cpu").manual_seed(0)

    def randn(*shape, k=1.0):
        return (torch.randn(*shape, generator=gen) * k).to(torch.bfloat16).to(dev)

    cases = []  # (kernel, shape, format, fn() -> outputs)
    tok, hid = (8, 256) if args.smoke else (16384, 4096)
    x, w = randn(tok, hid), (1 + 0.1 * torch.randn(hid, generator=gen)).to(torch.bfloat16).to(dev)
    for fmt in args.norm_formats:
        spec = get_format(fmt)
        n = x.numel()
        if fused_norm.rmsnorm_quant_unsupported(x, w, spec):
            continue
        bufs = (torch.empty_like(x), torch.empty(spec.code_bytes(n), dtype=torch.uint8, device=dev),
                torch.empty(spec.num_blocks(n), dtype=torch.float32, device=dev))
        cases.append(("rmsnorm_quant", (tok, hid), fmt,
                      lambda spec=spec, b=bufs: (fused_norm.rmsnorm_quant_into(x, w, 1e-5, spec, *b), b)[1]))
    shapes = [(4, 256)] if args.smoke else [(8192, 8192), (4096, 11008)]
    for rows, cols in shapes:
        g, u, dh = randn(rows, cols, k=2.0), randn(rows, cols), randn(rows, cols)
        n = g.numel()
        for fmt in args.swiglu_formats:
            spec = get_format(fmt)
            codes = [torch.empty(spec.code_bytes(n), dtype=torch.uint8, device=dev),
                     torch.empty(spec.num_blocks(n), device=dev),
                     torch.empty(spec.code_bytes(n), dtype=torch.uint8, device=dev),
                     torch.empty(spec.num_blocks(n), device=dev)]
            h = torch.empty_like(g)
            fs.silu_mul_quant_into(g, u, spec, h, *codes)  # the backward decodes these
            outs = [torch.empty_like(g) for _ in range(3)]
            fwd_bufs = [torch.empty_like(c) for c in codes] + [torch.empty_like(g)]
            def fwd(spec=spec, b=fwd_bufs, g=g, u=u):
                fs.silu_mul_quant_into(g, u, spec, b[4], *b[:4])
                return b

            def bwd(spec=spec, c=codes, o=outs, dh=dh):
                fs.silu_mul_backward_into(dh, *c, spec, *o)
                return o

            cases += [("silu_mul_quant", (rows, cols), fmt, fwd), ("silu_mul_backward", (rows, cols), fmt, bwd)]

    times: dict[tuple, dict[str, list[float]]] = {}
    first: dict[tuple, list] = {}
    identical: dict[tuple, bool] = {}
    old = os.environ.get("AGOQ_CUDA_MAXNREG")
    try:
        for _ in range(args.rounds):
            for setting in args.settings:
                os.environ["AGOQ_CUDA_MAXNREG"] = setting
                for kernel, shape, fmt, fn in cases:
                    key = (kernel, shape, fmt)
                    out = [t.clone() for t in fn()]
                    if key not in first:
                        first[key] = out
                    identical[key] = identical.get(key, True) and all(
                        torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(first[key], out))
                    times.setdefault(key, {}).setdefault(setting, []).append(timed(fn))
    finally:
        if old is None:
            os.environ.pop("AGOQ_CUDA_MAXNREG", None)
        else:
            os.environ["AGOQ_CUDA_MAXNREG"] = old

    ref = args.settings[0]
    rows_out = []
    for (kernel, shape, fmt), by in times.items():
        caps = {s: parse_maxnreg(s).get((kernel, fmt, _tile(kernel, fmt))) for s in args.settings}
        med = {s: statistics.median(v) for s, v in by.items()}
        rows_out.append({"kernel": kernel, "shape": list(shape), "format": fmt, "ms": by, "median_ms": med,
                         "cap": caps, "vs_first": {s: med[ref] / med[s] for s in med},
                         "bit_identical": identical[(kernel, shape, fmt)]})
    label = {s: s if len(s) <= 8 else f"#{i}" for i, s in enumerate(args.settings)}
    head = " | ".join(f"{label[s]} ms (cap)" for s in args.settings)
    lines = ["settings: " + "; ".join(f"{label[s]} = {s!r}" for s in args.settings), "",
             f"| kernel | shape | format | {head} | best | same bits |",
             "|---|---|---|" + "---:|" * len(args.settings) + "---|---|"]
    for r in rows_out:
        cells = " | ".join(f"{r['median_ms'][s]:.4f} ({r['cap'][s] or '-'})" for s in args.settings)
        best = min(args.settings, key=lambda s: r["median_ms"][s])
        lines.append(f"| {r['kernel']} | {r['shape'][0]}x{r['shape'][1]} | {r['format']} | {cells} | {label[best]} | "
                     f"{'yes' if r['bit_identical'] else 'NO'} |")
    print("\n".join(lines))
    report = {"env": harness.environment(dev if dev.type == "cuda" else None), "settings": args.settings,
              "rounds": args.rounds, "rows": rows_out}
    harness.write_json(report, args.json, "bench_maxnreg")
    if not all(r["bit_identical"] for r in rows_out):
        sys.exit(1)
    return report


def _tile(kernel: str, fmt: str) -> bool:
    """Whether ``kernel`` on ``fmt`` runs on the 16-lane tile by default (the launcher's rules; buffer alignment
    aside), for the cap column."""
    from agoq_core.formats.spec import get_format
    from agoq_cuda.launch import fused_vec16

    return bool(fused_vec16(kernel, get_format(fmt), (), writes=True))


if __name__ == "__main__":
    main()
