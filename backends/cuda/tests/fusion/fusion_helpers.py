"""Helpers for the fusion tests: the cuda backend (it claims the fused GEMMs) and float64 oracles."""
from __future__ import annotations

import torch

__all__ = ["fused_backend", "ref_linear", "ref_weight_grad", "assert_bits_equal"]

FUSED_OPS = frozenset({"gemm_quant_epilogue", "gemm_dequant_prologue"})


def fused_backend():
    """The real CudaBackend, which claims (and implements) the fused ops."""
    from agoq_cuda.backend import CudaBackend

    be = CudaBackend.create()
    assert FUSED_OPS <= be.capabilities().ops, "agoq-cuda no longer claims the fused GEMMs"
    return be


def ref_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """float64 x @ wᵀ + b on the CPU (the exact product of the given 16-bit operands, then one rounding)."""
    y = x.detach().cpu().double() @ w.detach().cpu().double().t()
    return y + b.detach().cpu().double() if b is not None else y


def ref_weight_grad(dy: torch.Tensor, x_dq: torch.Tensor) -> torch.Tensor:
    """float64 dW = dyᵀ @ x for 2-D dy [M, N] and dequantized x [M, K]."""
    return dy.detach().cpu().double().t() @ x_dq.detach().cpu().double()


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Bit equality; float32 NaNs compare equal whatever their payload (the contract's scale NaN)."""
    got, want = got.detach().cpu().reshape(-1), want.detach().cpu().reshape(-1)
    assert got.dtype == want.dtype and got.numel() == want.numel(), (what, got.dtype, want.dtype, got.numel(),
                                                                     want.numel())
    if got.dtype == torch.float32:
        bad = (got.view(torch.int32) != want.view(torch.int32)) & ~(torch.isnan(got) & torch.isnan(want))
    elif got.dtype in (torch.bfloat16, torch.float16):
        bad = (got.view(torch.int16) != want.view(torch.int16)) & ~(torch.isnan(got) & torch.isnan(want))
    else:
        bad = got != want
    idx = bad.nonzero().reshape(-1)
    assert idx.numel() == 0, (f"{what}: {idx.numel()} of {got.numel()} differ, first at {int(idx[0])}: "
                              f"got {got[idx[0]].item()!r}, want {want[idx[0]].item()!r}")
