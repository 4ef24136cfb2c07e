"""The 8-bit gradient buffers: one (codes, scales) pair per bucket, a QuantizedTensor view per parameter.

Memory: 1 byte per element + 4 bytes per block (fp8/int8, block 256: 1.0156 bytes per gradient element),
against 2 for bf16 gradients and 4 for fp32 main gradients.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from agoq_core import api
from agoq_core.formats.tensor import QuantizedTensor
from agoq_core.quangrad.layout import BucketLayout, ParamSlot
from agoq_core.quangrad.protocol import ChunkPlan, dequantize_bucket

if TYPE_CHECKING:
    from agoq_core.backend.protocol import Backend

__all__ = ["GradStorage"]


class GradStorage:
    def __init__(self, layout: BucketLayout, device: torch.device, backend: "Backend") -> None:
        self.layout, self.device, self.backend = layout, device, backend
        spec = layout.spec
        self.plans = [ChunkPlan(spec=spec, world_size=layout.world_size, numel=b.numel) for b in layout.buckets]
        self.codes = [torch.full((p.code_bytes,), spec.zero_code, dtype=torch.uint8, device=device) for p in self.plans]
        self.scales = [torch.zeros(p.num_blocks, dtype=torch.float32, device=device) for p in self.plans]
        self.views: list[QuantizedTensor] = [self._view(s) for s in layout.slots]
        # per slot, what fold_ needs on every call (issue 17: host time per hook call): numel, device, codes, scales
        self._fold_args = [(v.numel, v.device, v.codes, v.scales) for v in self.views]
        self._folded: set[int] = set()          # parameters folded since the buffers were last zeroed
        self._checked: set[torch.dtype] = set()  # gradient dtypes the backend was asked about
        self._checked_group = False  # group_fp32's fp32 dequantize asked of the backend

    def _view(self, s: ParamSlot) -> QuantizedTensor:
        spec = self.layout.spec
        c0 = spec.code_bytes(s.offset)
        b0 = s.offset // spec.block
        codes = self.codes[s.bucket][c0: c0 + spec.code_bytes(s.numel)]
        scales = self.scales[s.bucket][b0: b0 + spec.num_blocks(s.numel)]
        return QuantizedTensor(codes, scales, torch.Size([s.numel]), getattr(torch, s.dtype), spec)

    @property
    def nbytes(self) -> int:
        """Bytes held by the 8-bit gradient buffers (codes + scales, padding included)."""
        return sum(c.numel() + 4 * s.numel() for c, s in zip(self.codes, self.scales))

    def fold_(self, index: int, g: torch.Tensor) -> None:
        """Add gradient ``g`` of parameter ``index`` into its 8-bit storage (fp32 add, requantize).

        The first fold after the buffers were zeroed is a plain quantize: Q(D(0) + g) = Q(0 + g) = Q(g)
        bit for bit (0 + g is g except that -0 becomes +0, which quantize flushes to 0 anyway; NaN/Inf
        stay NaN/Inf), and it skips decoding the zeros. Called once per parameter per micro-batch from
        the gradient hook, so the backend's capabilities are checked once per gradient dtype, not per call.
        """
        numel, device, codes, scales = self._fold_args[index]
        spec = self.layout.spec
        if g.dtype not in self._checked:
            api.check_supported(self.backend, spec, device, "accumulate", g.dtype)
            api.check_supported(self.backend, spec, device, "quantize", g.dtype)
            self._checked.add(g.dtype)
        if g.numel() != numel or g.device != device:
            raise ValueError(f"GradStorage.fold_: parameter {self.layout.slots[index].name!r} holds {numel} "
                             f"elements on {device}, got a gradient of {g.numel()} on {g.device}")
        if not numel:
            return
        # the flat view the backend takes, without a new tensor where none is needed (a 1-D contiguous gradient
        # that is not part of a graph is passed as is)
        if g.requires_grad:
            g = g.detach()
        if not g.is_contiguous():
            g = g.contiguous()
        flat = g if g.dim() == 1 else g.view(-1)
        if index in self._folded:
            self.backend.accumulate_(codes, scales, spec, flat)
        else:
            self.backend.quantize_into(flat, spec, codes, scales)
            self._folded.add(index)

    def zero_(self) -> None:
        self._folded.clear()
        zc = self.layout.spec.zero_code
        for c, s in zip(self.codes, self.scales):
            c.fill_(zc)
            s.zero_()

    def has_nonfinite(self) -> bool:
        """Whether any block held NaN/Inf (its scale is NaN): one host synchronisation for every bucket."""
        return bool(torch.stack([torch.isnan(s).any() for s in self.scales]).any())

    def nonfinite_params(self) -> list[str]:
        return [s.name for s, v in zip(self.layout.slots, self.views) if v.has_nonfinite()]

    def group_fp32(self, bis: list[int]) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """Consecutive buckets ``bis`` dequantized into ONE fp32 buffer (padding included), and each bucket's
        segment of it: one allocation and one backend call per bucket, the same values as :meth:`bucket_fp32`."""
        plans = self.plans
        buf = torch.empty(sum(plans[bi].numel for bi in bis), dtype=torch.float32, device=self.device)
        segs = buf.split([plans[bi].numel for bi in bis])
        if not self._checked_group:
            api.check_supported(self.backend, self.layout.spec, self.device, "dequantize")
            self._checked_group = True
        spec = self.layout.spec
        for bi, seg in zip(bis, segs):
            if seg.numel():
                self.backend.dequantize_into(self.codes[bi], self.scales[bi], spec, seg)
        return buf, segs

    def bucket_fp32(self, bi: int) -> torch.Tensor:
        """The whole padded bucket dequantized to fp32 (one bucket of scratch)."""
        plan = self.plans[bi]
        return dequantize_bucket(self.codes[bi], self.scales[bi], plan, plan.numel, torch.float32, backend=self.backend)

    def param_fp32(self, index: int) -> torch.Tensor:
        s = self.layout.slots[index]
        return api.dequantize(self.views[index], torch.float32, backend=self.backend).view(s.shape)
