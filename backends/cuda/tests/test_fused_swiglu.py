"""Fused SiLU&Mul + quantize (forward) and SiLU&Mul backward with the decode inside
(agoq_cuda.fused_swiglu), against the unfused path written with torch: the reference codec, F.silu and
autograd's SiLU backward. Bit for bit."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from agoq_core.formats import reference as ref
from agoq_core.formats.spec import get_format
from agoq_cuda.fused_swiglu import (silu_mul_backward_into, silu_mul_backward_unsupported, silu_mul_backward_variants,
                                    silu_mul_quant_into, silu_mul_quant_unsupported, silu_mul_quant_variants)
from cuda_inputs import assert_bits_equal


def _bufs(spec, n, device):
    return [torch.full((spec.code_bytes(n),), 0xA5, dtype=torch.uint8, device=device),
            torch.full((spec.num_blocks(n),), -7.0, device=device),
            torch.full((spec.code_bytes(n),), 0x5A, dtype=torch.uint8, device=device),
            torch.full((spec.num_blocks(n),), -9.0, device=device)]


def _unfused_backward(dh, g, u):
    """SwiGLUFunction's unfused chunk: a = silu(g) under autograd, h = a * u, du = dh * a, dg = silu'(dh * u)."""
    g = g.detach().requires_grad_(True)
    with torch.enable_grad():
        a = F.silu(g)
    (dg,) = torch.autograd.grad(a, (g,), dh * u)
    return a.detach() * u, dg, dh * a.detach()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_silu_every_16_bit_input(dtype, device):
    """h = silu(g) * 1 for all 65,536 bit patterns of g: each variant the device offers either equals
    F.silu everywhere or is reported as not matching (the LAAQ check then skips it); at least one equals."""
    spec = get_format("int8")
    g = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)
    g = torch.where(torch.isfinite(g), g, torch.zeros_like(g)).to(device)
    u = torch.ones_like(g)
    want = F.silu(g)
    matching = []
    for v in silu_mul_quant_variants(g.device):
        h = torch.empty_like(g)
        silu_mul_quant_into(g, u, spec, h, *_bufs(spec, g.numel(), device), variant=v)
        if torch.equal(h.view(torch.int16), want.view(torch.int16)):
            matching.append(v)
    assert matching, "no variant reproduces F.silu"
    if g.device.type == "cpu":  # the interpreter: numpy's exp matches torch's after the bf16 rounding
        assert ("exp" in matching) == (dtype == torch.bfloat16) and "table" in matching


_FORMATS = ["nf4", "int4", "fp4_e2m1", "int5", "int6", "fp8_e4m3", "mxfp4", "mxfp8"]


@pytest.mark.parametrize("fmt,dtype,vec16", [
    *[(f, d, t) for t in (False, True) for d in (torch.bfloat16, torch.float16) for f in _FORMATS],
    *[(f, torch.bfloat16, "paired") for f in ("nf4", "int4", "mxfp4")]])
def test_forward_and_backward_match_unfused(fmt, dtype, vec16, device, monkeypatch):
    """Both tiles (the generic one and the codec kernels' 16-lane tile), every variant the device offers;
    ``paired``: the 16-lane backward with its bf16 roundings paired (AGOQ_CUDA_BACKWARD_PAIRED, off by default)."""
    if vec16 == "paired":
        monkeypatch.setenv("AGOQ_CUDA_BACKWARD_PAIRED", fmt)
        vec16 = True
    spec = get_format(fmt)
    gen = torch.Generator().manual_seed(3)
    rows, cols = 6, 256
    gate = (torch.randn(rows, cols, generator=gen) * 4).to(dtype)
    up = (torch.randn(rows, cols, generator=gen) * 2).to(dtype)
    gate[1, :spec.block] = 0.0                       # a zero block
    gate[2, 5], up[3, 7] = 60000.0 if dtype == torch.float16 else 3e38, 1e-30  # near max, subnormal-ish
    dh = torch.randn(rows, cols, generator=gen).to(dtype)
    gate, up, dh = gate.to(device), up.to(device), dh.to(device)
    n = gate.numel()
    bufs = _bufs(spec, n, device)
    fwd_ok = []
    for v in silu_mul_quant_variants(gate.device):
        h = torch.empty_like(gate)
        silu_mul_quant_into(gate, up, spec, h, *bufs, variant=v, vec16=vec16)
        for (c, s_), x in (((bufs[0], bufs[1]), gate), ((bufs[2], bufs[3]), up)):  # codes never vary
            rc, rs = ref.quantize_blocks(x.cpu(), spec)
            assert_bits_equal(c, rc, f"{fmt} codes ({v})")
            assert_bits_equal(s_, rs, f"{fmt} scales ({v})")
        if _same(h, F.silu(gate) * up):
            fwd_ok.append(v)
    # backward from the kept codes: decoded as dequantize writes them, then the unfused elementwise ops
    g = ref.dequantize_blocks(bufs[0].cpu(), bufs[1].cpu(), spec, n).to(dtype).view(rows, cols).to(device)
    u = ref.dequantize_blocks(bufs[2].cpu(), bufs[3].cpu(), spec, n).to(dtype).view(rows, cols).to(device)
    want = _unfused_backward(dh, g, u)
    bwd_ok = []
    for v in silu_mul_backward_variants(dh.device):
        outs = [torch.empty_like(dh) for _ in range(3)]
        silu_mul_backward_into(dh, *bufs, spec, *outs, variant=v, vec16=vec16)
        if all(_same(o, w) for o, w in zip(outs, want)):
            bwd_ok.append(v)
    assert fwd_ok and bwd_ok, (fwd_ok, bwd_ok)
    if device.type == "cpu":  # the interpreter: torch's own tables, and torch's CPU kernel contracts 1 + x(1 - s)
        assert "table" in fwd_ok and "table_fma64" in bwd_ok, (fwd_ok, bwd_ok)


def _same(a, b):
    a, b = a.cpu(), b.cpu()
    return torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(a[~torch.isnan(a)].view(torch.int16),
                                                                        b[~torch.isnan(b)].view(torch.int16))


def test_the_fma_variant_is_needed_on_cpu(device):
    """Teeth: without the single rounding of 1 + x(1 - s), some float16 gradients differ from torch's CPU kernel."""
    if device.type != "cpu":
        pytest.skip("torch's CPU kernel")
    spec = get_format("int8")
    gen = torch.Generator().manual_seed(1)
    g = (torch.randn(64, 256, generator=gen) * 0.3 - 1.28).to(torch.float16)  # 1 + x(1 - s) cancels near -1.28
    dh = torch.randn(64, 256, generator=gen).to(torch.float16)
    bufs = _bufs(spec, g.numel(), device)
    silu_mul_quant_into(g, torch.ones_like(g), spec, torch.empty_like(g), *bufs, variant="table")
    gd = ref.dequantize_blocks(bufs[0], bufs[1], spec, g.numel()).to(torch.float16).view(g.shape)
    ud = ref.dequantize_blocks(bufs[2], bufs[3], spec, g.numel()).to(torch.float16).view(g.shape)
    want = _unfused_backward(dh, gd, ud)[1]
    res = {}
    for v in ("table", "table_fma64"):
        outs = [torch.empty_like(dh) for _ in range(3)]
        silu_mul_backward_into(dh, *bufs, spec, *outs, variant=v)
        res[v] = _same(outs[1], want)
    assert res == {"table": False, "table_fma64": True}, res


def test_unsupported_calls_are_explained():
    spec = get_format("nf4")
    x = torch.zeros(4, 256, dtype=torch.bfloat16)
    assert silu_mul_quant_unsupported(x, x, spec) is None
    assert "bfloat16 or float16" in silu_mul_quant_unsupported(x.float(), x.float(), spec)
    assert "contiguous" in silu_mul_quant_unsupported(torch.zeros(4, 512, dtype=torch.bfloat16)[:, :256], x, spec)
    assert "whole blocks" in silu_mul_quant_unsupported(x[:, :100].contiguous(), x[:, :100].contiguous(), spec)
    assert "per-tensor scale" in silu_mul_quant_unsupported(x, x, get_format("nvfp4"))
    assert "differ" in silu_mul_quant_unsupported(x, x[:2], spec)
    assert silu_mul_backward_unsupported(x, spec) is None
    assert "contiguous" in silu_mul_backward_unsupported(x.t(), spec)
    with pytest.raises(ValueError, match="unknown variant"):
        silu_mul_quant_into(x, x, spec, torch.empty_like(x), *_bufs(spec, x.numel(), "cpu"), variant="bogus")


def test_the_16_lane_tile_is_taken_where_asked_and_allowed():
    """vec16=True runs the 16-lane tile when the blocks and code buffers allow it, the generic tile otherwise;
    vec16=None follows the launcher's rules (AGOQ_CUDA_VEC16; the fused norm's tile is off unless asked for)."""
    from agoq_cuda.launch import LAUNCHER, fused_vec16

    spec, n = get_format("int4"), 4 * 256
    c = torch.empty(spec.code_bytes(n) + 4, dtype=torch.uint8)
    for op, writes in (("silu_mul_quant", True), ("silu_mul_backward", False), ("rmsnorm_quant", True)):
        assert fused_vec16(op, spec, (c[:-4], c[4:]), writes=writes, vec16=True) == {"VEC16": True}
        assert fused_vec16(op, spec, (c[:-4], c[1:-3]), writes=writes, vec16=True) == {}  # int32 words: aligned
        assert fused_vec16(op, spec, (c[:-4], c[4:]), writes=writes, vec16=False) == {}
        assert fused_vec16(op, spec.with_block(8), (c[:-4], c[4:]), writes=writes, vec16=True) == {}  # block < 16
    i8 = get_format("int8")
    assert fused_vec16("silu_mul_backward", i8, (c[1:],), writes=False, vec16=True) == {"VEC16": True}  # read as bytes
    assert fused_vec16("silu_mul_quant", i8, (c[1:],), writes=True, vec16=True) == {}  # written as int32 words
    assert fused_vec16("rmsnorm_quant", spec, (c[:-4],), writes=True) == {}  # not timed on a GPU yet: opt-in
    old = LAUNCHER.geometry.vec16_rules
    try:
        LAUNCHER.geometry.vec16_rules = {("silu_mul_backward", "*"): False, ("rmsnorm_quant", "*"): True}
        assert fused_vec16("silu_mul_backward", spec, (c[:-4], c[4:]), writes=False) == {}
        assert fused_vec16("silu_mul_quant", spec, (c[:-4], c[4:]), writes=True) == {"VEC16": True}
        assert fused_vec16("rmsnorm_quant", spec, (c[:-4],), writes=True) == {"VEC16": True}
    finally:
        LAUNCHER.geometry.vec16_rules = old


def test_bench_swiglu_tiles_smoke(tmp_path):
    """benchmarks/bench_swiglu_tiles.py --smoke: both tiles run, write the same bits, and the report says so."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    out = tmp_path / "t.json"
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_swiglu_tiles.py"), "--smoke", "--formats",
                        "int4", "--json", str(out)], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, TRITON_INTERPRET="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert {(x["op"], x["tile"]) for x in rows} == {(o, t) for o in ("silu_mul_quant", "silu_mul_backward")
                                                   for t in ("generic", "vec16")}
    assert all(x["tiles_bit_identical"] and x["ms"] > 0 for x in rows)
