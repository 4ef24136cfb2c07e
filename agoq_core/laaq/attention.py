"""The attention core under LAAQ: left alone by default; quantized only for the naive ablation.

The paper keeps Q, K, V, the softmax state and the attention output in 16-bit (its error analysis
gives Q/K gradient errors growing as L^{3/2}·sqrt(d_k) when they are quantized, and the uniform
4-bit run did not converge). For that ablation, :func:`attention_core_hooks` quantizes every
floating-point tensor the attention kernel saves for backward (SDPA's Q, K, V and output; eager
attention's probabilities too) through ``torch.autograd.graph.saved_tensors_hooks``.

Not quantized even then: tensors that do not require grad (the RoPE cos/sin tables shared by all
layers, SDPA's logsumexp: batch·heads·seq fp32 values) and parameters. They are still reported to
the memory meters, because these hooks hide any outer pack hook while they are active.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from agoq_core.formats.spec import FormatSpec
from agoq_core.formats.tensor import QuantizedTensor
from agoq_core.laaq import storage

__all__ = ["attention_core_hooks"]


class _Packed:
    """A saved tensor stored by the attention hooks (quantized, or as is) plus its original layout."""

    __slots__ = ("stored", "stride", "offset")

    def __init__(self, stored: storage.Stored, stride: tuple[int, ...] | None, offset: int) -> None:
        self.stored, self.stride, self.offset = stored, stride, offset


@contextlib.contextmanager
def attention_core_hooks(spec: FormatSpec | None, layer: int | None, backend: str | None) -> Iterator[None]:
    """Within this context, tensors saved for backward are kept in ``spec`` (None: as they are)."""
    # One attention call: a tensor saved twice is stored once. The tensor is held (until the call
    # returns) so that its id cannot be reused by another tensor meanwhile.
    seen: dict[int, tuple[torch.Tensor, _Packed]] = {}

    def pack(t: torch.Tensor):
        key = id(t)
        if key in seen:
            return seen[key][1]
        quantize = (spec is not None and t.is_floating_point() and t.requires_grad and not t.is_leaf
                    and t.numel() > 0)
        if quantize:
            p = _Packed(storage.store(t, spec, role="attention_core", layer=layer, backend=backend),
                        t.stride(), t.storage_offset())
        else:
            p = _Packed(storage.store(t, None, role="attention_core", layer=layer, backend=backend), None, 0)
        seen[key] = (t, p)
        return p

    def unpack(p: _Packed) -> torch.Tensor:
        if not isinstance(p.stored, QuantizedTensor):
            return p.stored
        dense = storage.load(p.stored, None, backend)
        # Some backward kernels assume the layout forward saw (e.g. a transposed Q view).
        if p.stride is not None and dense.stride() != p.stride and 0 not in p.stride:
            out = torch.empty_strided(dense.shape, p.stride, dtype=dense.dtype, device=dense.device)
            out.copy_(dense)
            dense = out
        return dense

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        try:
            yield
        finally:
            seen.clear()
