"""QuanGradDDP: the data-parallel wrapper users put around model + optimizer instead of DDP.

    qg = QuanGradDDP(model, lambda ps: torch.optim.AdamW(ps, lr=3e-4), config=QuanGradConfig(max_grad_norm=1.0))
    for batch in loader:
        for i, mb in enumerate(micro_batches(batch)):          # gradient accumulation, as with DDP
            with qg.no_sync() if i < n - 1 else contextlib.nullcontext():
                (qg(**mb).loss / n).backward()
        report = qg.step()                                       # reduce, clip, optimizer step, zero
        if report.skipped: ...                                   # NaN/Inf gradient: nothing was applied

During backward every parameter's gradient is folded into its 8-bit buffer the moment autograd has
accumulated it (post-accumulate-grad hook) and the 16-bit ``.grad`` is freed at once. In the last
micro-batch (outside ``no_sync``) a bucket's collective is launched as soon as all of its gradients are
in, so communication overlaps the rest of backward.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import struct
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch.utils.weak import WeakIdKeyDictionary

from agoq_core.api import check_supported
from agoq_core.backend import check_same_backend_across_ranks, get_backend
from agoq_core.errors import CapabilityError
from agoq_core.formats.policy import default_gradient_format, fp8_cast_unavailable
from agoq_core.errors import NonFiniteError
from agoq_core.quangrad.collective import BucketOp, group_info, make_bucket_op
from agoq_core.quangrad.config import QuanGradConfig
from agoq_core.quangrad.layout import BucketLayout, check_layout_across_ranks, plan_buckets
from agoq_core.quangrad.storage import GradStorage

log = logging.getLogger("agoq")

__all__ = ["QuanGradDDP", "StepReport", "QuanGradReport"]

_PARAM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True, slots=True)
class StepReport:
    """What ``QuanGradDDP.step()`` did."""

    step: int
    """Optimizer steps applied before this one (skipped steps do not count)."""
    skipped: bool
    reason: str | None
    grad_norm: float
    """Global L2 norm of the reduced (averaged) gradient before clipping; NaN/Inf if non-finite."""
    clip_coef: float
    nonfinite_params: tuple[str, ...] = ()
    """Parameters whose gradient held NaN/Inf (empty unless skipped for that reason, or applied anyway with
    ``on_nonfinite="apply"``; sharded mode names only those this rank's shard saw)."""
    wire_bytes: int = 0
    """Bytes this rank sent in gradient collectives for this step."""


@dataclass(frozen=True, slots=True)
class QuanGradReport:
    """Setup summary: what is stored how, which buckets compress and which fall back, and why."""

    backend: str
    world_size: int
    fmt: str
    block: int
    collective: str
    sharded: bool
    num_params: int
    param_numel: int
    buckets: tuple[dict[str, Any], ...]
    gradient_bytes: int
    """Bytes of the 8-bit gradient buffers (codes + scales + padding)."""
    bf16_gradient_bytes: int
    fp32_gradient_bytes: int
    master_weight_bytes: int
    optimizer: str
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def fallback_buckets(self) -> list[dict[str, Any]]:
        return [b for b in self.buckets if b["path"] not in (self.collective, "local")]

    def __str__(self) -> str:
        mib = 1 << 20
        lines = [
            f"QuanGrad: backend {self.backend}, {self.world_size} ranks, {self.fmt} block {self.block}, "
            f"collective {self.collective}{' (sharded, ZeRO-1)' if self.sharded else ''}",
            f"  {self.num_params} parameters, {self.param_numel:,} elements in {len(self.buckets)} buckets",
            f"  gradient memory {self.gradient_bytes / mib:.2f} MiB (bf16 grads: {self.bf16_gradient_bytes / mib:.2f} "
            f"MiB, fp32 main grads: {self.fp32_gradient_bytes / mib:.2f} MiB); fp32 master weights "
            f"{self.master_weight_bytes / mib:.2f} MiB; optimizer {self.optimizer}",
        ]
        fb = self.fallback_buckets
        if fb:
            lines.append(f"  {len(fb)} of {len(self.buckets)} buckets use another collective:")
            lines += [f"    bucket {b['index']} ({b['numel']:,} elements): {b['path']} - {b['reason']}" for b in fb]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def sum_of_squares(x: torch.Tensor) -> float:
    """sum(x**2) of a (device) tensor as a host float, with fp32 device arithmetic only.

    Ascend's vector units (and its norm operator) have no float64, so the core never asks a device for it:
    the squares are summed in fp32 on the device (relative error ~1e-7, ample for clipping) and returned as
    a Python float, which callers combine in fp64. When the fp32 sum overflows or underflows, or x holds
    NaN/Inf, it is redone on x scaled by a power of two near 1/max|x| (exact), rescaled on the host; NaN/Inf
    in x give NaN/Inf."""
    return sums_of_squares([x])[0]


def sums_of_squares(xs: list[torch.Tensor]) -> list[float]:
    """:func:`sum_of_squares` of every tensor in ``xs``, with one host synchronisation for all of them."""
    return _finish_sums([_device_sum_of_squares(x) for x in xs], xs.__getitem__)


def _fp32_flat(x: torch.Tensor) -> torch.Tensor:
    xf = x.detach().reshape(-1)
    return xf if xf.dtype == torch.float32 else xf.float()


def _device_sum_of_squares(x: torch.Tensor) -> torch.Tensor | None:
    """The fp32 sum of squares of ``x`` as a 0-d device tensor, not synchronised (None for an empty x)."""
    if x.numel() == 0:
        return None
    xf = _fp32_flat(x)
    # one reduction pass (the norm kernel squares as it reads), not x*x materialised and then summed: on a 1B
    # model's fp32 buckets that product is 4 GB written and read again per step. The square of the fp32 norm is
    # within ~2 ulp of the fp32 sum (ample for clipping); overflow/underflow still take the rescaled redo.
    return torch.linalg.vector_norm(xf).square()


def _rescaled_sum_of_squares(x: torch.Tensor) -> float:
    """The overflow/underflow/non-finite path of :func:`sum_of_squares` (one more pass, rare)."""
    xf = _fp32_flat(x)
    m = float(xf.abs().amax())
    if m == 0.0 or not math.isfinite(m):
        return m * m if m == m else float("nan")
    e = math.frexp(m)[1]  # 2**(e-1) <= m < 2**e; two factors keep each scaling a normal fp32 number
    h = -(e // 2)
    y = (xf * (2.0 ** h)) * (2.0 ** (-e - h))
    return float(torch.sum(y * y)) * 2.0 ** (2 * e)


def _finish_sums(parts: list[torch.Tensor | None], source: Callable[[int], torch.Tensor]) -> list[float]:
    """Host floats of device sums made by :func:`_device_sum_of_squares`, with ONE synchronisation for all
    of them (a ``float()`` per tensor stalls the host once each); each value is the float
    :func:`sum_of_squares` gives. ``source(i)`` gives tensor i again for the rare rescaled redo."""
    live = [p for p in parts if p is not None]
    it = iter(torch.stack(live).tolist() if live else [])
    out = []
    for i, p in enumerate(parts):
        s = 0.0 if p is None else next(it)
        out.append(s if p is None or (math.isfinite(s) and s >= 2.0 ** -100) else _rescaled_sum_of_squares(source(i)))
    return out


# parameter -> the QuanGradDDP whose hooks it carries. A second wrapper on the same parameters would
# fold every gradient into two storages and step it twice; it is refused at construction instead.
# (keyed by identity: tensors' __eq__ is elementwise)
_OWNERS: "WeakIdKeyDictionary" = WeakIdKeyDictionary()


class QuanGradDDP(torch.nn.Module):
    """Data parallelism with 8-bit gradient storage and QuanGrad's precision-preserving all-reduce.

    ``optimizer`` is a callable ``params -> torch.optim.Optimizer``; it receives the tensors the wrapper
    steps: the fp32 master copies (in ``model.parameters()`` order, trainable ones only) or, with
    ``config.sharded``, one flat fp32 shard per bucket. ``agoq_core.quangrad.optimizer_factory`` builds
    common ones (``"adamw"``, ``"adamw8bit"``...).
    """

    def __init__(self, module: torch.nn.Module, optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer], *,
                 config: QuanGradConfig | None = None) -> None:
        super().__init__()
        cfg = QuanGradConfig() if config is None else config
        if not isinstance(cfg, QuanGradConfig):
            raise TypeError(f"config must be a QuanGradConfig, got {type(cfg).__name__}")
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        if not callable(optimizer) or isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                "optimizer must be a callable params -> torch.optim.Optimizer (the wrapper decides which tensors "
                "the optimizer steps), e.g. lambda ps: torch.optim.AdamW(ps, lr=3e-4), got "
                f"{type(optimizer).__name__}"
            )
        self.module = module
        self.config = cfg
        self.rank, self.world_size = self._rank_and_world(cfg)
        if self._distributed:  # first, so that a rank whose backend differs cannot strand the others
            check_same_backend_across_ranks(cfg.group, cfg.backend)
        self.backend = get_backend(cfg.backend)
        if isinstance(cfg.fmt, str) and cfg.fmt.strip().lower() == "auto":
            fmt, why = default_gradient_format(self.backend.capabilities())
            cfg = dataclasses.replace(cfg, fmt=fmt)
            if why and self.rank == 0:
                log.warning("agoq QuanGrad: %s", why)
        if cfg.collective == "naive_fp8":
            why = fp8_cast_unavailable(self.backend.capabilities(), cfg.spec.name)
            if why:
                raise CapabilityError(f"QuanGradConfig(collective='naive_fp8'): {why}")
        self.config = cfg
        spec = cfg.spec

        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("QuanGradDDP: the model has no trainable parameters")
        devices = sorted({str(p.device) for _, p in named})
        if len(devices) != 1:
            raise ValueError(f"QuanGradDDP: all parameters must be on one device, found {devices}")
        bad = [(n, p.dtype) for n, p in named if p.dtype not in _PARAM_DTYPES]
        if bad:
            raise TypeError(f"QuanGradDDP: parameters must be float32/bfloat16/float16, got {bad[:3]}")
        self.device = named[0][1].device
        for op in ("quantize", "dequantize", "accumulate", "reduce_requantize"):
            check_supported(self.backend, spec, self.device, op)
        if isinstance(module, QuanGradDDP):
            raise ValueError("QuanGradDDP: the module is already a QuanGradDDP; wrap the model once "
                             "(use qg.module for the underlying model)")
        owned = [n for n, p in named if (o := _OWNERS.get(p)) is not None and o() is not None and o()._hooks]
        if owned:
            raise ValueError(
                f"QuanGradDDP: parameters {owned[:3]} are already wrapped by another QuanGradDDP (a second "
                "wrapper would reduce and step every gradient twice); reuse the first wrapper, or call its "
                "remove_hooks() before wrapping the model again")
        self._params = [p for _, p in named]
        self.param_names = [n for n, _ in named]

        if cfg.broadcast_params and self._distributed:
            self._broadcast_from_rank0()
        self.layout: BucketLayout = plan_buckets(named, world_size=self.world_size, spec=spec,
                                                 cap_numel=cfg.bucket_cap_numel, path_for=self._path_for,
                                                 sharded=cfg.sharded)
        if self._distributed:
            check_layout_across_ranks(self.layout, group=cfg.group, device=self.device, backend=self.backend)
        self.storage = GradStorage(self.layout, self.device, self.backend)
        self._groups = self._step_groups()  # buckets per optimizer call (fixed by the layout and the config)

        self.use_master = cfg.master_weights == "on" or (
            cfg.master_weights == "auto" and any(p.dtype != torch.float32 for p in self._params))
        if cfg.sharded:
            self._shards = [torch.nn.Parameter(self._bucket_params_fp32(b.index).chunk(self.world_size)[self.rank].clone())
                            for b in self.layout.buckets]
            opt_params: list[torch.Tensor] = list(self._shards)
        elif self.use_master:
            self._masters = [torch.nn.Parameter(p.detach().float().clone()) for p in self._params]
            opt_params = list(self._masters)
        else:
            self._masters = self._params
            opt_params = list(self._params)
        if not cfg.sharded:  # per step group: (master, start in the group's fp32 buffer, numel, shape, needs a cast)
            self._group_grads = []
            for bis in self._groups:
                rows, base = [], 0
                for bi in bis:
                    for sl in self.layout.buckets[bi].slots:
                        m = self._masters[sl.index]
                        rows.append((m, base + sl.offset, sl.numel, sl.shape, m.dtype != torch.float32))
                    base += self.storage.plans[bi].numel
                self._group_grads.append(rows)
        self.optimizer = optimizer(opt_params)
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer(params) must return a torch.optim.Optimizer, got {type(self.optimizer).__name__}")

        for p in self._params:
            p.grad = None
        self._hooks = [p.register_post_accumulate_grad_hook(self._make_hook(i)) for i, p in enumerate(self._params)]
        for p in self._params:
            _OWNERS[p] = weakref.ref(self)
        self._sync = True
        self._steps = 0
        self._attempts = 0        # step() calls, applied or skipped: what a user calls 'step N'
        self.skipped_steps = 0    # steps not applied because the reduced gradient was not finite
        self._reset_window()
        self.report = self._build_report()
        log.info("%s", self.report)

    # ---- setup helpers ---------------------------------------------------------------------------------
    def _rank_and_world(self, cfg: QuanGradConfig) -> tuple[int, int]:
        if cfg.group is None and not (dist.is_available() and dist.is_initialized()):
            return 0, 1  # single process: 8-bit storage, nothing to communicate
        return group_info(cfg.group)

    @property
    def _distributed(self) -> bool:
        """Whether the ranks are other processes (setup collectives needed); False for virtual ranks
        (agoq_core.quangrad.virtual), which all live in this process."""
        return self.world_size > 1

    def _path_for(self, padded: int) -> tuple[str, str]:
        cfg = self.config
        if self.world_size == 1:
            return "local", "world size 1: nothing to reduce"
        if cfg.collective != "quangrad":
            return cfg.collective, f"config.collective={cfg.collective!r}"
        if padded * 4 < cfg.min_compress_bytes:
            return cfg.fallback_dtype, (f"{padded * 4:,} B of fp32 gradient < min_compress_bytes={cfg.min_compress_bytes:,}: "
                                        f"vendor {cfg.fallback_dtype} all-reduce (compression does not pay below the crossover)")
        return "quangrad", ""

    def _broadcast_from_rank0(self) -> None:
        group = self.config.group
        src = dist.get_global_rank(group, 0) if group is not None else 0
        tensors = [p for _, p in self.module.named_parameters()] + [b for _, b in self.module.named_buffers()]
        with torch.no_grad():
            for t in tensors:
                if t.numel() == 0:
                    continue
                flat = t.detach().contiguous().view(-1)
                buf = flat.view(torch.uint8) if t.dtype.is_floating_point else flat
                dist.broadcast(buf, src=src, group=group)
                if flat.data_ptr() != t.data_ptr():
                    t.copy_(flat.view(t.shape))

    def _bucket_params_fp32(self, bi: int) -> torch.Tensor:
        b = self.layout.buckets[bi]
        flat = torch.zeros(b.numel, dtype=torch.float32, device=self.device)
        for s in b.slots:
            flat[s.offset: s.offset + s.numel] = self._params[s.index].detach().reshape(-1)
        return flat

    def _build_report(self) -> QuanGradReport:
        cfg, lay = self.config, self.layout
        n = lay.param_numel
        if cfg.sharded:
            master = sum(s.numel() * 4 for s in self._shards)
        else:
            master = sum(m.numel() * 4 for m in self._masters) if self.use_master else 0
        notes = []
        if cfg.sharded:
            notes.append("sharded: the optimizer steps flat fp32 shards; use an element-wise optimizer (Adam, AdamW, SGD)")
        return QuanGradReport(
            backend=self.backend.name, world_size=self.world_size, fmt=lay.spec.name, block=lay.spec.block,
            collective=cfg.collective, sharded=cfg.sharded, num_params=len(lay.slots), param_numel=n,
            buckets=tuple({"index": b.index, "numel": b.numel, "params": len(b.slots), "path": b.path,
                           "reason": b.reason} for b in lay.buckets),
            gradient_bytes=self.storage.nbytes, bf16_gradient_bytes=2 * n, fp32_gradient_bytes=4 * n,
            master_weight_bytes=master, optimizer=type(self.optimizer).__module__ + "." + type(self.optimizer).__name__,
            notes=tuple(notes),
        )

    # ---- accumulation ----------------------------------------------------------------------------------
    def _reset_window(self) -> None:
        nb = len(self.layout.buckets)
        self._received: list[set[int]] = [set() for _ in range(nb)]
        self._ops: list[BucketOp | None] = [None] * nb
        self._next_launch = 0
        self._accumulated = False
        # (group index, fp32 buffer, bucket segments) that _global_norm dequantized last and the step reuses
        self._kept: tuple[int, torch.Tensor, tuple[torch.Tensor, ...]] | None = None

    def _make_hook(self, index: int) -> Callable[[torch.Tensor], None]:
        def hook(p: torch.Tensor) -> None:
            self._on_grad(index, p)
        return hook

    def _on_grad(self, index: int, p: torch.Tensor) -> None:
        g = p.grad
        if g is None:
            return
        slot = self.layout.slots[index]
        if g.is_sparse:
            raise TypeError(f"QuanGradDDP: parameter {slot.name!r} has a sparse gradient, which is not supported")
        if self._ops[slot.bucket] is not None:
            raise RuntimeError(
                f"QuanGradDDP: a gradient for {slot.name!r} arrived after its bucket was already all-reduced in "
                "this accumulation window. Run the non-final micro-batches under `with qg.no_sync():` (as with "
                "DDP) and call qg.step() before the next window"
            )
        with torch.no_grad():
            self.storage.fold_(index, g)
        p.grad = None  # the 16-bit gradient is gone now; only the 8-bit buffer holds it
        self._accumulated = True
        if self._sync and self.config.overlap:
            rec = self._received[slot.bucket]
            rec.add(index)
            if len(rec) == len(self.layout.buckets[slot.bucket].slots):
                self._pump()

    def _pump(self) -> None:
        """Launch ready buckets strictly in index order (same collective sequence on every rank)."""
        nb = len(self.layout.buckets)
        while self._next_launch < nb:
            k = self._next_launch
            if len(self._received[k]) != len(self.layout.buckets[k].slots):
                return
            self._launch(k)

    def _launch(self, k: int) -> None:
        b = self.layout.buckets[k]
        op = make_bucket_op(b.path, self.storage.codes[k], self.storage.scales[k], self.storage.plans[k],
                            group=self.config.group, backend=self.backend, sharded=self.config.sharded)
        op.launch()
        self._ops[k] = op
        if k > 0 and self._ops[k - 1].stage == 1:
            self._ops[k - 1].advance()
        # Finish k-2 now (its all-gather was issued one launch ago) so that at most three buckets hold
        # transfer buffers at once, instead of every bucket's all-gather result waiting for step().
        if k > 1 and self._ops[k - 2].stage == 2:
            self._ops[k - 2].finish()
        self._next_launch = k + 1

    def _finish_all(self) -> None:
        while self._next_launch < len(self.layout.buckets):
            self._launch(self._next_launch)
        for op in self._ops:
            if op.stage == 1:
                op.advance()
            if op.stage == 2:
                op.finish()

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients (8-bit) without launching collectives, as DDP.no_sync()."""
        prev, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = prev

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    # ---- step ------------------------------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the accumulated gradients (no collective)."""
        self.storage.zero_()
        self._reset_window()

    def _global_norm(self, mult: float) -> float:
        """L2 norm of the reduced gradient x ``mult``: per-bucket sums of squares computed on the device in
        fp32 (NPUs have no fp64 vector ops: :func:`sum_of_squares`), combined in fp64 on the host in bucket
        order (and in rank order for the shards, exchanged as bytes), so every rank computes the same float."""
        if self.config.sharded:
            local = sum(sums_of_squares([op.shard for op in self._ops]))
            parts = [local]
            if self.world_size > 1:
                mine = torch.frombuffer(bytearray(struct.pack("<d", local)), dtype=torch.uint8).to(self.device)
                out = torch.empty(8 * self.world_size, dtype=torch.uint8, device=self.device)
                self.backend.all_gather_bytes(out, mine, group=self.config.group)
                raw = bytes(out.cpu().tolist())
                parts = [struct.unpack_from("<d", raw, 8 * r)[0] for r in range(self.world_size)]
            total = 0.0
            for v in parts:  # rank order: every rank adds the same numbers in the same order
                total += v
        else:
            # Group by group, as the step dequantizes them: the last group's fp32 buffer is kept for the step, which
            # steps it first (without step_per_bucket that is every bucket: one dequantize per bucket per step). At
            # most one group of fp32 gradient exists at a time either way. The per-bucket sums stay on the device
            # until all are queued: one host synchronisation per step.
            parts = []
            last = len(self._groups) - 1
            for gi, bis in enumerate(self._groups):
                buf, segs = self.storage.group_fp32(bis)
                parts += [_device_sum_of_squares(g) for g in segs]
                if gi == last:
                    self._kept = (gi, buf, segs)
                del buf, segs
            return self._bucket_norm(parts, self.storage.bucket_fp32, mult)
        total *= mult * mult
        return math.sqrt(total) if total >= 0 else float("nan")

    @staticmethod
    def _bucket_norm(parts: list, source: Callable[[int], torch.Tensor], mult: float) -> float:
        """The norm x ``mult`` from per-bucket device sums of squares (one host synchronisation), combined in fp64
        in bucket order; ``source(bi)``: bucket bi in fp32 again, for the rare rescaled redo."""
        total = 0.0
        for v in _finish_sums(parts, source):
            total += v
        total *= mult * mult
        return math.sqrt(total) if total >= 0 else float("nan")

    def step(self) -> StepReport:
        """Finish the gradient reduction, check for NaN/Inf, clip, step the optimizer, zero the buffers."""
        if not self._accumulated:
            raise RuntimeError("QuanGradDDP.step() called but no gradient was accumulated since the last step: "
                               "run forward and backward first")
        cfg = self.config
        self._finish_all()
        wire = sum(op.sent_bytes for op in self._ops)
        avg = 1.0 / self.world_size if cfg.average else 1.0
        # Nothing to clip and every block finite (a NaN scale marks a block that held NaN/Inf, the only way the
        # norm can be non-finite): the norm is only reported, so it is summed from the fp32 gradient the optimizer
        # step dequantizes anyway -- one dequantize per bucket, not two; the same float. on_nonfinite="apply" does
        # not look first (has_nonfinite is a host synchronisation): the step is applied whatever the gradient.
        apply = cfg.on_nonfinite == "apply"
        one_pass = cfg.max_grad_norm is None and not cfg.sharded and cfg.step_per_bucket \
            and (apply or not self.storage.has_nonfinite())
        norm = 0.0 if one_pass else self._global_norm(avg)
        self._attempts += 1
        if not math.isfinite(norm) and not apply:
            names = self._nonfinite_names()
            self.zero_grad()
            reason = f"non-finite gradient (norm {norm}) in {', '.join(names[:8]) or 'another rank'}"
            if cfg.on_nonfinite == "raise":
                raise NonFiniteError(f"QuanGradDDP step {self._steps}: {reason}; the step was not applied")
            self.skipped_steps += 1
            if self.rank == 0:  # every rank skips the same step; one line per step is enough
                log.warning("agoq QuanGrad: skipping step %d (%d skipped so far): %s", self._attempts,
                            self.skipped_steps, reason)
            return StepReport(step=self._steps, skipped=True, reason=reason, grad_norm=norm, clip_coef=0.0,
                              nonfinite_params=names, wire_bytes=wire)
        names: tuple[str, ...] = ()
        if apply and not math.isfinite(norm):  # known before the step (clipping or sharding computed it): name them
            names = self._nonfinite_names()
        coef = 1.0
        if cfg.max_grad_norm is not None and math.isfinite(norm):
            coef = min(1.0, cfg.max_grad_norm / (norm + 1e-6))  # torch.nn.utils.clip_grad_norm_'s rule
        with torch.no_grad():
            if cfg.sharded:
                self._step_sharded(avg * coef)
            else:
                sums: list | None = [] if one_pass else None
                self._step_replicated(avg * coef, sums=sums)
                if one_pass:
                    norm = self._bucket_norm(sums, self.storage.bucket_fp32, avg)
        reason = None
        if apply and not math.isfinite(norm):  # applied anyway, as asked: say so once the norm is known
            if one_pass:  # the storage still holds the gradient (zeroed below)
                names = self._nonfinite_names()
            reason = (f"non-finite gradient (norm {norm}) applied (on_nonfinite='apply') in "
                      f"{', '.join(names[:8]) or 'another rank'}")
            if self.rank == 0:
                log.warning("agoq QuanGrad: step %d: %s", self._attempts, reason)
        self.zero_grad()
        report = StepReport(step=self._steps, skipped=False, reason=reason, grad_norm=norm, clip_coef=coef,
                            nonfinite_params=names, wire_bytes=wire)
        self._steps += 1
        return report

    def _nonfinite_names(self) -> tuple[str, ...]:
        """The parameters whose gradient holds NaN/Inf (sharded: those this rank's shard saw); call before the
        window is zeroed (and, sharded, before the step drops the shards)."""
        if self.config.sharded:
            return tuple(self._nonfinite_shard_params())
        return tuple(self.storage.nonfinite_params())

    def _nonfinite_shard_params(self) -> list[str]:
        out = []
        for op, b in zip(self._ops, self.layout.buckets):
            c0 = self.rank * op.plan.chunk
            bad = ~torch.isfinite(op.shard)
            if bool(bad.any()):
                for s in b.slots:
                    lo, hi = max(s.offset, c0), min(s.offset + s.numel, c0 + op.plan.chunk)
                    if lo < hi and bool(bad[lo - c0: hi - c0].any()):
                        out.append(s.name)
        return out

    def _step_groups(self) -> list[list[int]]:
        """Bucket indices per optimizer call: every bucket in one call without step_per_bucket, else consecutive
        buckets up to step_group_mb MiB of fp32 gradient per call (at least one)."""
        nb = len(self.layout.buckets)
        if not self.config.step_per_bucket:
            return [list(range(nb))]
        cap = self.config.step_group_mb * (1 << 20)
        groups: list[list[int]] = []
        size = 0.0
        for bi, b in enumerate(self.layout.buckets):
            if groups and size + 4 * b.numel <= cap:
                groups[-1].append(bi)
                size += 4 * b.numel
            else:
                groups.append([bi])
                size = 4 * b.numel
        return groups

    def _step_replicated(self, mult: float, sums: list | None = None) -> None:
        """Dequantize, scale by ``mult`` and step, a group of buckets at a time (the group _global_norm kept first);
        ``sums``: also append each bucket's device sum of squares (before scaling, bucket order, for the reported
        norm). Per group: one fp32 buffer, one scaling pass, one optimizer call; the parameters get the masters'
        values in one foreach copy at the end."""
        opt = self.optimizer
        kept, self._kept = self._kept, None
        order = list(range(len(self._groups)))
        if kept is not None:
            order.remove(kept[0])
            order.insert(0, kept[0])
        for gi in order:
            if kept is not None and kept[0] == gi:
                buf, segs = kept[1], kept[2]
                kept = None
            else:
                buf, segs = self.storage.group_fp32(self._groups[gi])
            if sums is not None:
                sums += [_device_sum_of_squares(g) for g in segs]
            if mult != 1.0:
                buf.mul_(mult)
            grads = self._group_grads[gi]
            for m, start, numel, shape, cast in grads:
                g = buf[start: start + numel].view(shape)
                m.grad = g.to(m.dtype) if cast else g
            opt.step()
            for m, *_ in grads:
                m.grad = None
            del buf, segs
        if self.use_master:
            torch._foreach_copy_(self._params, self._masters)  # one round-to-nearest-even cast per element, as copy_

    def _step_sharded(self, mult: float) -> None:
        for op, shard, b in zip(self._ops, self._shards, self.layout.buckets):
            shard.grad = op.shard.mul_(mult)
            self.optimizer.step()
            shard.grad = None
            dtypes = {self._params[s.index].dtype for s in b.slots}
            dt = dtypes.pop() if len(dtypes) == 1 else torch.float32
            mine = shard.detach().to(dt)
            if self.world_size > 1:
                full = torch.empty(b.numel, dtype=dt, device=self.device)
                self.backend.all_gather_bytes(full, mine, group=self.config.group)
            else:
                full = mine
            for s in b.slots:
                self._params[s.index].copy_(full[s.offset: s.offset + s.numel].view(s.shape))
            op.shard = None

    # ---- introspection ---------------------------------------------------------------------------------
    @property
    def gradient_bytes(self) -> int:
        """Bytes of the persistent 8-bit gradient buffers (what replaces .grad / main_grad)."""
        return self.storage.nbytes

    def gradient_buffers(self) -> list[torch.Tensor]:
        """The tensors that hold the gradients between backward and step (codes and scales of every
        bucket), for memory accounting by storage."""
        return [*self.storage.codes, *self.storage.scales]

    def gradient(self, name: str) -> torch.Tensor:
        """The accumulated gradient of parameter ``name`` dequantized to fp32 (for inspection)."""
        try:
            i = self.param_names.index(name)
        except ValueError:
            raise KeyError(f"no trainable parameter {name!r}; known: {self.param_names[:5]}...") from None
        return self.storage.param_fp32(i)

    def remove_hooks(self) -> None:
        """Detach the wrapper from the model's parameters (the model may then be wrapped again)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for p in self._params:
            if (o := _OWNERS.get(p)) is not None and o() is self:
                del _OWNERS[p]
