"""Test and benchmark inputs shared by tests/ and benchmarks/ (device-neutral, seeded)."""
from __future__ import annotations

import torch

__all__ = ["gradient_like"]


def gradient_like(seed: int, rank: int, n_segments: int = 24, seg: int = 4096) -> torch.Tensor:
    """Gradient-like data for the error table: per-"layer" magnitudes spread over 4 decades, a shared
    signal plus rank-specific noise, heavy-tailed (Student-t, 3 degrees of freedom)."""
    g_common = torch.Generator().manual_seed(seed)
    g_rank = torch.Generator().manual_seed(seed * 7919 + rank + 1)
    scales = 10.0 ** (torch.rand(n_segments, generator=g_common) * 4 - 5)
    common = torch.randn(n_segments * seg, generator=g_common)
    chi = torch.distributions.Chi2(3.0)
    torch.manual_seed(seed * 31 + rank)
    t3 = torch.randn(n_segments * seg, generator=g_rank) / torch.sqrt(chi.sample((n_segments * seg,)) / 3.0)
    return (0.5 * common + t3) * scales.repeat_interleave(seg)
