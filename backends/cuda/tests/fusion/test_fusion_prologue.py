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
from agoq_cuda.fusion.tolerances import sqnr_db, sqnr_floor
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

