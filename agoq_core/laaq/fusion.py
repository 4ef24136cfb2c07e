"""The seams where LAAQ's GEMMs meet its codecs, and where fused kernels take over.

LAAQ's autograd functions never put a GEMM next to a codec themselves; they call these helpers:

* :func:`linear_and_quantize` — the gate/up (FC1) GEMM that produces the SiLU&Mul input and the
  quantized copy LAAQ keeps of it. Fused: capability ``gemm_quant_epilogue``.
* :func:`weight_grad` — dW = dYᵀ·X where X is a kept (possibly quantized) tensor. Fused:
  ``gemm_dequant_prologue``.
* :func:`weight_grad_gated` — dW = dYᵀ·(M ⊙ X) with X kept quantized (the down projection: M =
  act(gate), X = up; the SwiGLU output is then never materialised). Fused: ``gemm_dequant_prologue``
  with its ``mul`` operand.
* :func:`dequantize_for_gemm` — a kept tensor rebuilt to feed a GEMM or a recomputation.

Dispatch (docs/fusion.md): when fusion is switched on (``AGOQ_FUSION=1``), the selected backend claims
the op and the backend's ``*_unsupported`` check returns None, the fused kernel runs; otherwise
the unfused composition (a torch GEMM plus the backend's codec) runs and the reason is logged once.
A failing kernel is never caught. The unfused weight-gradient GEMM is ``(Xᵀ·dY)ᵀ`` on the flattened
tokens, the product PyTorch's own Linear backward computes, so LAAQ with native storage reproduces
its gradients bit for bit (tested).
"""
from __future__ import annotations

import logging
import os

import torch
import torch.nn.functional as F

from agoq_core.backend import get_backend
from agoq_core.formats.spec import FormatSpec
from agoq_core.formats.tensor import QuantizedTensor
from agoq_core.laaq import storage
from agoq_core.laaq.storage import Stored

__all__ = ["linear_and_quantize", "weight_grad", "weight_grad_gated", "dequantize_for_gemm", "input_grad",
           "fusion_enabled"]

log = logging.getLogger("agoq.laaq")
_logged: set[tuple[str, str]] = set()


def fusion_enabled() -> bool:
    """True only with ``AGOQ_FUSION=1``.

    Opt-in because on the H200 (docs/benchmarks.md §4, 2026-11-29) the fused FC1 epilogue was at
    break-even (0.93-1.03x the unfused cuBLAS + codec path) and the dequantizing-prologue dW GEMMs were
    7-15x slower than cuBLAS + a separate dequantize: the unfused path is the faster default.
    """
    return os.environ.get("AGOQ_FUSION", "0").strip() == "1"


def _fused_backend(op: str, backend: str | None, check) -> object | None:
    """The backend if it claims ``op`` and ``check(backend)`` finds nothing against this call."""
    if not fusion_enabled():
        return None
    be = get_backend(backend)
    if op not in be.capabilities().ops:
        return None
    reason = check(be)
    if reason is None:
        return be
    if (op, reason) not in _logged:
        _logged.add((op, reason))
        log.info("agoq: %s not fused on backend %r: %s (running the unfused composition)", op, be.name, reason)
    return None


def linear_and_quantize(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                        spec: FormatSpec | None, *, role: str, layer: int | None,
                        backend: str | None) -> tuple[torch.Tensor, Stored]:
    """``y = x Wᵀ + b`` and the stored copy of ``y`` (quantized in ``spec``, or ``y`` itself)."""
    if spec is not None and x.numel():
        x2 = x.reshape(-1, x.shape[-1])
        be = _fused_backend("gemm_quant_epilogue", backend,
                            lambda b: b.gemm_quant_epilogue_unsupported(x2, weight, bias, spec))
        if be is not None:
            m, n = x2.shape[0], weight.shape[0]
            out = torch.empty(m, n, dtype=x.dtype, device=x.device)
            codes = torch.empty(spec.code_bytes(m * n), dtype=torch.uint8, device=x.device)
            scales = torch.empty(spec.num_blocks(m * n), dtype=torch.float32, device=x.device)
            be.gemm_quant_epilogue_into(x2, weight, bias, spec, out, codes, scales)
            q = QuantizedTensor(codes, scales, (*x.shape[:-1], n), x.dtype, spec)
            return out.view(*x.shape[:-1], n), storage.record(q, role=role, layer=layer)
    y = F.linear(x, weight, bias)
    return y, storage.store(y, spec, role=role, layer=layer, backend=backend)


def dequantize_for_gemm(s: Stored, dtype: torch.dtype | None = None, backend: str | None = None) -> torch.Tensor:
    """A kept tensor back in ``dtype``, ready to be a GEMM operand."""
    return storage.load(s, dtype, backend)


def _prologue(grad_out: torch.Tensor, x: QuantizedTensor, mul: torch.Tensor | None,
              backend: str | None) -> torch.Tensor | None:
    g2 = grad_out.reshape(-1, grad_out.shape[-1])
    k = x.shape[-1]
    m2 = mul.reshape(-1, k) if mul is not None else None
    be = _fused_backend("gemm_dequant_prologue", backend,
                        lambda b: b.gemm_dequant_prologue_unsupported(g2, x.spec, k, m2))
    if be is None:
        return None
    out = torch.empty(g2.shape[1], k, dtype=grad_out.dtype, device=grad_out.device)
    be.gemm_dequant_prologue_into(g2, x.codes, x.scales, x.spec, k, out, m2)
    return out


def weight_grad(grad_out: torch.Tensor, x: torch.Tensor | Stored, *, backend: str | None = None) -> torch.Tensor:
    """dW[out, in] = Σ_tokens dY[t, out] · X[t, in], with X given dense or as a kept tensor."""
    if isinstance(x, QuantizedTensor):
        fused = _prologue(grad_out, x, None, backend) if x.numel else None
        if fused is not None:
            return fused
        x = dequantize_for_gemm(x, grad_out.dtype, backend)
    g2 = grad_out.reshape(-1, grad_out.shape[-1])
    x2 = x.reshape(-1, x.shape[-1])
    return x2.t().mm(g2).t()


def weight_grad_gated(grad_out: torch.Tensor, x: Stored, mul: torch.Tensor, *, dense: torch.Tensor | None = None,
                      backend: str | None = None) -> torch.Tensor:
    """dW = dYᵀ · (mul ⊙ X) for a kept X (``dense``: X already decoded, if the caller has it).

    Unfused: h = mul * X (the same product, in the same order, as the forward's ``act(gate) * up``),
    then :func:`weight_grad`."""
    if isinstance(x, QuantizedTensor) and x.numel:
        fused = _prologue(grad_out, x, mul, backend)
        if fused is not None:
            return fused
    if dense is None:
        dense = dequantize_for_gemm(x, mul.dtype, backend) if isinstance(x, QuantizedTensor) else x
    return weight_grad(grad_out, mul * dense.reshape(mul.shape))


def input_grad(grad_out: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """dX = dY · W (shape of the forward input)."""
    return grad_out.matmul(weight)
