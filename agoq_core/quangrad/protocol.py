"""QuanGrad's wire protocol: how a quantized bucket is cut into chunks, packed, reduced and rebuilt.

One bucket of P elements (P a multiple of world_size x block, zero-padded) is stored as codes
(``spec.code_bytes(P)`` bytes) and fp32 scales (P / block). Chunk r is elements [r*C, (r+1)*C) with
C = P / W, so every chunk is whole blocks and owns its scales. On the wire a chunk is one segment of
S = code_bytes(C) + 4 * C / block bytes: its codes, then its scales as little-endian fp32 bytes.

All-reduce (paper §5.3), per rank:
  1. all-to-all: send segment r of my bucket to rank r           (W x S bytes in, W x S out)
  2. reduce:     dequantize the W received segments to fp32, sum them in rank order 0..W-1
                 (left fold), requantize -> my reduced segment  (agoq_core.api.reduce_requantize)
  3. all-gather: every rank's reduced segment -> the whole bucket, identical on every rank
Reduce-scatter (ZeRO-1): steps 1-2 without requantizing; rank r keeps chunk r of the fp32 sum.

The real collective path (collective.py) and the single-process simulation below share these
functions, so the simulation's payloads are the bytes the real path hands to the byte collectives.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch

from agoq_core import api
from agoq_core.formats.spec import FormatSpec
from agoq_core.formats.tensor import QuantizedTensor
from agoq_core.quangrad.config import resolve_spec

if TYPE_CHECKING:
    from agoq_core.backend.protocol import Backend

__all__ = [
    "ChunkPlan",
    "padded_numel",
    "pack_segments",
    "unpack_segments",
    "segment_views",
    "scatter_segments",
    "reduce_segment",
    "sum_segments_fp32",
    "exchange_rows",
    "all_reduce_storages",
    "WirePayload",
    "SimulatedAllReduce",
    "SimulatedReduceScatter",
    "simulate_all_reduce",
    "simulate_reduce_scatter",
]


def padded_numel(numel: int, world_size: int, block: int) -> int:
    """``numel`` rounded up to a multiple of ``world_size * block`` (0 stays 0)."""
    unit = world_size * block
    return -(-numel // unit) * unit


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    """Sizes of one bucket on the wire. ``numel`` is the padded element count."""

    spec: FormatSpec
    world_size: int
    numel: int

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        unit = self.world_size * self.spec.block
        if self.numel % unit:
            raise ValueError(
                f"a QuanGrad bucket must hold a multiple of world_size x block = {self.world_size} x "
                f"{self.spec.block} = {unit} elements so that each rank's chunk is whole blocks; got "
                f"{self.numel}. Pad it to padded_numel(...) = {padded_numel(self.numel, self.world_size, self.spec.block)}"
            )

    @classmethod
    def for_numel(cls, numel: int, world_size: int, spec: FormatSpec) -> "ChunkPlan":
        return cls(spec=spec, world_size=world_size, numel=padded_numel(numel, world_size, spec.block))

    @property
    def chunk(self) -> int:
        """Elements per rank's chunk (C)."""
        return self.numel // self.world_size

    @property
    def chunk_code_bytes(self) -> int:
        return self.spec.code_bytes(self.chunk)

    @property
    def chunk_blocks(self) -> int:
        return self.chunk // self.spec.block

    @property
    def segment_bytes(self) -> int:
        """Bytes of one chunk on the wire (S): codes then fp32 scales."""
        return self.chunk_code_bytes + 4 * self.chunk_blocks

    @property
    def code_bytes(self) -> int:
        return self.spec.code_bytes(self.numel)

    @property
    def num_blocks(self) -> int:
        return self.numel // self.spec.block

    def wire_bytes_per_rank(self) -> dict[str, int]:
        """Bytes one rank sends to other ranks (its own segment never leaves it)."""
        s = self.segment_bytes * (self.world_size - 1)
        return {"all_to_all": s, "all_gather": s, "total": 2 * s}

    def check_storage(self, codes: torch.Tensor, scales: torch.Tensor) -> None:
        if codes.dtype != torch.uint8 or codes.dim() != 1 or codes.numel() != self.code_bytes:
            raise ValueError(f"bucket codes must be flat uint8[{self.code_bytes}], got {codes.dtype}{list(codes.shape)}")
        if scales.dtype != torch.float32 or scales.dim() != 1 or scales.numel() != self.num_blocks:
            raise ValueError(f"bucket scales must be flat float32[{self.num_blocks}], got {scales.dtype}{list(scales.shape)}")


def _scale_bytes(scales: torch.Tensor) -> torch.Tensor:
    # fp32 -> its 4 bytes per value in memory order (little-endian on every platform torch targets).
    return scales.contiguous().view(torch.uint8)


def pack_segments(codes: torch.Tensor, scales: torch.Tensor, plan: ChunkPlan,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """Bucket (codes, scales) -> the all-to-all send buffer uint8[W, S]; row r goes to rank r."""
    plan.check_storage(codes, scales)
    w, cb = plan.world_size, plan.chunk_code_bytes
    if out is None:
        out = torch.empty(w, plan.segment_bytes, dtype=torch.uint8, device=codes.device)
    out[:, :cb].copy_(codes.view(w, cb))
    out[:, cb:].copy_(_scale_bytes(scales).view(w, 4 * plan.chunk_blocks))
    return out


def unpack_segments(buf: torch.Tensor, plan: ChunkPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8[W, S] (one segment per rank, in rank order) -> codes uint8[W, Cb], scales fp32[W, NBc]."""
    w, cb = plan.world_size, plan.chunk_code_bytes
    buf = buf.view(w, plan.segment_bytes)
    codes = buf[:, :cb].contiguous()
    scales = buf[:, cb:].contiguous().view(torch.float32)
    return codes, scales


def segment_views(seg: torch.Tensor, plan: ChunkPlan) -> QuantizedTensor:
    """A uint8[S] segment as a QuantizedTensor of C elements whose codes/scales are views into it
    (the reduce step writes straight into the all-gather send buffer)."""
    cb = plan.chunk_code_bytes
    return QuantizedTensor(seg[:cb], seg[cb:].view(torch.float32), torch.Size([plan.chunk]), torch.float32,
                           plan.spec)


def scatter_segments(gathered: torch.Tensor, plan: ChunkPlan, codes: torch.Tensor, scales: torch.Tensor) -> None:
    """All-gather result uint8[W, S] -> the whole bucket's (codes, scales), in place."""
    plan.check_storage(codes, scales)
    w, cb = plan.world_size, plan.chunk_code_bytes
    g = gathered.view(w, plan.segment_bytes)
    codes.view(w, cb).copy_(g[:, :cb])
    scales.view(torch.uint8).view(w, 4 * plan.chunk_blocks).copy_(g[:, cb:])


def reduce_segment(recv: torch.Tensor, plan: ChunkPlan, out_seg: torch.Tensor | None = None, *,
                   backend: "str | Backend | None" = None) -> torch.Tensor:
    """The W received segments -> my reduced segment uint8[S]: fp32 left-fold sum, requantized."""
    codes, scales = unpack_segments(recv, plan)
    if out_seg is None:
        out_seg = torch.empty(plan.segment_bytes, dtype=torch.uint8, device=recv.device)
    api.reduce_requantize(codes, scales, plan.spec, plan.chunk, backend=backend, out=segment_views(out_seg, plan))
    return out_seg


def sum_segments_fp32(recv: torch.Tensor, plan: ChunkPlan, *, backend: "str | Backend | None" = None) -> torch.Tensor:
    """The W received segments -> fp32[C], the left-fold sum in rank order (reduce-scatter result)."""
    codes, scales = unpack_segments(recv, plan)
    total = None
    for r in range(plan.world_size):
        q = QuantizedTensor(codes[r], scales[r], torch.Size([plan.chunk]), torch.float32, plan.spec)
        d = api.dequantize(q, torch.float32, backend=backend)
        total = d if total is None else total + d  # one fp32 add per rank, in rank order
    return total


def quantize_padded(x: torch.Tensor, plan: ChunkPlan, *, backend: "str | Backend | None" = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat x (numel <= plan.numel) -> bucket storage (codes, scales) of plan.numel elements; the
    padding is zeros (zero codes, zero scales), exactly what quantizing the zero-padded tensor gives."""
    flat = x.detach().reshape(-1)
    n = flat.numel()
    if n > plan.numel:
        raise ValueError(f"tensor of {n} elements does not fit a bucket of {plan.numel}")
    codes = torch.full((plan.code_bytes,), plan.spec.zero_code, dtype=torch.uint8, device=x.device)
    scales = torch.zeros(plan.num_blocks, dtype=torch.float32, device=x.device)
    if n:
        q = api.quantize(flat, plan.spec, backend=backend)
        codes[: q.codes.numel()].copy_(q.codes)
        scales[: q.scales.numel()].copy_(q.scales)
    return codes, scales


def dequantize_bucket(codes: torch.Tensor, scales: torch.Tensor, plan: ChunkPlan, numel: int,
                      dtype: torch.dtype = torch.float32, *, backend: "str | Backend | None" = None) -> torch.Tensor:
    """The first ``numel`` elements of a bucket, dequantized to ``dtype``."""
    q = QuantizedTensor(codes[: plan.spec.code_bytes(numel)], scales[: plan.spec.num_blocks(numel)],
                        torch.Size([numel]), dtype, plan.spec)
    return api.dequantize(q, dtype, backend=backend)


# ---- single-process simulation (conformance suite, tests) -------------------------------------------

class WirePayload(NamedTuple):
    """Bytes one rank hands to the byte collectives: the all-to-all send buffer (uint8[W*S], segment r
    for rank r) and the all-gather send buffer (uint8[S], its reduced segment)."""

    all_to_all: torch.Tensor
    all_gather: torch.Tensor


class SimulatedAllReduce(NamedTuple):
    payloads: list[WirePayload]
    """Per rank."""
    results: list[torch.Tensor]
    """Per rank: the all-reduced tensor (sum, not average) in the input's shape and dtype."""


class SimulatedReduceScatter(NamedTuple):
    payloads: list[torch.Tensor]
    """Per rank: the all-to-all send buffer uint8[W*S]."""
    shards: list[torch.Tensor]
    """Per rank r: fp32[C], elements [r*C, (r+1)*C) of the zero-padded flat sum."""
    chunk: int
    """C, elements per shard."""


def _check_rank_tensors(rank_tensors: list[torch.Tensor]) -> None:
    if not isinstance(rank_tensors, (list, tuple)) or not rank_tensors:
        raise ValueError("rank_tensors must be a non-empty list with one tensor per rank")
    t0 = rank_tensors[0]
    for r, t in enumerate(rank_tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"rank_tensors[{r}] is a {type(t).__name__}, not a tensor")
        if t.shape != t0.shape or t.dtype != t0.dtype:
            raise ValueError(f"every rank must pass the same shape and dtype: rank 0 has {t0.dtype}{list(t0.shape)}, "
                             f"rank {r} has {t.dtype}{list(t.shape)}")


def exchange_rows(sends: list[torch.Tensor], dst: int) -> torch.Tensor:
    """all_to_all_single in one process: what rank ``dst`` receives, row ``dst`` of every rank's send
    buffer (uint8[W, S]) in source-rank order."""
    return torch.stack([send[dst] for send in sends])


def all_reduce_storages(codes: list[torch.Tensor], scales: list[torch.Tensor], plan: ChunkPlan,
                        out_codes: torch.Tensor, out_scales: torch.Tensor, *,
                        backend: "str | Backend | None" = None) -> list[WirePayload]:
    """QuanGrad's all-reduce of one bucket for W = plan.world_size ranks in one process: rank r's
    bucket storage is (codes[r], scales[r]); the result every real rank ends with is written to
    (out_codes, out_scales), which may be one rank's own storage. Returns each rank's wire payload.

    The same functions as the real path (collective.QuanGradOp) in the same order: pack, all-to-all,
    reduce_segment (fp32 sum in rank order, requantize), all-gather, scatter."""
    if len(codes) != plan.world_size or len(scales) != plan.world_size:
        raise ValueError(f"a bucket planned for {plan.world_size} ranks needs {plan.world_size} storages, "
                         f"got {len(codes)} codes and {len(scales)} scales")
    sends = [pack_segments(c, s, plan) for c, s in zip(codes, scales)]  # rank r's uint8[W, S]
    segs = [reduce_segment(exchange_rows(sends, r), plan, backend=backend) for r in range(plan.world_size)]
    scatter_segments(torch.stack(segs), plan, out_codes, out_scales)
    return [WirePayload(send.reshape(-1), seg) for send, seg in zip(sends, segs)]


def _simulate_a2a(rank_tensors, spec, backend):
    w = len(rank_tensors)
    plan = ChunkPlan.for_numel(rank_tensors[0].numel(), w, spec)
    storages = [quantize_padded(t, plan, backend=backend) for t in rank_tensors]
    return plan, storages


def simulate_all_reduce(rank_tensors: list[torch.Tensor], fmt: str | FormatSpec = "fp8_e4m3",
                        block: int | None = None, backend: "str | Backend | None" = None) -> SimulatedAllReduce:
    """Run QuanGrad's all-reduce for W = len(rank_tensors) ranks in one process.

    Returns (payloads, results): per rank the exact bytes handed to the all-to-all and the all-gather,
    and the result tensor every real rank would end with (bit-identical to the gloo/NCCL/HCCL path).
    """
    _check_rank_tensors(rank_tensors)
    spec = resolve_spec(fmt, block)
    t0 = rank_tensors[0]
    if t0.numel() == 0:
        empty = torch.empty(0, dtype=torch.uint8, device=t0.device)
        return SimulatedAllReduce([WirePayload(empty, empty) for _ in rank_tensors], [t.clone() for t in rank_tensors])
    plan, storages = _simulate_a2a(rank_tensors, spec, backend)
    codes = torch.empty(plan.code_bytes, dtype=torch.uint8, device=t0.device)
    scales = torch.empty(plan.num_blocks, dtype=torch.float32, device=t0.device)
    payloads = all_reduce_storages([c for c, _ in storages], [s for _, s in storages], plan, codes, scales,
                                   backend=backend)
    out = dequantize_bucket(codes, scales, plan, t0.numel(), t0.dtype, backend=backend).view(t0.shape)
    return SimulatedAllReduce(payloads, [out.clone() for _ in range(plan.world_size)])


def simulate_reduce_scatter(rank_tensors: list[torch.Tensor], fmt: str | FormatSpec = "fp8_e4m3",
                            block: int | None = None, backend: "str | Backend | None" = None) -> SimulatedReduceScatter:
    """QuanGrad's reduce-scatter for W = len(rank_tensors) ranks in one process: per rank the
    all-to-all payload and its fp32 shard of the sum (no requantization, no all-gather)."""
    _check_rank_tensors(rank_tensors)
    spec = resolve_spec(fmt, block)
    if rank_tensors[0].numel() == 0:
        empty = torch.empty(0, dtype=torch.uint8)
        return SimulatedReduceScatter([empty] * len(rank_tensors),
                                      [torch.empty(0, dtype=torch.float32) for _ in rank_tensors], 0)
    plan, storages = _simulate_a2a(rank_tensors, spec, backend)
    sends = [pack_segments(c, s, plan) for c, s in storages]
    shards = [sum_segments_fp32(exchange_rows(sends, r), plan, backend=backend) for r in range(plan.world_size)]
    return SimulatedReduceScatter([s.reshape(-1) for s in sends], shards, plan.chunk)
