"""Kernel fusion for LAAQ on CUDA: the codec fused into the GEMMs that produce and consume kept tensors.

* :func:`gemm_quant_epilogue` — forward gate/up (FC1) GEMM ``y = x Wᵀ (+ b)`` that also writes the
  block-quantized copy of ``y`` LAAQ keeps (capability ``gemm_quant_epilogue``).
* :func:`gemm_dequant_prologue` — backward weight-gradient GEMM ``dW = dYᵀ · X`` reading X from its
  quantized copy, optionally ``dW = dYᵀ · (m ⊙ X)`` (the down projection's input ``act(gate) * up``
  rebuilt from the kept ``up``) (capability ``gemm_dequant_prologue``).

Numerics (docs/fusion.md): the codes and scales are bit-exact with the reference codec applied to the
16-bit ``y`` the same kernel returns; the GEMM results meet the SQNR floors in :mod:`.tolerances`.
The ``*_into`` launchers and ``*_unsupported`` checks in :mod:`.launch` are what the Backend methods call.
"""
from __future__ import annotations

import torch

from agoq_core.formats.spec import FormatSpec, get_format
from agoq_core.formats.tensor import QuantizedTensor

__all__ = ["gemm_quant_epilogue", "gemm_dequant_prologue"]


def gemm_quant_epilogue(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                        fmt: str | FormatSpec = "int4", block: int | None = None,
                        config=None, kernel: str | None = None) -> tuple[torch.Tensor, QuantizedTensor]:
    """``y = x @ weightᵀ + bias`` (shape ``x.shape[:-1] + (N,)``, x's dtype) and ``quantize(y, fmt)``, fused.

    Raises ValueError with the reason when the call cannot be fused (see launch.epilogue_unsupported)."""
    from agoq_cuda.fusion import launch

    spec = get_format(fmt, block)
    x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    n = weight.shape[0] if weight.dim() == 2 else -1
    y = torch.empty((x2.shape[0], n), dtype=x.dtype, device=x.device)
    numel = y.numel()
    codes = torch.empty(spec.code_bytes(numel), dtype=torch.uint8, device=x.device)
    scales = torch.empty(spec.num_blocks(numel), dtype=torch.float32, device=x.device)
    launch.gemm_quant_epilogue_into(x2, weight, bias, spec, y, codes, scales, config=config, kernel=kernel)
    y = y.view(*x.shape[:-1], n)
    return y, QuantizedTensor(codes, scales, y.shape, y.dtype, spec)


def gemm_dequant_prologue(grad_out: torch.Tensor, x: QuantizedTensor, *, mul: torch.Tensor | None = None,
                          config=None) -> torch.Tensor:
    """``dW[N, K] = Σ_tokens grad_out[t, N] · B[t, K]`` in grad_out's dtype, fused, with B = dequantize(x)
    (in grad_out's dtype) or ``mul * dequantize(x)`` when ``mul`` (x's shape, grad_out's dtype) is given.

    ``x`` holds the GEMM input [..., K] kept quantized; its leading dims must match grad_out's."""
    from agoq_cuda.fusion import launch

    if not isinstance(x, QuantizedTensor):
        raise TypeError(f"gemm_dequant_prologue: x must be a QuantizedTensor, got {type(x).__name__}")
    x.validate()
    if len(x.shape) < 1 or grad_out.dim() < 1 or tuple(x.shape[:-1]) != tuple(grad_out.shape[:-1]):
        raise ValueError(f"gemm_dequant_prologue: x {tuple(x.shape)} and grad_out {tuple(grad_out.shape)} must "
                         "share their leading (token) dims")
    k = x.shape[-1]
    g2 = grad_out.reshape(-1, grad_out.shape[-1])
    out = torch.empty((g2.shape[1], k), dtype=grad_out.dtype, device=grad_out.device)
    m2 = mul.reshape(-1, k) if mul is not None else None
    launch.gemm_dequant_prologue_into(g2, x.codes, x.scales, x.spec, k, out, m2, config=config)
    return out
