"""Launcher-side checks shared by every backend that launches these kernels (imports torch only).

The core validates user input before it reaches a backend; these checks guard the kernel boundary
itself (a launcher called with buffers of the wrong size would write out of bounds on a device).
"""
from __future__ import annotations

import torch

from agoq_core.formats.spec import FormatSpec
from agoq_triton_kernels.layout import FLOAT_BF16, FLOAT_F16, FLOAT_F32

__all__ = ["FLOAT_KIND", "float_view", "check_codec_buffers"]

FLOAT_KIND = {torch.float32: FLOAT_F32, torch.bfloat16: FLOAT_BF16, torch.float16: FLOAT_F16}


def float_view(t: torch.Tensor, what: str, who: str = "agoq Triton") -> tuple[torch.Tensor, int]:
    """(tensor to pass, its FLOAT_* kind): bf16 travels as an int16 view, rounded with integer logic."""
    if t.dtype not in FLOAT_KIND:
        raise TypeError(f"{what}: {who} kernels take float32, bfloat16 or float16, got {t.dtype}")
    kind = FLOAT_KIND[t.dtype]
    return (t.view(torch.int16) if kind == FLOAT_BF16 else t), kind


def check_codec_buffers(spec: FormatSpec, n: int, codes: torch.Tensor, scales: torch.Tensor,
                        device: torch.device, what: str, data: str = "the data") -> None:
    """codes/scales must be uint8/fp32, exactly sized for ``n`` elements of ``spec``, contiguous, on ``device``."""
    if codes.dtype != torch.uint8 or scales.dtype != torch.float32:
        raise TypeError(f"{what}: want uint8 codes and float32 scales, got {codes.dtype} and {scales.dtype}")
    if codes.numel() != spec.code_bytes(n) or scales.numel() != spec.num_blocks(n):
        raise ValueError(f"{what}: {n} elements of {spec.name}/block {spec.block} need {spec.code_bytes(n)} code "
                         f"bytes and {spec.num_blocks(n)} scales, got {codes.numel()} and {scales.numel()}")
    for name, t in (("codes", codes), ("scales", scales)):
        if not t.is_contiguous():
            raise ValueError(f"{what}: {name} must be contiguous")
        if t.device != device:
            raise ValueError(f"{what}: {name} is on {t.device} but {data} is on {device}")
