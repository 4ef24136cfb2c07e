"""Compile every Ascend kernel variant with the real Triton-Ascend frontend, as far as it goes without an NPU.

Runs in a venv with ``triton-ascend`` (NOT upstream triton; see frontend_compile.sh, which makes one):

    python backends/ascend/scripts/frontend_compile.py [--quick] [--keep DIR] [--json OUT]

For each kernel (quantize, dequantize, accumulate, reduce_requantize) x format (the microscaling ones
included; nvfp4 has no accumulate / reduce_requantize) x I/O dtype x launch kind (whole blocks / ragged last
block) with the constexprs agoq-ascend launches (HW=False, NF4_LUT=False, Ascend tile geometry), and for
NVFP4's tensor-scale pass (absmax_kernel, tensor_scale_kernel), it runs:

1. Triton-Ascend's Python frontend: the kernel source -> Triton IR (``make_ir``), then its TTIR passes
   (``make_ttir``: inliner, combine, canonicalize, CSE, LICM, loop unroll);
2. ``triton-adapter-opt --discrete-mask-access-conversion`` alone, and fails if any masked ``tt.load`` or
   ``tt.store`` lost its mask: that is the pass's fallback for masks its mask analysis cannot parse
   (full-block loads plus select, read-modify-write stores bounded only by the tile: risk 3 of
   docs/backends/ascend.md);
3. the whole Triton IR -> linalg/HIVM pipeline of ``ttir_to_linalg`` (discrete-mask conversion,
   annotation, unstructure, triton-to-hivm/hfusion/llvm, bubble-up, triton-to-linalg) and fails on any
   pass that rejects the kernel;
4. checks the Triton IR for operations the Ascend path must not contain: floating-point division
   (risk 1: the quotients are division-free), fp8 types, and unsigned int compares; and that
   reduce_requantize computes its rank offsets in int64;
5. checks the linalg IR for global-memory views (``memref.reinterpret_cast`` of a kernel argument) whose
   innermost stride is not 1: a load or store that Triton-Ascend can only move element by element (its
   migration guide: a non-contiguous tail axis gets an extra size-1 axis padded to 32 bytes per element,
   "discrete memory access"). The 5/6-bit packing used to store and load one byte per pack group with a
   stride of 5/3 bytes (risk 5); agoq-ascend now launches the contiguous layout (kernels.CONTIG).

It stops before the device binary: that step needs CANN's ``bishengir-compile``, which the script looks for
and reports (with it on PATH, ``--bishengir`` also runs the A2/A3 binary step). Exit status 0 iff every
variant passed. Nothing here needs or touches an NPU.
"""
from __future__ import annotations

import argparse
import inspect
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path[:0] = [str(REPO / "backends" / "triton_common")]

FORMATS = {  # name: (kind, bits, block, qmax), as agoq_core.formats registers them
    "int4": ("int", 4, 128, 7.0), "int5": ("int", 5, 128, 15.0), "int6": ("int", 6, 128, 31.0),
    "int8": ("int", 8, 128, 127.0), "fp4_e2m1": ("fp4_e2m1", 4, 128, 6.0), "nf4": ("nf4", 4, 128, 1.0),
    "fp8_e4m3": ("fp8_e4m3", 8, 256, 448.0), "fp8_e5m2": ("fp8_e5m2", 8, 256, 57344.0),
    # the microscaling formats: (kind, bits, block, qmax, scale kind); NVFP4 has no accumulate/reduce_requantize
    "mxfp4": ("fp4_e2m1", 4, 32, 6.0, "e8m0"), "mxfp8": ("fp8_e4m3", 8, 32, 448.0, "e8m0"),
    "nvfp4": ("fp4_e2m1", 4, 16, 6.0, "e4m3_tensor"),
}
#: op x format pairs the launcher refuses (agoq_core.api: a per-tensor scale cannot be requantized blockwise)
REFUSED = {("accumulate", "nvfp4"), ("reduce_requantize", "nvfp4")}
DTYPES = {"float32": ("*fp32", 0), "bfloat16": ("*i16", 1), "float16": ("*fp16", 2)}
OPS = ("quantize", "dequantize", "accumulate", "reduce_requantize")
ROWS = 8  # a typical planner choice (the IR does not depend on it beyond shapes)


def _die(msg: str) -> None:
    print(f"frontend_compile: {msg}", file=sys.stderr)
    raise SystemExit(2)


def _check_triton_ascend():
    try:
        import triton
        from triton.backends.ascend import compiler as ascend_compiler  # noqa: F401
    except ImportError as e:
        _die(f"triton-ascend is not importable here ({e}); run frontend_compile.sh, which makes a venv with it")
    return triton


def launch_constexprs(fmt: str, ragged: bool) -> dict:
    """The format and geometry constexprs agoq-ascend launches (agoq_ascend.launch.AscendGeometry: HW False,
    NF4_LUT False, contig_pack True; backends/ascend/tests/test_ascend_contiguous_packing.py checks them)."""
    from agoq_triton_kernels.layout import format_constexprs

    kind, bits, block, qmax, *scale = FORMATS[fmt]
    c = format_constexprs(kind=kind, bits=bits, block=block, qmax=qmax, scale_kind=scale[0] if scale else "absmax")
    c.update(BLOCK_P=max(32, c["BLOCK_P"]), ROWS=1 if ragged else ROWS, RAGGED=ragged, HW=False, NF4_LUT=False,
             CONTIG=True)
    return c


def _variant_args(op: str, fmt: str, dtype: str, ragged: bool):
    c = launch_constexprs(fmt, ragged)
    ptr, fk = DTYPES[dtype]
    sizes = {"n": "i32", "n_blocks": "i32", "n_tiles": "i32"}
    if op == "quantize":
        sig = {"x_ptr": ptr, "codes_ptr": "*i8", "scales_ptr": "*fp32", **sizes}
        c.update(X_FLOAT=fk, elut_ptr=None, NF4_LUT=False)
        if c.get("SCALE") == 2:  # NVFP4: [S, RN(1/S)] from Launcher.tensor_scale
            sig["ts_ptr"] = "*fp32"
    elif op == "dequantize":
        sig = {"codes_ptr": "*i8", "scales_ptr": "*fp32", "lut_ptr": "*fp32", "out_ptr": ptr, **sizes}
        c.update(OUT_FLOAT=fk, NF4_LUT=False)
    elif op == "accumulate":
        sig = {"codes_ptr": "*i8", "scales_ptr": "*fp32", "lut_ptr": "*fp32", "g_ptr": ptr, **sizes}
        c.update(G_FLOAT=fk, NF4_LUT=False, elut_ptr=None)
    else:
        sig = {"codes_ptr": "*i8", "scales_ptr": "*fp32", "lut_ptr": "*fp32", "codes_out_ptr": "*i8",
               "scales_out_ptr": "*fp32", **sizes, "world": "i32", "codes_stride": "i32", "scales_stride": "i32"}
        c.update(NF4_LUT=False, elut_ptr=None)
    from agoq_triton_kernels import kernels as K

    fn = getattr(K, f"{op}_kernel")
    for prm in fn.params:  # parameters agoq-ascend leaves at their defaults (e.g. SCALE=0, ts_ptr=None)
        if prm.name not in sig and prm.name not in c:
            default = prm.default if prm.has_default else None
            c[prm.name] = None if default is inspect.Parameter.empty else default
    for k in c:
        sig[k] = "constexpr"
    return {p.name: sig[p.name] for p in fn.params}, c


def _masked_mem_ops(ir_text: str) -> tuple[int, int]:
    """(masked tt.load count, masked tt.store count) in MLIR text: a mask is a second operand."""
    loads = stores = 0
    for line in ir_text.splitlines():
        m = re.search(r"\btt\.(load|store)\s+([^:{]*)", line)
        if not m:
            continue
        operands = [o for o in m.group(2).split(",") if o.strip()]
        if m.group(1) == "load" and len(operands) >= 2:
            loads += 1
        elif m.group(1) == "store" and len(operands) >= 3:
            stores += 1
    return loads, stores


_FORBIDDEN = {
    "floating-point division (risk 1: Ascend quotients must be division-free)": re.compile(r"arith\.divf|tt\.precise_divf"),
    "fp8 type (A2/A3 have no FP8)": re.compile(r"\bf8E"),
    "unsigned compare (uint32 is unsupported on Ascend)": re.compile(r"arith\.cmpi\s+u(lt|le|gt|ge)"),
}


_GM_VIEW = re.compile(r"memref\.reinterpret_cast %arg\d+ to offset: \[[^\]]*\], sizes: \[([^\]]*)\], "
                      r"strides: \[([^\]]*)\]")


def strided_gm_views(linalg_text: str) -> list[str]:
    """Global-memory views in linalg IR whose innermost stride is not 1 (element-by-element transfers)."""
    return [f"sizes [{m.group(1)}] strides [{m.group(2)}]" for m in _GM_VIEW.finditer(linalg_text)
            if m.group(2).split(",")[-1].strip() != "1"]


def nvfp4_scale_variants(dtypes) -> list[tuple[str, str, dict, dict]]:
    """(name, kernel, signature, constexprs) of NVFP4's tensor-scale pass as the shared launcher runs it on
    agoq-ascend (Launcher.tensor_scale): absmax_kernel per I/O dtype, whole and ragged, then the one-program
    tensor_scale_kernel (division-free: no arith.divf may appear)."""
    out = []
    for dtype, ragged in itertools.product(dtypes, (False, True)):
        ptr, fk = DTYPES[dtype]
        sig = {"x_ptr": ptr, "part_ptr": "*fp32", "n": "i32", "n_blocks": "i32", "n_tiles": "i32"}
        c = {k: launch_constexprs("nvfp4", ragged)[k] for k in ("BLOCK", "BLOCK_P", "ROWS", "RAGGED")}
        c["X_FLOAT"] = fk
        out.append((f"absmax-nvfp4-{dtype}-{'ragged' if ragged else 'whole'}", "absmax_kernel",
                    {**sig, **{k: "constexpr" for k in c}}, c))
    # agoq_core.formats.mx's NVFP4_SCALE_DIVISOR / NVFP4_MIN_TENSOR_SCALE (not importable here: that venv has no torch)
    c = dict(DIVISOR=448.0 * 6.0, MIN_SCALE=2.0 ** -100, BLOCK_P=1024)
    out.append(("tensor_scale-nvfp4-float32-whole", "tensor_scale_kernel",
                {"part_ptr": "*fp32", "n_parts": "i32", "out_ptr": "*fp32", **{k: "constexpr" for k in c}}, c))
    return out


def _compile(triton, name, kernel, sig, consts, adapter, keep, bishengir):
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, make_backend

    from agoq_triton_kernels import kernels as K

    fn = getattr(K, kernel)
    target = GPUTarget("npu", "Ascend910B3", 0)
    backend = make_backend(target)
    options = backend.parse_options({"multibuffer": True, "enable_fp_fusion": False})
    src = ASTSource(fn, sig, consts)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    mod = src.make_ir(options, backend.get_codegen_implementation(), backend.get_module_map(), context)
    metadata = {"hash": src.hash(), "target": target, **options.__dict__}
    stages: dict = {}
    backend.add_stages(stages, options)
    ttir = stages["ttir"](mod, metadata)
    ttir_text = str(ttir)
    problems = []
    for what, pat in _FORBIDDEN.items():
        if pat.search(ttir_text):
            problems.append(f"Triton IR contains {what}")
    if kernel == "reduce_requantize_kernel" and not re.search(r"arith\.muli [^\n]*: i64", ttir_text):
        problems.append("the rank offset r * codes_stride is not computed in int64 (it passes 2**31 for big chunks)")
    with tempfile.TemporaryDirectory() as tmp:
        src_path = Path(tmp) / "kernel.ttir.mlir"
        src_path.write_text(ttir_text)
        dm_path = Path(tmp) / "kernel.discrete.mlir"
        r = subprocess.run([adapter, str(src_path), "--discrete-mask-access-conversion=compile-on-910-95=False "
                            "force-simt-template=False", "-o", str(dm_path)], capture_output=True, text=True)
        if r.returncode:
            problems.append(f"discrete-mask-access-conversion rejected it: {r.stderr.strip()[-800:]}")
        else:
            before, after = _masked_mem_ops(ttir_text), _masked_mem_ops(dm_path.read_text())
            if after != before:
                problems.append(f"discrete-mask fallback: masked (loads, stores) {before} -> {after} "
                                "(a mask the mask analysis could not parse became a full-block access)")
    linalg = None
    try:
        linalg = stages["ttadapter"](ttir, metadata)
    except subprocess.CalledProcessError as e:
        err = (e.stderr or b"").decode(errors="replace").strip()
        problems.append(f"ttir_to_linalg (triton-adapter-opt pipeline) failed: {err[-1500:]}")
    if linalg is not None:
        strided = strided_gm_views(linalg)
        if strided:
            problems.append(f"discrete global-memory access (innermost stride != 1): {'; '.join(sorted(set(strided)))} "
                            f"x{len(strided)}")
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        (keep / f"{name}.ttir.mlir").write_text(ttir_text)
        if linalg is not None:
            (keep / f"{name}.linalg.mlir").write_text(linalg)
    if linalg is not None and bishengir:
        try:
            stages["npubin"](linalg, metadata)
        except Exception as e:  # noqa: BLE001  (report whatever the device compiler says)
            problems.append(f"bishengir-compile failed: {str(e)[-1500:]}")
    return name, problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="float32 I/O only (87 variants instead of 219)")
    ap.add_argument("--keep", type=Path, help="write each variant's Triton IR and linalg IR here")
    ap.add_argument("--json", type=Path, help="write the results as JSON here")
    ap.add_argument("--bishengir", action="store_true",
                    help="also run the device-binary step (needs CANN's bishengir-compile on PATH)")
    ap.add_argument("-k", default="", help="only variants whose name contains this")
    args = ap.parse_args(argv)
    triton = _check_triton_ascend()
    from triton.backends.ascend.utils import _get_triton_adapter_opt_path

    adapter = _get_triton_adapter_opt_path()
    bishengir = shutil.which("bishengir-compile")
    print(f"triton-ascend {triton.__version__}; triton-adapter-opt: {adapter}; bishengir-compile: "
          f"{bishengir or 'absent (stopping before the device binary)'}")
    if args.bishengir and not bishengir:
        _die("--bishengir: bishengir-compile is not on PATH (source CANN's set_env.sh)")
    dtypes = ["float32"] if args.quick else list(DTYPES)
    variants = []
    for op, fmt, dtype, ragged in itertools.product(OPS, FORMATS, dtypes, (False, True)):
        if (op == "reduce_requantize" and dtype != "float32") or (op, fmt) in REFUSED:
            continue  # reduce_requantize's inputs are codes: no float I/O dtype
        variants.append((f"{op}-{fmt}-{dtype}-{'ragged' if ragged else 'whole'}", f"{op}_kernel",
                         *_variant_args(op, fmt, dtype, ragged)))
    variants += nvfp4_scale_variants(dtypes)
    results, t0 = [], time.time()
    for name, kernel, sig, consts in variants:
        if args.k not in name:
            continue
        t = time.time()
        try:
            name, problems = _compile(triton, name, kernel, sig, consts, adapter, args.keep,
                                      bishengir if args.bishengir else None)
        except Exception as e:  # noqa: BLE001  (a frontend rejection is a result, not a crash)
            problems = [f"frontend error: {type(e).__name__}: {str(e)[-1500:]}"]
        results.append({"variant": name, "ok": not problems, "problems": problems, "seconds": round(time.time() - t, 2)})
        print(f"{'ok  ' if not problems else 'FAIL'} {name} ({time.time() - t:.1f}s)")
        for p in problems:
            print(f"     {p}")
    bad = [r for r in results if not r["ok"]]
    total = time.time() - t0
    print(f"{len(results) - len(bad)}/{len(results)} variants passed the Triton-Ascend frontend in {total:.0f}s "
          f"(device binary: {'compiled' if args.bishengir else 'not attempted'})")
    if args.json:
        args.json.write_text(json.dumps({"triton_ascend": triton.__version__, "bishengir_compile": bishengir,
                                         "seconds": round(total, 1), "results": results}, indent=1))
    return 1 if bad or not results else 0


if __name__ == "__main__":
    raise SystemExit(main())
