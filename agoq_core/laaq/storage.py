"""How LAAQ keeps a tensor for backward: quantized through the selected backend, or as is.

Every tensor LAAQ keeps passes through :func:`store`, which also reports it to the active memory
meters (agoq_core.laaq.memory), so the accounting sees exactly what is held, not a formula.

Large tensors are coded in chunks of ``_CHUNK`` elements written into one preallocated
QuantizedTensor: block-wise codes are independent per block, so chunking changes no bit, and it
bounds the codec's temporaries (the reference codec builds fp32 and int64 copies: ~12 bytes per
element, 12 GiB for one 64K-token LLaMA-2-7B gate/up output if done in one piece).
"""
from __future__ import annotations

import math
from typing import Callable, Union

import torch

from agoq_core.api import check_supported
from agoq_core.backend import get_backend
from agoq_core.formats.spec import FormatSpec
from agoq_core.formats.tensor import QuantizedTensor

__all__ = ["Stored", "store", "record", "load", "rows", "load_rows", "row_alignment", "stored_nbytes", "stored_tensors", "add_listener", "remove_listener"]

Stored = Union[QuantizedTensor, torch.Tensor]

#: Elements per codec call. 2**26 = 64 Mi elements: temporaries of the reference codec stay under
#: ~0.8 GiB, while a Triton kernel launch per 64 Mi elements costs nothing measurable.
_CHUNK = 1 << 26

# Callables (role, layer, Stored) -> None, called for every stored tensor (memory meters).
_listeners: list[Callable[[str, "int | None", Stored], None]] = []


def add_listener(fn: Callable[[str, "int | None", Stored], None]) -> None:
    _listeners.append(fn)


def remove_listener(fn: Callable[[str, "int | None", Stored], None]) -> None:
    _listeners.remove(fn)


def _quantize(x: torch.Tensor, spec: FormatSpec, backend: str | None) -> QuantizedTensor:
    flat = x.detach().reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    n = flat.numel()
    codes = torch.empty(spec.code_bytes(n), dtype=torch.uint8, device=x.device)
    scales = torch.empty(spec.num_blocks(n), dtype=torch.float32, device=x.device)
    q = QuantizedTensor(codes, scales, x.shape, x.dtype, spec)
    if n == 0 or x.device.type == "meta":  # meta: sizes only (used to measure big models cheaply)
        return q
    be = get_backend(backend)
    check_supported(be, spec, x.device, "quantize", x.dtype)
    step = max(spec.block, (_CHUNK // spec.block) * spec.block)  # whole blocks -> whole pack groups
    if spec.tensor_scaled:  # NVFP4: one tensor scale over the whole tensor, so one call
        step = max(n, 1)
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        b0, b1 = lo // spec.block, -(-hi // spec.block)
        be.quantize_into(flat[lo:hi], spec, codes[spec.code_bytes(lo):spec.code_bytes(hi)], scales[b0:b1])
    return q


def _dequantize(q: QuantizedTensor, dtype: torch.dtype, backend: str | None, lo: int = 0,
                hi: int | None = None, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """Elements [lo, hi) of the flattened ``q`` (lo on a block boundary) as a tensor of ``shape``."""
    hi = q.numel if hi is None else hi
    out = torch.empty(shape if shape is not None else q.shape, dtype=dtype, device=q.device)
    if hi <= lo or q.device.type == "meta":
        return out
    be = get_backend(backend)
    check_supported(be, q.spec, q.device, "dequantize")
    flat = out.view(-1)
    spec = q.spec
    step = max(spec.block, (_CHUNK // spec.block) * spec.block)
    for a in range(lo, hi, step):
        b = min(hi, a + step)
        be.dequantize_into(q.codes[spec.code_bytes(a):spec.code_bytes(b)],
                           q.scales[a // spec.block:-(-b // spec.block)], spec, flat[a - lo:b - lo])
    return out


def store(x: torch.Tensor, spec: FormatSpec | None, *, role: str, layer: int | None,
          backend: str | None = None) -> Stored:
    """Keep ``x`` for backward: a QuantizedTensor in ``spec``, or ``x`` itself (detached) if None."""
    return record(x.detach() if spec is None else _quantize(x, spec, backend), role=role, layer=layer)


def record(s: Stored, *, role: str, layer: int | None) -> Stored:
    """Announce a kept tensor made elsewhere (e.g. by a fused GEMM epilogue) to the memory meters."""
    for fn in _listeners:
        fn(role, layer, s)
    return s


def load(s: Stored, dtype: torch.dtype | None = None, backend: str | None = None) -> torch.Tensor:
    """The tensor back, in ``dtype`` (default: the dtype it was stored from)."""
    if isinstance(s, QuantizedTensor):
        return _dequantize(s, dtype or s.dtype, backend)
    return s if dtype is None or s.dtype == dtype else s.to(dtype)


def row_alignment(s: Stored, row: int) -> int:
    """Rows of ``row`` elements per aligned group: slices of whole groups start on a block boundary."""
    if not isinstance(s, QuantizedTensor):
        return 1
    return s.spec.block // math.gcd(row, s.spec.block)


def rows(s: Stored, r0: int, r1: int) -> Stored:
    """Rows [r0, r1) of ``s`` seen as [-1, last dim], without decoding: a QuantizedTensor over the
    same codes and scales (``r0`` a multiple of :func:`row_alignment`), or a 2-D view."""
    row = s.shape[-1]
    if not isinstance(s, QuantizedTensor):
        return s.reshape(-1, row)[r0:r1]
    spec = s.spec
    if (r0 * row) % spec.block:
        raise ValueError(f"rows: row {r0} of {row} elements does not start on a {spec.block}-element block; "
                         f"use multiples of row_alignment() = {row_alignment(s, row)}")
    lo, hi = r0 * row, r1 * row
    return QuantizedTensor(s.codes[spec.code_bytes(lo):spec.code_bytes(hi)],
                           s.scales[lo // spec.block:-(-hi // spec.block)], (r1 - r0, row), s.dtype, spec)


def load_rows(s: Stored, r0: int, r1: int, dtype: torch.dtype | None = None,
              backend: str | None = None) -> torch.Tensor:
    """Rows [r0, r1) of ``s`` seen as [-1, last dim], as a 2-D tensor. For a QuantizedTensor only those
    rows are decoded; ``r0`` must be a multiple of :func:`row_alignment`."""
    row = s.shape[-1]
    if isinstance(s, QuantizedTensor):
        if (r0 * row) % s.spec.block:
            raise ValueError(f"load_rows: row {r0} of {row} elements does not start on a {s.spec.block}-element "
                             f"block; use multiples of row_alignment() = {row_alignment(s, row)}")
        return _dequantize(s, dtype or s.dtype, backend, r0 * row, r1 * row, (r1 - r0, row))
    rows = s.reshape(-1, row)[r0:r1]
    return rows if dtype is None or rows.dtype == dtype else rows.to(dtype)


def stored_tensors(s: Stored) -> tuple[torch.Tensor, ...]:
    """The tensors that hold the storage of ``s`` (codes and scales, or the tensor)."""
    return (s.codes, s.scales) if isinstance(s, QuantizedTensor) else (s,)


def stored_nbytes(s: Stored) -> int:
    return s.nbytes if isinstance(s, QuantizedTensor) else s.numel() * s.element_size()
