"""CPU codecs: the agoq-cpu backend (torch.compile, Inductor C++) against the reference, same process.

    python benchmarks/bench_codecs_cpu.py                 # 64 MiB of fp32 per tensor, every format
    python benchmarks/bench_codecs_cpu.py --smoke         # 1 MiB, two formats: a quick check that it runs

Per format: quantize (fp32 -> codes + scales) and dequantize (-> fp32); for the gradient formats also
accumulate (QuanGrad: 8-bit buffer += fp32 gradient, in place) and reduce_requantize (W = 4 chunks).
Time = median of ``--reps`` calls after one warm-up call (which compiles; its time is reported
separately). Bandwidth = (bytes read + bytes written) / time, also as % of a same-size ``copy_`` measured
in the same run. Every output is compared bit for bit with the reference's ("exact"). Prints a
Markdown table and writes JSON (``--json``, default ``$OUT/bench_codecs_cpu.json`` if ``$OUT`` is set).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import time

GRAD_FORMATS = ("fp8_e4m3", "fp8_e5m2", "int8")
WORLD = 4


def _parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="1 MiB, int4 and fp8_e4m3 only")
    ap.add_argument("--size-mib", type=int, default=64, help="fp32 input size in MiB (default 64)")
    ap.add_argument("--formats", nargs="*", help="formats (default: all)")
    ap.add_argument("--reps", type=int, default=5, help="timed calls per cell (median; default 5)")
    ap.add_argument("--ref-reps", type=int, default=3, help="timed reference calls (default 3)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    ap.add_argument("--json", help="write the JSON here")
    return ap.parse_args(argv)


def _median_s(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _same(a, b) -> bool:
    import torch

    if a.dtype.is_floating_point:
        na, nb = a.isnan(), b.isnan()
        return bool(torch.equal(na, nb) and torch.equal(a[~na], b[~nb]))
    return bool(torch.equal(a, b))


def main(argv=None) -> dict:
    args = _parse(argv)
    import torch

    from agoq_core.backend.reference import ReferenceBackend
    from agoq_core.formats import reference as ref
    from agoq_core.formats.spec import get_format, list_formats
    from agoq_cpu.backend import CpuBackend

    if args.threads:
        torch.set_num_threads(args.threads)
    mib = 1 if args.smoke else args.size_mib
    fmts = args.formats or (["int4", "fp8_e4m3"] if args.smoke else [s.name for s in list_formats()])
    n = mib * (1 << 20) // 4
    cpu, refb = CpuBackend(), ReferenceBackend()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, generator=gen)

    dst = torch.empty_like(x)
    t_copy = _median_s(lambda: dst.copy_(x), max(args.reps, 5))
    copy_gbs = 2 * 4 * n / t_copy / 1e9
    del dst
    rows: list[dict] = []

    def record(op, fmt, nbytes, run_cpu, run_ref, check):
        n_compiled = len(cpu.compiler.compiled)
        t0 = time.perf_counter()
        run_cpu()  # warm-up: compiles the variant on first use
        first = time.perf_counter() - t0
        compile_s = sum(s for _, s in cpu.compiler.compiled[n_compiled:]) if len(cpu.compiler.compiled) > n_compiled else 0.0
        exact = check()
        t_cpu = _median_s(run_cpu, args.reps)
        t_ref = _median_s(run_ref, args.ref_reps)
        row = {"op": op, "fmt": fmt, "size_mib": mib, "bytes": nbytes, "cpu_ms": t_cpu * 1e3, "ref_ms": t_ref * 1e3,
               "speedup": t_ref / t_cpu, "gb_s": nbytes / t_cpu / 1e9, "pct_copy": 100 * nbytes / t_cpu / 1e9 / copy_gbs,
               "compile_s": compile_s, "first_call_s": first, "exact": exact}
        rows.append(row)
        print(f"{op:18s} {fmt:9s} cpu {t_cpu * 1e3:8.1f} ms  ref {t_ref * 1e3:8.1f} ms  x{t_ref / t_cpu:5.1f}  "
              f"{row['gb_s']:5.1f} GB/s ({row['pct_copy']:.0f}% of copy)  compile {compile_s:.1f} s  exact={exact}",
              flush=True)

    for fmt in fmts:
        spec = get_format(fmt)
        cb, nb = spec.code_bytes(n), spec.num_blocks(n)
        codes = torch.empty(cb, dtype=torch.uint8)
        scales = torch.empty(nb, dtype=torch.float32)
        rc = torch.empty_like(codes)
        rs = torch.empty_like(scales)
        record("quantize", fmt, 4 * n + cb + 4 * nb,
               lambda: cpu.quantize_into(x, spec, codes, scales), lambda: refb.quantize_into(x, spec, rc, rs),
               lambda: (refb.quantize_into(x, spec, rc, rs), _same(codes, rc) and _same(scales, rs))[1])
        out = torch.empty(n, dtype=torch.float32)
        rout = torch.empty_like(out)
        record("dequantize", fmt, cb + 4 * nb + 4 * n,
               lambda: cpu.dequantize_into(codes, scales, spec, out), lambda: refb.dequantize_into(codes, scales, spec, rout),
               lambda: (refb.dequantize_into(codes, scales, spec, rout), _same(out, rout))[1])
        del out, rout
        if fmt in GRAD_FORMATS:
            g = torch.randn(n, generator=gen) * 1e-2
            c0, s0 = codes.clone(), scales.clone()
            c1, s1 = codes.clone(), scales.clone()

            def check_acc():
                a, b = c0.clone(), s0.clone()
                cpu.accumulate_(a, b, spec, g)
                wc, ws = ref.accumulate(c0, s0, spec, n, g)
                return _same(a, wc) and _same(b, ws)

            # the buffer drifts from call to call; the work per call does not
            record("accumulate", fmt, 2 * (cb + 4 * nb) + 4 * n,
                   lambda: cpu.accumulate_(c1, s1, spec, g), lambda: ref.accumulate(c0, s0, spec, n, g), check_acc)
            del g, c0, s0, c1, s1
            nc = n // WORLD // spec.block * spec.block
            parts = [ref.quantize_blocks(torch.randn(nc, generator=gen), spec) for _ in range(WORLD)]
            cin, sin = torch.stack([c for c, _ in parts]), torch.stack([s for _, s in parts])
            cout = torch.empty(spec.code_bytes(nc), dtype=torch.uint8)
            sout = torch.empty(spec.num_blocks(nc), dtype=torch.float32)
            record("reduce_requantize", fmt, (WORLD + 1) * (spec.code_bytes(nc) + 4 * spec.num_blocks(nc)),
                   lambda: cpu.reduce_requantize_into(cin, sin, spec, nc, cout, sout),
                   lambda: ref.reduce_requantize(cin, sin, spec, nc),
                   lambda: (lambda w: _same(cout, w[0]) and _same(sout, w[1]))(ref.reduce_requantize(cin, sin, spec, nc)))
            del cin, sin, cout, sout
        del codes, scales, rc, rs

    env = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "machine": platform.machine(),
           "processor": platform.processor(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
           "torch": torch.__version__, "python": platform.python_version(), "loadavg": os.getloadavg(),
           "copy_gb_s": copy_gbs, "codec_mode": cpu.compiler.reason, "compile_s_total": cpu.compiler.compile_seconds}
    print(f"\n{mib} MiB fp32 inputs; copy_ {copy_gbs:.1f} GB/s; {env['torch_threads']} torch threads; "
          f"load average {env['loadavg'][0]:.1f}; {env['codec_mode']}")
    print("| op | format | cpu ms | reference ms | speed-up | GB/s (% of copy) | compile s | exact |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['op']} | {r['fmt']} | {r['cpu_ms']:.1f} | {r['ref_ms']:.1f} | {r['speedup']:.1f}x | "
              f"{r['gb_s']:.2f} ({r['pct_copy']:.0f}%) | {r['compile_s']:.1f} | {'yes' if r['exact'] else 'NO'} |")
    result = {"env": env, "rows": rows}
    path = args.json or (os.path.join(os.environ["OUT"], "bench_codecs_cpu.json") if os.environ.get("OUT") else None)
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {path}")
    if not all(r["exact"] for r in rows):
        raise SystemExit("some cpu codec outputs differ from the reference (see 'exact')")
    return result


if __name__ == "__main__":
    main()
