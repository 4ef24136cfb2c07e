"""The arms of ``agoq train``: one table of what each arm changes against the baseline.

Every arm builds its model from the same seed and trains on the same batches; a recipe says how its
activations (an LAAQ policy) and its gradients (a QuanGrad config) are kept:

| arm | activations (LAAQ) | gradients (QuanGrad) | optimizer |
|---|---|---|---|
| baseline | autograd's own (fp32 on CPU, bf16 on accelerators) | ``.grad`` + DDP all-reduce | AdamW (fp32 masters for bf16) |
| agoq | paper policy: norm / SiLU&Mul / out-proj inputs at 4 bits, attention core kept | FP8 E4M3 buffers, precision-preserving all-reduce | AdamW, or 8-bit AdamW with ``--agoq-optimizer adamw8bit`` |
| uniform4-attn | everything 4-bit, attention core included | as agoq | as agoq |
| naive-fp8-allreduce | as agoq | FP8, one shared scale, FP8 partial sums (FP8-LM) | as agoq |
| int8-everywhere | everything int8, attention core included | int8 buffers | as agoq |
| laaq-only | as agoq | as baseline | as baseline |
| quangrad-only | as baseline | as agoq | as agoq |

A new arm is one row of :data:`RECIPES`. This module imports nothing heavy: ``--help`` reads it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

__all__ = ["Recipe", "RECIPES", "ABLATIONS", "describe_arm"]


@dataclass(frozen=True)
class Recipe:
    description: str
    laaq: Callable[[Any], Any] | None
    """LAAQConfig class -> the arm's policy; None: autograd's own activations."""
    quangrad: Mapping[str, Any] | None
    """QuanGradConfig fields; None: plain .grad (+ DDP), as the baseline."""
    ablation: bool = True
    """Added with ``--ablation NAME`` (baseline and agoq have their own switches)."""


_QUANGRAD = {"fmt": "fp8_e4m3", "collective": "quangrad"}

# The 4-bit format is LAAQ's default (int4, block 128) for both the paper policy and the naive
# uniform one, so the uniform4-attn ablation changes *where* 4 bits are used, nothing else.
RECIPES: dict[str, Recipe] = {
    "baseline": Recipe("plain training: autograd's saved activations, .grad tensors, DDP all-reduce, AdamW",
                       laaq=None, quangrad=None, ablation=False),
    "agoq": Recipe("LAAQ (paper policy, 4-bit) + QuanGrad (FP8 E4M3 gradients, precision-preserving all-reduce)",
                   laaq=lambda C: C.paper(), quangrad=_QUANGRAD, ablation=False),
    "uniform4-attn": Recipe(
        "every saved activation, attention core included, at 4 bits (the paper: does not converge)",
        laaq=lambda C: C.uniform(C().norm_input, include_attention=True), quangrad=_QUANGRAD),
    "naive-fp8-allreduce": Recipe(
        "FP8 gradients reduced the FP8-LM way: one shared scale, low-precision sum",
        laaq=lambda C: C.paper(), quangrad={"fmt": "fp8_e4m3", "collective": "naive_fp8"}),
    "int8-everywhere": Recipe(
        "every saved activation (attention included) at int8 and int8 gradients",
        laaq=lambda C: C.uniform("int8", include_attention=True), quangrad={"fmt": "int8", "collective": "quangrad"}),
    "laaq-only": Recipe(
        "AGoQ's activation half alone: LAAQ (paper policy) with plain .grad gradients and DDP",
        laaq=lambda C: C.paper(), quangrad=None),
    "quangrad-only": Recipe(
        "AGoQ's gradient half alone: QuanGrad FP8 gradients with autograd's own activations",
        laaq=None, quangrad=_QUANGRAD),
}

#: Arms that ``--ablation`` can add next to the baseline and AGoQ arms, with their descriptions.
ABLATIONS: dict[str, str] = {k: r.description for k, r in RECIPES.items() if r.ablation}


def describe_arm(name: str) -> str:
    return RECIPES[name].description
