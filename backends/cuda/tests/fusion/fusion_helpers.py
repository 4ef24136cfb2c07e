"""Helpers for the fusion tests: the cuda backend with the fused GEMMs attached, and float64 oracles.

``fused_backend()`` returns the real CudaBackend if it already claims the fused ops (after the
integration diff in docs/fusion.md is applied); until then, a subclass that adds exactly the four methods
and the two ops that diff adds, so the tests exercise the same code either way.
"""
from __future__ import annotations

import torch

from agoq_core.backend import Capabilities
from agoq_cuda.fusion import launch

__all__ = ["fused_backend", "ref_linear", "ref_weight_grad", "assert_bits_equal"]

FUSED_OPS = frozenset({"gemm_quant_epilogue", "gemm_dequant_prologue"})


def fused_backend():
    from agoq_cuda.backend import CudaBackend

    be = CudaBackend.create()
    if FUSED_OPS <= be.capabilities().ops:
        return be

    class FusedCudaBackend(CudaBackend):
        def capabilities(self) -> Capabilities:
            c = super().capabilities()
            return Capabilities(formats=c.formats, device_types=c.device_types, ops=c.ops | FUSED_OPS,
                                collectives=c.collectives, input_dtypes=c.input_dtypes, max_block=c.max_block,
                                notes=c.notes)

        def gemm_quant_epilogue_unsupported(self, x, weight, bias, spec):
            return launch.epilogue_unsupported(x, weight, bias, spec)

        def gemm_quant_epilogue_into(self, x, weight, bias, spec, out, codes, scales):
            launch.gemm_quant_epilogue_into(x, weight, bias, spec, out, codes, scales)

        def gemm_dequant_prologue_unsupported(self, grad, spec, k, mul=None):
            return launch.prologue_unsupported(grad, spec, k, mul)

        def gemm_dequant_prologue_into(self, grad, codes, scales, spec, k, out, mul=None):
            launch.gemm_dequant_prologue_into(grad, codes, scales, spec, k, out, mul)

    return FusedCudaBackend(interpreted=be.interpreted)


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
