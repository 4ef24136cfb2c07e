"""Triton kernel bodies shared by AGoQ's Triton backends (agoq-cuda; agoq-ascend reuses them).

This distribution declares no dependency on ``triton`` on purpose: on CUDA it comes from ``triton``,
on Ascend from ``triton-ascend``, which installs a module of the same name.

Layers: :mod:`.layout` (plain-Python constexpr tables, imports nothing), :mod:`.codes` (element-wise
@triton.jit helpers of the numerics contract), :mod:`.kernels` (the four codec kernels). A backend
supplies the launcher: tile rows, grid size, warps, and the chunking of huge tensors.
"""
from agoq_triton_kernels.layout import (  # noqa: F401  (plain data; no triton import)
    FLOAT_KINDS, KIND_IDS, MAX_BLOCK, MAX_CHUNK_ELEMENTS, format_constexprs, next_pow2,
)

__version__ = "0.1.0"

__all__ = ["FLOAT_KINDS", "KIND_IDS", "MAX_BLOCK", "MAX_CHUNK_ELEMENTS", "format_constexprs", "next_pow2"]
