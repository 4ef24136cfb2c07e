"""The 16-lane tile chosen per (op, format): AGOQ_CUDA_VEC16 / CudaGeometry(vec16=...) rules, the defaults
table, and the rule they fall back to; either tile gives the same bits."""
from __future__ import annotations

import pytest
import torch

from agoq_core.formats import reference as ref
from agoq_core.formats.spec import get_format
from agoq_cuda import launch as cl
from agoq_cuda.launch import CudaGeometry, parse_vec16
from agoq_triton_kernels.launch import Launcher
from cuda_inputs import assert_bits_equal


def test_parse():
    assert parse_vec16(None) == {("*", "*"): None}
    assert parse_vec16("0") == {("*", "*"): False}
    assert parse_vec16(" ON ") == {("*", "*"): True}
    assert parse_vec16("dequantize=0, dequantize:int5=1,*:nf4=auto") == {
        ("dequantize", "*"): False, ("dequantize", "int5"): True, ("*", "nf4"): None}
    for bad in ("dequantise=0", "dequantize", "dequantize=maybe"):
        with pytest.raises(ValueError, match="AGOQ_CUDA_VEC16"):
            parse_vec16(bad)


def _vec16(geo, op, fmt):
    return geo.plan(op, get_format(fmt), 4096, torch.bfloat16, torch.device("cpu"), rows=None, programs=None).vec16


def test_rules_defaults_and_rule(monkeypatch):
    auto = CudaGeometry(vec16="auto")
    assert _vec16(auto, "dequantize", "int5") and _vec16(auto, "quantize", "int4")
    # the measured table (2026-12-02): dequantize of 4/8-bit codes is faster on the generic tile
    assert not _vec16(auto, "dequantize", "int8") and not _vec16(auto, "dequantize", "fp8_e4m3")
    assert _vec16(auto, "quantize", "int8") and _vec16(auto, "accumulate", "fp8_e4m3")
    assert _vec16(auto, "reduce_requantize", "int8") and not _vec16(auto, "reduce_requantize", "int4")
    g = CudaGeometry(vec16="dequantize=0,dequantize:int5=1")
    assert not _vec16(g, "dequantize", "int8") and _vec16(g, "dequantize", "int5") and _vec16(g, "quantize", "int8")
    assert _vec16(CudaGeometry(vec16="1"), "reduce_requantize", "int4")
    assert not _vec16(CudaGeometry(vec16="*:int4=0"), "accumulate", "int4")
    # the fused kernels (2026-12-02 19:00): int4 SiLU&Mul backward generic; RMSNorm+quantize 16-lane for nf4 only
    vec = auto.vec16_for
    assert not vec("silu_mul_backward", get_format("int4")) and vec("silu_mul_backward", get_format("nf4"))
    assert vec("silu_mul_quant", get_format("int4"))
    assert vec("rmsnorm_quant", get_format("nf4")) and not vec("rmsnorm_quant", get_format("int4"))
    assert CudaGeometry(vec16="rmsnorm_quant=1").vec16_for("rmsnorm_quant", get_format("int4"))
    monkeypatch.setitem(cl.VEC16_DEFAULTS, ("dequantize", "int5"), False)
    assert not _vec16(auto, "dequantize", "int5")
    assert _vec16(CudaGeometry(vec16="dequantize:int8=1"), "dequantize", "int8")  # a rule beats the table
    monkeypatch.setenv("AGOQ_CUDA_VEC16", "quantize=0")
    assert not _vec16(CudaGeometry(), "quantize", "int4")


@pytest.mark.parametrize("fmt", ["int4", "fp8_e4m3"])
def test_both_tiles_same_bits(fmt, device):
    spec = get_format(fmt)
    n = 2 * spec.block
    x = (torch.randn(n, generator=torch.Generator().manual_seed(3)) * 3).to(torch.bfloat16)
    codes, scales = ref.quantize_blocks(x, spec)
    want = ref.dequantize_blocks(codes, scales, spec, n, torch.bfloat16)
    for rule in ("dequantize=0", "dequantize=1"):
        la = Launcher(CudaGeometry(vec16=rule))
        out = torch.empty(n, dtype=torch.bfloat16, device=device)
        la.dequantize(codes.to(device), scales.to(device), spec, out)
        assert_bits_equal(out, want, f"{fmt} {rule}")
