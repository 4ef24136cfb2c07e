"""Compile the codec kernels for sm_90 without a GPU and count their instructions per element.

``python -m agoq_cuda.codec_isa [--formats int4 mxfp4 ...] [--ops quantize ...] [--json out.json] [--ops-histogram]``
(run WITHOUT TRITON_INTERPRET). For each format it compiles the codec kernels as agoq-cuda launches them on an
H200 (bf16 input/output, HW=True, the geometry's rows and warps for 2**30 elements; reduce_requantize for
4 ranks) through Triton's real NVIDIA pipeline and reports SASS instructions per element, statically:

* ``sass_per_element``: the whole cubin / elements per tile (prologue, cold paths and padding included: an
  upper bound, the number quoted before 2026-12-01 17:00);
* ``loop_per_element``: the instructions of the persistent loop's body (from the target of its back-edge to
  the back-edge) without the cold regions a conditional branch skips to call a subroutine (the slow path of
  ``div.rn`` for special operands), per element: what one tile costs a thread when no slow path runs.

These are static counts, not measurements: they ignore latency, memory stalls and issue conflicts. The
issue-17 budget: an H200 copies ~4.2 TB/s, i.e. about 20 instructions per element of bf16 quantize.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import re
import subprocess
import tempfile

__all__ = ["compile_codec", "loop_body", "main"]

_WORLD = 4  # reduce_requantize: ranks summed per element


def _signature(op: str, spec, lut: bool) -> dict:
    ts = "*fp32" if spec.tensor_scaled else "constexpr"
    elut = "*i64" if lut else "constexpr"
    if op == "quantize":
        return {"x_ptr": "*i16", "codes_ptr": "*i8", "scales_ptr": "*fp32", "n": "i32", "n_blocks": "i32",
                "n_tiles": "i32", "elut_ptr": elut, "ts_ptr": ts}
    if op == "dequantize":
        return {"codes_ptr": "*i8", "scales_ptr": "*fp32", "lut_ptr": "*fp32", "out_ptr": "*i16", "n": "i32",
                "n_blocks": "i32", "n_tiles": "i32"}
    if op == "accumulate":
        return {"codes_ptr": "*i8", "scales_ptr": "*fp32", "lut_ptr": "*fp32", "g_ptr": "*i16", "n": "i32",
                "n_blocks": "i32", "n_tiles": "i32", "elut_ptr": elut}
    if op == "reduce_requantize":
        return {"codes_ptr": "*i8", "scales_ptr": "*fp32", "lut_ptr": "*fp32", "codes_out_ptr": "*i8",
                "scales_out_ptr": "*fp32", "n": "i32", "n_blocks": "i32", "n_tiles": "i32", "world": "i32",
                "codes_stride": "i32", "scales_stride": "i32", "elut_ptr": elut}
    raise ValueError(f"unknown op {op!r}; known: quantize, dequantize, accumulate, reduce_requantize")


def compile_codec(op: str, fmt: str, arch: int = 90, nf4_lut: bool = True, hw: bool = True) -> dict:
    """Compile ``op`` for ``fmt`` as agoq-cuda would launch it on an H200 and count its SASS (``hw=False``: the
    portable arithmetic, as on a GPU older than sm_89 or with hw=False asked for)."""
    import torch

    from agoq_core.formats.spec import get_format
    from agoq_cuda.launch import CudaGeometry
    from agoq_triton_kernels import kernels as K
    from agoq_triton_kernels.layout import FLOAT_BF16, format_constexprs

    spec = get_format(fmt)
    c = format_constexprs(kind=spec.kind, bits=spec.bits, block=spec.block, qmax=spec.qmax,
                          scale_kind=spec.scale_kind)
    geo = CudaGeometry()
    geo.packed_max = False  # the plan would ask the (absent) GPU; decided by arch below
    la = geo.plan(op, spec, 1 << 30, torch.bfloat16, torch.device("cuda"), rows=None, programs=132)
    la = dataclasses.replace(la, max16=la.words and op == "quantize" and _packs_max(arch))
    lut = spec.kind == "nf4" and nf4_lut
    c.update(ROWS=la.rows, BLOCK_P=la.block_p, RAGGED=False, HW=hw, NF4_LUT=lut)
    fn = {"quantize": K.quantize_kernel, "dequantize": K.dequantize_kernel, "accumulate": K.accumulate_kernel,
          "reduce_requantize": K.reduce_requantize_kernel}[op]
    sig = _signature(op, spec, lut)
    c.update(X_FLOAT=FLOAT_BF16, OUT_FLOAT=FLOAT_BF16, G_FLOAT=FLOAT_BF16)
    from agoq_triton_kernels.launch import _vec16

    class _Aligned:  # what the launcher passes for aligned code buffers of whole blocks
        @staticmethod
        def data_ptr():
            return 0

    c.update(_vec16(la, spec, False, _Aligned, stride=0, op=op))
    for k in ("elut_ptr", "ts_ptr"):
        if sig.get(k) == "constexpr":
            c[k] = None
    c = {k: v for k, v in c.items() if k in fn.arg_names}
    rec = {"op": op, "fmt": fmt, "rows": la.rows, "hw": hw}
    return _compile_and_count(fn, sig, c, la.options["num_warps"], la.rows * spec.block, arch, rec)


def _packs_max(arch: int) -> bool:
    """CudaGeometry.packs_max for an sm_``arch`` GPU that is not here: sm_90+, unless AGOQ_CUDA_PACKED_MAX=0."""
    from agoq_cuda.launch import CudaGeometry

    return CudaGeometry().packed_max and arch >= 90


def _compile_and_count(fn, sig: dict, c: dict, warps: int, elems: int, arch: int, rec: dict,
                       maxnreg: int | None = None) -> dict:
    """Compile ``fn`` (signature ``sig``, constexprs ``c``) for sm_``arch`` and count its SASS per element
    (``elems`` elements per loop iteration of the whole program); ``maxnreg``: ptxas's register cap, as launched."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource

    for prm in fn.params:  # defaults the JIT would fill in (SCALE=0, ...)
        if prm.name not in sig and prm.name not in c:
            c[prm.name] = prm.default
    for k in c:
        sig[k] = "constexpr"
    # what the JIT knows of real launches: pointers 16-byte aligned, rank strides multiples of 16
    attrs = {(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k in sig
             if sig[k].startswith("*") or k in ("codes_stride", "scales_stride")}
    src = ASTSource(fn, {k: sig.get(k, "constexpr") for k in fn.arg_names}, c, attrs)
    opts = {"num_warps": warps, "enable_fp_fusion": False, **({"maxnreg": maxnreg} if maxnreg else {})}
    ck = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=opts)
    threads = 32 * warps
    rec.update({"warps": warps, "elements_per_tile": elems,
                "ptx_lines": sum(1 for ln in ck.asm["ptx"].splitlines() if ln.strip().endswith(";")),
                "registers": getattr(ck, "n_regs", None) or _registers(ck.asm["cubin"]),
                "shared_bytes": ck.metadata.shared})
    sass = _sass(ck.asm["cubin"])
    if sass is not None:
        ins = _parse(sass)
        body = loop_body(ins)
        rec["sass_instructions"] = len(ins)
        rec["sass_per_element"] = round(len(ins) * threads / elems, 1)
        rec["loop_instructions"] = len(body)
        rec["loop_per_element"] = round(len(body) * threads / elems, 2)
        rec["loop_opcodes"] = dict(collections.Counter(_opcode(t) for _, t in body).most_common())
        rec["local_memory_ops"] = sum(1 for _, t in ins if _opcode(t) in ("STL", "LDL"))  # register spills
        rec["_sass"] = sass
    return rec


#: The fused kernels (``--fused``), compiled with the variant LAAQ keeps first on the H200.
FUSED_OPS = ("silu_mul_quant", "silu_mul_backward", "rmsnorm_quant")


def compile_fused(op: str, fmt: str, vec16: bool, arch: int = 90, hidden: int = 4096,
                  maxnreg: int | None = None, prefetch: bool | None = None) -> dict:
    """Compile a fused kernel of agoq-cuda (FUSED_OPS) for sm_90 on the generic or the 16-lane tile, as it is
    launched on an H200 (bf16; SiLU&Mul: variants ``libdevice`` / ``table_fma``, the codec geometry's rows and
    warps; RMSNorm: variant ``tree``, one ``hidden``-element token row per loop iteration), and count its SASS.
    ``maxnreg``: None compiles with the register cap the launch uses (agoq_cuda.launch.MAXNREG), 0 without a cap,
    N with a cap of N. ``prefetch``: the RMSNorm's next-row prefetch (None: as launched,
    agoq_cuda.launch.NORM_PREFETCH for the tile; a prefetching launch takes no cap)."""
    import torch

    from agoq_core.formats.spec import get_format
    from agoq_cuda import fused_norm, fused_swiglu
    from agoq_cuda.launch import MAXNREG, NORM_PREFETCH, CudaGeometry, backward_pairs, norm_prefetch_words
    from agoq_triton_kernels.layout import FLOAT_BF16, format_constexprs

    spec = get_format(fmt)
    c = format_constexprs(kind=spec.kind, bits=spec.bits, block=spec.block, qmax=spec.qmax,
                          scale_kind=spec.scale_kind)
    lut = spec.kind == "nf4"
    c.update(HW=True, NF4_LUT=lut, FLOAT=FLOAT_BF16, VEC16=bool(vec16) and spec.block >= 16)
    p16, p32, i8 = "*i16", "*fp32", "*i8"
    if op == "rmsnorm_quant":
        fn, warps, elems = fused_norm._rmsnorm_quant_kernel, 8 if hidden <= 8192 else 16, hidden
        order, rsq = fused_norm.VARIANTS["tree"]
        pf = fmt in NORM_PREFETCH[bool(c["VEC16"])] if prefetch is None else bool(prefetch)
        c.update(H=hidden, NBR=hidden // spec.block, ORDER=order, RSQRT=rsq, LANES=32, LOG_LANES=5, WRITE_R=0,
                 r_ptr=None, PREFETCH=pf)
        # as fused_norm launches it on sm_90: bf16 words where every thread owns its elements, their absmax
        # (MAX16) with them, the prefetching loop on words only with MAX16
        words = bool(c["VEC16"]) and CudaGeometry().reads_words(torch.bfloat16, c["BLOCK_P"], hidden // spec.block,
                                                                warps, torch.device("cuda"))
        packed = words and _packs_max(arch)
        c.update(WORDS=words and (not pf or (packed and norm_prefetch_words(fmt))), MAX16=packed)
        sig = {"x_ptr": p16, "w_ptr": p16, "y_ptr": p16, "codes_ptr": i8, "scales_ptr": p32, "M": "i32",
               "eps": "fp32", "ts_ptr": p32 if spec.tensor_scaled else "constexpr",
               "elut_ptr": "*i64" if lut else "constexpr"}
    else:
        la = CudaGeometry().plan("quantize", spec, 1 << 30, torch.bfloat16, torch.device("cuda"), rows=None,
                                 programs=132)
        fn, warps, elems = None, la.options["num_warps"], la.rows * spec.block
        c.update(ROWS=la.rows, BLOCK_P=la.block_p)
        sizes = {"n": "i32", "n_blocks": "i32", "n_tiles": "i32"}
        if op == "silu_mul_quant":
            fn = fused_swiglu._silu_mul_quant_kernel
            c.update(SILU=fused_swiglu.FORWARD_VARIANTS["libdevice"], tab_ptr=None,
                     WORDS=bool(la.words and c["VEC16"]), MAX16=bool(la.words and c["VEC16"]) and _packs_max(arch))
            sig = {"g_ptr": p16, "u_ptr": p16, "h_ptr": p16, "gc_ptr": i8, "gs_ptr": p32, "uc_ptr": i8,
                   "us_ptr": p32, **sizes, "elut_ptr": "*i64" if lut else "constexpr"}
        elif op == "silu_mul_backward":
            fn = fused_swiglu._silu_mul_backward_kernel
            silu, sig_, fma = fused_swiglu.BACKWARD_VARIANTS["table_fma"]
            c.update(SILU=silu, SIG=sig_, FMA=fma, PAIRED=bool(c["VEC16"]) and backward_pairs(fmt))
            sig = {"dh_ptr": p16, "gc_ptr": i8, "gs_ptr": p32, "uc_ptr": i8, "us_ptr": p32, "lut_ptr": p32,
                   "tab_ptr": p32, "sig_ptr": p32, "h_ptr": p16, "dg_ptr": p16, "du_ptr": p16, **sizes}
        else:
            raise ValueError(f"unknown fused op {op!r}; known: {', '.join(FUSED_OPS)}")
    for k in ("elut_ptr", "ts_ptr"):
        if sig.get(k) == "constexpr":
            c[k] = None
    c = {k: v for k, v in c.items() if k in fn.arg_names}
    rec = {"op": op, "fmt": fmt, "tile": "vec16" if c.get("VEC16") else "generic", "rows": elems // spec.block}
    cap = (None if c.get("PREFETCH") else MAXNREG.get((op, fmt, bool(c.get("VEC16"))))) if maxnreg is None \
        else (maxnreg or None)
    return _compile_and_count(fn, sig, c, warps, elems, arch, rec, maxnreg=cap)


def _parse(sass: str) -> list[tuple[int, str]]:
    out = []
    for ln in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+([A-Z@][^;]*);", ln)
        if m:
            out.append((int(m.group(1), 16), m.group(2).strip()))
    return out


def _opcode(text: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]


def loop_body(ins: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The instructions of the outermost loop (widest backward branch), without cold regions: the
    instructions a conditional forward branch skips when the skipped region calls a subroutine."""
    best = None
    for a, t in ins:
        m = re.search(r"\bBRA\s+(?:`?\(?)?(0x[0-9a-f]+)", t)
        if m and int(m.group(1), 16) < a and (best is None or a - int(m.group(1), 16) > best[1] - best[0]):
            best = (int(m.group(1), 16), a)
    if best is None:
        return list(ins)
    body = [(a, t) for a, t in ins if best[0] <= a <= best[1]]
    cold = set()
    for a, t in body:
        m = re.match(r"@!?U?P\w+\s+BRA\s+(0x[0-9a-f]+)", t)
        if m:
            region = [(b, u) for b, u in body if a < b < int(m.group(1), 16)]
            if any("CALL" in u for _, u in region):
                cold.update(b for b, _ in region)
    return [(a, t) for a, t in body if a not in cold]


def _cuobjdump(cubin: bytes, flag: str) -> str | None:
    try:
        import triton.backends.nvidia as nv

        cuobjdump = os.path.join(os.path.dirname(nv.__file__), "bin", "cuobjdump")
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubin)
            f.flush()
            return subprocess.run([cuobjdump, flag, f.name], capture_output=True, text=True, timeout=60).stdout
    except Exception:
        return None


def _sass(cubin: bytes) -> str | None:
    return _cuobjdump(cubin, "-sass")


def _registers(cubin: bytes) -> int | None:
    """Registers per thread from the cubin's resource usage (``REG:N``): what sets occupancy; known without a
    GPU (Triton's ``n_regs`` is filled in only when a driver loads the kernel)."""
    out = _cuobjdump(cubin, "-res-usage") or ""
    m = re.search(r"REG:(\d+)", out)
    return int(m.group(1)) if m else None


FORMATS = ["int4", "int5", "int6", "int8", "fp4_e2m1", "nf4", "fp8_e4m3", "fp8_e5m2", "mxfp4", "mxfp8", "nvfp4"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", nargs="*", default=FORMATS)
    ap.add_argument("--ops", nargs="*", default=["quantize", "dequantize", "accumulate", "reduce_requantize"])
    ap.add_argument("--json", help="write every record (without the SASS text) to this file")
    ap.add_argument("--sass-dir", help="write each kernel's SASS to DIR/op_format.sass")
    ap.add_argument("--ops-histogram", action="store_true", help="print the loop body's opcode counts")
    ap.add_argument("--no-nf4-lut", action="store_true",
                    help="compile nf4 with NF4_LUT=False (compare/select encode and decode, as agoq-ascend launches)")
    ap.add_argument("--fused", action="store_true",
                    help=f"compile the fused kernels instead ({', '.join(FUSED_OPS)}; --ops picks among them), "
                         "each on the generic and the 16-lane tile")
    a = ap.parse_args(argv)
    from agoq_core.formats.spec import get_format

    if a.fused:
        ops = [o for o in a.ops if o in FUSED_OPS] or list(FUSED_OPS)
        print(f"{'op':18} {'format':9} {'tile':8} {'warps':>5} {'regs':>4} {'loop/elem':>9} {'cubin/elem':>10}")
        recs = []
        for f in a.formats:
            for op in ops:
                if op != "rmsnorm_quant" and get_format(f).tensor_scaled:
                    continue  # the fused SiLU&Mul is block-local only
                for vec16 in (False, True):
                    r = compile_fused(op, f, vec16)
                    r.pop("_sass", None)
                    recs.append(r)
                    print(f"{op:18} {f:9} {r['tile']:8} {r['warps']:>5} {r['registers'] or '-':>4} "
                          f"{r.get('loop_per_element', '-'):>9} {r.get('sass_per_element', '-'):>10}", flush=True)
        if a.json:
            with open(a.json, "w") as fh:
                json.dump(recs, fh, indent=1)
        return 0

    recs = []
    print(f"{'op':18} {'format':9} {'rows':>4} {'warps':>5} {'regs':>4} {'loop/elem':>9} {'cubin/elem':>10}")
    for f in a.formats:
        for op in a.ops:
            if op in ("accumulate", "reduce_requantize") and get_format(f).tensor_scaled:
                continue  # not block-local: the launcher refuses them
            r = compile_codec(op, f, nf4_lut=not a.no_nf4_lut)
            sass = r.pop("_sass", None)
            if a.sass_dir and sass:
                os.makedirs(a.sass_dir, exist_ok=True)
                with open(os.path.join(a.sass_dir, f"{op}_{f}.sass"), "w") as fh:
                    fh.write(sass)
            recs.append(r)
            print(f"{op:18} {f:9} {r['rows']:>4} {r['warps']:>5} {r['registers'] or '-':>4} "
                  f"{r.get('loop_per_element', '-'):>9} {r.get('sass_per_element', '-'):>10}", flush=True)
            if a.ops_histogram:
                print("   ", r.get("loop_opcodes"))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(recs, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
