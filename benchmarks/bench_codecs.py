"""Codec kernels against the memory-bandwidth limit and against what a user would otherwise run.

One command on the lent H200 (a few minutes, about half of it torch.compile):

    PYTHONPATH=.:backends/triton_common:backends/cuda python benchmarks/bench_codecs.py

(issue 17, < 5 minutes: ``--sizes-mib 1024 --no-sweep --deadline-s 270``; every format incl. mxfp4, mxfp8,
nvfp4, torch.compile of the reference at the same size (int4, int6, nf4, fp4_e2m1, fp8_e4m3, int8, mxfp4, nvfp4
in that order, until the deadline), QuanGrad's kernels on a 2**25-element bucket (device time from a CUDA
graph, and the time of one eager call with its host overhead), and the fused RMSNorm+quantize rows at 16K
tokens x 4096 against HF's RMSNorm (eager and compiled) + the codec kernel.) Writes ``$OUT/bench_codecs.md``
too.

prints a table and writes ``$OUT/bench_codecs.json`` (or ``--json PATH``). ``--tiny`` runs the same code
paths on tiny tensors through Triton's interpreter on CPU (timings meaningless; a smoke test).

Per format and tensor size (64 MiB, 256 MiB, 1 GiB of bf16, i.e. 32M..512M elements):
* quantize (bf16 -> codes + fp32 scales) and dequantize (-> bf16) of the agoq-cuda Triton kernels;
* accumulate (QuanGrad: 8-bit buffer += bf16 gradient, in place) and reduce_requantize (sum of W = 4
  ranks' chunks, requantized) for the gradient formats.
Bandwidth = (bytes read + bytes written, each counted once) / median time (``triton.testing.do_bench``,
L2 flushed between runs), shown as % of the device-to-device copy bandwidth measured in the same run.
Baselines: the reference backend (pure torch, the oracle) on the same GPU, eager and under
``torch.compile`` (what a user would write instead); the compiled baseline is measured at one size for a
few formats (compiling every graph would take the whole run). Every kernel output is compared bit for bit
with the eager reference output on the GPU ("exact").
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the shared harness beside this script
import harness  # noqa: E402

SIZES_MIB = (64, 256, 1024)
GRAD_FORMATS = ("fp8_e4m3", "fp8_e5m2", "int8", "mxfp8")
WORLD = 4


def _parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", "--smoke", dest="tiny", action="store_true",
                    help="CPU smoke test through Triton's interpreter")
    ap.add_argument("--sizes-mib", type=int, nargs="*", help=f"bf16 tensor sizes in MiB (default {SIZES_MIB})")
    ap.add_argument("--formats", nargs="*", help="formats (default: all)")
    ap.add_argument("--compile-formats", nargs="*",
                    default=["int4", "int6", "nf4", "fp4_e2m1", "fp8_e4m3", "int8", "mxfp4", "nvfp4"],
                    help="formats whose reference is also timed under torch.compile, in this order until the deadline "
                         "(default int4 int6 nf4 fp4_e2m1 fp8_e4m3 int8 mxfp4 nvfp4)")
    ap.add_argument("--norm-tokens", type=int, default=16384,
                    help="tokens of the fused RMSNorm+quantize rows (hidden 4096, LLaMA-2-7B); 0 skips them")
    ap.add_argument("--compile-size-mib", type=int, default=None,
                    help="size of the torch.compile rows (default: the largest --sizes-mib, so they sit in the table)")
    ap.add_argument("--bucket-log2", type=int, default=25,
                    help="QuanGrad bucket of 2**N elements (0 skips the section; --tiny uses 2**14)")
    ap.add_argument("--no-sweep", action="store_true", help="skip the launch-geometry sweep")
    ap.add_argument("--dequant-tiles", choices=("default", "both"), default="default",
                    help="both: also time dequantize with the 16-lane tile forced off and on (AGOQ_CUDA_VEC16 "
                         "rules dequantize=0 / dequantize=1), rows 'dequantize vec16=0|1', to pick the per-format "
                         "defaults (agoq_cuda.launch.VEC16_DEFAULTS) from one run")
    ap.add_argument("--deadline-s", type=float, default=330.0,
                    help="stop starting new measurements after this many seconds (rows left are marked)")
    harness.add_json_arg(ap, "bench_codecs")
    return ap.parse_args(argv)


def main(argv=None) -> dict:
    args = _parse(argv)
    if args.tiny:
        os.environ["TRITON_INTERPRET"] = "1"  # before any @triton.jit decorator runs
    import torch
    import triton
    import triton.testing

    from agoq_core.formats import reference as ref
    from agoq_core.formats.spec import get_format, list_formats
    from agoq_cuda import launch

    t_start = time.time()
    dev = torch.device("cpu" if args.tiny else "cuda")
    sizes = args.sizes_mib or ([1] if args.tiny else list(SIZES_MIB))
    fmts = args.formats or [s.name for s in list_formats(microscaling=True)]
    scale_div = 1024 if args.tiny else 1  # --tiny: "MiB" means KiB

    def over_deadline() -> bool:
        return time.time() - t_start > args.deadline_s

    def bench(fn) -> float:
        if args.tiny:
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")

    def same(a, b) -> bool:
        if a.dtype.is_floating_point:
            iv = {4: torch.int32, 2: torch.int16}[a.element_size()]
            na, nb = torch.isnan(a), torch.isnan(b)
            return bool(torch.equal(na, nb) and torch.equal(a.view(iv)[~na], b.view(iv)[~nb]))
        return bool(torch.equal(a, b))

    gen = torch.Generator(device=dev).manual_seed(0)

    def randn(n, dtype=torch.bfloat16):
        return torch.randn(n, generator=gen, device=dev, dtype=torch.float32).to(dtype)

    # ---- the ceiling: device-to-device copy of the largest size -------------------------------------------
    n_copy = max(sizes) * (1 << 20) // 2 // scale_div
    src = randn(n_copy)
    dst = torch.empty_like(src)
    if not args.tiny:
        # ~1 s of copies first: the 2026-11-29 runs measured the first (64 MiB) rows while the clocks were
        # still ramping up (a 64 MiB int8 dequantize at 39% of copy bandwidth vs 92% at 256 MiB)
        t_end = time.time() + 1.0
        while time.time() < t_end:
            dst.copy_(src)
        torch.cuda.synchronize()
    t_copy = bench(lambda: dst.copy_(src))
    copy_gbs = 2 * src.numel() * 2 / (t_copy * 1e-3) / 1e9
    del src, dst
    print(f"device-to-device copy of {max(sizes)} MiB: {t_copy * 1e3:.1f} us = {copy_gbs:.0f} GB/s (read + write)")

    rows: list[dict] = []

    def record(op, fmt, mib, nbytes, kernel_ms, eager_ms, exact, **extra):
        gbs = nbytes / (kernel_ms * 1e-3) / 1e9
        row = {"op": op, "fmt": fmt, "size_mib": mib, "bytes": nbytes, "kernel_us": kernel_ms * 1e3, "gb_s": gbs,
               "pct_copy": 100 * gbs / copy_gbs, "eager_us": None if eager_ms is None else eager_ms * 1e3,
               "speedup_vs_eager": None if eager_ms is None else eager_ms / kernel_ms, "compile_us": None,
               "speedup_vs_compile": None, "exact": exact, **extra}
        rows.append(row)
        return row

    skipped: list[str] = []
    errors: list[str] = []

    def guarded(what, fn):
        # one failing kernel must not cost the rest of a GPU run: record it and go on
        try:
            fn()
        except Exception as exc:  # noqa: BLE001
            errors.append(f"{what}: {type(exc).__name__}: {str(exc)[:300]}")
            print(f"ERROR {errors[-1]}", flush=True)
    # ---- quantize / dequantize ----------------------------------------------------------------------------
    tiles = ("0", "1") if args.dequant_tiles == "both" else ()
    if tiles:
        from agoq_cuda.launch import CudaGeometry
        from agoq_triton_kernels.launch import Launcher

        tile_launchers = {v: Launcher(CudaGeometry(vec16=f"dequantize={v}")) for v in tiles}
    for mib in sizes:
        n = mib * (1 << 20) // 2 // scale_div
        x = randn(n)
        for fmt in fmts:
            if over_deadline():
                skipped.append(f"quantize/dequantize {fmt} {mib} MiB")
                continue

            def qd(fmt=fmt, n=n, mib=mib, x=x):
                spec = get_format(fmt)
                cb, nb = spec.code_bytes(n), spec.num_blocks(n)
                codes = torch.empty(cb, dtype=torch.uint8, device=dev)
                scales = torch.empty(nb, dtype=torch.float32, device=dev)
                tk = bench(lambda: launch.quantize(x, spec, codes, scales))
                rc, rs = ref.quantize_blocks(x, spec)
                exact = same(codes, rc) and same(scales, rs)
                te = bench(lambda: ref.quantize_blocks(x, spec))
                del rc, rs
                record("quantize", fmt, mib, 2 * n + cb + 4 * nb, tk, te, exact)
                out = torch.empty(n, dtype=torch.bfloat16, device=dev)
                tk = bench(lambda: launch.dequantize(codes, scales, spec, out))
                exact = same(out, ref.dequantize_blocks(codes, scales, spec, n, torch.bfloat16))
                te = bench(lambda: ref.dequantize_blocks(codes, scales, spec, n, torch.bfloat16))
                record("dequantize", fmt, mib, cb + 4 * nb + 2 * n, tk, te, exact)
                for v in tiles:  # --dequant-tiles both: the same dequantize with each tile, in this run
                    la = tile_launchers[v]
                    tk = bench(lambda la=la: la.dequantize(codes, scales, spec, out))
                    exact = same(out, ref.dequantize_blocks(codes, scales, spec, n, torch.bfloat16))
                    applies = spec.block >= 16 and spec.block & (spec.block - 1) == 0
                    record(f"dequantize vec16={v}", fmt, mib, cb + 4 * nb + 2 * n, tk, te, exact,
                           vec16_applies=applies)
                del out, codes, scales

            guarded(f"quantize/dequantize {fmt} {mib} MiB", qd)
        del x

    # ---- QuanGrad: accumulate (in place) and the reduce step of the all-reduce -----------------------------
    for mib in sizes:
        n = mib * (1 << 20) // 2 // scale_div
        for fmt in [f for f in GRAD_FORMATS if f in fmts]:
            if over_deadline():
                skipped.append(f"accumulate/reduce {fmt} {mib} MiB")
                continue

            def ar(fmt=fmt, n=n, mib=mib):
                spec = get_format(fmt)
                cb, nb = spec.code_bytes(n), spec.num_blocks(n)
                g = randn(n) * 1e-3
                codes0, scales0 = ref.quantize_blocks(randn(n) * 1e-2, spec)
                codes, scales = codes0.clone(), scales0.clone()
                launch.accumulate(codes, scales, spec, g)
                wc, ws = ref.accumulate(codes0, scales0, spec, n, g)
                exact = same(codes, wc) and same(scales, ws)
                del wc, ws
                tk = bench(lambda: launch.accumulate(codes, scales, spec, g))  # state drifts; the work does not
                te = bench(lambda: ref.accumulate(codes0, scales0, spec, n, g))
                record("accumulate", fmt, mib, 2 * (cb + 4 * nb) + 2 * n, tk, te, exact)
                del codes, scales, codes0, scales0, g
                # each rank reduces 1/W of the buffer, receiving that chunk from all W ranks
                nc = n // WORLD // spec.block * spec.block
                ccb, cnb = spec.code_bytes(nc), spec.num_blocks(nc)
                parts = [ref.quantize_blocks(randn(nc) * 1e-3, spec) for _ in range(WORLD)]
                cin = torch.stack([c for c, _ in parts])
                sin = torch.stack([s for _, s in parts])
                del parts
                cout = torch.empty(ccb, dtype=torch.uint8, device=dev)
                sout = torch.empty(cnb, dtype=torch.float32, device=dev)
                tk = bench(lambda: launch.reduce_requantize(cin, sin, spec, nc, cout, sout))
                wc, ws = ref.reduce_requantize(cin, sin, spec, nc)
                exact = same(cout, wc) and same(sout, ws)
                te = bench(lambda: ref.reduce_requantize(cin, sin, spec, nc))
                record("reduce_requantize", fmt, mib, (WORLD + 1) * (ccb + 4 * cnb), tk, te, exact, world=WORLD)
                del cin, sin, cout, sout, wc, ws

            guarded(f"accumulate/reduce {fmt} {mib} MiB", ar)

    # ---- QuanGrad's kernels on one bucket (2**25 elements: the size QuanGrad's buckets have) -------------
    # Device time from a CUDA graph of the launcher call (what the kernel costs in a captured or well-queued
    # step), and the time of one eager call between two events (what a Python caller waiting on it sees: host
    # launch overhead included). Bits checked against the reference on the same GPU.
    bucket: list[dict] = []
    if args.bucket_log2:
        nbk = 1 << (14 if args.tiny else args.bucket_log2)

        def graph_time(fn) -> float:
            if args.tiny:
                return bench(fn)
            return triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median")

        def call_time(fn, reps=30) -> float:
            if args.tiny:
                return bench(fn)
            return harness.cuda_median_ms(fn, reps)

        for fmt in [f for f in GRAD_FORMATS if f in fmts]:
            if over_deadline():
                skipped.append(f"bucket {fmt}")
                continue

            def bk(fmt=fmt):
                spec = get_format(fmt)
                n = nbk
                cb, nb = spec.code_bytes(n), spec.num_blocks(n)
                g = randn(n) * 1e-3
                codes = torch.empty(cb, dtype=torch.uint8, device=dev)
                scales = torch.empty(nb, dtype=torch.float32, device=dev)

                def row(op, fn, nbytes, exact, **extra):
                    tg, tc = graph_time(fn), call_time(fn)
                    gbs = nbytes / (tg * 1e-3) / 1e9
                    bucket.append({"op": op, "fmt": fmt, "numel": n, "bytes": nbytes, "graph_us": tg * 1e3,
                                   "graph_gb_s": gbs, "graph_pct_copy": 100 * gbs / copy_gbs, "call_us": tc * 1e3,
                                   "call_pct_copy": 100 * nbytes / (tc * 1e-3) / 1e9 / copy_gbs, "exact": exact,
                                   **extra})

                launch.quantize(g, spec, codes, scales)
                rc, rs = ref.quantize_blocks(g, spec)
                row("quantize", lambda: launch.quantize(g, spec, codes, scales), 2 * n + cb + 4 * nb,
                    same(codes, rc) and same(scales, rs))
                c0, s0 = rc.clone(), rs.clone()
                ca, sa = c0.clone(), s0.clone()
                launch.accumulate(ca, sa, spec, g)
                wc, ws = ref.accumulate(c0, s0, spec, n, g)
                exact = same(ca, wc) and same(sa, ws)
                row("accumulate", lambda: launch.accumulate(ca, sa, spec, g), 2 * (cb + 4 * nb) + 2 * n, exact)
                for w in (4, 8):
                    nc = n // w // spec.block * spec.block
                    ccb, cnb = spec.code_bytes(nc), spec.num_blocks(nc)
                    cin = c0[: w * ccb].view(w, ccb)
                    sin = s0[: w * cnb].view(w, cnb)
                    cout = torch.empty(ccb, dtype=torch.uint8, device=dev)
                    sout = torch.empty(cnb, dtype=torch.float32, device=dev)
                    launch.reduce_requantize(cin, sin, spec, nc, cout, sout)
                    wc, ws = ref.reduce_requantize(cin, sin, spec, nc)
                    row(f"reduce_requantize W={w}", lambda: launch.reduce_requantize(cin, sin, spec, nc, cout, sout),
                        (w + 1) * (ccb + 4 * cnb), same(cout, wc) and same(sout, ws), world=w)

            guarded(f"bucket {fmt}", bk)

    # ---- torch.compile of the reference (one size, a few formats; compiling is slow) ----------------------
    compile_info: list[dict] = []
    cmib = (args.compile_size_mib or max(sizes)) if not args.tiny else sizes[0]
    for fmt in args.compile_formats or []:
        if fmt not in fmts:
            continue
        spec = get_format(fmt)
        n = cmib * (1 << 20) // 2 // scale_div
        x = randn(n)
        ops = [("quantize", lambda x=x, spec=spec: ref.quantize_blocks(x, spec))]
        cq, sq = ref.quantize_blocks(x, spec)
        ops.append(("dequantize", lambda cq=cq, sq=sq, spec=spec, n=n: ref.dequantize_blocks(cq, sq, spec, n,
                                                                                             torch.bfloat16)))
        if fmt in GRAD_FORMATS:
            g = randn(n) * 1e-3
            ops.append(("accumulate", lambda cq=cq, sq=sq, spec=spec, n=n, g=g: ref.accumulate(cq, sq, spec, n, g)))
        for op, fn in ops:
            if over_deadline():
                skipped.append(f"torch.compile {op} {fmt}")
                continue

            def comp(op=op, fn=fn, fmt=fmt):
                torch._dynamo.reset()
                cfn = torch.compile(fn, dynamic=False)
                t0 = time.time()
                got = cfn()
                compile_s = time.time() - t0
                want = fn()
                got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
                c_exact = all(same(a, b) for a, b in zip(got, want))
                tc = bench(cfn)
                compile_info.append({"op": op, "fmt": fmt, "size_mib": cmib, "compile_s": compile_s,
                                     "compiled_us": tc * 1e3, "compiled_matches_eager": c_exact})
                for r in rows:
                    if r["op"] == op and r["fmt"] == fmt and r["size_mib"] == cmib:
                        r["compile_us"] = tc * 1e3
                        r["speedup_vs_compile"] = tc / (r["kernel_us"] * 1e-3)
                del got, want

            guarded(f"torch.compile {op} {fmt}", comp)
        del x

    # ---- fused RMSNorm + quantize-its-input vs the unfused pair (LLaMA-2-7B hidden 4096) --------------------
    fused: list[dict] = []
    if args.norm_tokens:
        from agoq_cuda.fused_norm import rmsnorm_quant_into
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        hid = 4096 if not args.tiny else 256
        tok = args.norm_tokens if not args.tiny else 8
        xn = randn(tok * hid).view(tok, hid)
        norm = LlamaRMSNorm(hid, eps=1e-5).to(dev, torch.bfloat16)
        with torch.no_grad():
            norm.weight.copy_(1 + 0.1 * randn(hid))
        cnorm = torch.compile(norm) if not args.tiny else norm
        for fmt in [f for f in ("int4", "nf4", "fp4_e2m1", "mxfp4", "nvfp4", "int8") if f in fmts]:
            if over_deadline():
                skipped.append(f"fused rmsnorm {fmt}")
                continue

            def fz(fmt=fmt):
                spec = get_format(fmt)
                n = xn.numel()
                codes = torch.empty(spec.code_bytes(n), dtype=torch.uint8, device=dev)
                scales = torch.empty(spec.num_blocks(n), dtype=torch.float32, device=dev)
                y = torch.empty_like(xn)
                with torch.no_grad():
                    tf = bench(lambda: rmsnorm_quant_into(xn, norm.weight, 1e-5, spec, y, codes, scales))
                    rc, rs = ref.quantize_blocks(xn, spec)
                    exact = same(codes, rc) and same(scales, rs)
                    yw = norm(xn)
                    y_ulp_frac = float((y != yw).float().mean())
                    # LAAQ's rule for the fused norm (docs/fusion.md): codes exact; y within NORM_MAX_STEPS
                    # steps of the dtype of the model's norm (rows whose sum of squares rounds differently)
                    from agoq_core.laaq.fusion import NORM_MAX_STEPS, _ordered

                    y_steps = int((_ordered(y) - _ordered(yw)).abs().max())
                    y_close = y_steps <= NORM_MAX_STEPS
                    c2 = torch.empty_like(codes)
                    s2 = torch.empty_like(scales)
                    tu = bench(lambda: (norm(xn), launch.quantize(xn, spec, c2, s2)))
                    cnorm(xn)
                    tc = bench(lambda: (cnorm(xn), launch.quantize(xn, spec, c2, s2)))
                nbytes = 2 * n * 2 + spec.code_bytes(n) + 4 * spec.num_blocks(n)  # read x once, write y + codes
                fused.append({"fmt": fmt, "tokens": tok, "hidden": hid, "fused_us": tf * 1e3,
                              "unfused_eager_us": tu * 1e3, "unfused_compiled_norm_us": tc * 1e3,
                              "speedup_vs_eager_pair": tu / tf, "speedup_vs_compiled_pair": tc / tf,
                              "pct_copy": 100 * nbytes / (tf * 1e-3) / 1e9 / copy_gbs, "codes_exact": exact,
                              "y_within_tolerance": y_close, "y_max_steps": y_steps, "y_fraction_differing": y_ulp_frac})
                if not exact or not y_close:
                    errors.append(f"fused rmsnorm {fmt}: codes exact {exact}, y {y_steps} steps from the model's norm "
                                  f"(tolerance {NORM_MAX_STEPS})")

            guarded(f"fused rmsnorm {fmt}", fz)
        del xn

    # ---- launch-geometry sweep (informs the launcher's defaults) -------------------------------------------
    sweep: list[dict] = []
    if not args.no_sweep and not args.tiny:
        mib = 256 if 256 in sizes else sizes[0]
        n = mib * (1 << 20) // 2
        x = randn(n)
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        for fmt in ("int4", "int5", "int6", "fp8_e4m3"):
            if fmt not in fmts:
                continue
            spec = get_format(fmt)
            bp = triton.next_power_of_2(spec.block)
            codes = torch.empty(spec.code_bytes(n), dtype=torch.uint8, device=dev)
            scales = torch.empty(spec.num_blocks(n), dtype=torch.float32, device=dev)
            out = torch.empty(n, dtype=torch.bfloat16, device=dev)
            for lanes in (1024, 2048, 4096):
                for per_sm in (None,):
                    if over_deadline():
                        break
                    r = max(1, lanes // bp)
                    p = 1 << 30 if per_sm is None else per_sm * sms

                    def one(r=r, p=p, per_sm=per_sm, spec=spec, codes=codes, scales=scales, out=out, fmt=fmt):
                        tq = bench(lambda: launch.quantize(x, spec, codes, scales, rows=r, programs=p))
                        td = bench(lambda: launch.dequantize(codes, scales, spec, out, rows=r, programs=p))
                        sweep.append({"fmt": fmt, "size_mib": mib, "tile_lanes": r * bp, "programs_per_sm": per_sm,
                                      "quantize_us": tq * 1e3, "dequantize_us": td * 1e3})

                    guarded(f"sweep {fmt} rows={r} programs={p}", one)
            del codes, scales, out
        del x

    # ---- report -----------------------------------------------------------------------------------------
    def fmt_opt(v, spec):
        return "-" if v is None else format(v, spec)

    header = (f"{'op':<18}{'format':<10}{'MiB':>6}{'kernel us':>11}{'GB/s':>8}{'% copy':>8}{'eager us':>11}"
              f"{'x eager':>9}{'compile us':>12}{'x compile':>10}  exact")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['op']:<18}{r['fmt']:<10}{r['size_mib']:>6}{r['kernel_us']:>11.1f}{r['gb_s']:>8.0f}"
              f"{r['pct_copy']:>7.1f}%{fmt_opt(r['eager_us'], '11.1f'):>11}"
              f"{fmt_opt(r['speedup_vs_eager'], '8.1f'):>8}x{fmt_opt(r['compile_us'], '12.1f'):>12}"
              f"{fmt_opt(r['speedup_vs_compile'], '9.2f'):>9}x  {'yes' if r['exact'] else 'NO'}")
    for b in bucket:
        print(f"bucket 2^{b['numel'].bit_length() - 1} {b['op']:<22}{b['fmt']:<10} graph {b['graph_us']:8.1f} us "
              f"({b['graph_pct_copy']:5.1f}% copy)  one call {b['call_us']:8.1f} us ({b['call_pct_copy']:5.1f}% copy)  "
              f"{'exact' if b['exact'] else 'NOT EXACT'}")
    for c in compile_info:
        print(f"torch.compile {c['op']} {c['fmt']}: compiled in {c['compile_s']:.1f} s, "
              f"{c['compiled_us']:.1f} us, matches eager: {c['compiled_matches_eager']}")
    if sweep:
        print("geometry sweep (us): fmt lanes programs/SM -> quantize dequantize")
        for s in sweep:
            print(f"  {s['fmt']:<9}{s['tile_lanes']:>6}{str(s['programs_per_sm']):>6} -> "
                  f"{s['quantize_us']:9.1f}{s['dequantize_us']:9.1f}")
    for fz in fused:
        print(f"fused rmsnorm+quantize {fz['fmt']:<9} {fz['tokens']}x{fz['hidden']}: {fz['fused_us']:.1f} us "
              f"({fz['pct_copy']:.0f}% copy), x{fz['speedup_vs_eager_pair']:.2f} vs eager norm + codec, "
              f"x{fz['speedup_vs_compiled_pair']:.2f} vs compiled norm + codec, codes exact {fz['codes_exact']}, "
              f"y within tolerance {fz['y_within_tolerance']} (max {fz['y_max_steps']} steps) "
              f"({100 * fz['y_fraction_differing']:.2f}% of y differ)")
    tile_rows = dequant_tiles(rows)
    if tile_rows:
        print("dequantize tiles (% of copy): format MiB  vec16=0  vec16=1  -> faster")
        for t in tile_rows:
            print(f"  {t['fmt']:<10}{t['size_mib']:>6}{t['pct_copy_vec16_0']:8.1f}%{t['pct_copy_vec16_1']:8.1f}%  -> "
                  f"{t['faster']}{'' if t['vec16_applies'] else ' (VEC16 does not apply: same tile)'}")
    for s in skipped:
        print(f"not run (deadline {args.deadline_s:.0f} s): {s}")
    for e in errors:
        print(f"ERROR {e}")

    env = harness.environment(dev)
    result = {"env": env, "copy": {"size_mib": max(sizes), "us": t_copy * 1e3, "gb_s": copy_gbs}, "rows": rows,
              "dequant_tiles": tile_rows, "compile": compile_info, "bucket": bucket, "sweep": sweep, "fused_rmsnorm": fused, "skipped": skipped,
              "errors": errors,
              "all_exact": bool(rows) and all(r["exact"] for r in rows + bucket) and not errors,
              "seconds": time.time() - t_start}
    harness.write_json(result, args.json, "bench_codecs")
    md = args.json[:-5] + ".md" if args.json and args.json.endswith(".json") else (
        os.path.join(os.environ["OUT"], "bench_codecs.md") if os.environ.get("OUT") else None)
    if md:  # beside the JSON (--json x.json -> x.md), else $OUT/bench_codecs.md
        with open(md, "w") as f:
            f.write(markdown(result))
    print(f"all kernel outputs bit-exact with the reference: {result['all_exact']}  ({result['seconds']:.0f} s)")
    return result


def dequant_tiles(rows: list[dict]) -> list[dict]:
    """Per (format, size): dequantize's % of copy with the 16-lane tile off and on (``--dequant-tiles both``)."""
    by = {}
    for r in rows:
        if r["op"].startswith("dequantize vec16="):
            by.setdefault((r["fmt"], r["size_mib"]), {})[r["op"][-1]] = r
    out = []
    for (fmt, mib), d in by.items():
        if set(d) != {"0", "1"}:
            continue
        p0, p1 = d["0"]["pct_copy"], d["1"]["pct_copy"]
        out.append({"fmt": fmt, "size_mib": mib, "pct_copy_vec16_0": p0, "pct_copy_vec16_1": p1,
                    "us_vec16_0": d["0"]["kernel_us"], "us_vec16_1": d["1"]["kernel_us"],
                    "faster": "vec16=1" if p1 > p0 else "vec16=0", "vec16_applies": d["1"]["vec16_applies"],
                    "exact": d["0"]["exact"] and d["1"]["exact"]})
    return out


def markdown(result: dict) -> str:
    """The docs/bench/codecs.md table of one run."""
    e = result["env"]
    out = [f"{e['date']}, {e.get('gpu', e['device'])}, torch {e['torch']}, triton {e['triton']}; copy "
           f"{result['copy']['gb_s']:.0f} GB/s; command `{e['command']}`", "",
           "| op | format | MiB | GB/s | % copy | x eager ref | x compiled ref | exact |", "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        xe = "-" if r["speedup_vs_eager"] is None else f"{r['speedup_vs_eager']:.1f}"
        xc = "-" if r["speedup_vs_compile"] is None else f"{r['speedup_vs_compile']:.2f}"
        out.append(f"| {r['op']} | {r['fmt']} | {r['size_mib']} | {r['gb_s']:.0f} | {r['pct_copy']:.1f} | {xe} | {xc} "
                   f"| {'yes' if r['exact'] else 'NO'} |")
    if result.get("dequant_tiles"):
        out += ["", "| dequantize tile | format | MiB | vec16=0 % copy | vec16=1 % copy | faster | exact |",
                "|---|---|---|---|---|---|---|"]
        for t in result["dequant_tiles"]:
            out.append(f"| dequantize | {t['fmt']} | {t['size_mib']} | {t['pct_copy_vec16_0']:.1f} | "
                       f"{t['pct_copy_vec16_1']:.1f} | {t['faster'] if t['vec16_applies'] else 'n/a (same tile)'} | "
                       f"{'yes' if t['exact'] else 'NO'} |")
    if result.get("bucket"):
        out += ["", "| QuanGrad bucket op | format | elements | graph us | % copy | one call us | % copy | exact |",
                "|---|---|---|---|---|---|---|---|"]
        for b in result["bucket"]:
            out.append(f"| {b['op']} | {b['fmt']} | {b['numel']} | {b['graph_us']:.1f} | {b['graph_pct_copy']:.1f} | "
                       f"{b['call_us']:.1f} | {b['call_pct_copy']:.1f} | {'yes' if b['exact'] else 'NO'} |")
    if result.get("compile"):
        out += ["", "| torch.compile of the reference | format | MiB | compile s | compiled us | = eager output |",
                "|---|---|---|---|---|---|"]
        for c in result["compile"]:
            out.append(f"| {c['op']} | {c['fmt']} | {c['size_mib']} | {c['compile_s']:.1f} | {c['compiled_us']:.1f} | "
                       f"{c['compiled_matches_eager']} |")
    if result.get("skipped") or result.get("errors"):
        out += [""] + [f"* not run (deadline): {x}" for x in result.get("skipped", [])] + \
               [f"* ERROR: {x}" for x in result.get("errors", [])]
    if result.get("fused_rmsnorm"):
        out += ["", "| fused RMSNorm+quantize | tokens x hidden | us | % copy | x eager pair | x compiled pair | "
                "codes exact | y within tolerance |", "|---|---|---|---|---|---|---|---|"]
        for f in result["fused_rmsnorm"]:
            out.append(f"| {f['fmt']} | {f['tokens']}x{f['hidden']} | {f['fused_us']:.1f} | {f['pct_copy']:.0f} | "
                       f"{f['speedup_vs_eager_pair']:.2f} | {f['speedup_vs_compiled_pair']:.2f} | {f['codes_exact']} | "
                       f"{f['y_within_tolerance']} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
