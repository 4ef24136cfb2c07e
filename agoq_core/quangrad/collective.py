"""QuanGrad's collectives on a real torch.distributed group, as three-stage bucket operations.

Each bucket operation runs ``launch()`` (first collective, async), ``advance()`` (wait for it, local
reduction, second collective, async) and ``finish()`` (wait, write the result). The data-parallel
wrapper interleaves buckets as launch(k), advance(k-1) so that bucket k's all-to-all overlaps bucket
k-1's reduction and all-gather and both overlap the rest of backward. The order of collectives depends
only on bucket indices, never on timing, so every rank issues the same sequence (NCCL/HCCL match
collectives by order; a mismatch would hang).

Paths: ``QuanGradOp`` (the precision-preserving all-reduce or its reduce-scatter variant),
``VendorOp`` (plain fp32/bf16 all-reduce or reduce-scatter: the baselines and the crossover fallback),
``NaiveFP8Op`` (one shared scale, FP8 partial sums: the FP8-LM baseline the paper shows diverging).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from agoq_core import api
from agoq_core.backend import get_backend
from agoq_core.errors import BackendError, BackendMismatchError
from agoq_core.formats.spec import FormatSpec
from agoq_core.quangrad import protocol as P
from agoq_core.quangrad.agree import agree_across_ranks
from agoq_core.quangrad.config import resolve_spec

if TYPE_CHECKING:
    from agoq_core.backend.protocol import Backend

__all__ = ["group_info", "BucketOp", "QuanGradOp", "VendorOp", "NaiveFP8Op", "LocalOp", "make_bucket_op", "all_reduce_",
           "reduce_scatter", "ReduceScatterResult", "ring_all_reduce_bytes"]

_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def group_info(group: Any = None) -> tuple[int, int]:
    """(rank, world_size) of ``group``, with a clear error if torch.distributed is not initialised."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "QuanGrad needs an initialised torch.distributed process group: call "
            "torch.distributed.init_process_group(...) first (torchrun sets the environment), or use "
            "agoq_core.quangrad.protocol.simulate_all_reduce for a single-process run"
        )
    return dist.get_rank(group), dist.get_world_size(group)


def ring_all_reduce_bytes(numel: int, element_size: int, world_size: int) -> int:
    """Bytes one rank sends in a ring all-reduce (reduce-scatter + all-gather): 2 (W-1)/W x N x size."""
    return 2 * (world_size - 1) * numel * element_size // world_size


def _wait(work: Any) -> None:
    if work is not None:
        work.wait()


class BucketOp:
    """One bucket's reduction across ranks. Subclasses fill ``launch``/``advance``/``finish``.

    Works on a bucket's quantized storage (``codes``, ``scales`` of ``plan.numel`` elements). After
    ``finish()`` the storage holds the reduced sum (all-reduce), or ``shard`` holds this rank's fp32
    chunk of it (``sharded=True``: reduce-scatter; the storage is left as it was).
    """

    path = "base"

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, plan: P.ChunkPlan, *, group: Any,
                 backend: "Backend", sharded: bool) -> None:
        plan.check_storage(codes, scales)
        self.codes, self.scales, self.plan = codes, scales, plan
        self.group, self.backend, self.sharded = group, backend, sharded
        self.rank, self.world = group_info(group)
        if self.world != plan.world_size:
            raise ValueError(f"bucket planned for {plan.world_size} ranks but the group has {self.world}")
        self.shard: torch.Tensor | None = None
        self.sent_bytes = 0
        self.stage = 0  # 0 new, 1 launched, 2 advanced, 3 finished

    def launch(self) -> None:
        raise NotImplementedError

    def advance(self) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        raise NotImplementedError

    def run(self) -> "BucketOp":
        """All three stages back to back (no overlap)."""
        self.launch()
        self.advance()
        self.finish()
        return self

    def _requantize_into_storage(self, x: torch.Tensor) -> None:
        q = api.quantize(x, self.plan.spec, backend=self.backend)
        self.codes.copy_(q.codes)
        self.scales.copy_(q.scales)


class QuanGradOp(BucketOp):
    """All-to-all of 8-bit segments, fp32 rank-order sum, requantize, all-gather (or keep the fp32 shard)."""

    path = "quangrad"

    def launch(self) -> None:
        plan = self.plan
        self._send = P.pack_segments(self.codes, self.scales, plan)
        self._recv = torch.empty_like(self._send)
        self._work = self.backend.all_to_all_bytes(self._recv, self._send, group=self.group, async_op=True)
        self.sent_bytes += plan.segment_bytes * (self.world - 1)
        self.stage = 1

    def advance(self) -> None:
        _wait(self._work)
        self._send = None  # free the send buffer as soon as the all-to-all is done
        plan = self.plan
        if self.sharded:
            self.shard = P.sum_segments_fp32(self._recv, plan, backend=self.backend)
            self._work = None
        else:
            self._seg = P.reduce_segment(self._recv, plan, backend=self.backend)
            self._gathered = torch.empty(self.world, plan.segment_bytes, dtype=torch.uint8, device=self.codes.device)
            self._work = self.backend.all_gather_bytes(self._gathered, self._seg, group=self.group, async_op=True)
            self.sent_bytes += plan.segment_bytes * (self.world - 1)
        self._recv = None
        self.stage = 2

    def finish(self) -> None:
        _wait(self._work)
        if not self.sharded:
            P.scatter_segments(self._gathered, self.plan, self.codes, self.scales)
            self._gathered = self._seg = None
        self._work = None
        self.stage = 3


class VendorOp(BucketOp):
    """Plain all-reduce (or reduce-scatter) of the dequantized bucket in fp32 or bf16 by the process
    group's own collective; the sum is requantized into the 8-bit storage."""

    def __init__(self, *args: Any, dtype: str = "fp32", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dtype = _TORCH_DTYPES[dtype]
        self.path = f"{dtype}_vendor"

    def launch(self) -> None:
        plan = self.plan
        x = P.dequantize_bucket(self.codes, self.scales, plan, plan.numel, self.dtype, backend=self.backend)
        if self.sharded:
            self._out = torch.empty(plan.chunk, dtype=self.dtype, device=x.device)
            fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            self._work = fn(self._out, x, group=self.group, async_op=True)
            self.sent_bytes += (self.world - 1) * plan.chunk * x.element_size()
        else:
            self._out = x
            self._work = dist.all_reduce(x, group=self.group, async_op=True)
            self.sent_bytes += ring_all_reduce_bytes(plan.numel, x.element_size(), self.world)
        self.stage = 1

    def advance(self) -> None:
        self.stage = 2

    def finish(self) -> None:
        _wait(self._work)
        if self.sharded:
            self.shard = self._out.float()
        else:
            self._requantize_into_storage(self._out)
        self._out = self._work = None
        self.stage = 3


class NaiveFP8Op(BucketOp):
    """FP8-LM style: one scale shared by the whole bucket and all ranks, FP8 partial sums."""

    path = "naive_fp8"

    def launch(self) -> None:
        from agoq_core.quangrad import baselines as B

        plan = self.plan
        x = P.dequantize_bucket(self.codes, self.scales, plan, plan.numel, torch.float32, backend=self.backend)
        self._scale = B.shared_scale(B.gather_amax(x, group=self.group, backend=self.backend), self.world, plan.spec)
        send = B.naive_encode(x, self._scale, plan.spec).view(self.world, plan.chunk)
        self._recv = torch.empty_like(send)
        self._send = send
        self._work = self.backend.all_to_all_bytes(self._recv, send, group=self.group, async_op=True)
        self.sent_bytes += 4 * (self.world - 1) + plan.chunk * (self.world - 1)
        self.stage = 1

    def advance(self) -> None:
        from agoq_core.quangrad import baselines as B

        _wait(self._work)
        self._send = None
        seg = B.fp8_rank_order_sum(self._recv, self.plan.spec)
        if self.sharded:
            self.shard = B.naive_decode(seg, self._scale, self.plan.spec)
            self._work = None
        else:
            self._seg = seg
            self._gathered = torch.empty(self.world, self.plan.chunk, dtype=torch.uint8, device=seg.device)
            self._work = self.backend.all_gather_bytes(self._gathered, seg, group=self.group, async_op=True)
            self.sent_bytes += self.plan.chunk * (self.world - 1)
        self._recv = None
        self.stage = 2

    def finish(self) -> None:
        from agoq_core.quangrad import baselines as B

        _wait(self._work)
        if not self.sharded:
            self._requantize_into_storage(B.naive_decode(self._gathered.reshape(-1), self._scale, self.plan.spec))
            self._gathered = self._seg = None
        self._work = None
        self.stage = 3


class LocalOp(BucketOp):
    """World size 1: nothing to reduce. The storage already holds the sum; the sharded variant's shard is
    the whole bucket in fp32."""

    path = "local"

    def __init__(self, codes, scales, plan, *, group, backend, sharded):  # no process group needed
        plan.check_storage(codes, scales)
        self.codes, self.scales, self.plan = codes, scales, plan
        self.group, self.backend, self.sharded = group, backend, sharded
        self.rank, self.world = 0, 1
        self.shard, self.sent_bytes, self.stage = None, 0, 0

    def launch(self) -> None:
        self.stage = 1

    def advance(self) -> None:
        self.stage = 2

    def finish(self) -> None:
        if self.sharded:
            self.shard = P.dequantize_bucket(self.codes, self.scales, self.plan, self.plan.numel, torch.float32,
                                             backend=self.backend)
        self.stage = 3


def make_bucket_op(path: str, codes: torch.Tensor, scales: torch.Tensor, plan: P.ChunkPlan, *, group: Any,
                   backend: "Backend", sharded: bool) -> BucketOp:
    """``path``: "quangrad", "naive_fp8", "fp32" or "bf16" (vendor collective in that dtype), "local"."""
    kw = dict(group=group, backend=backend, sharded=sharded)
    if path == "local":
        return LocalOp(codes, scales, plan, **kw)
    if path == "quangrad":
        return QuanGradOp(codes, scales, plan, **kw)
    if path == "naive_fp8":
        return NaiveFP8Op(codes, scales, plan, **kw)
    if path in _TORCH_DTYPES:
        return VendorOp(codes, scales, plan, dtype=path, **kw)
    raise ValueError(f"unknown bucket path {path!r}")


# ---- the small checking API ----------------------------------------------------------------------------

def _check_tensor(t: object, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what}: t must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"{what}: t must be float32, bfloat16 or float16, got {t.dtype}")
    if t.is_sparse:
        raise TypeError(f"{what}: sparse tensors are not supported")
    return t


def _backend_mismatch(heads: list[dict[str, Any]]) -> Exception | None:
    """Different backends: the error (and wording) of agoq_core.backend.check_same_backend_across_ranks."""
    names = [h.get("backend") for h in heads]
    if len(set(names)) == 1:
        return None
    detail = "; ".join(f"rank {r}: {n}" for r, n in enumerate(names))
    return BackendMismatchError(
        f"the ranks of this process group use different agoq backends ({detail}). Every rank must run the "
        "same backend on the same device type: set AGOQ_BACKEND=<name> identically on every rank (and the "
        "variables that pick its mode, such as TRITON_INTERPRET)")


def _resolve_and_agree(t: torch.Tensor, spec: FormatSpec, backend: "str | Backend | None", group: Any,
                       what: str) -> "Backend":
    """The backend, after one tiny all-gather that every rank issues on every call: padding would hide a
    size mismatch and a format mismatch would decode as NaN, so ranks compare (numel, format, block,
    dtype, backend) before any payload. A rank whose backend selection fails still takes part (its
    header says why), so the others get the same error instead of waiting."""
    try:
        be, failure = get_backend(backend), None
        name = f"{be.name} ({be.device_type})"
    except BackendError as exc:
        be, name, failure = None, f"failed: {type(exc).__name__}: {exc}"[:120], exc
    header = {"numel": t.numel(), "fmt": spec.name, "block": spec.block,
              "dtype": str(t.dtype).replace("torch.", ""), "backend": name}
    agree_across_ranks(header, group=group, device=t.device, backend=None, what=what,
                       fix="Every rank must pass a tensor of the same size and dtype with the same fmt, block "
                           "and backend (as with torch.distributed.all_reduce).", special=_backend_mismatch)
    if failure is not None:
        raise failure
    return be


def all_reduce_(t: torch.Tensor, *, group: Any = None, fmt: str | FormatSpec = "fp8_e4m3", block: int | None = None,
                backend: "str | Backend | None" = None) -> torch.Tensor:
    """In place: ``t`` <- QuanGrad all-reduce (SUM) of ``t`` over ``group``; every rank ends with the
    identical tensor.

    ``t`` is quantized block-wise (``fmt``, ``block``: default 256), cut into world_size chunks of
    whole blocks (zero padding when its size does not divide), exchanged with an all-to-all, summed in
    fp32 in rank order, requantized and all-gathered. NaN/Inf anywhere in a block on any rank makes
    that block NaN on every rank. Every rank must pass the same size, dtype, fmt, block and backend:
    a small header exchanged first checks it and raises ``RankMismatchError`` on every rank otherwise.
    """
    _check_tensor(t, "all_reduce_")
    spec = resolve_spec(fmt, block)
    _, world = group_info(group)
    be = _resolve_and_agree(t, spec, backend, group, "quangrad.all_reduce_")
    n = t.numel()
    if n == 0:  # every rank agreed on 0 elements: nothing to exchange
        return t
    plan = P.ChunkPlan.for_numel(n, world, spec)
    codes, scales = P.quantize_padded(t, plan, backend=be)
    QuanGradOp(codes, scales, plan, group=group, backend=be, sharded=False).run()
    out = P.dequantize_bucket(codes, scales, plan, n, t.dtype, backend=be)
    with torch.no_grad():
        t.copy_(out.view(t.shape))
    return t


class ReduceScatterResult:
    """This rank's fp32 shard of a QuanGrad reduce-scatter: ``shard`` holds elements
    [start, stop) of the flattened sum; the padded tail (stop > numel) is zeros."""

    __slots__ = ("shard", "start", "stop", "numel")

    def __init__(self, shard: torch.Tensor, start: int, stop: int, numel: int) -> None:
        self.shard, self.start, self.stop, self.numel = shard, start, stop, numel

    def __repr__(self) -> str:
        return f"ReduceScatterResult(elements [{self.start}, {self.stop}) of {self.numel}, {self.shard.dtype})"


def reduce_scatter(t: torch.Tensor, *, group: Any = None, fmt: str | FormatSpec = "fp8_e4m3",
                   block: int | None = None, backend: "str | Backend | None" = None) -> ReduceScatterResult:
    """QuanGrad reduce-scatter (SUM, ZeRO-1 style): all-to-all of 8-bit chunks and a fp32 rank-order sum;
    rank r keeps chunk r (C = padded_numel / world_size elements) in fp32. ``t`` is not modified."""
    _check_tensor(t, "reduce_scatter")
    spec = resolve_spec(fmt, block)
    rank, world = group_info(group)
    be = _resolve_and_agree(t, spec, backend, group, "quangrad.reduce_scatter")
    n = t.numel()
    if n == 0:
        return ReduceScatterResult(torch.empty(0, dtype=torch.float32, device=t.device), 0, 0, 0)
    plan = P.ChunkPlan.for_numel(n, world, spec)
    codes, scales = P.quantize_padded(t, plan, backend=be)
    op = QuanGradOp(codes, scales, plan, group=group, backend=be, sharded=True).run()
    return ReduceScatterResult(op.shard, rank * plan.chunk, (rank + 1) * plan.chunk, n)
