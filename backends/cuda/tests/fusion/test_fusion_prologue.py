"""gemm_dequant_prologue: dW = dYᵀ · D(X) with X read from its quantized copy, never materialised.

Oracle: float64 dYᵀ @ D_ref(X), where D_ref is the reference dequantize to dY's dtype (the operand the
unfused path materialises), within the SQNR floor; NaN blocks of X must give NaN dW columns exactly.
"""
from __future__ import annotations

import pytest
import torch

import agoq_core
from agoq_core.formats import reference as ref
from agoq_core.formats.spec import activation_formats
from agoq_cuda.fusion import gemm_dequant_prologue
from agoq_cuda.fusion.launch import TileConfig
from agoq_core.testing.tolerances import sqnr_db, sqnr_floor
from fusion_helpers import ref_weight_grad

DTYPES = [torch.bfloat16, torch.float16]


def _inputs(m, n, k, dtype, fmt, seed, *, block=None, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    dy = torch.randn(m, n, generator=g).to(dtype)
    x = (torch.randn(m, k, generator=g) * 3).to(dtype)
    q = agoq_core.quantize(x, fmt, block=block, backend="reference")
    return dy.to(device), q.to(device), q


def _want(dy, q_cpu):
    d = ref.dequantize_blocks(q_cpu.codes, q_cpu.scales, q_cpu.spec, q_cpu.numel, dy.dtype).view(q_cpu.shape)
    return ref_weight_grad(dy.reshape(-1, dy.shape[-1]), d.reshape(-1, d.shape[-1])), d


def _check(out, dy, q_cpu):
    want, d = _want(dy, q_cpu)
    assert out.shape == want.shape and out.dtype == dy.dtype
    assert torch.equal(torch.isnan(out.cpu()), torch.isnan(want)), "NaN pattern of dW"
    s = sqnr_db(out, want)
    assert s >= sqnr_floor(dy.dtype), f"dW SQNR {s:.1f} dB < {sqnr_floor(dy.dtype)} dB"
    return s, d


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "f16"])
@pytest.mark.parametrize("fmt", activation_formats())
def test_weight_grad_within_floor(fmt, dtype, device):
    dy, q, q_cpu = _inputs(75, 48, 256, dtype, fmt, seed=len(fmt) + 1, device=device)
    out = gemm_dequant_prologue(dy, q)
    s, d = _check(out, dy, q_cpu)
    # As accurate as the unfused path LAAQ runs today: dequantize, then torch's GEMM (x2ᵀ·g2)ᵀ.
    unfused = d.t().mm(dy.cpu()).t()
    assert s >= sqnr_db(unfused, _want(dy, q_cpu)[0]) - 1.0


@pytest.mark.parametrize("block", [32, 256])
def test_other_block_sizes(block, device):
    dy, q, q_cpu = _inputs(33, 16, 512, torch.bfloat16, "nf4", seed=block, block=block, device=device)
    _check(gemm_dequant_prologue(dy, q), dy, q_cpu)


def test_many_ragged_tiles_3d_tokens_and_strided_grad(device):
    # dW tile 16x128 over N=40, K=384 (3 x 3 programs, ragged N), tokens in 16-steps over M=2*37=74 (ragged).
    g = torch.Generator().manual_seed(21)
    dyt = torch.randn(40, 2, 37, generator=g).to(torch.bfloat16).to(device)
    dy = dyt.permute(1, 2, 0)                                  # [2, 37, 40], non-contiguous
    x = (torch.randn(2, 37, 384, generator=g)).to(torch.bfloat16)
    q_cpu = agoq_core.quantize(x, "int6", backend="reference")
    cfg = TileConfig(block_m=16, block_n=128, block_k=16, group_m=2, num_warps=4, num_stages=2)
    out = gemm_dequant_prologue(dy, q_cpu.to(device), config=cfg)
    _check(out, dy.reshape(-1, 40), q_cpu)


def test_nan_block_poisons_its_columns_only(device):
    dy, _, _ = _inputs(40, 32, 256, torch.bfloat16, "int4", seed=4, device=device)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(40, 256, generator=g).to(torch.bfloat16)
    x[6, 130] = float("inf")                                   # block 1 of row 6 -> scale NaN
    q_cpu = agoq_core.quantize(x, "int4", backend="reference")
    out = gemm_dequant_prologue(dy, q_cpu.to(device)).cpu()
    assert torch.isnan(out[:, 128:]).all() and torch.isfinite(out[:, :128]).all()
    _check(out, dy, q_cpu)


def test_no_tokens_gives_zero_gradient(device):
    dy = torch.empty(0, 32, dtype=torch.bfloat16, device=device)
    q = agoq_core.quantize(torch.empty(0, 128), "int4", backend="reference").to(device)
    out = gemm_dequant_prologue(dy, q)
    assert out.shape == (32, 128) and (out == 0).all()


def test_leading_dims_must_match(device):
    dy, q, _ = _inputs(10, 16, 128, torch.bfloat16, "int4", seed=1, device=device)
    with pytest.raises(ValueError, match="leading"):
        gemm_dequant_prologue(dy[:9], q)
    with pytest.raises(TypeError, match="QuantizedTensor"):
        gemm_dequant_prologue(dy, torch.zeros(10, 128))



@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "f16"])
@pytest.mark.parametrize("fmt", ["int4", "nf4", "int6"])
def test_gated_weight_grad_within_floor(fmt, dtype, device):
    # LAAQ's down projection: h = act(gate) * up rebuilt from the kept `up` and m = act(gate).
    dy, q, q_cpu = _inputs(70, 40, 256, dtype, fmt, seed=3 * len(fmt), device=device)
    g = torch.Generator().manual_seed(99)
    m = torch.nn.functional.silu(torch.randn(70, 256, generator=g) * 2).to(dtype)
    out = gemm_dequant_prologue(dy, q, mul=m.to(device))
    d = ref.dequantize_blocks(q_cpu.codes, q_cpu.scales, q_cpu.spec, q_cpu.numel, dtype).view(70, 256)
    h = m * d                                     # torch's 16-bit product (the unfused operand)
    want = ref_weight_grad(dy, h)
    s = sqnr_db(out, want)
    assert s >= sqnr_floor(dtype), f"dW SQNR {s:.1f} dB"
    assert s >= sqnr_db(h.t().mm(dy.cpu()).t(), want) - 1.0   # the unfused GEMM on h


@pytest.mark.parametrize("fmt, mul", [("int4", False), ("fp4_e2m1", False), ("int5", True), ("nf4", True),
                                      ("int8", True)])
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "f16"])
def test_identity_grad_exposes_the_operand_bit_for_bit(fmt, mul, dtype, device):
    # dY = I: each dW element is one product with 1 plus zeros, exact in fp32, so dW = B exactly — the
    # prologue's operand must equal the unfused path's materialised operand in every bit.
    m, k = 48, 256
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(m, k, generator=g) * 3).to(dtype)
    x[3, :128] = torch.linspace(-7, 7, 128).to(dtype) * 2.0**-4     # exact int4 grid points and ties
    q_cpu = agoq_core.quantize(x, fmt, backend="reference")
    b = ref.dequantize_blocks(q_cpu.codes, q_cpu.scales, q_cpu.spec, q_cpu.numel, dtype).view(m, k)
    mm = torch.nn.functional.silu(torch.randn(m, k, generator=g) * 2).to(dtype) if mul else None
    if mul:
        b = mm * b
    eye = torch.eye(m, dtype=dtype, device=device)
    cfg = TileConfig(block_m=16, block_n=128, block_k=16, num_warps=4, num_stages=2)
    out = gemm_dequant_prologue(eye, q_cpu.to(device), mul=mm.to(device) if mul else None, config=cfg)
    # The only freedom: a GEMM sum turns -0 into +0 (0 + -0 = +0), so compare with zeros made positive.
    assert torch.equal((out.cpu() + 0.0).view(torch.int16), (b + 0.0).view(torch.int16))
