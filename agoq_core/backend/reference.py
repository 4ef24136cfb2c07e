"""The built-in ``reference`` backend: the pure-torch oracle codecs on any device torch has.

Registered through the same ``agoq_backends`` hook as every third-party plugin.
"""
from __future__ import annotations

import torch

from agoq_core.backend.hookspec import hookimpl
from agoq_core.backend.protocol import BackendBase
from agoq_core.backend.types import Availability, BackendInfo, Capabilities
from agoq_core.formats import reference as ref
from agoq_core.formats.spec import list_formats

__all__ = ["ReferenceBackend", "agoq_backends"]


class ReferenceBackend(BackendBase):
    name = "reference"
    dist_backend = "gloo"

    def capabilities(self) -> Capabilities:
        return Capabilities(
            formats=frozenset(s.name for s in list_formats(microscaling=True)),
            device_types=frozenset({"*"}),  # any device torch supports
            ops=frozenset({"quantize", "dequantize", "accumulate", "reduce_requantize"}),
            collectives=frozenset({"all_to_all", "all_gather"}),
            input_dtypes=frozenset({torch.float32, torch.bfloat16, torch.float16, torch.float64}),
            notes=("pure torch; the oracle the conformance suite compares every backend against",),
        )

    def quantize_into(self, x, spec, codes, scales):
        c, s = ref.quantize_blocks(x, spec)
        codes.copy_(c)
        scales.copy_(s)

    def dequantize_into(self, codes, scales, spec, out):
        out.copy_(ref.dequantize_blocks(codes, scales, spec, out.numel(), out.dtype))

    def accumulate_(self, codes, scales, spec, g):
        c, s = ref.accumulate(codes, scales, spec, g.numel(), g)
        codes.copy_(c)
        scales.copy_(s)

    def reduce_requantize_into(self, codes, scales, spec, numel, codes_out, scales_out):
        c, s = ref.reduce_requantize(codes, scales, spec, numel)
        codes_out.copy_(c)
        scales_out.copy_(s)


def _probe() -> Availability:
    return Availability(True, "pure torch: runs wherever torch runs")


@hookimpl
def agoq_backends() -> list[BackendInfo]:
    return [BackendInfo(
        name="reference", device_type="cpu", probe=_probe, load=ReferenceBackend,
        accelerator=False, distribution="agoq",
    )]
