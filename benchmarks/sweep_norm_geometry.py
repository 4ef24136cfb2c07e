"""The fused RMSNorm + quantize (agoq_cuda.fused_norm) over its launch geometry: warps per program x persistent
programs x tile, per format, at LLaMA-2-7B's norm shape (16384 x 4096 bf16, what bench_codecs' norm row times),
against the compiled norm + codec pair of the same run. Picks the geometry defaults (issue 17: fused norm >= 1.3x
the pair).

    source benchmarks/gpu_env.sh && python benchmarks/sweep_norm_geometry.py      # H200, ~1-2 min
    python benchmarks/sweep_norm_geometry.py --smoke                             # CPU, interpreter: checks the script
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
    ap.add_argument("--formats", nargs="+", default=["int4", "nf4", "fp4_e2m1", "mxfp4"])
    ap.add_argument("--warps", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--programs-per-sm", type=int, nargs="+", default=[4, 8, 16, 0],
                    help="persistent programs per SM (0: one program per row)")
    ap.add_argument("--tiles", nargs="+", choices=["generic", "vec16"], default=["generic", "vec16"])
    ap.add_argument("--prefetch", type=int, nargs="+", choices=[0, 1], default=[0],
                    help="1: each program loads its next row before this row's work (fused_norm's prefetch)")
    ap.add_argument("--maxnreg", nargs="+", default=["auto"],
                    help="AGOQ_CUDA_MAXNREG settings to run under (agoq_cuda.launch.parse_maxnreg)")
    harness.add_json_arg(ap, "sweep_norm_geometry")
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    from agoq_core.formats.spec import get_format
    from agoq_cuda.fused_norm import rmsnorm_quant_into
    from agoq_cuda.launch import LAUNCHER

    dev = torch.device("cpu" if args.smoke else "cuda")
    m, h = (4, 256) if args.smoke else (16384, 4096)
    sms = 1 if args.smoke else torch.cuda.get_device_properties(dev).multi_processor_count
    warps = [None] if args.smoke else args.warps

    def timed(fn) -> float:  # device time, the host's launch cost left out (one event pair per call until 2026-12-06)
        return harness.kernel_ms_or_run(fn, dev)

    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(m, h, generator=gen) * 2).to(torch.bfloat16).to(dev)
    w = (1 + 0.1 * torch.randn(h, generator=gen)).to(torch.bfloat16).to(dev)
    report = {"env": harness.environment(dev if dev.type == "cuda" else None), "shape": [m, h], "rows": [],
              "pair_ms": {}}
    for fmt in args.formats:
        spec = get_format(fmt)
        codes = torch.empty(spec.code_bytes(x.numel()), dtype=torch.uint8, device=dev)
        scales = torch.empty(spec.num_blocks(x.numel()), device=dev)

        def norm(t):
            tf = t.float()
            return w * (tf * torch.rsqrt(tf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(t.dtype)

        cnorm = norm if args.smoke else torch.compile(norm)

        def pair():
            cnorm(x)
            LAUNCHER.quantize(x.reshape(-1), spec, codes, scales)

        pair_ms = report["pair_ms"][fmt] = timed(pair)
        refs = {}  # y per tile and warps: "tree" sums y's squares in the layout's order, so y may differ across them
        combos = [(vec16, pf, cap, wp, pps) for vec16 in [t == "vec16" for t in args.tiles]
                  for pf in args.prefetch for cap in args.maxnreg for wp in warps for pps in args.programs_per_sm]
        for vec16, pf, cap, wp, pps in combos:
            progs = m if pps == 0 else min(m, pps * sms)
            y = torch.empty_like(x)
            os.environ["AGOQ_CUDA_MAXNREG"] = cap  # read per launch (agoq_cuda.launch.fused_maxnreg)
            ms = timed(lambda: rmsnorm_quant_into(x, w, 1e-5, spec, y, codes, scales, programs=progs,
                                                  vec16=vec16, warps=wp, prefetch=bool(pf)))
            got = (codes.clone(), scales.clone(), y.clone())
            ref = refs.setdefault((vec16, wp), got)  # codes and scales: every combination alike
            same = all(torch.equal(a, b) for a, b in zip(got, ref)) and all(
                torch.equal(a, b) for a, b in zip(got[:2], next(iter(refs.values()))[:2]))
            row = {"format": fmt, "tile": "vec16" if vec16 else "generic", "prefetch": pf, "maxnreg": cap,
                   "warps": wp, "programs": progs, "us": ms * 1e3,
                   "x_vs_compiled_pair": pair_ms / ms if ms else None, "same_bits": same}
            report["rows"].append(row)
            print(f"{fmt:9s} {row['tile']:7s} prefetch {pf} maxnreg {cap:8s} warps {wp} programs {progs:6d}: "
                  f"{ms * 1e3:7.1f} us"
                  + (f"  x{pair_ms / ms:.2f} vs compiled pair ({pair_ms * 1e3:.1f} us)" if ms else "")
                  + ("" if same else "  BITS DIFFER"), flush=True)
        os.environ.pop("AGOQ_CUDA_MAXNREG", None)
    harness.write_json(report, args.json, "sweep_norm_geometry")
    return report


if __name__ == "__main__":
    main()
