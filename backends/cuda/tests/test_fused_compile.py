"""The fused kernels compile for sm_90 through Triton's real NVIDIA pipeline on both tiles (the interpreter the other
tests run in accepts programs the compiler rejects), and the 16-lane tile's loop is the shorter one where it is the
default (a static count: ``python -m agoq_cuda.codec_isa --fused``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def test_fused_kernels_compile_for_sm90_on_both_tiles(tmp_path):
    pytest.importorskip("triton.backends.nvidia")
    out = tmp_path / "fused.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the compiler, not the interpreter
    r = subprocess.run([sys.executable, "-m", "agoq_cuda.codec_isa", "--fused", "--formats", "int4", "nf4",
                        "--json", str(out)], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = {(x["op"], x["fmt"], x["tile"]): x for x in json.loads(out.read_text())}
    assert len(recs) == 12  # 3 ops x 2 formats x 2 tiles
    if "loop_per_element" not in next(iter(recs.values())):
        pytest.skip("cuobjdump not available: compiled, not counted")
    for op in ("silu_mul_quant", "silu_mul_backward", "rmsnorm_quant"):
        for fmt in ("int4", "nf4"):
            assert recs[(op, fmt, "vec16")]["loop_per_element"] < recs[(op, fmt, "generic")]["loop_per_element"], op


def test_codec_kernel_counts_still_compile(tmp_path):
    """The codec kernels' path of codec_isa (shared compile-and-count helper with --fused)."""
    pytest.importorskip("triton.backends.nvidia")
    out = tmp_path / "codec.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-m", "agoq_cuda.codec_isa", "--formats", "nf4", "--ops", "quantize",
                        "dequantize", "--json", str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = json.loads(out.read_text())
    assert [(x["op"], x["fmt"]) for x in recs] == [("quantize", "nf4"), ("dequantize", "nf4")]
    assert all(x["elements_per_tile"] == x["rows"] * 128 for x in recs)  # nf4 blocks of 128 (the default)


_CAPS_SCRIPT = """
import json, sys
from agoq_cuda import codec_isa
from agoq_cuda.launch import MAXNREG
out = []
for (op, fmt, vec16), cap in sorted(MAXNREG.items()):
    for m in (cap, 0):  # as launched without the prefetch (a prefetching launch takes no cap), then uncapped
        r = codec_isa.compile_fused(op, fmt, vec16, maxnreg=m, prefetch=False)
        out.append({"op": op, "fmt": fmt, "vec16": vec16, "cap": m, "registers": r["registers"],
                    "spills": r.get("local_memory_ops")})
json.dump(out, sys.stdout)
"""


def test_fused_register_caps_spill_nothing_and_are_needed():
    """agoq_cuda.launch.MAXNREG: each capped fused kernel fits its cap without a register spill (no local-memory op
    in its sm_90 SASS), and without the cap ptxas takes more registers (so the cap buys a program per SM)."""
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _CAPS_SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = json.loads(r.stdout)
    if any(x["registers"] is None or x["spills"] is None for x in recs):
        pytest.skip("cuobjdump not available: compiled, not counted")
    for capped, free in zip(recs[::2], recs[1::2]):
        assert capped["registers"] <= capped["cap"] and capped["spills"] == 0, capped
        assert free["registers"] > capped["cap"], free


def test_microscaling_kernels_compile_for_sm90_with_and_without_hw():
    """mx_quantize_tile's two paths (HW: div.rn and mul.rn; portable: codes.exact_div and the sign OR), and NVFP4's
    tensor-scale pass (absmax_kernel, tensor_scale_kernel), through Triton's real NVIDIA pipeline: the
    interpreter the bit tests run in accepts programs the compiler rejects. Nothing spills."""
    pytest.importorskip("triton.backends.nvidia")
    code = """
import json
from agoq_cuda import codec_isa as ci
from agoq_triton_kernels import kernels as K
recs = [ci.compile_codec("quantize", f, hw=hw) for f in ("nvfp4", "mxfp4", "mxfp8") for hw in (True, False)]
recs.append(ci._compile_and_count(K.tensor_scale_kernel, {"part_ptr": "*fp32", "n_parts": "i32", "out_ptr": "*fp32"},
                                  dict(DIVISOR=2688.0, MIN_SCALE=2.0 ** -100, BLOCK_P=1024), 4, 1, 90,
                                  {"op": "tensor_scale", "fmt": "nvfp4"}))
recs.append(ci._compile_and_count(K.absmax_kernel, {"x_ptr": "*i16", "part_ptr": "*fp32", "n": "i32", "n_blocks": "i32",
                                  "n_tiles": "i32"}, dict(BLOCK=16, BLOCK_P=16, ROWS=128, RAGGED=False, X_FLOAT=1), 4,
                                  2048, 90, {"op": "absmax", "fmt": "nvfp4"}))
print(json.dumps([{k: v for k, v in r.items() if not k.startswith("_")} for r in recs]))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = json.loads(r.stdout.strip().splitlines()[-1])
    assert [(x["op"], x["fmt"]) for x in recs][-2:] == [("tensor_scale", "nvfp4"), ("absmax", "nvfp4")]
    assert len(recs) == 8 and all(x["ptx_lines"] > 0 for x in recs)
    assert all(x.get("local_memory_ops", 0) == 0 for x in recs), [x["op"] for x in recs if x.get("local_memory_ops")]
