"""Virtual data-parallel ranks: W ranks' gradient reduction computed in one process, through the
arithmetic of the real collectives, so that the all-reduce ablations can be studied on one device.

Each virtual rank runs its own micro-batches (its own data shard) on the one model; its gradients
are kept apart from the other ranks' until the step, then reduced exactly as W processes would:

- QuanGrad (``VirtualQuanGradDDP``, collective "quangrad"): each rank's 8-bit bucket storage is packed
  into segments, exchanged (the all-to-all, as row moves), summed in fp32 in rank order and
  requantized (``protocol.reduce_segment``), all-gathered and scattered — the functions the real
  ``collective.QuanGradOp`` calls, in the same order (``protocol.all_reduce_storages``).
- The naive FP8 all-reduce (collective "naive_fp8"): the global amax (all-gather + max), the shared
  pre-scaled scale, FP8 codes and FP8 partial sums in rank order (``baselines.shared_scale``,
  ``naive_encode``, ``fp8_rank_order_sum``, ``naive_decode``), then requantized into the storage.
- A vendor all-reduce (collective "fp32"/"bf16", and buckets below ``min_compress_bytes``), and the
  baseline's ``.grad`` all-reduce (``VirtualGradSum``): a sum in rank order in that dtype.

Bit-identical to a real W-process gloo run (tests/quangrad/test_virtual.py, tests/train/
test_virtual_ranks.py): QuanGrad and the naive FP8 all-reduce at any W, because their real paths
sum in rank order by construction. gloo's own all-reduce (DDP, the vendor path) sums each quarter
of a buffer in a different rotation of the ranks (measured, torch 2.13 CPU), so the rank-ordered
fp32 sum here equals it at W = 2 (fp32 addition is commutative) and differs from it in the last
bits at W >= 3. This is a numerics tool, not a speed model: it runs W micro-batches per step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from agoq_core import api
from agoq_core.quangrad import baselines as B
from agoq_core.quangrad import protocol as P
from agoq_core.quangrad.collective import ring_all_reduce_bytes
from agoq_core.quangrad.config import QuanGradConfig
from agoq_core.quangrad.storage import GradStorage
from agoq_core.quangrad.wrapper import QuanGradDDP

__all__ = ["VirtualQuanGradDDP", "VirtualGradSum", "GradError", "reduce_bucket", "check_virtual_world"]

_VENDOR_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def check_virtual_world(world_size: object) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"virtual world_size must be an int >= 1 (the number of simulated ranks), got {world_size!r}")
    return world_size


@dataclass(frozen=True, slots=True)
class _VirtualOp:
    """What the wrapper's step() reads from a finished bucket operation."""

    path: str
    sent_bytes: int
    stage: int = 3
    shard: Any = None


def reduce_bucket(path: str, codes: list[torch.Tensor], scales: list[torch.Tensor], plan: P.ChunkPlan,
                  out_codes: torch.Tensor, out_scales: torch.Tensor, *, backend: Any = None) -> int:
    """Reduce one bucket held by W = plan.world_size virtual ranks (rank r: ``codes[r]``, ``scales[r]``)
    the way bucket path ``path`` does across processes; the result every rank would end with goes to
    (out_codes, out_scales). Returns the bytes one real rank would send."""
    w = plan.world_size
    if len(codes) != w or len(scales) != w:
        raise ValueError(f"bucket planned for {w} ranks but {len(codes)} rank storages were given")
    spec = plan.spec
    if path == "local":
        if w != 1:
            raise ValueError(f"path 'local' is for one rank, the bucket has {w}")
        if out_codes.data_ptr() != codes[0].data_ptr():
            out_codes.copy_(codes[0])
            out_scales.copy_(scales[0])
        return 0
    if path == "quangrad":
        P.all_reduce_storages(codes, scales, plan, out_codes, out_scales, backend=backend)
        return plan.wire_bytes_per_rank()["total"]

    def rank_fp32(r: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return P.dequantize_bucket(codes[r], scales[r], plan, plan.numel, dtype, backend=backend)

    if path == "naive_fp8":  # collective.NaiveFP8Op, step by step
        amax = torch.stack([rank_fp32(r).abs().amax() for r in range(w)]).max()  # gather_amax: all-gather + max
        scale = B.shared_scale(amax, w, spec)
        sends = [B.naive_encode(rank_fp32(r), scale, spec).view(w, plan.chunk) for r in range(w)]
        segs = [B.fp8_rank_order_sum(P.exchange_rows(sends, r), spec) for r in range(w)]
        total = B.naive_decode(torch.stack(segs).reshape(-1), scale, spec)
        sent = 4 * (w - 1) + 2 * plan.chunk * (w - 1)
    elif path in _VENDOR_DTYPES:  # collective.VendorOp: dequantize, all-reduce in that dtype, requantize
        dtype = _VENDOR_DTYPES[path]
        total = rank_fp32(0, dtype)
        for r in range(1, w):
            total = total + rank_fp32(r, dtype)  # rank order (gloo's ring uses other orders: module doc)
        sent = ring_all_reduce_bytes(plan.numel, total.element_size(), w)
    else:
        raise ValueError(f"unknown bucket path {path!r}")
    q = api.quantize(total, spec, backend=backend)  # BucketOp._requantize_into_storage
    out_codes.copy_(q.codes)
    out_scales.copy_(q.scales)
    return sent


@dataclass(frozen=True, slots=True)
class GradError:
    """One parameter's reduced gradient against the exact one (the fp32 sum of every rank's raw
    micro-batch gradients): ``error`` = ||reduced - exact|| / ||exact|| (normalised L2);
    ``collective_error`` = the same against the fp32 sum of what the ranks stored (8-bit), i.e. what
    the collective alone adds."""

    error: float
    collective_error: float
    norm: float


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    nb = float(torch.linalg.vector_norm(b, dtype=torch.float64))
    d = float(torch.linalg.vector_norm((a - b), dtype=torch.float64))
    return d / nb if nb > 0 else (0.0 if d == 0 else float("inf"))


class VirtualQuanGradDDP(QuanGradDDP):
    """``QuanGradDDP`` for ``world_size`` data-parallel ranks simulated in this process.

        qg = VirtualQuanGradDDP(model, lambda ps: torch.optim.AdamW(ps), world_size=8)
        for r in range(8):
            qg.set_rank(r)                      # the next backward passes fold into rank r's buffers
            for mb in rank_micro_batches(r):    # rank r's data shard
                (qg(**mb).loss / n).backward()
        report = qg.step()                      # reduce as 8 ranks would, clip, optimizer step

    Every rank's 8-bit gradient buffers are kept (W x the per-rank gradient memory); nothing is
    launched during backward; ``step()`` reduces every bucket through :func:`reduce_bucket` and
    then runs ``QuanGradDDP.step`` unchanged. ``track_errors=True`` also keeps an fp32 copy of the
    raw gradients so that ``last_errors`` holds each parameter's :class:`GradError` after a step.
    The replicated (non-sharded) mode only.
    """

    def __init__(self, module: torch.nn.Module, optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer], *,
                 world_size: int, config: QuanGradConfig | None = None, track_errors: bool = False) -> None:
        w = check_virtual_world(world_size)
        if config is not None and isinstance(config, QuanGradConfig) and config.sharded:
            raise ValueError("VirtualQuanGradDDP simulates the replicated all-reduce; sharded=True (ZeRO-1) is not "
                             "supported with virtual ranks")
        self._virtual_world = w
        super().__init__(module, optimizer, config=config)
        self._storages = [self.storage] + [GradStorage(self.layout, self.device, self.backend) for _ in range(w - 1)]
        self._vrank = 0
        self.track_errors = bool(track_errors)
        self._exact: dict[int, torch.Tensor] = {}
        self.last_errors: dict[str, GradError] = {}

    # ---- the virtual world -------------------------------------------------------------------------------
    def _rank_and_world(self, cfg: QuanGradConfig) -> tuple[int, int]:
        return 0, self._virtual_world

    @property
    def _distributed(self) -> bool:
        return False

    @property
    def virtual_rank(self) -> int:
        return self._vrank

    def set_rank(self, rank: int) -> None:
        """Fold the following backward passes into virtual rank ``rank``'s gradient buffers."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ValueError(f"virtual rank must be in [0, {self.world_size}), got {rank!r}")
        self._vrank = rank
        self.storage = self._storages[rank]

    @property
    def all_gradient_bytes(self) -> int:
        """Bytes of every virtual rank's 8-bit buffers (``gradient_bytes`` is one rank's, as on a real rank)."""
        return sum(s.nbytes for s in self._storages)

    # ---- accumulation and reduction (QuanGradDDP's hooks) ---------------------------------------------
    def _on_grad(self, index: int, p: torch.Tensor) -> None:
        if self.track_errors and p.grad is not None:
            g = p.grad.detach().float()
            ex = self._exact.get(index)
            self._exact[index] = g.clone() if ex is None else ex.add_(g)
        super()._on_grad(index, p)

    def _pump(self) -> None:
        """Nothing is launched during backward: the other ranks' gradients are not there yet."""

    def _finish_all(self) -> None:
        self.last_errors = {}
        if self.track_errors:
            stored = {s.index: self._sum_stored(s.index) for s in self.layout.slots if s.index in self._exact}
        out = self._storages[0]
        for k, b in enumerate(self.layout.buckets):
            sent = reduce_bucket(b.path, [s.codes[k] for s in self._storages], [s.scales[k] for s in self._storages],
                                 out.plans[k], out.codes[k], out.scales[k], backend=self.backend)
            self._ops[k] = _VirtualOp(path=b.path, sent_bytes=sent)
        self.set_rank(0)
        self._next_launch = len(self.layout.buckets)
        if self.track_errors:
            for s in self.layout.slots:
                ex = self._exact.pop(s.index, None)
                if ex is None:
                    continue
                red = out.param_fp32(s.index).reshape(-1)
                ex = ex.reshape(-1)
                self.last_errors[s.name] = GradError(error=_rel(red, ex), collective_error=_rel(red, stored[s.index]),
                                                     norm=float(torch.linalg.vector_norm(ex, dtype=torch.float64)))

    def _sum_stored(self, index: int) -> torch.Tensor:
        total = None
        for st in self._storages:
            d = st.param_fp32(index).reshape(-1)
            total = d if total is None else total + d
        return total

    def zero_grad(self, set_to_none: bool = True) -> None:
        for st in self._storages:
            st.zero_()
        self._exact.clear()
        self.set_rank(0)
        self._reset_window()


class VirtualGradSum:
    """The baseline's data-parallel all-reduce (DDP: each rank's ``.grad`` / W, summed) for W ranks
    simulated in this process. Call ``end_rank()`` after each rank's backward passes (it takes the
    ``.grad`` tensors away and adds them, in rank order, into an fp32 sum), then ``finish()`` before
    the optimizer step (it puts the averaged gradient back into ``.grad``, in the parameter's dtype).

    Memory: one fp32 sum per parameter (not W copies). For fp32 parameters this is DDP's arithmetic
    with the ranks summed in order (= gloo's at W = 2, module doc); for bf16 parameters the sum is
    kept in fp32 and rounded once, which is more exact than a bf16 NCCL ring (documented deviation).
    """

    def __init__(self, params: list[torch.Tensor], world_size: int) -> None:
        self.world_size = check_virtual_world(world_size)
        self.params = [p for p in params if p.requires_grad]
        self._sum: list[torch.Tensor | None] = [None] * len(self.params)
        self._ranks = 0

    def end_rank(self) -> None:
        w = self.world_size  # DDP (gradient_as_bucket_view) divides each rank's gradient by W before the sum
        with torch.no_grad():
            for i, p in enumerate(self.params):
                g = p.grad
                if g is None:
                    continue
                g = g.float() / w
                self._sum[i] = g if self._sum[i] is None else self._sum[i] + g
                p.grad = None
        self._ranks += 1

    def finish(self) -> None:
        if self._ranks != self.world_size:
            raise RuntimeError(f"VirtualGradSum.finish(): {self._ranks} of {self.world_size} virtual ranks ran "
                               "backward this step; call end_rank() once per rank")
        for p, s in zip(self.params, self._sum):
            p.grad = None if s is None else s.to(p.dtype)
        self._sum = [None] * len(self.params)
        self._ranks = 0
