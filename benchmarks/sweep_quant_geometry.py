"""The codec quantize (16-lane tile, bf16 input) over its launch: one tile per program (the default) against
persistent programs per SM, with and without the prefetch of each program's next tile (kernels.quantize_kernel's
PREFETCH), per format, 1 GiB of bf16, as % of the device-to-device copy bandwidth measured in the same run. Every
variant's codes and scales are compared with the default launch's, bit for bit. Picks agoq_cuda.launch.QUANT_PREFETCH
and QUANT_PROGRAMS_PER_SM (issue 17: every quantize >= 85% of copy on the H200).

    source benchmarks/gpu_env.sh && python benchmarks/sweep_quant_geometry.py    # H200, ~1 min
    python benchmarks/sweep_quant_geometry.py --smoke                           # CPU, interpreter: checks the script
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

FORMATS = ["fp4_e2m1", "mxfp4", "nf4", "int4", "int8"]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="a small tensor on CPU through the Triton interpreter")
    ap.add_argument("--formats", nargs="+", default=FORMATS)
    ap.add_argument("--size-mib", type=int, default=1024, help="bf16 input size (the issue's goal rows: 1 GiB)")
    ap.add_argument("--programs-per-sm", type=int, nargs="+", default=[2, 4, 8, 16],
                    help="persistent programs per SM of the non-default variants")
    ap.add_argument("--prefetch", type=int, nargs="+", choices=[0, 1], default=[0, 1])
    harness.add_json_arg(ap, "sweep_quant_geometry")
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    from agoq_core.formats.spec import get_format
    from agoq_cuda.launch import CudaGeometry
    from agoq_triton_kernels.launch import Launcher

    dev = torch.device("cpu" if args.smoke else "cuda")
    n = (1 << 14) if args.smoke else args.size_mib * (1 << 20) // 2
    sms = 1 if args.smoke else torch.cuda.get_device_properties(dev).multi_processor_count
    timed = lambda fn: harness.kernel_ms_or_run(fn, dev)  # noqa: E731
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(n, generator=gen) * 2).to(torch.bfloat16).to(dev)
    report = {"env": harness.environment(dev if dev.type == "cuda" else None), "numel": n, "rows": []}
    if dev.type == "cuda":  # the clocks ramp up first, then the ceiling of this run
        dst = torch.empty_like(x)
        t_end = time.time() + 1.0
        while time.time() < t_end:
            dst.copy_(x)
        torch.cuda.synchronize()
        t_copy = timed(lambda: dst.copy_(x))
        del dst
        report["copy_gb_s"] = copy_gbs = 2 * x.numel() * 2 / (t_copy * 1e-3) / 1e9
        print(f"copy {args.size_mib} MiB: {t_copy * 1e3:.1f} us = {copy_gbs:.0f} GB/s (read + write)", flush=True)
    else:
        copy_gbs = None
    plain = Launcher(CudaGeometry(vec16="quantize=1", quant_prefetch=False))
    pref = Launcher(CudaGeometry(vec16="quantize=1", quant_prefetch=True))
    variants = [("default", plain, None)] + [
        (f"{'prefetch' if pf else 'persistent'} {pps}/SM", pref if pf else plain, pps * sms)
        for pf in args.prefetch for pps in args.programs_per_sm]
    for fmt in args.formats:
        spec = get_format(fmt)
        codes = torch.empty(spec.code_bytes(n), dtype=torch.uint8, device=dev)
        scales = torch.empty(spec.num_blocks(n), device=dev)
        nbytes = x.numel() * 2 + codes.numel() + scales.numel() * 4
        ref = None
        for name, la, progs in variants:
            codes.zero_()
            ms = timed(lambda: la.quantize(x, spec, codes, scales, programs=progs))
            plan = la.last_plans[-1]
            got = (codes.clone(), scales.view(torch.int32).clone())
            ref = ref or got
            same = all(torch.equal(a, b) for a, b in zip(got, ref))
            pct = 100 * nbytes / (ms * 1e-3) / 1e9 / copy_gbs if ms and copy_gbs else None
            row = {"format": fmt, "variant": name, "programs": plan.programs, "rows": plan.rows,
                   "us": ms * 1e3, "pct_copy": pct, "same_bits": same}
            report["rows"].append(row)
            print(f"{fmt:9s} {name:16s} programs {plan.programs:8d}: {ms * 1e3:8.1f} us"
                  + (f"  {pct:5.1f}% of copy" if pct else "") + ("" if same else "  BITS DIFFER"), flush=True)
        del codes, scales
    harness.write_json(report, args.json, "sweep_quant_geometry")
    return report


if __name__ == "__main__":
    main()
