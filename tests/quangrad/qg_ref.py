"""Independent references for QuanGrad's protocol, written from the paper's description (§5.3) on top
of the format oracle (agoq_core.formats.reference), without the protocol module's chunking code.

Because every chunk is whole blocks, requantizing chunk by chunk equals requantizing the whole summed
vector block by block; and zero padding changes no block of the real elements. So the all-reduce of
W tensors is simply Q(sum_r D(Q(t_r))) with the sum a left fold in fp32, on the unpadded tensors.
"""
from __future__ import annotations

import torch

from agoq_core.formats import reference as ref
from agoq_core.formats.spec import FormatSpec


def dq_q(x: torch.Tensor, spec: FormatSpec) -> torch.Tensor:
    c, s = ref.quantize_blocks(x.reshape(-1).float(), spec)
    return ref.dequantize_blocks(c, s, spec, x.numel(), torch.float32)


def fp32_fold(rank_tensors: list[torch.Tensor], spec: FormatSpec) -> torch.Tensor:
    total = dq_q(rank_tensors[0], spec)
    for t in rank_tensors[1:]:
        total = total + dq_q(t, spec)
    return total


def all_reduce(rank_tensors: list[torch.Tensor], spec: FormatSpec) -> torch.Tensor:
    """What every rank must end with, in the input dtype and shape."""
    t0 = rank_tensors[0]
    return dq_q(fp32_fold(rank_tensors, spec), spec).to(t0.dtype).view(t0.shape)


def padded(n: int, world: int, block: int) -> int:
    unit = world * block
    return ((n + unit - 1) // unit) * unit


def a2a_payload(t: torch.Tensor, world: int, spec: FormatSpec) -> bytes:
    """The bytes a rank sends in the all-to-all: for each destination r, the codes of elements
    [r*C, (r+1)*C) of its zero-padded quantized tensor, then their fp32 scales (little-endian)."""
    p = padded(t.numel(), world, spec.block)
    x = torch.zeros(p)
    x[: t.numel()] = t.reshape(-1).float()
    c, s = ref.quantize_blocks(x, spec)
    chunk, nbc = p // world, p // world // spec.block
    out = b""
    for r in range(world):
        out += c[r * chunk:(r + 1) * chunk].numpy().tobytes() + s[r * nbc:(r + 1) * nbc].numpy().astype("<f4").tobytes()
    return out


def ag_payload(rank_tensors: list[torch.Tensor], rank: int, spec: FormatSpec) -> bytes:
    """The bytes rank ``rank`` sends in the all-gather: its chunk of Q(sum), codes then scales."""
    world = len(rank_tensors)
    n = rank_tensors[0].numel()
    p = padded(n, world, spec.block)
    total = torch.zeros(p)
    total[:n] = fp32_fold(rank_tensors, spec)
    c, s = ref.quantize_blocks(total, spec)
    chunk, nbc = p // world, p // world // spec.block
    return (c[rank * chunk:(rank + 1) * chunk].numpy().tobytes()
            + s[rank * nbc:(rank + 1) * nbc].numpy().astype("<f4").tobytes())


def reduce_scatter_shard(rank_tensors: list[torch.Tensor], rank: int, spec: FormatSpec) -> torch.Tensor:
    world = len(rank_tensors)
    n = rank_tensors[0].numel()
    p = padded(n, world, spec.block)
    total = torch.zeros(p)
    total[:n] = fp32_fold(rank_tensors, spec)
    chunk = p // world
    return total[rank * chunk:(rank + 1) * chunk]


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality (NaN-safe)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def sqnr_db(y: torch.Tensor, exact: torch.Tensor) -> float:
    y, exact = y.double().reshape(-1), exact.double().reshape(-1)
    err = (y - exact).norm()
    return float("inf") if err == 0 else float(20 * torch.log10(exact.norm() / err))
