"""The seams where kernel fusion plugs into LAAQ's autograd (the unfused implementations).

LAAQ's autograd functions never call a GEMM next to a codec directly; they call these helpers.
Today each is a torch GEMM plus the backend's codec. A backend that claims the optional
capabilities ``gemm_quant_epilogue`` / ``gemm_dequant_prologue`` (agoq_core.backend.types.OPS) can
be routed here later, in this file only, without touching the autograd functions:

* :func:`linear_and_quantize` — the gate/up (FC1) GEMM that produces the SiLU&Mul input and the
  quantized copy LAAQ keeps of it (epilogue fusion).
* :func:`weight_grad` — dW = dYᵀ·X where X is a kept (possibly quantized) tensor (prologue fusion).
* :func:`dequantize_for_gemm` — a kept tensor rebuilt to feed a GEMM or a recomputation.

The weight-gradient GEMM is written ``(Xᵀ·dY)ᵀ`` on the flattened tokens, the same product
PyTorch's own Linear backward computes, so LAAQ with native storage reproduces its gradients bit
for bit (tested).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from agoq_core.formats.spec import FormatSpec
from agoq_core.laaq import storage
from agoq_core.laaq.storage import Stored

__all__ = ["linear_and_quantize", "weight_grad", "dequantize_for_gemm", "input_grad"]


def linear_and_quantize(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                        spec: FormatSpec | None, *, role: str, layer: int | None,
                        backend: str | None) -> tuple[torch.Tensor, Stored]:
    """``y = x Wᵀ + b`` and the stored copy of ``y`` (quantized in ``spec``, or ``y`` itself)."""
    y = F.linear(x, weight, bias)
    return y, storage.store(y, spec, role=role, layer=layer, backend=backend)


def dequantize_for_gemm(s: Stored, dtype: torch.dtype | None = None, backend: str | None = None) -> torch.Tensor:
    """A kept tensor back in ``dtype``, ready to be a GEMM operand."""
    return storage.load(s, dtype, backend)


def weight_grad(grad_out: torch.Tensor, x: torch.Tensor | Stored, *, backend: str | None = None) -> torch.Tensor:
    """dW[out, in] = Σ_tokens dY[t, out] · X[t, in], with X given dense or as a kept tensor."""
    if not isinstance(x, torch.Tensor):
        x = dequantize_for_gemm(x, grad_out.dtype, backend)
    g2 = grad_out.reshape(-1, grad_out.shape[-1])
    x2 = x.reshape(-1, x.shape[-1])
    return x2.t().mm(g2).t()


def input_grad(grad_out: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """dX = dY · W (shape of the forward input)."""
    return grad_out.matmul(weight)
