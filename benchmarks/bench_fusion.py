"""Kernel fusion benchmark: fused GEMM+codec vs unfused (cuBLAS GEMM + our codec kernel) vs the plain GEMM.

One command on the lent H200 (about 2-4 minutes, most of it Triton compiling and autotuning 5 tile configs
of 4 kernel variants):

    PYTHONPATH=.:backends/triton_common:backends/cuda python benchmarks/bench_fusion.py

prints a table and writes ``$OUT/bench_fusion.json`` (or ``--json PATH``). On a CPU-only machine,
``--tiny`` runs the same code paths on tiny shapes through Triton's interpreter (timings meaningless;
it checks that the script works end to end).

What is measured, per LLaMA layer shape and token count T (bf16, nf4 block 128 = LAAQ's default format;
``--fmt int4`` etc. for the others):
* ``fc1_epilogue`` — the gate (= up) projection y = x Wᵀ, x [T, hidden], W [inter, hidden], whose output
  LAAQ keeps quantized (role mlp_act_input). plain: ``F.linear`` (cuBLAS). unfused: ``F.linear`` + the cuda
  backend's quantize kernel on y. fused: gemm_quant_epilogue (y and Q(y) in one kernel), the kernel family
  the launcher picks (it times the per-tile "ptr" kernel and the persistent TMA kernel once per shape);
  the JSON also has both families' times.
* ``down_dw_gated`` — the down projection's weight gradient dW [hidden, inter] = dYᵀ · h, h = act(gate) * up
  rebuilt from the kept 4-bit up (role mlp_act_input; LAAQ's default backward). plain: the GEMM on a dense
  h. unfused: ``h = act * up`` (torch) + the GEMM; fused: gemm_dequant_prologue with ``mul=act``, h never
  written. (Dequantizing gate and up is needed by both paths — their gradients read them — so not timed.)
* ``oproj_dw_prologue`` — the attention out-projection weight gradient dW = dYᵀ · X, X [T, hidden] kept
  quantized (role attn_out_input when the attention output is not kept by SDPA itself). plain: the GEMM on a
  bf16 X. unfused: the cuda backend's dequantize to bf16 + the same GEMM LAAQ runs (``x.t().mm(dy).t()``).
  fused: gemm_dequant_prologue.
* ``fc1_dw_prologue`` — the same for a converted Linear of the gate/up shape whose input is kept quantized
  (role linear_input, own models' Linear modules), dW [inter, hidden].
Each timing is the median of ``triton.testing.do_bench`` (L2 flushed between runs). Every fused result is
also checked on the GPU: codes/scales bit-exact with the backend's own quantize kernel applied to the fused
y, and the SQNR of the fused outputs against the unfused ones.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the shared harness beside this script
import harness  # noqa: E402

from agoq_core.models import MODELS  # noqa: E402

SHAPES = {m: (MODELS[m].hidden, MODELS[m].intermediate) for m in ("llama2-7b", "llama3-8b")}  # (hidden, inter)
TOKENS = (4096, 8192, 16384)
TINY_SHAPES = {"micro": (MODELS["micro"].hidden, MODELS["micro"].intermediate)}
TINY_TOKENS = (64, 96)


def _parse(argv):
    ap = argparse.ArgumentParser(description="fused vs unfused vs plain GEMMs for LAAQ (kernel fusion)")
    ap.add_argument("--tiny", action="store_true", help="CPU: tiny shapes in Triton's interpreter (smoke test)")
    ap.add_argument("--tokens", type=int, nargs="*", help=f"token counts (default {TOKENS})")
    ap.add_argument("--models", nargs="*", choices=sorted(SHAPES), help="model shapes (default all)")
    ap.add_argument("--fmt", default="nf4", help="activation format (default nf4, LAAQConfig's default)")
    harness.add_json_arg(ap, "bench_fusion")
    return ap.parse_args(argv)


def main(argv=None) -> dict:
    args = _parse(argv)
    if args.tiny:
        os.environ["TRITON_INTERPRET"] = "1"  # before any @triton.jit decorator runs
    import torch
    import torch.nn.functional as F

    from agoq_core.formats.spec import get_format
    from agoq_cuda.backend import CudaBackend
    from agoq_cuda.fusion import launch
    from agoq_core.testing.tolerances import sqnr_db

    be = CudaBackend.create()
    dev = torch.device(be.device_type)
    spec = get_format(args.fmt)
    dtype = torch.bfloat16
    shapes = TINY_SHAPES if args.tiny else {m: SHAPES[m] for m in (args.models or sorted(SHAPES))}
    tokens = args.tokens or (TINY_TOKENS if args.tiny else TOKENS)

    if args.tiny:
        def bench(fn):
            fn()
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
    else:
        import triton.testing

        def bench(fn):
            return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))

    g = torch.Generator(device="cpu").manual_seed(0)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype).to(dev)

    rows = []
    for model, (hidden, inter) in shapes.items():
        for t in tokens:
            # ---- fc1 epilogue ---------------------------------------------------------------------------
            x, w = randn(t, hidden), randn(inter, hidden, scale=hidden ** -0.5)
            n = t * inter
            y = torch.empty(t, inter, dtype=dtype, device=dev)
            yf = torch.empty_like(y)
            codes, scales = (torch.empty(spec.code_bytes(n), dtype=torch.uint8, device=dev),
                             torch.empty(spec.num_blocks(n), dtype=torch.float32, device=dev))
            codes_f, scales_f = torch.empty_like(codes), torch.empty_like(scales)

            def plain():
                torch.matmul(x, w.t(), out=y)

            def unfused():
                torch.matmul(x, w.t(), out=y)
                be.quantize_into(y.view(-1), spec, codes, scales)

            def codec_only():
                be.quantize_into(y.view(-1), spec, codes, scales)

            def fused(kernel=None):
                launch.gemm_quant_epilogue_into(x, w, None, spec, yf, codes_f, scales_f, kernel=kernel)

            fused()  # compile + autotune (+ the ptr/tma choice) outside the timing
            unfused()
            be.synchronize(dev)
            check = _check_epilogue(be, spec, yf, codes_f, scales_f, y, sqnr_db)
            for fam in launch.KERNELS:  # both kernel families, each autotuned, for the record
                fused(fam)
                be.synchronize(dev)
                check[f"fused_{fam}_ms"] = round(bench(lambda: fused(fam)), 4)
                c = _check_epilogue(be, spec, yf, codes_f, scales_f, y, sqnr_db)
                check[f"{fam}_codes_bit_exact"] = c["codes_bit_exact"] and c["scales_bit_exact"]
            check["kernel_chosen"] = {str(k): v for k, v in launch._chosen.items() if k[1] == inter and k[2] == hidden}
            rows.append(_row(model, "fc1_epilogue", t, (t, inter, hidden), bench(plain), bench(unfused),
                             bench(fused), bench(codec_only), check, launch, "epilogue"))
            del x, w, y, yf, codes, scales, codes_f, scales_f

            # ---- weight gradients with a quantized input ------------------------------------------------
            for name, n_out, k_in, gated in (("down_dw_gated", hidden, inter, True),
                                             ("oproj_dw_prologue", hidden, hidden, False),
                                             ("fc1_dw_prologue", inter, hidden, False)):
                dy, xin = randn(t, n_out), randn(t, k_in, scale=3.0)
                m = t * k_in
                qc, qs = (torch.empty(spec.code_bytes(m), dtype=torch.uint8, device=dev),
                          torch.empty(spec.num_blocks(m), dtype=torch.float32, device=dev))
                be.quantize_into(xin.view(-1), spec, qc, qs)
                xd = torch.empty_like(xin)
                be.dequantize_into(qc, qs, spec, xd.view(-1))
                act = F.silu(randn(t, k_in, scale=2.0)) if gated else None   # m = act(gate), LAAQ keeps it dense
                h = act * xd if gated else xd
                dw = torch.empty(n_out, k_in, dtype=dtype, device=dev)
                dwf = torch.empty_like(dw)

                def plain_dw():
                    torch.matmul(h.t(), dy, out=dw.t())

                if gated:
                    # LAAQ dequantizes gate and up anyway (their gradients need them); unfused, it then
                    # materialises h = act(gate) * up for the GEMM; fused, the GEMM multiplies in registers.
                    def extra_dw():
                        torch.mul(act, xd, out=h)
                else:
                    def extra_dw():
                        be.dequantize_into(qc, qs, spec, xd.view(-1))

                def unfused_dw():
                    extra_dw()
                    torch.matmul(h.t(), dy, out=dw.t())   # (xᵀ·dy)ᵀ: LAAQ's weight_grad GEMM

                def fused_dw():
                    launch.gemm_dequant_prologue_into(dy, qc, qs, spec, k_in, dwf, act)

                fused_dw()
                unfused_dw()
                be.synchronize(dev)
                check = {"sqnr_fused_vs_unfused_db": round(sqnr_db(dwf, dw), 2)}
                rows.append(_row(model, name, t, (n_out, k_in, t), bench(plain_dw), bench(unfused_dw),
                                 bench(fused_dw), bench(extra_dw), check, launch, "prologue"))
                del dy, xin, qc, qs, xd, dw, dwf, act, h
            if dev.type == "cuda":
                torch.cuda.empty_cache()

    report = _report(rows, args, torch, be, dev)
    _print(report)
    harness.write_json(report, args.json, "bench_fusion")
    return report


def _check_epilogue(be, spec, yf, codes_f, scales_f, y_unfused, sqnr_db) -> dict:
    """On the device: the fused codes/scales equal the backend's own quantize kernel on the fused y."""
    import torch

    c2, s2 = torch.empty_like(codes_f), torch.empty_like(scales_f)
    be.quantize_into(yf.view(-1), spec, c2, s2)
    same_s = (s2.view(torch.int32) == scales_f.view(torch.int32)) | (torch.isnan(s2) & torch.isnan(scales_f))
    return {"codes_bit_exact": bool(torch.equal(c2, codes_f)), "scales_bit_exact": bool(same_s.all()),
            "y_equal_to_unfused_frac": float((yf == y_unfused).float().mean()),
            "sqnr_fused_vs_unfused_db": round(sqnr_db(yf, y_unfused), 2)}


def _row(model, kind, tokens, mnk, plain, unfused, fused, extra, check, launch, which) -> dict:
    """One table row. ``extra``: the separate kernel the fused one replaces (the codec, or h = act * up)."""
    m, n, k = mnk
    cfg = {}
    if not launch.is_interpreted():  # the autotuners' last choices (the shape just measured)
        tuned = {"ptr": launch._tuned(which)}
        if which == "epilogue":
            tuned["tma"] = launch._tuned_tma()
        cfg = {f: str(t.best_config) for f, t in tuned.items() if getattr(t, "best_config", None) is not None}
    flop = 2 * m * n * k
    return {"model": model, "gemm": kind, "tokens": tokens, "M": m, "N": n, "K": k,
            "plain_ms": round(plain, 4), "unfused_ms": round(unfused, 4), "fused_ms": round(fused, 4),
            "extra_ms": round(extra, 4),
            "fused_tflops": round(flop / fused / 1e9, 1), "plain_tflops": round(flop / plain / 1e9, 1),
            "speedup_vs_unfused": round(unfused / fused, 3), "fused_over_plain": round(fused / plain, 3),
            "tile_config": cfg, **check}


def _report(rows, args, torch, be, dev) -> dict:
    def gmean(v):
        import math
        return round(math.exp(sum(math.log(max(x, 1e-9)) for x in v) / len(v)), 3) if v else None

    env = harness.environment(dev, backend=repr(be), fmt=args.fmt, tiny=args.tiny)
    env["device"] = env.get("gpu") or "cpu (Triton interpreter)"
    summary = {
        "speedup_vs_unfused_mean": round(sum(r["speedup_vs_unfused"] for r in rows) / len(rows), 3),
        "speedup_vs_unfused_gmean": gmean([r["speedup_vs_unfused"] for r in rows]),
        "fused_over_plain_mean": round(sum(r["fused_over_plain"] for r in rows) / len(rows), 3),
        "goal_speedup_ge_1.05": None, "goal_within_10pct_of_plain": None,
        "all_codes_bit_exact": all(r.get("codes_bit_exact", True) and r.get("scales_bit_exact", True)
                                   and r.get("ptr_codes_bit_exact", True) and r.get("tma_codes_bit_exact", True)
                                   for r in rows),
    }
    summary["goal_speedup_ge_1.05"] = summary["speedup_vs_unfused_mean"] >= 1.05
    summary["goal_within_10pct_of_plain"] = summary["fused_over_plain_mean"] <= 1.10
    for kind in sorted({r["gemm"] for r in rows}):
        sub = [r for r in rows if r["gemm"] == kind]
        summary[f"{kind}_speedup_vs_unfused_mean"] = round(sum(r["speedup_vs_unfused"] for r in sub) / len(sub), 3)
        summary[f"{kind}_fused_over_plain_mean"] = round(sum(r["fused_over_plain"] for r in sub) / len(sub), 3)
    return {"benchmark": "bench_fusion", "environment": env, "summary": summary, "rows": rows}


def _print(report) -> None:
    env, rows = report["environment"], report["rows"]
    print(f"# bench_fusion  {env['date']}  {env['device']}  torch {env['torch']}  triton {env['triton']}  "
          f"fmt {env['fmt']}")
    hdr = (f"{'model':10s} {'gemm':18s} {'tokens':>6s} {'M x N x K':>18s} {'plain ms':>9s} {'unfused':>9s} "
           f"{'(extra)':>8s} {'fused':>9s} {'TFLOP/s':>8s} {'vs unfused':>10s} {'vs plain':>9s} {'bit-exact':>9s}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        exact = "yes" if r.get("codes_bit_exact", True) and r.get("scales_bit_exact", True) else "NO"
        if "codes_bit_exact" not in r:
            exact = "n/a"
        elif not all(r.get(f"{f}_codes_bit_exact", True) for f in ("ptr", "tma")):
            exact = "NO"
        print(f"{r['model']:10s} {r['gemm']:18s} {r['tokens']:6d} {r['M']:>6d}x{r['N']:>5d}x{r['K']:>5d} "
              f"{r['plain_ms']:9.3f} {r['unfused_ms']:9.3f} {r['extra_ms']:8.3f} {r['fused_ms']:9.3f} "
              f"{r['fused_tflops']:8.1f} {r['speedup_vs_unfused']:9.3f}x {r['fused_over_plain']:8.3f}x {exact:>9s}")
    s = report["summary"]
    print(f"mean speedup vs unfused {s['speedup_vs_unfused_mean']}x (goal >= 1.05: {s['goal_speedup_ge_1.05']}); "
          f"mean fused/plain {s['fused_over_plain_mean']}x (goal <= 1.10: {s['goal_within_10pct_of_plain']}); "
          f"codes bit-exact everywhere: {s['all_codes_bit_exact']}")


if __name__ == "__main__":
    main()
