"""The fused SiLU&Mul kernels (agoq_cuda.fused_swiglu) on the generic tile and on the codec kernels' 16-lane tile:
time of each, the bytes they move as a share of the copy bandwidth measured in the same run, and whether both tiles
write the same bits (issue 17: LAAQ's elementwise kernels at the bandwidth limit).

    source benchmarks/gpu_env.sh && python benchmarks/bench_swiglu_tiles.py          # H200, ~30 s
    python benchmarks/bench_swiglu_tiles.py --smoke                                 # CPU, interpreter: checks the script

Shapes: llama-1b's MLP at 8K tokens ([8192, 8192], what ``agoq train --model llama-1b`` runs) and LLaMA-2-7B's at
4K ([4096, 11008]); formats int4 (agoq train's default) and nf4; bf16; the variant LAAQ keeps on the device (the first
of the backend's list). Writes ``$OUT/bench_swiglu_tiles.json`` (or ``--json``) and a table to stdout.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU through the Triton interpreter")
    ap.add_argument("--formats", nargs="+", default=["int4", "nf4"])
    ap.add_argument("--iters", type=int, default=30)
    harness.add_json_arg(ap, "bench_swiglu_tiles")
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    from agoq_core.formats.spec import get_format
    from agoq_cuda import fused_swiglu as fs

    dev = torch.device("cpu" if args.smoke else "cuda")
    shapes = [(4, 256)] if args.smoke else [(8192, 8192), (4096, 11008)]
    iters = 2 if args.smoke else args.iters

    def timed(fn) -> float:
        """Median ms: the kernel's device time on the GPU (harness.kernel_median_ms, the host's launch cost left out;
        runs before 2026-12-06 timed one call per event pair, host included); wall time in the interpreter."""
        if dev.type == "cuda":
            return harness.kernel_median_ms(fn, rep_ms=max(50, 3 * iters))
        import time

        fn()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) * 1e3 / iters

    big = torch.empty(1 << (20 if args.smoke else 28), dtype=torch.uint8, device=dev)  # 256 MiB copy
    copy_gbs = 2 * big.numel() / timed(lambda: big.clone()) / 1e6
    fwd_v, bwd_v = fs.silu_mul_quant_variants(dev)[0], fs.silu_mul_backward_variants(dev)[0]
    report = {"env": harness.environment(dev if dev.type == "cuda" else None), "copy_gbs": copy_gbs,
              "variants": {"silu_mul_quant": fwd_v, "silu_mul_backward": bwd_v}, "rows": []}
    gen = torch.Generator(device="cpu").manual_seed(0)
    for rows, cols in shapes:
        g = (torch.randn(rows, cols, generator=gen) * 2).to(torch.bfloat16).to(dev)
        u = torch.randn(rows, cols, generator=gen).to(torch.bfloat16).to(dev)
        dh = torch.randn(rows, cols, generator=gen).to(torch.bfloat16).to(dev)
        n, e = g.numel(), g.element_size()
        for fmt in args.formats:
            spec = get_format(fmt)
            code_bytes = 2 * (spec.code_bytes(n) + 4 * spec.num_blocks(n))
            outs = {}
            for tile, vec16 in (("generic", False), ("vec16", True)):
                bufs = [torch.empty(spec.code_bytes(n), dtype=torch.uint8, device=dev),
                        torch.empty(spec.num_blocks(n), device=dev),
                        torch.empty(spec.code_bytes(n), dtype=torch.uint8, device=dev),
                        torch.empty(spec.num_blocks(n), device=dev)]
                h = torch.empty_like(g)
                fwd = timed(lambda: fs.silu_mul_quant_into(g, u, spec, h, *bufs, variant=fwd_v, vec16=vec16))
                bo = [torch.empty_like(g) for _ in range(3)]
                bwd = timed(lambda: fs.silu_mul_backward_into(dh, *bufs, spec, *bo, variant=bwd_v, vec16=vec16))
                outs[tile] = [t.clone() for t in (*bufs, h, *bo)]
                for op, ms, moved in (("silu_mul_quant", fwd, 3 * n * e + code_bytes),      # g, u in; h, codes out
                                      ("silu_mul_backward", bwd, 4 * n * e + code_bytes)):  # dh, codes in; h, dg, du
                    report["rows"].append({"op": op, "shape": [rows, cols], "format": fmt, "tile": tile, "ms": ms,
                                           "pct_copy": 100 * moved / ms / 1e6 / copy_gbs})
            same = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
                       for a, b in zip(outs["generic"], outs["vec16"]))
            for r in report["rows"][-4:]:
                r["tiles_bit_identical"] = same
    lines = [f"{report['env'].get('gpu', dev)}; copy {copy_gbs:.0f} GB/s; variants {fwd_v} / {bwd_v}", "",
             "| op | shape | format | tile | ms | % copy | tiles bit-identical |", "|---|---|---|---|---:|---:|---|"]
    lines += [f"| {r['op']} | {r['shape'][0]}x{r['shape'][1]} | {r['format']} | {r['tile']} | {r['ms']:.3f} | "
              f"{r['pct_copy']:.1f} | {'yes' if r['tiles_bit_identical'] else 'NO'} |" for r in report["rows"]]
    print("\n".join(lines))
    harness.write_json(report, args.json, "bench_swiglu_tiles")
    if not all(r["tiles_bit_identical"] for r in report["rows"]):
        sys.exit(1)
    return report


if __name__ == "__main__":
    main()
