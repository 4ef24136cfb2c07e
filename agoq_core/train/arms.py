"""The arms of a comparison: how each one wraps the same model, optimizer and gradient sync.

Every arm builds its model from the same seed and trains on the same batches; they differ only in
what this file (the baseline arm) and agoq_arm.py (the LAAQ / QuanGrad arms) set up, following the
recipes in recipes.py.

An arm whose parts are not installed is reported as unavailable (with the reason); it is never
replaced by something else.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from agoq_core.quangrad.optim import optimizer_factory
from agoq_core.train.config import TrainConfig
from agoq_core.train.memory import grad_bytes, optimizer_state_bytes
from agoq_core.train.runtime import Runtime

__all__ = ["Arm", "ArmUnavailable", "MasterWeights", "make_baseline_arm", "make_optimizer"]


class ArmUnavailable(RuntimeError):
    """This arm cannot run here (a component is missing); the message says which and why."""


@dataclass
class Arm:
    """One arm, set up on one process. The loop calls forward_backward per micro-batch, then step."""

    name: str
    model: torch.nn.Module          # the unwrapped model (eval, activation accounting)
    rt: Runtime
    cfg: TrainConfig
    optimizer: Any = None
    ddp: Any = None                 # the DDP wrapper (baseline with world > 1)
    quangrad: Any = None            # QuanGrad's data-parallel wrapper (AGoQ arms)
    notes: list[str] = field(default_factory=list)
    laaq_report: Any = None
    masters: "MasterWeights | None" = None   # baseline with bf16 weights: fp32 copies the optimizer steps
    grad_sum: Any = None            # --virtual-ranks, .grad arms: the simulated DDP all-reduce (VirtualGradSum)

    # ---- one optimizer step ---------------------------------------------------------------------
    def forward_backward(self, batch: torch.Tensor, *, scale: float, last: bool,
                         forward_ctx: Any = None) -> float:
        """Forward and backward of one micro-batch; returns its (unscaled) mean token loss.

        ``forward_ctx`` (a context manager) wraps the forward only, e.g. the saved-tensor counter:
        tensors that backward's recomputation saves briefly are not activations held across the step.
        """
        batch = batch.to(self.rt.device, non_blocking=True)
        if self.quangrad is not None:
            sync = self.quangrad.no_sync() if (not last and hasattr(self.quangrad, "no_sync")) else \
                contextlib.nullcontext()
            fwd = self.quangrad
        elif self.ddp is not None:
            sync = self.ddp.no_sync() if not last else contextlib.nullcontext()
            fwd = self.ddp
        else:
            sync, fwd = contextlib.nullcontext(), self.model
        with sync:
            with forward_ctx or contextlib.nullcontext():
                loss = fwd(input_ids=batch, labels=batch).loss
            (loss * scale).backward()
        return float(loss.detach())

    # ---- --virtual-ranks (agoq_core.quangrad.virtual) --------------------------------------------
    def begin_rank(self, rank: int) -> None:
        """The next micro-batches are virtual rank ``rank``'s (no-op without --virtual-ranks)."""
        if self.quangrad is not None and hasattr(self.quangrad, "set_rank"):
            self.quangrad.set_rank(rank)

    def end_rank(self) -> None:
        """This rank's micro-batches are done: its ``.grad`` joins the simulated all-reduce."""
        if self.grad_sum is not None:
            self.grad_sum.end_rank()

    def track_grad_errors(self, on: bool) -> bool:
        """Measure this step's reduced-gradient errors (QuanGrad arms with virtual ranks); False if the
        arm has none to measure."""
        qg = self.quangrad
        if qg is None or not hasattr(qg, "track_errors"):
            return False
        qg.track_errors = on
        return on

    def grad_errors(self) -> dict[str, Any]:
        """Per parameter: [normalised L2 error, the collective's share, exact norm] of the last step."""
        errs = getattr(self.quangrad, "last_errors", None) or {}
        return {n: [e.error, e.collective_error, e.norm] for n, e in errs.items()}

    def grad_storage_bytes(self) -> int:
        """Bytes holding gradients now (called after the last backward of a step, before the update)."""
        extra: list[torch.Tensor] = []
        if self.quangrad is not None:  # QuanGrad's 8-bit codes and fp32 block scales, per bucket
            qg = self.quangrad
            extra = list(qg.gradient_buffers()) if hasattr(qg, "gradient_buffers") else \
                [*qg.storage.codes, *qg.storage.scales]
        return grad_bytes(self.model.parameters(), extra)

    def step(self, lr: float) -> tuple[float, bool]:
        """Apply the update at learning rate ``lr``; returns (global grad norm before clipping, skipped)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.quangrad is not None:
            out = self.quangrad.step()
            return float(out.grad_norm), bool(out.skipped)
        if self.grad_sum is not None:
            self.grad_sum.finish()
        stepped = self.masters.load_grads() if self.masters is not None else list(self.model.parameters())
        clip = self.cfg.grad_clip if self.cfg.grad_clip > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(stepped, clip)
        norm_f = float(norm)
        skipped = not math.isfinite(norm_f)
        if not skipped:
            self.optimizer.step()
            if self.masters is not None:
                self.masters.store()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.zero_grad(set_to_none=True)
        return norm_f, skipped

    def master_weight_bytes(self) -> int | None:
        """Bytes of fp32 master weights kept beside bf16 parameters (None when the model is fp32)."""
        if self.masters is not None:
            return self.masters.nbytes
        if self.quangrad is not None:
            return self.quangrad.report.master_weight_bytes or None
        return None

    def before_eval(self) -> None:
        """Make ``self.model`` whole on this rank before evaluation (pipeline arms gather stages)."""

    def optimizer_state_bytes(self) -> int:
        return optimizer_state_bytes(self.optimizer)

    def close(self) -> None:
        if self.quangrad is not None:
            self.quangrad.remove_hooks()
        if self.laaq_report is not None:
            self.laaq_report.undo()


class MasterWeights:
    """fp32 master copies of bf16 parameters, as mixed-precision training keeps them (Megatron,
    DeepSpeed): the optimizer steps the fp32 copies, the model gets one rounding to bf16 per step."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        self.params = params
        self.fp32 = [torch.nn.Parameter(p.detach().float().clone()) for p in params]

    def load_grads(self) -> list[torch.nn.Parameter]:
        for p, m in zip(self.params, self.fp32):
            m.grad = None if p.grad is None else p.grad.float()
        return self.fp32

    @torch.no_grad()
    def store(self) -> None:
        torch._foreach_copy_(self.params, self.fp32)  # one launch, the same round-to-nearest-even casts as copy_

    @property
    def nbytes(self) -> int:
        return sum(m.numel() * m.element_size() for m in self.fp32)


def make_optimizer(params, cfg: TrainConfig, kind: str):
    """AdamW (``kind`` "adamw") or bitsandbytes' 8-bit AdamW ("adamw8bit") over ``params``, LLaMA's
    recipe: betas (0.9, 0.95), eps 1e-8, no weight decay on 1-D tensors (the norms' weights)."""
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    try:
        build = optimizer_factory(kind, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)
    except ImportError as exc:
        raise ArmUnavailable(f"optimizer {kind!r}: {exc}") from exc
    return build(groups)


def make_baseline_arm(model: torch.nn.Module, rt: Runtime, cfg: TrainConfig) -> Arm:
    arm = Arm(name="baseline", model=model, rt=rt, cfg=cfg)
    if rt.world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        # gradient_as_bucket_view: the .grad tensors are views into DDP's buckets, so the measured
        # gradient bytes are what DDP really holds (otherwise it keeps a second, hidden copy).
        arm.ddp = DDP(model, device_ids=None if rt.device.type == "cpu" else [rt.device.index],
                      gradient_as_bucket_view=True)
        arm.notes.append(f"DDP over {rt.world} ranks ({rt.dist_backend})")
    params = list(model.parameters())
    if cfg.virtual_ranks:
        from agoq_core.quangrad.virtual import VirtualGradSum

        arm.grad_sum = VirtualGradSum(params, cfg.virtual_ranks)
        arm.notes.append(f"{cfg.virtual_ranks} virtual ranks: .grad summed in fp32 in rank order (DDP's arithmetic)")
    if any(p.dtype != torch.float32 for p in params):
        arm.masters = MasterWeights(params)
        params = arm.masters.fp32
        arm.notes.append("bf16 weights, fp32 master weights stepped by the optimizer")
    arm.optimizer = make_optimizer(params, cfg, cfg.optimizer)
    return arm
