"""Compile the fused GEMMs for a GPU target without a GPU, and report what the compiler made of them.

``python -m agoq_cuda.fusion.compile_check [--arch 90] [--quick]`` (with TRITON_INTERPRET unset) lowers each
kernel variant through Triton's real NVIDIA pipeline (TTIR -> TTGIR -> LLVM -> PTX -> cubin with the
bundled ptxas), specialised the way Triton's JIT would specialise a real LLaMA-shaped launch (16-byte
aligned pointers, sizes and strides divisible by 16, unit strides as constants). It prints, per variant:
compile time, shared memory, registers/spills, whether the operand loads were software-pipelined
(``async_copy``), and whether ``tl.dot`` became Hopper ``wgmma``. CPU CI runs the quick set, so a kernel
that does not compile for sm_90 fails here, not on the lent GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

__all__ = ["compile_variants", "main"]


def _variants(quick: bool):
    from agoq_core.formats.spec import get_format
    from agoq_cuda.fusion.launch import _GPU_CONFIGS, _GPU_PROLOGUE_CONFIGS

    fmts = ["int4"] if quick else ["int4", "fp4_e2m1", "nf4", "int5", "int6", "int8"]
    cfgs = _GPU_CONFIGS[:1] if quick else _GPU_CONFIGS
    out = []
    for fmt in fmts:
        spec = get_format(fmt)
        for c in cfgs:
            out.append(("epilogue", spec, c, "bf16"))
            out.append(("epilogue-tma", spec, c, "bf16"))
            out.append(("prologue", spec, c, "bf16"))
            out.append(("prologue+mul", spec, c, "bf16"))
        if not quick:
            for c in _GPU_PROLOGUE_CONFIGS[len(_GPU_CONFIGS):]:
                out.append(("prologue", spec, c, "bf16"))
                out.append(("prologue+mul", spec, c, "bf16"))
    if not quick:
        out.append(("epilogue", get_format("int4"), _GPU_CONFIGS[0], "fp16"))
        out.append(("prologue", get_format("int4"), _GPU_CONFIGS[0], "fp16"))
    return out


def _compile(kind, spec, cfg, dtype, arch):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource

    from agoq_cuda.fusion import kernels as K
    from agoq_triton_kernels.layout import KIND_IDS

    p16 = "*bf16" if dtype == "bf16" else "*fp16"
    fmt = {"KIND": KIND_IDS[spec.kind], "BITS": spec.bits, "BLOCK": spec.block}
    flt = 1 if dtype == "bf16" else 2
    if kind == "epilogue":
        fn = K.gemm_quant_epilogue_kernel
        sig = {"x_ptr": p16, "w_ptr": p16, "b_ptr": p16, "y_ptr": p16, "codes_ptr": "*i8", "scales_ptr": "*fp32",
               "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_wn": "i32", "M_KEY": "i32"}
        const = dict(stride_xk=1, stride_wk=1, HAS_BIAS=False, FLOAT=flt, INTERP=False, QMAX=float(spec.qmax), **fmt,
                     BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, EVEN_K=True)
    elif kind == "epilogue-tma":
        fn = K.gemm_quant_epilogue_tma_kernel
        el = p16[1:]
        sig = {"x_desc": f"tensordesc<{el}[{cfg.block_m},{cfg.block_k}]>",
               "w_desc": f"tensordesc<{el}[{cfg.block_n},{cfg.block_k}]>", "b_ptr": p16, "y_ptr": p16,
               "codes_ptr": "*i8", "scales_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "M_KEY": "i32"}
        const = dict(HAS_BIAS=False, FLOAT=flt, INTERP=False, QMAX=float(spec.qmax), **fmt, BLOCK_M=cfg.block_m,
                     BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, NUM_PROGRAMS=132)
    else:
        fn = K.gemm_dequant_prologue_kernel
        sig = {"g_ptr": p16, "codes_ptr": "*i8", "scales_ptr": "*fp32", "lut_ptr": "*fp32", "m_ptr": p16,
               "out_ptr": p16, "M": "i32", "N": "i32", "K": "i32", "stride_gm": "i32", "stride_mm": "i32",
               "M_KEY": "i32"}
        const = dict(stride_gn=1, stride_mk=1, HAS_MUL=kind == "prologue+mul", FLOAT=flt, INTERP=False,
                     NF4_LUT=False, **fmt,
                     BLOCK_N=cfg.block_m, BLOCK_K=cfg.block_n, BLOCK_R=cfg.block_k, GROUP_M=cfg.group_m)
    # Triton's JIT marks 16-byte-aligned pointers and ints divisible by 16 (every LLaMA size) like this.
    attrs = {(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k in sig if not sig[k].startswith("tensordesc")}
    for k in const:
        sig[k] = "constexpr"
    src = ASTSource(fn, {k: sig[k] for k in fn.arg_names}, const, attrs)
    t0 = time.time()
    ck = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                        options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    secs = time.time() - t0
    ttgir = ck.asm["ttgir"]
    regs, spill = _resource_usage(ck.asm["cubin"])
    return {
        "kernel": kind, "fmt": spec.name, "block": spec.block, "dtype": dtype,
        "tile": [cfg.block_m, cfg.block_n, cfg.block_k], "warps": cfg.num_warps, "stages": cfg.num_stages,
        "compile_s": round(secs, 2), "shared_bytes": ck.metadata.shared,
        "pipelined_loads": ttgir.count("async_copy_global_to_local") + ttgir.count("async_tma_copy"),
        "wgmma": "warp_group_dot" in ttgir, "registers": regs, "spill_bytes": spill,
    }


def _resource_usage(cubin: bytes) -> tuple[int | None, int | None]:
    """(registers per thread, spill store bytes) from the bundled cuobjdump; (None, None) if unavailable."""
    import subprocess
    import tempfile

    from triton.backends.nvidia import compiler as nv

    try:
        tool = os.path.join(os.path.dirname(nv.__file__), "bin", "cuobjdump")
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubin)
            f.flush()
            txt = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, timeout=60).stdout
    except Exception:  # informational only
        return None, None
    regs = re.search(r"REG:(\d+)", txt)
    spill = re.search(r"STACK:(\d+)", txt)
    return (int(regs.group(1)) if regs else None), (int(spill.group(1)) if spill else None)


def compile_variants(*, quick: bool = True, arch: int = 90) -> list[dict]:
    if os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on"):
        raise RuntimeError("compile_check needs real Triton JIT functions: run it with TRITON_INTERPRET unset")
    return [_compile(*v, arch) for v in _variants(quick)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, default=90, help="CUDA compute capability x10 (90 = H100/H200)")
    ap.add_argument("--quick", action="store_true", help="one tile config, int4 only")
    ap.add_argument("--json", help="write the records here")
    a = ap.parse_args(argv)
    recs = compile_variants(quick=a.quick, arch=a.arch)
    for r in recs:
        print(f"{r['kernel']:12s} {r['fmt']:9s} {r['dtype']} tile {'x'.join(map(str, r['tile']))} w{r['warps']} "
              f"s{r['stages']}: {r['compile_s']:5.1f}s shared {r['shared_bytes'] / 1024:6.1f} KiB, "
              f"pipelined loads {r['pipelined_loads']}, wgmma {r['wgmma']}, regs {r['registers']}, "
              f"stack {r['spill_bytes']} B")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(recs, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
