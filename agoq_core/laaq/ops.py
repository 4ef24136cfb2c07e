"""LAAQ's codec entry points as ``torch.library`` custom ops, so torch.compile sees them as opaque ops.

Under torch.compile (agoq_core.laaq.traced) the autograd functions call these instead of the backend
directly: Dynamo and AOTAutograd trace only their fake (shape/dtype) implementations, computed from the
FormatSpec (``code_bytes``/``num_blocks``), and the compiled graph calls the real ones, which are the
eager path's own functions (agoq_core.laaq.storage: same backend lookup, chunking and kernels, so the
same bits). The backend is looked up inside the op at run time, never while tracing; the memory
meters' listeners run there too, so kept tensors are reported from compiled code as from eager code.

A FormatSpec travels as (name, block), the two fields ``get_format`` rebuilds it from; the backend as
its name ("" = the auto-selected one); the layer as an int (-1 = none; the traced path always passes -1:
an int argument is a constant of the graph, so a per-layer index made every layer a new graph --
agoq_core.laaq.traced._keep). ``torch.library.custom_op``
and ``register_fake`` exist since torch 2.4 (the GPU machine runs 2.11, CI 2.13).

Ops are registered on first use (:func:`ensure_registered`, called by ``laaq.apply``), not at
import: importing agoq_core stays light.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
from torch import Tensor  # noqa: F401  (custom_op reads the annotations from module scope)

from agoq_core.formats.spec import FormatSpec, get_format

__all__ = ["ensure_registered", "spec_args", "quantize", "dequantize"]

NAMESPACE = "agoq"


def spec_args(spec: FormatSpec) -> tuple[str, int]:
    """What a custom op receives for ``spec``."""
    return spec.name, spec.block


@functools.lru_cache(maxsize=None)
def _spec(fmt: str, block: int) -> FormatSpec:
    return get_format(fmt, block)


@functools.lru_cache(maxsize=1)
def ensure_registered() -> None:
    """Define the ``agoq::`` ops (idempotent; once per process)."""
    from agoq_core.formats.tensor import QuantizedTensor
    from agoq_core.laaq import storage

    @torch.library.custom_op(f"{NAMESPACE}::quantize", mutates_args=())
    def quantize(x: Tensor, fmt: str, block: int, backend: str, role: str, layer: int) -> tuple[Tensor, Tensor]:
        """(codes, scales) of ``x`` in ``fmt``/``block``; reported to the memory meters as ``role``."""
        q = storage.store(x, _spec(fmt, block), role=role, layer=None if layer < 0 else layer,
                          backend=backend or None)
        return q.codes, q.scales

    @quantize.register_fake
    def _(x, fmt, block, backend, role, layer):
        spec, n = _spec(fmt, block), x.numel()
        return (x.new_empty((spec.code_bytes(n),), dtype=torch.uint8),
                x.new_empty((spec.num_blocks(n),), dtype=torch.float32))

    @torch.library.custom_op(f"{NAMESPACE}::dequantize", mutates_args=())
    def dequantize(codes: Tensor, scales: Tensor, fmt: str, block: int, backend: str, shape: list[int],
                   dtype: torch.dtype) -> Tensor:
        """The tensor of ``shape``/``dtype`` that ``codes``/``scales`` encode."""
        q = QuantizedTensor(codes, scales, tuple(shape), dtype, _spec(fmt, block))
        return storage.load(q, dtype, backend or None)

    @dequantize.register_fake
    def _(codes, scales, fmt, block, backend, shape, dtype):
        return codes.new_empty(shape, dtype=dtype)


def quantize(x: torch.Tensor, spec: FormatSpec, backend: Optional[str], role: str,
             layer: Optional[int]) -> tuple[torch.Tensor, torch.Tensor]:
    fmt, block = spec_args(spec)
    return torch.ops.agoq.quantize(x, fmt, block, backend or "", role, -1 if layer is None else layer)


def dequantize(codes: torch.Tensor, scales: torch.Tensor, spec: FormatSpec, backend: Optional[str],
               shape, dtype: torch.dtype) -> torch.Tensor:
    fmt, block = spec_args(spec)
    return torch.ops.agoq.dequantize(codes, scales, fmt, block, backend or "", list(shape), dtype)
