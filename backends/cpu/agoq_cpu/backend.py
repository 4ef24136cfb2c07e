"""The ``cpu`` Backend object: compiled torch codecs on CPU tensors, gloo byte collectives.

Every op splits its flat buffer into whole blocks, which go through one compiled variant
(agoq_cpu.compiled), and a ragged tail of fewer than one block, which goes through the reference
codecs (agoq_core.formats.reference: the oracle itself, so the tail cannot disagree with it). Tensors
of fewer than two whole blocks go entirely to the reference: Dynamo specialises sizes 0 and 1, so
they would cost one more compile for a few hundred elements. The OCP MX / NVFP4 formats (mxfp4, mxfp8,
nvfp4) are claimed and run on the reference codecs too (not compiled yet).
"""
from __future__ import annotations

import torch

from agoq_core.backend import BackendBase, Capabilities
from agoq_core.formats import reference as ref
from agoq_core.formats.spec import list_formats
from agoq_cpu.compiled import Compiler

__all__ = ["CpuBackend"]

_MIN_BLOCKS = 2


def _compiled_path(spec, nf: int) -> bool:
    """Whole blocks go through a compiled graph, except for tensors of fewer than 2 blocks and for the
    OCP MX / NVFP4 formats (power-of-two and per-tensor scales: docs/formats.md §9)."""
    return nf >= _MIN_BLOCKS and spec.scale_kind == "absmax"
_COMPUTE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # others (float64) are rounded to fp32 first


def _input(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype in _COMPUTE_DTYPES else t.to(torch.float32)  # fp64 -> fp32: RNE (docs/formats.md §3.1)


def _retyped_alias(t: torch.Tensor, others: tuple[torch.Tensor, ...]) -> bool:
    if t._base is not None and t._base.dtype != t.dtype:
        return True
    ptr = t.untyped_storage().data_ptr()
    return any(o.dtype != t.dtype and o.untyped_storage().data_ptr() == ptr for o in others)


class _Writable:
    """Output buffers a compiled graph may write in place. aot_autograd (torch 2.13) cannot mutate a view
    that shares its storage with a tensor of another dtype ("input mutations on views with different
    dtypes"): the QuanGrad protocol packs codes and fp32 scales into one byte payload. Such buffers are
    swapped for a scratch tensor (a copy, when the op also reads them) and copied back on exit."""

    def __init__(self, *ts: torch.Tensor, inputs: tuple[torch.Tensor, ...] = (), read: bool = False) -> None:
        self.ts = ts
        others = ts + inputs
        self.bufs = tuple((t.clone() if read else torch.empty_like(t)) if _retyped_alias(t, others) else t
                          for t in ts)

    def __enter__(self) -> tuple[torch.Tensor, ...]:
        return self.bufs

    def __exit__(self, *exc) -> None:
        for t, b in zip(self.ts, self.bufs):
            if b is not t:
                t.copy_(b)


class CpuBackend(BackendBase):
    name = "cpu"
    device_type = "cpu"
    dist_backend = "gloo"  # BackendBase's all_to_all/all_gather on uint8 views: the same byte protocol

    def __init__(self, compile: bool | None = None, *, quiet: bool = False) -> None:
        self.compiler = Compiler(compile, quiet=quiet)
        self._caps = self._capabilities()

    def capabilities(self) -> Capabilities:
        return self._caps  # the core asks before every op: build it once

    def _capabilities(self) -> Capabilities:
        return Capabilities(
            formats=frozenset(s.name for s in list_formats(microscaling=True)),
            device_types=frozenset({"cpu"}),
            ops=frozenset({"quantize", "dequantize", "accumulate", "reduce_requantize"}),
            collectives=frozenset({"all_to_all", "all_gather"}),
            input_dtypes=frozenset({torch.float32, torch.bfloat16, torch.float16, torch.float64}),
            notes=(self.compiler.reason,
                   "bit-exact with the reference; ragged tails (< 1 block), tensors under 2 blocks and the "
                   "MX/NVFP4 formats use the reference codecs"),
        )

    # ---- codecs ------------------------------------------------------------------------------------
    def quantize_into(self, x, spec, codes, scales):
        n, b = x.numel(), spec.block
        nf = n // b
        if not _compiled_path(spec, nf):
            c, s = ref.quantize_blocks(x, spec)
            codes.copy_(c)
            scales.copy_(s)
            return
        x = _input(x)
        cbf = spec.code_bytes(nf * b)
        table, qmax = self.compiler.consts(spec)
        with _Writable(codes[:cbf], scales[:nf], inputs=(x,)) as (c, s):
            self.compiler.get("quantize", spec, x.dtype)(x[: nf * b].view(nf, b), qmax, c.view(nf, -1), s)
        if nf * b < n:
            c, s = ref.quantize_blocks(x[nf * b:], spec)
            codes[cbf:].copy_(c)
            scales[nf:].copy_(s)

    def dequantize_into(self, codes, scales, spec, out):
        n, b = out.numel(), spec.block
        nf = n // b
        if not _compiled_path(spec, nf):
            out.copy_(ref.dequantize_blocks(codes, scales, spec, n, out.dtype))
            return
        cbf = spec.code_bytes(nf * b)
        table, _ = self.compiler.consts(spec)
        with _Writable(out[: nf * b], inputs=(codes, scales)) as (o,):
            self.compiler.get("dequantize", spec, out.dtype)(codes[:cbf].view(nf, -1), scales[:nf], table, o.view(nf, b))
        if nf * b < n:
            out[nf * b:].copy_(ref.dequantize_blocks(codes[cbf:], scales[nf:], spec, n - nf * b, out.dtype))

    def accumulate_(self, codes, scales, spec, g):
        n, b = g.numel(), spec.block
        nf = n // b
        if not _compiled_path(spec, nf):
            c, s = ref.accumulate(codes, scales, spec, n, g)
            codes.copy_(c)
            scales.copy_(s)
            return
        g = _input(g)
        cbf = spec.code_bytes(nf * b)
        table, qmax = self.compiler.consts(spec)
        with _Writable(codes[:cbf], scales[:nf], inputs=(g,), read=True) as (c, s):
            self.compiler.get("accumulate", spec, g.dtype)(c.view(nf, -1), s, g[: nf * b].view(nf, b), table, qmax)
        if nf * b < n:
            c, s = ref.accumulate(codes[cbf:], scales[nf:], spec, n - nf * b, g[nf * b:])
            codes[cbf:].copy_(c)
            scales[nf:].copy_(s)

    def reduce_requantize_into(self, codes, scales, spec, numel, codes_out, scales_out):
        b = spec.block
        nf = numel // b
        if not _compiled_path(spec, nf):
            c, s = ref.reduce_requantize(codes, scales, spec, numel)
            codes_out.copy_(c)
            scales_out.copy_(s)
            return
        w, cbf = codes.shape[0], spec.code_bytes(nf * b)
        table, qmax = self.compiler.consts(spec)
        full_codes = codes[:, :cbf] if cbf == codes.shape[1] else codes[:, :cbf].contiguous()
        full_scales = scales[:, :nf] if nf == scales.shape[1] else scales[:, :nf].contiguous()
        with _Writable(codes_out[:cbf], scales_out[:nf], inputs=(codes, scales)) as (c, s):
            self.compiler.get("reduce_requantize", spec, torch.float32)(
                full_codes.view(w, nf, -1), full_scales, table, qmax, c.view(nf, -1), s)
        if nf * b < numel:
            c, s = ref.reduce_requantize(codes[:, cbf:], scales[:, nf:], spec, numel - nf * b)
            codes_out[cbf:].copy_(c)
            scales_out[nf:].copy_(s)

    def __repr__(self) -> str:
        mode = "compiled" if self.compiler.compile else "eager"
        return f"<agoq backend 'cpu' ({mode} codecs)>"
