"""A DDP communication hook for users who want QuanGrad's wire compression but keep DDP (and its
16/32-bit gradients in memory).

    from agoq_core.quangrad import register_comm_hook
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = register_comm_hook(ddp, fmt="fp8_e4m3")
    ... train as usual ...; print(state.summary())

Each DDP bucket (a flat gradient buffer) is quantized, all-reduced with QuanGrad's protocol and
averaged, or, below ``min_compress_bytes``, averaged with the vendor all-reduce (counted in the state,
never silent). The hook runs its bucket's collectives to completion before returning (DDP's own
bucket order keeps ranks in step); for overlapped launches and 8-bit storage use QuanGradDDP.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from agoq_core.backend import check_same_backend_across_ranks, get_backend
from agoq_core.quangrad import protocol as P
from agoq_core.quangrad.collective import QuanGradOp, group_info, ring_all_reduce_bytes
from agoq_core.quangrad.config import DEFAULT_BLOCK, DEFAULT_MIN_COMPRESS_BYTES, resolve_spec

log = logging.getLogger("agoq")

__all__ = ["QuanGradHookState", "quangrad_hook", "register_comm_hook"]


@dataclass
class QuanGradHookState:
    """State of the DDP hook: format, crossover, and counters of what each bucket went through."""

    fmt: str = "fp8_e4m3"
    block: int = DEFAULT_BLOCK
    min_compress_bytes: int = DEFAULT_MIN_COMPRESS_BYTES
    group: Any = None
    backend: Any = None
    compressed_buckets: int = 0
    fallback_buckets: int = 0
    wire_bytes: int = 0
    compressed_bytes: int = 0   # gradient bytes (as DDP hands them over) that went through QuanGrad
    fallback_bytes: int = 0     # ... and through the vendor all-reduce (below min_compress_bytes)
    fallback_reasons: dict[int, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _step_seen: dict[int, bool] = field(default_factory=dict, repr=False)  # bucket -> compressed, first step
    _step_logged: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        self.spec = resolve_spec(self.fmt, self.block)
        self.be = get_backend(self.backend)

    def _note(self, index: int, nbytes: int, compressed: bool) -> None:
        """Count a bucket; when the first step is complete (a bucket comes back), log its split once,
        so a threshold that compresses nothing is visible in the log, not only in summary()."""
        if compressed:
            self.compressed_buckets += 1
            self.compressed_bytes += nbytes
        else:
            self.fallback_buckets += 1
            self.fallback_bytes += nbytes
        if self._step_logged:
            return
        if index in self._step_seen:
            self._step_logged = True
            n_c = sum(self._step_seen.values())
            log.warning("agoq QuanGrad hook, first step: %d of %d DDP buckets compressed (%s); %d below "
                        "min_compress_bytes=%s went through the vendor all-reduce%s", n_c, len(self._step_seen),
                        self.spec.name, len(self._step_seen) - n_c, f"{self.min_compress_bytes:,}",
                        " -- nothing is compressed: lower min_compress_bytes or raise DDP's bucket_cap_mb"
                        if n_c == 0 else "")
        else:
            self._step_seen[index] = compressed

    def summary(self) -> str:
        s = (f"QuanGrad DDP hook ({self.spec.name}, block {self.spec.block}, min_compress_bytes "
             f"{self.min_compress_bytes:,}): {self.compressed_buckets} bucket reductions compressed "
             f"({self.compressed_bytes:,} B of gradients), {self.fallback_buckets} through the vendor all-reduce "
             f"({self.fallback_bytes:,} B), {self.wire_bytes:,} bytes sent")
        if self.fallback_reasons:
            s += "\n" + "\n".join(f"  DDP bucket {i}: {r}" for i, r in sorted(self.fallback_reasons.items()))
        return s


def quangrad_hook(state: QuanGradHookState, bucket: dist.GradBucket) -> torch.futures.Future:
    """DDP comm hook: average the bucket over ranks with QuanGrad's all-reduce (in place)."""
    buf = bucket.buffer()
    _, world = group_info(state.group)
    nbytes = buf.numel() * 4
    if nbytes < state.min_compress_bytes:
        with state._lock:
            state._note(bucket.index(), nbytes, False)
            state.wire_bytes += ring_all_reduce_bytes(buf.numel(), buf.element_size(), world)
            if bucket.index() not in state.fallback_reasons:
                state.fallback_reasons[bucket.index()] = (
                    f"{nbytes:,} B < min_compress_bytes={state.min_compress_bytes:,}: vendor all-reduce in {buf.dtype}")
                log.info("agoq QuanGrad hook: DDP bucket %d uses the vendor all-reduce (%s)", bucket.index(),
                         state.fallback_reasons[bucket.index()])
        buf.div_(world)
        fut = dist.all_reduce(buf, group=state.group, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])
    n = buf.numel()
    plan = P.ChunkPlan.for_numel(n, world, state.spec)
    codes, scales = P.quantize_padded(buf, plan, backend=state.be)
    op = QuanGradOp(codes, scales, plan, group=state.group, backend=state.be, sharded=False).run()
    out = P.dequantize_bucket(codes, scales, plan, n, torch.float32, backend=state.be)
    with torch.no_grad():
        buf.copy_(out.div_(world))
    with state._lock:
        state._note(bucket.index(), nbytes, True)
        state.wire_bytes += op.sent_bytes
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(buf)
    return fut


# DDP checks the hook's annotations by identity; with postponed (string) annotations it would refuse it.
quangrad_hook.__annotations__ = {"state": QuanGradHookState, "bucket": dist.GradBucket,
                                 "return": torch.futures.Future[torch.Tensor]}


def register_comm_hook(ddp_model: torch.nn.parallel.DistributedDataParallel, *, fmt: str = "fp8_e4m3",
                       block: int | None = None, min_compress_bytes: int | None = None,
                       backend: Any = None) -> QuanGradHookState:
    """Install ``quangrad_hook`` on a DDP model; returns the state (read its counters and summary())."""
    if not isinstance(ddp_model, torch.nn.parallel.DistributedDataParallel):
        raise TypeError(f"register_comm_hook needs a DistributedDataParallel model, got {type(ddp_model).__name__}")
    check_same_backend_across_ranks(ddp_model.process_group, backend)
    state = QuanGradHookState(fmt=fmt, block=block or DEFAULT_BLOCK,
                              min_compress_bytes=DEFAULT_MIN_COMPRESS_BYTES if min_compress_bytes is None
                              else min_compress_bytes,
                              group=ddp_model.process_group, backend=backend)
    if dist.is_available() and dist.is_initialized():
        # Ranks hooked with different formats/blocks/crossovers would decode each other's bytes as NaN.
        from agoq_core.quangrad.agree import agree_across_ranks

        device = next(ddp_model.module.parameters()).device
        agree_across_ranks({"fmt": state.spec.name, "block": state.spec.block,
                            "min_compress_bytes": state.min_compress_bytes, "backend": state.be.name},
                           group=state.group, device=device, backend=state.be, what="register_comm_hook",
                           fix="Every rank must call register_comm_hook with the same fmt, block, "
                               "min_compress_bytes and backend.")
    ddp_model.register_comm_hook(state, quangrad_hook)
    return state
