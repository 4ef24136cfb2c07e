"""Compile the codec kernels for sm_90 without a GPU and count their instructions per element.

``python -m agoq_cuda.codec_isa [--formats int4 mxfp4 ...] [--json out.json]`` (run WITHOUT TRITON_INTERPRET).
For each format it compiles quantize_kernel / dequantize_kernel as agoq-cuda launches them on an H200 (bf16
input, HW=True, the geometry's rows and warps for 2**30 elements) through Triton's real NVIDIA pipeline and
reports SASS instructions of the loop body per element (static count of the whole cubin / elements per tile
iteration: an upper bound that ignores the prologue). This is how the quantize kernels' cost is read on a
machine without a GPU (issue 17: the bandwidth leaves room for ~20 instructions per element on an H200).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile

__all__ = ["compile_codec", "main"]


def compile_codec(op: str, fmt: str, arch: int = 90) -> dict:
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource

    from agoq_core.formats.spec import get_format
    from agoq_cuda.launch import geometry
    from agoq_triton_kernels import kernels as K
    from agoq_triton_kernels.layout import FLOAT_BF16, format_constexprs

    spec = get_format(fmt)
    c = format_constexprs(kind=spec.kind, bits=spec.bits, block=spec.block, qmax=spec.qmax,
                          scale_kind=spec.scale_kind)
    geo = geometry(c["BLOCK_P"], (1 << 30) // spec.block, torch.device("cuda"), programs=132)
    lut = spec.kind == "nf4"
    c.update(ROWS=geo.rows, RAGGED=False, HW=True, NF4_LUT=lut)
    if op == "quantize":
        fn = K.quantize_kernel
        sig = {"x_ptr": "*i16", "codes_ptr": "*i8", "scales_ptr": "*fp32", "n": "i32", "n_blocks": "i32",
               "n_tiles": "i32", "elut_ptr": "*i64" if lut else "constexpr", "ts_ptr": "*fp32"
               if spec.tensor_scaled else "constexpr"}
        c.update(X_FLOAT=FLOAT_BF16)
        if not lut:
            c["elut_ptr"] = None
        if not spec.tensor_scaled:
            c["ts_ptr"] = None
    else:
        fn = K.dequantize_kernel
        sig = {"codes_ptr": "*i8", "scales_ptr": "*fp32", "lut_ptr": "*fp32", "out_ptr": "*i16", "n": "i32",
               "n_blocks": "i32", "n_tiles": "i32"}
        c.update(OUT_FLOAT=FLOAT_BF16)
    c = {k: v for k, v in c.items() if k in fn.arg_names}
    for prm in fn.params:  # defaults the JIT would fill in (SCALE=0, ...)
        if prm.name not in sig and prm.name not in c:
            c[prm.name] = prm.default
    for k in c:
        sig[k] = "constexpr"
    attrs = {(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k in sig
             if sig[k].startswith("*")}
    src = ASTSource(fn, {k: sig.get(k, "constexpr") for k in fn.arg_names}, c, attrs)
    ck = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                        options={"num_warps": geo.num_warps, "enable_fp_fusion": False})
    sass = _sass(ck.asm["cubin"])
    elems = geo.rows * spec.block
    threads = 32 * geo.num_warps
    rec = {"op": op, "fmt": fmt, "rows": geo.rows, "warps": geo.num_warps, "elements_per_tile": elems,
           "ptx_lines": sum(1 for ln in ck.asm["ptx"].splitlines() if ln.strip().endswith(";"))}
    if sass is not None:
        rec["sass_instructions"] = sass
        rec["sass_per_element"] = round(sass * threads / elems, 1)
    return rec


def _sass(cubin: bytes) -> int | None:
    try:
        from triton.backends.nvidia.compiler import get_ptxas  # noqa: F401
        import triton.backends.nvidia as nv
        import os

        cuobjdump = os.path.join(os.path.dirname(nv.__file__), "bin", "cuobjdump")
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubin)
            f.flush()
            out = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True, timeout=60).stdout
    except Exception:
        return None
    return sum(1 for ln in out.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/\s+[A-Z@]", ln)) or None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", nargs="*", default=["int4", "int5", "int6", "int8", "fp4_e2m1", "nf4", "fp8_e4m3",
                                                     "mxfp4", "mxfp8", "nvfp4"])
    ap.add_argument("--ops", nargs="*", default=["quantize", "dequantize"])
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    recs = [compile_codec(op, f) for f in a.formats for op in a.ops]
    for r in recs:
        print(json.dumps(r))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(recs, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
