"""Public codec verbs: validate, allocate, dispatch to the selected backend.

Everything that reaches a backend is flat, contiguous, on a device the backend serves, in a dtype it
takes, and in a format it claims; anything else fails here with a message that names the fix.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from agoq_core.backend import get_backend
from agoq_core.errors import CapabilityError, FormatError
from agoq_core.formats.spec import FormatSpec, get_format
from agoq_core.formats.tensor import QuantizedTensor

if TYPE_CHECKING:
    from agoq_core.backend.protocol import Backend

__all__ = ["quantize", "dequantize", "accumulate_", "reduce_requantize", "check_supported"]

_FLOAT_INPUTS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_KERNEL_OUTPUTS = (torch.float32, torch.bfloat16, torch.float16)


def check_supported(be: "Backend", spec: FormatSpec, device: torch.device, op: str = "quantize",
                    dtype: torch.dtype | None = None) -> None:
    """Raise CapabilityError unless ``be`` claims ``op`` for ``spec`` on ``device`` (and ``dtype``)."""
    if spec.tensor_scaled and op in ("accumulate", "reduce_requantize"):
        raise FormatError(f"{op}: {spec.name} scales every block by a per-tensor scale, which a block-wise "
                          "requantize cannot keep; use a format with block-local scales (mxfp8, fp8_e4m3, int8)")
    caps = be.capabilities()
    if op not in caps.ops:
        raise CapabilityError(f"{op!r} is not supported by backend {be.name!r} (it provides {sorted(caps.ops)}); "
                              "choose a backend that does with AGOQ_BACKEND")
    if spec.name not in caps.formats:
        raise CapabilityError(
            f"backend {be.name!r} does not support format {spec.name!r}; it supports {sorted(caps.formats)}"
        )
    if "*" not in caps.device_types and device.type not in caps.device_types:
        raise CapabilityError(
            f"backend {be.name!r} serves {sorted(caps.device_types)} tensors, got a tensor on {device}; "
            f"move it with .to({sorted(caps.device_types)[0]!r}) or choose another backend with AGOQ_BACKEND"
        )
    if spec.block > caps.max_block:
        raise CapabilityError(f"backend {be.name!r} takes blocks up to {caps.max_block}, got block={spec.block}")
    if dtype is not None and caps.input_dtypes and dtype not in caps.input_dtypes:
        raise CapabilityError(
            f"backend {be.name!r} takes {sorted(str(d) for d in caps.input_dtypes)} inputs, got {dtype}"
        )


def _check_float(x: object, what: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOAT_INPUTS:
        raise FormatError(
            f"{what} must be float32, bfloat16, float16 or float64, got {x.dtype}; convert it with .float()"
        )
    return x


def quantize(x: torch.Tensor, fmt: str | FormatSpec, *, block: int | None = None,
             backend: "str | Backend | None" = None) -> QuantizedTensor:
    """Quantize ``x`` block-wise in format ``fmt`` (``"int4"``, ``"fp8_e4m3"`` ...).

    Blocks run over the flattened tensor; the last one may be ragged. NaN/Inf make their whole
    block dequantize to NaN (its scale is NaN) so they can never pass silently. An empty tensor
    gives an empty QuantizedTensor.
    """
    _check_float(x, "quantize: x")
    spec = get_format(fmt, block)
    be = get_backend(backend)
    check_supported(be, spec, x.device, "quantize", x.dtype)
    flat = x.detach().contiguous().reshape(-1)
    n = flat.numel()
    codes = torch.empty(spec.code_bytes(n), dtype=torch.uint8, device=x.device)
    scales = torch.empty(spec.num_blocks(n), dtype=torch.float32, device=x.device)
    if n:
        be.quantize_into(flat, spec, codes, scales)
    return QuantizedTensor(codes, scales, x.shape, x.dtype, spec)


def dequantize(q: QuantizedTensor, dtype: torch.dtype | None = None, *,
               backend: "str | Backend | None" = None) -> torch.Tensor:
    """Rebuild a tensor of ``q.shape`` in ``dtype`` (default: the dtype ``q`` was made from)."""
    if not isinstance(q, QuantizedTensor):
        raise TypeError(f"dequantize expects a QuantizedTensor, got {type(q).__name__}")
    q.validate()
    dtype = dtype or q.dtype
    if dtype not in _FLOAT_INPUTS:
        raise FormatError(f"dequantize: dtype must be a float dtype, got {dtype}")
    be = get_backend(backend)
    check_supported(be, q.spec, q.device, "dequantize")
    kdtype = dtype if dtype in _KERNEL_OUTPUTS else torch.float32
    out = torch.empty(q.shape, dtype=kdtype, device=q.device)
    if out.numel():
        be.dequantize_into(q.codes, q.scales, q.spec, out.view(-1))
    return out if kdtype == dtype else out.to(dtype)


def accumulate_(q: QuantizedTensor, g: torch.Tensor, *, backend: "str | Backend | None" = None) -> QuantizedTensor:
    """In place: ``q <- quantize(dequantize(q) + g)`` with the add in fp32 (QuanGrad accumulation)."""
    _check_float(g, "accumulate_: g")
    if g.numel() != q.numel:
        raise ValueError(f"accumulate_: g has {g.numel()} elements but q holds {q.numel} (shape {tuple(q.shape)})")
    if g.device != q.device:
        raise ValueError(f"accumulate_: g is on {g.device} but q is on {q.device}")
    be = get_backend(backend)
    check_supported(be, q.spec, q.device, "accumulate", g.dtype)
    if q.numel:
        be.accumulate_(q.codes, q.scales, q.spec, g.detach().contiguous().reshape(-1))
    return q


def reduce_requantize(codes: torch.Tensor, scales: torch.Tensor, spec: FormatSpec | str, numel: int, *,
                      backend: "str | Backend | None" = None, out: QuantizedTensor | None = None) -> QuantizedTensor:
    """Sum W quantized chunks (``codes`` uint8[W, code_bytes], ``scales`` fp32[W, NB]) in fp32 in rank
    order and requantize: the reduction step of QuanGrad's all-reduce."""
    spec = get_format(spec)
    if codes.dim() != 2 or scales.dim() != 2 or codes.shape[0] != scales.shape[0]:
        raise ValueError(f"reduce_requantize: want codes[W, B] and scales[W, NB], got {tuple(codes.shape)} "
                         f"and {tuple(scales.shape)}")
    if codes.shape[1] != spec.code_bytes(numel) or scales.shape[1] != spec.num_blocks(numel):
        raise ValueError(
            f"reduce_requantize: {numel} elements of {spec.name}/block {spec.block} need "
            f"{spec.code_bytes(numel)} code bytes and {spec.num_blocks(numel)} scales per rank, got "
            f"{codes.shape[1]} and {scales.shape[1]}"
        )
    be = get_backend(backend)
    check_supported(be, spec, codes.device, "reduce_requantize")
    if out is None:
        out = QuantizedTensor(torch.empty(spec.code_bytes(numel), dtype=torch.uint8, device=codes.device),
                              torch.empty(spec.num_blocks(numel), dtype=torch.float32, device=codes.device),
                              torch.Size([numel]), torch.float32, spec)
    if numel:
        be.reduce_requantize_into(codes.contiguous(), scales.contiguous(), spec, numel, out.codes, out.scales)
    return out
