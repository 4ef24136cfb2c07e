"""Baseline all-reduces kept for comparison with QuanGrad's precision-preserving one.

- ``fp32_all_reduce_``: the exact baseline, the process group's own fp32 all-reduce.
- ``bf16_all_reduce_``: cast to bf16, vendor all-reduce (partial sums rounded to bf16), cast back.
- ``naive_fp8_all_reduce_``: FP8-LM style (Peng et al. 2023), the "FP8-AllReduce" the AGoQ paper shows
  diverging (Fig. 8): ONE scale for the whole tensor, shared by all ranks (the global absmax, pre-scaled
  by the world size so that the sum cannot overflow), FP8 codes, and a low-precision sum where every
  partial sum is rounded back to FP8, as an FP8 ring reduction does. We sum in rank order over an
  all-to-all so that the result is deterministic; a ring rounds the same W-1 partial sums.

All three are SUMs, like torch.distributed.all_reduce and QuanGrad's all_reduce_.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from agoq_core.backend import get_backend
from agoq_core.formats.spec import FormatSpec
from agoq_core.quangrad.collective import group_info
from agoq_core.quangrad.config import resolve_spec

if TYPE_CHECKING:
    from agoq_core.backend.protocol import Backend

__all__ = [
    "fp32_all_reduce_",
    "bf16_all_reduce_",
    "naive_fp8_all_reduce_",
    "simulate_naive_fp8_all_reduce",
    "shared_scale",
    "naive_encode",
    "naive_decode",
    "fp8_rank_order_sum",
    "gather_amax",
]

_FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def _fp8_dtype(spec: FormatSpec) -> torch.dtype:
    try:
        return _FP8[spec.kind]
    except KeyError:
        raise ValueError(f"the naive FP8 all-reduce needs fp8_e4m3 or fp8_e5m2, got {spec.name}") from None


def _round_fp8(x: torch.Tensor, spec: FormatSpec) -> torch.Tensor:
    # Clamp before the cast (saturating, as the hardware cast does; torch 2.11 would give NaN).
    return x.clamp(-spec.qmax, spec.qmax).to(_fp8_dtype(spec))


def _decode(codes: torch.Tensor, spec: FormatSpec) -> torch.Tensor:
    return codes.view(_fp8_dtype(spec)).to(torch.float32)


def shared_scale(amax: torch.Tensor, world_size: int, spec: FormatSpec) -> torch.Tensor:
    """FP8-LM pre-scaling: ``amax x W / qmax`` so that a sum of W values cannot exceed qmax.
    A non-finite amax gives a NaN scale (the whole result becomes NaN: never silent)."""
    amax = amax.to(torch.float32)
    s = amax * float(world_size) / spec.qmax
    return torch.where(torch.isfinite(amax), s, torch.full_like(s, float("nan")))


def naive_encode(x: torch.Tensor, scale: torch.Tensor, spec: FormatSpec) -> torch.Tensor:
    """fp32 x -> FP8 codes (uint8) of x / scale, one scale for everything."""
    div = torch.where(scale == 0, torch.ones_like(scale), scale)
    return _round_fp8(x.to(torch.float32) / div, spec).view(torch.uint8)


def naive_decode(codes: torch.Tensor, scale: torch.Tensor, spec: FormatSpec) -> torch.Tensor:
    return _decode(codes, spec) * scale


def fp8_rank_order_sum(codes: torch.Tensor, spec: FormatSpec) -> torch.Tensor:
    """uint8[W, C] FP8 codes -> uint8[C]: ((c0 + c1) + c2) ... with every partial sum rounded to FP8."""
    acc = _decode(codes[0], spec)
    for r in range(1, codes.shape[0]):
        acc = _round_fp8(acc + _decode(codes[r], spec), spec).to(torch.float32)
    return _round_fp8(acc, spec).view(torch.uint8)


def gather_amax(x: torch.Tensor, *, group: Any = None, backend: "str | Backend | None" = None) -> torch.Tensor:
    """Max |x| over all ranks (NaN if any rank has NaN: all-gather + max, not a MAX all-reduce, whose
    NaN handling varies across collective libraries)."""
    be = get_backend(backend)
    _, world = group_info(group)
    a = x.abs().amax().reshape(1).to(torch.float32) if x.numel() else torch.zeros(1, device=x.device)
    out = torch.empty(world, dtype=torch.float32, device=x.device)
    be.all_gather_bytes(out, a, group=group)
    return out.max()


def _check(t: object, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"{what}: t must be a float32/bfloat16/float16 tensor, got {type(t).__name__} "
                        f"{getattr(t, 'dtype', '')}")
    return t


def fp32_all_reduce_(t: torch.Tensor, *, group: Any = None) -> torch.Tensor:
    """In place: SUM all-reduce in fp32 by the process group's own collective (the exact baseline)."""
    _check(t, "fp32_all_reduce_")
    x = t.detach().float().contiguous()
    dist.all_reduce(x, group=group)
    with torch.no_grad():
        t.copy_(x.view(t.shape))
    return t


def bf16_all_reduce_(t: torch.Tensor, *, group: Any = None) -> torch.Tensor:
    """In place: SUM all-reduce in bf16 by the process group's own collective."""
    _check(t, "bf16_all_reduce_")
    x = t.detach().to(torch.bfloat16).contiguous()
    dist.all_reduce(x, group=group)
    with torch.no_grad():
        t.copy_(x.view(t.shape))
    return t


def naive_fp8_all_reduce_(t: torch.Tensor, *, group: Any = None, fmt: str = "fp8_e4m3",
                          backend: "str | Backend | None" = None) -> torch.Tensor:
    """In place: the naive FP8 all-reduce (see module docstring); every rank ends identical."""
    _check(t, "naive_fp8_all_reduce_")
    spec = resolve_spec(fmt, None)
    _fp8_dtype(spec)
    be = get_backend(backend)
    _, world = group_info(group)
    n = t.numel()
    if n == 0:
        return t
    chunk = -(-n // world)
    x = torch.zeros(world * chunk, dtype=torch.float32, device=t.device)
    x[:n] = t.detach().reshape(-1)
    scale = shared_scale(gather_amax(x, group=group, backend=be), world, spec)
    send = naive_encode(x, scale, spec).view(world, chunk)
    recv = torch.empty_like(send)
    be.all_to_all_bytes(recv, send, group=group)
    seg = fp8_rank_order_sum(recv, spec)
    gathered = torch.empty(world, chunk, dtype=torch.uint8, device=t.device)
    be.all_gather_bytes(gathered, seg, group=group)
    out = naive_decode(gathered.reshape(-1)[:n], scale, spec)
    with torch.no_grad():
        t.copy_(out.view(t.shape))
    return t


def simulate_naive_fp8_all_reduce(rank_tensors: list[torch.Tensor], fmt: str = "fp8_e4m3") -> torch.Tensor:
    """Single-process model of ``naive_fp8_all_reduce_``: the fp32 result every rank ends with."""
    spec = resolve_spec(fmt, None)
    w = len(rank_tensors)
    xs = [t.detach().float().reshape(-1) for t in rank_tensors]
    amax = torch.stack([x.abs().amax() for x in xs]).max()
    scale = shared_scale(amax, w, spec)
    codes = torch.stack([naive_encode(x, scale, spec) for x in xs])  # [W, n]: element-wise, chunking is moot
    return naive_decode(fp8_rank_order_sum(codes, spec), scale, spec).view(rank_tensors[0].shape)
