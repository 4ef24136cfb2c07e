"""NVFP4's tensor-scale pass (agoq_triton_kernels.kernels.absmax_kernel) over its launch geometry: rows per tile x
warps x programs, at 1 GiB of bf16, against the copy bandwidth of the same run and beside the whole NVFP4 quantize
(tensor-scale pass + encode) and the one-pass FP4 quantize. NVFP4 reads x twice by its definition (the tensor absmax
sets the fp32 scale every block scale is relative to), so its quantize is bounded by the two passes; this finds how
close the first one runs to the bandwidth. Every variant's maximum is checked against torch's.

    source benchmarks/gpu_env.sh && python benchmarks/bench_absmax.py       # one GPU, ~1-2 min
    python benchmarks/bench_absmax.py --smoke                               # CPU, interpreter: checks the script
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
    ap.add_argument("--mib", type=int, default=1024, help="input size, MiB of bf16")
    ap.add_argument("--rows", type=int, nargs="+", default=[128, 512, 1024, 2048, 4096],
                    help="16-element blocks per tile (the codec plan's is 128: 2048 elements)")
    ap.add_argument("--warps", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--programs-per-sm", type=int, nargs="+", default=[0, 4, 8, 16],
                    help="persistent programs per SM (0: one program per tile, as the codec plan launches)")
    harness.add_json_arg(ap, "bench_absmax")
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    from agoq_core.formats.spec import get_format
    from agoq_cuda.launch import LAUNCHER
    from agoq_triton_kernels import kernels as K
    from agoq_triton_kernels.buffers import float_view

    dev = torch.device("cpu" if args.smoke else "cuda")
    n = 4096 if args.smoke else args.mib * (1 << 20) // 2
    sms = 1 if args.smoke else torch.cuda.get_device_properties(dev).multi_processor_count
    rows_list = [4, 16] if args.smoke else args.rows
    warps_list = [4] if args.smoke else args.warps

    def timed(fn) -> float:
        return harness.kernel_ms_or_run(fn, dev)

    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(n, generator=gen) * 3).to(torch.bfloat16).to(dev)
    ref = x.float().abs().amax()
    spec = get_format("nvfp4")
    xv, xk = float_view(x, "bench_absmax")
    y = torch.empty_like(x)
    copy_ms = timed(lambda: y.copy_(x))
    copy_gbps = 4 * n / (copy_ms * 1e6) if copy_ms else 0.0
    report = {"env": harness.environment(dev if dev.type == "cuda" else None), "elements": n, "copy_ms": copy_ms,
              "copy_gbps": copy_gbps, "rows": []}
    if copy_ms:
        print(f"device-to-device copy of {2 * n >> 20} MiB: {copy_ms * 1e3:.1f} us = {copy_gbps:.0f} GB/s")

    def pct(ms: float, nbytes: float) -> float:
        return 100.0 * nbytes / (ms * 1e6) / copy_gbps if ms and copy_gbps else 0.0

    codes = torch.empty(spec.code_bytes(n), dtype=torch.uint8, device=dev)
    scales = torch.empty(spec.num_blocks(n), device=dev)
    fp4 = get_format("fp4_e2m1", 16)
    out_bytes = spec.code_bytes(n) + 4 * spec.num_blocks(n)
    for name, fn, nbytes in (
            ("tensor_scale (the launcher's pass)", lambda: LAUNCHER.tensor_scale(spec, x), 2 * n),
            ("quantize nvfp4 (both passes)", lambda: LAUNCHER.quantize(x, spec, codes, scales), 2 * n + out_bytes),
            ("quantize fp4_e2m1 block 16 (one pass)", lambda: LAUNCHER.quantize(x, fp4, codes, scales),
             2 * n + out_bytes)):
        ms = timed(fn)
        print(f"{name:40s} {ms * 1e3:9.1f} us  {pct(ms, nbytes):5.1f}% of copy")
        report["rows"].append({"what": name, "ms": ms, "pct_copy": pct(ms, nbytes)})

    nb = spec.num_blocks(n)
    for rows in rows_list:
        tiles = -(-nb // rows)
        for warps in warps_list:
            for pps in ([0, 2] if args.smoke else args.programs_per_sm):  # smoke: one SM, 2 programs: the loop
                grid = tiles if pps == 0 else min(tiles, pps * sms)
                part = torch.empty(grid, dtype=torch.float32, device=dev)
                opts = {} if dev.type == "cpu" else {"num_warps": warps}

                def run(grid=grid, part=part, rows=rows, tiles=tiles, opts=opts):
                    K.absmax_kernel[(grid,)](xv, part, n, nb, tiles, BLOCK=16, BLOCK_P=16, ROWS=rows, RAGGED=False,
                                             X_FLOAT=xk, **opts)
                run()
                ok = bool(torch.equal(part.amax(), ref))
                ms = timed(run)
                print(f"absmax rows {rows:5d} ({rows * 16:6d} elements) warps {warps:2d} programs {grid:8d}: "
                      f"{ms * 1e3:8.1f} us  {pct(ms, 2 * n):5.1f}% of copy  max exact {ok}")
                report["rows"].append({"what": "absmax", "rows": rows, "warps": warps, "programs": grid,
                                       "programs_per_sm": pps, "ms": ms, "pct_copy": pct(ms, 2 * n), "exact": ok})
                if not ok:
                    raise SystemExit(f"absmax rows {rows} warps {warps} programs {grid}: wrong maximum")
    harness.write_json(report, args.json, "bench_absmax")
    return report


if __name__ == "__main__":
    main()
