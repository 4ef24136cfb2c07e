"""LAAQ: keep near-4-bit copies of a decoder layer's inputs, recompute the rest in backward.

Quick start::

    from agoq_core import laaq
    report = laaq.apply(model)            # HF Llama / Mistral / Qwen2 / Qwen3, unmodified
    print(report); loss.backward() ...    # train as usual
    laaq.remove(model)                    # back to the original model

The paper's policy (arXiv 2605.00539 §4.1) is the default: both RMSNorm inputs, the SiLU&Mul input
and the attention out-projection input are kept at 4 bits (block 128); the RMSNorm outputs, the
norm statistics and the SwiGLU output are recomputed in backward; the attention core stays 16-bit.
``LAAQConfig`` selects other formats per role and per layer (DBCA-PP), or the naive all-4-bit
ablation. ``measure_saved_bytes`` reports what autograd really keeps, per layer and part.
"""
from agoq_core.laaq.config import NATIVE, ROLES, LAAQConfig, RolePlan  # noqa: F401
from agoq_core.laaq.families import FAMILIES, LayerFamily, register_family  # noqa: F401
from agoq_core.laaq.integrate import (Conversion, LAAQReport, Skip, apply, convert_linear, convert_norm,
                                      convert_swiglu, is_converted, remove)
from agoq_core.laaq.loss import chunked_linear_cross_entropy
from agoq_core.laaq.memory import PARTS, SavedBytes, SavedBytesMeter, flash_layout_sdpa, measure_saved_bytes  # noqa: F401
from agoq_core.laaq.numerics import GradientErrors, gradient_errors
from agoq_core.laaq.policy import PolicyReport, apply_policy

__all__ = [
    # the verb and its config
    "apply",
    "remove",
    "LAAQConfig",
    "LAAQReport",
    "Conversion",
    "Skip",
    # model families
    "LayerFamily",
    "register_family",
    # own model code
    "convert_norm",
    "convert_linear",
    "convert_swiglu",
    "is_converted",
    # memory accounting
    "measure_saved_bytes",
    "SavedBytes",
    "SavedBytesMeter",
    # numerics
    "gradient_errors",
    "GradientErrors",
    # long sequences
    "chunked_linear_cross_entropy",
    # memory-budget policy (agoq_core.planner.budget): LAAQ / checkpointing per layer
    "apply_policy",
    "PolicyReport",
]
