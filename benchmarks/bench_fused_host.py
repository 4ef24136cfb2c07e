"""Host time of the fused LAAQ launchers (agoq_cuda.fused_norm / fused_swiglu) per call, the kernel launch left out:
the Python a training step pays per fused call on top of the kernel (checks, views, launch arguments).

    python benchmarks/bench_fused_host.py            # CPU, ~15 s; any machine

The launch itself is replaced by a no-op (``Launcher.launch``), so what is timed is the launcher's own work on
CPU tensors under ``TRITON_INTERPRET=1``; on a GPU the real launch adds its own cost (the fast path's ~10 us,
docs/backends/cuda.md). Best of ``--repeats`` loops of ``--calls`` calls each, per launcher. Writes
``$OUT/bench_fused_host.json`` (or ``--json``) and a table to stdout.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", default="nf4")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    harness.add_json_arg(ap, "bench_fused_host")
    args = ap.parse_args(argv)
    os.environ["TRITON_INTERPRET"] = "1"  # CPU tensors; nothing is launched
    import torch

    from agoq_core.formats.spec import get_format
    from agoq_cuda import fused_norm, fused_swiglu as fs
    from agoq_triton_kernels.launch import Launcher

    spec = get_format(args.format)
    x, w = torch.randn(64, 2048, dtype=torch.bfloat16), torch.ones(2048, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    nb = [torch.empty(spec.code_bytes(x.numel()), dtype=torch.uint8), torch.empty(spec.num_blocks(x.numel()))]
    g = torch.randn(64, 8192, dtype=torch.bfloat16)
    u, h = torch.randn_like(g), torch.empty_like(g)
    n = g.numel()
    sb = [torch.empty(spec.code_bytes(n), dtype=torch.uint8), torch.empty(spec.num_blocks(n)),
          torch.empty(spec.code_bytes(n), dtype=torch.uint8), torch.empty(spec.num_blocks(n))]
    outs = [torch.empty_like(g) for _ in range(3)]
    calls = {"rmsnorm_quant_into": lambda: fused_norm.rmsnorm_quant_into(x, w, 1e-5, spec, y, *nb),
             "silu_mul_quant_into": lambda: fs.silu_mul_quant_into(g, u, spec, h, *sb),
             "silu_mul_backward_into": lambda: fs.silu_mul_backward_into(g, *sb, spec, *outs)}
    launched = [0]
    real = Launcher.launch
    Launcher.launch = lambda self, *a, **k: launched.__setitem__(0, launched[0] + 1)
    rows = []
    try:
        for name, fn in calls.items():
            fn()
            best = float("inf")
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    fn()
                best = min(best, (time.perf_counter() - t0) / args.calls)
            rows.append({"launcher": name, "format": args.format, "us_per_call": best * 1e6})
    finally:
        Launcher.launch = real
    expected = len(calls) * (1 + args.repeats * args.calls)
    if launched[0] != expected:  # every call reached the launch: nothing was refused or skipped on the way
        raise SystemExit(f"bench_fused_host: {launched[0]} launches for {expected} calls")
    print("| launcher | format | host us per call (launch stubbed) |\n|---|---|---:|")
    for r in rows:
        print(f"| {r['launcher']} | {r['format']} | {r['us_per_call']:.2f} |")
    report = {"env": harness.environment(), "rows": rows, "calls": args.calls, "repeats": args.repeats}
    harness.write_json(report, args.json, "bench_fused_host")
    return report


if __name__ == "__main__":
    main()
