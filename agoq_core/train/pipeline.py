"""Pipeline-parallel arms (``--pp S``): torch.distributed.pipelining over the model's decoder layers.

Every rank builds the whole model from the run's seed, keeps the layers of its stage(s) (the
planner's ``split_layers`` and ``HFStageModule``: embedding on the first stage, final norm and LM
head on the last) and runs the schedule (GPipe, 1F1B or interleaved 1F1B) on ``micro_batch``
sequences cut into ``pp_microbatches`` pipeline micro-batches.

- baseline: plain autograd on each stage, AdamW; the gradient norm used for clipping is the global one
  (squared norms summed over the stages).
- agoq: LAAQ with the DBCA-PP plan of ``agoq_core.planner.plan_for_pipeline`` for this stage (formats
  per layer so that no stage's activation peak exceeds the uniform-4-bit peak of the fullest stage),
  and QuanGrad's 8-bit gradient buffers on each stage. QuanGrad clips on the norm of its own group,
  which here is one stage; so clipping is done on the global norm, computed from QuanGrad's reduced
  8-bit buffers and applied by an optimizer pre-step hook (same rule as clip_grad_norm_).
- ablations: their fixed policy (no plan) with the same pipeline.

Limits: one data-parallel replica (``--nproc`` must equal ``--pp``). Evaluation gathers the trained
stage weights onto every rank (a broadcast per stage) and runs the plain forward there.
"""
from __future__ import annotations

import contextlib
import math
from typing import Any

import torch

from agoq_core.laaq import SavedBytesMeter
from agoq_core.planner import plan_for_pipeline
from agoq_core.planner.apply import build_stage_modules, causal_lm_loss
from agoq_core.planner.model import split_layers
from agoq_core.planner.schedules import SCHEDULES, PipelineSpec
from agoq_core.train.agoq_arm import check_recipe, laaq_policy, make_agoq_arm
from agoq_core.train.arms import Arm, MasterWeights, make_optimizer
from agoq_core.train.config import TrainConfig
from agoq_core.train.runtime import Runtime

__all__ = ["PipelineArm", "make_pipeline_arm"]

_PLANNED = ("agoq", "naive-fp8-allreduce")   # arms whose LAAQ policy comes from the DBCA-PP plan


class PipelineArm(Arm):
    """One rank's share of a pipelined arm; the loop drives it like any other arm."""

    plan_peaks: list[int] | None = None     # the DBCA-PP plan's activation peak per stage (planned arms)

    def setup_pipeline(self, stage_mods: list[tuple[int, torch.nn.Module]], num_vstages: int) -> None:
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining import schedules as sched


        cfg, rt = self.cfg, self.rt
        self.stage_mods = stage_mods
        self.container = torch.nn.ModuleList([m for _, m in stage_mods])
        self.stages = [PipelineStage(m, stage_index=vs, num_stages=num_vstages, device=rt.device)
                       for vs, m in stage_mods]
        self.has_first = any(vs == 0 for vs, _ in stage_mods)
        self.has_last = any(vs == num_vstages - 1 for vs, _ in stage_mods)
        self.M = cfg.num_pp_microbatches
        self._sample = None
        self._loss_scale = 1.0 / self.M
        d = SCHEDULES[cfg.pp_schedule]
        cls = getattr(sched, d.torch_class)
        # scale_grads=False: the loss is divided by the micro-batch count here instead, so the gradients
        # are the batch mean before they reach .grad (QuanGrad folds .grad into 8 bits at once, so a
        # later division of .grad by the schedule would never reach its buffers).
        kw = dict(loss_fn=self._loss_fn, scale_grads=False)
        self.schedule = cls(self.stages, self.M, **kw) if d.multi_chunk else cls(self.stages[0], self.M, **kw)
        self.owner_of: dict[int, int] = {}   # id(param) -> rank that trains it, filled by _share_owners

    def _loss_fn(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:

        loss = causal_lm_loss(logits[:, :-1], target[:, 1:]) * self._loss_scale
        if self._sample is not None:  # the last stage also keeps the loss's own saved tensors
            self._sample()
        return loss

    def _run_schedule(self, batch: torch.Tensor) -> float:
        # The schedule's own per-micro-batch losses (loss_fn may also run on placeholder inputs while
        # the stage infers shapes on the first step, so its calls cannot be collected directly).
        losses: list[torch.Tensor] = []
        if self.has_first and self.has_last:  # pragma: no cover - pp >= 2 always splits them
            self.schedule.step(batch, target=batch, losses=losses)
        elif self.has_first:
            self.schedule.step(batch)
        elif self.has_last:
            self.schedule.step(target=batch, losses=losses)
        else:
            self.schedule.step()
        local = float(torch.stack([l.detach().float() for l in losses]).mean()) / self._loss_scale if losses else 0.0
        return _sum_over_ranks(local, self.rt)  # only the last stage has the loss

    def forward_backward(self, batch: torch.Tensor, *, scale: float, last: bool, forward_ctx: Any = None) -> float:
        batch = batch.to(self.rt.device)
        self._loss_scale = scale / self.M
        sync = self.quangrad.no_sync() if self.quangrad is not None else contextlib.nullcontext()
        with sync:
            return self._run_schedule(batch)

    def measured_forward_backward(self, batch: torch.Tensor, *, scale: float, last: bool) -> tuple[float, dict]:
        """One schedule step under LAAQ's meter, sampled after every forward of this rank's stage(s):
        the largest sample is the stage's activation peak with the schedule's in-flight micro-batches."""
        meter = SavedBytesMeter(self.model, label=self.name)
        peak = {"total": 0, "layers": 0, "first": None}

        def sample(*_: Any) -> None:
            r = meter.result()
            if peak["first"] is None:
                peak["first"] = r.total
            if r.total > peak["total"]:
                peak["total"], peak["layers"] = r.total, r.layers_total

        handles = [m.register_forward_hook(sample) for _, m in self.stage_mods]
        self._sample = sample
        try:
            with meter:
                loss = self.forward_backward(batch, scale=scale, last=last)
        finally:
            self._sample = None
            for h in handles:
                h.remove()
        mem = {"activations": peak["total"], "activations_decoder_layers": peak["layers"],
               "activations_one_microbatch": peak["first"]}
        return loss, mem

    def step(self, lr: float) -> tuple[float, bool]:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        clip = self.cfg.grad_clip
        if self.quangrad is not None:
            local = 0.0
            for bi in range(len(self.quangrad.layout.buckets)):
                local += float(self.quangrad.storage.bucket_fp32(bi).double().pow(2).sum())
            norm = math.sqrt(_sum_over_ranks(local, self.rt))
            self._clip_coef = min(1.0, clip / (norm + 1e-6)) if clip > 0 else 1.0
            if not math.isfinite(norm):
                self._clip_coef = 1.0  # QuanGrad sees the NaN itself and skips the step
            out = self.quangrad.step()
            return norm, bool(out.skipped)
        stepped = self.masters.load_grads() if self.masters is not None else list(self.container.parameters())
        params = [p for p in stepped if p.grad is not None]
        local = float(sum(p.grad.double().pow(2).sum() for p in params)) if params else 0.0
        norm = math.sqrt(_sum_over_ranks(local, self.rt))
        skipped = not math.isfinite(norm)
        if not skipped:
            if clip > 0 and norm > clip:
                coef = clip / (norm + 1e-6)
                for p in params:
                    p.grad.mul_(coef)
            self.optimizer.step()
            if self.masters is not None:
                self.masters.store()
        self.optimizer.zero_grad(set_to_none=True)
        self.container.zero_grad(set_to_none=True)
        return norm, skipped

    def before_eval(self) -> None:
        """Every rank receives the current weights of every stage (from the rank that trains them)."""
        import torch.distributed as dist

        with torch.no_grad():
            for p in self.model.parameters():
                src = self.owner_of.get(id(p))
                if src is not None:
                    dist.broadcast(p.data, src=src)

    def gather_memory(self, memory: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Per-stage measurements of all ranks; the summary keeps the fullest stage's and each stage's."""
        import torch.distributed as dist

        per: list[Any] = [None] * self.rt.world
        dist.all_gather_object(per, dict(memory))
        merged: dict[str, Any] = {}
        for key in ("activations", "activations_decoder_layers", "gradients", "optimizer_state", "peak_device"):
            vals = [m.get(key) for m in per if m.get(key) is not None]
            merged[key] = max(vals) if vals else None
        for s, m in enumerate(per):
            merged[f"activations_stage{s}"] = m.get("activations")
            if self.plan_peaks:
                merged[f"planned_activations_stage{s}"] = self.plan_peaks[s]
        return merged, per

    def close(self) -> None:
        super().close()
        self.stages = []
        self.schedule = None


def _sum_over_ranks(value: float, rt: Runtime) -> float:
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device=rt.device if rt.dist_backend != "gloo" else "cpu")
    dist.all_reduce(t)
    return float(t.item())


def _share_owners(arm: PipelineArm, model: torch.nn.Module, rt: Runtime) -> None:
    import torch.distributed as dist

    mine = {id(p) for p in arm.container.parameters()}
    names = [n for n, p in model.named_parameters() if id(p) in mine]
    everyone: list[Any] = [None] * rt.world
    dist.all_gather_object(everyone, names)
    by_name = dict(model.named_parameters())
    for r, lst in enumerate(everyone):
        for n in lst:
            arm.owner_of.setdefault(id(by_name[n]), r)


def make_pipeline_arm(name: str, model: torch.nn.Module, rt: Runtime, cfg: TrainConfig) -> PipelineArm:
    import torch.distributed as dist

    spec = PipelineSpec(schedule=cfg.pp_schedule, stages=cfg.pp, microbatches=cfg.num_pp_microbatches)
    layers = split_layers(model.config.num_hidden_layers, spec)
    # QuanGrad reduces over data-parallel replicas of a stage: with one replica, a group of one rank.
    # new_group is collective: every rank creates every singleton group, in the same order.
    singles = [dist.new_group([r]) for r in range(rt.world)]
    arm = PipelineArm(name=name, model=model, rt=rt, cfg=cfg)
    if name != "baseline":
        check_recipe(name, cfg)
        policy = laaq_policy(name)
        if name in _PLANNED:
            plan = plan_for_pipeline(model.config, stages=cfg.pp, microbatches=cfg.num_pp_microbatches,
                                     schedule=cfg.pp_schedule,
                                     microbatch_size=cfg.micro_batch // cfg.num_pp_microbatches,
                                     seq_len=cfg.seq_len, dtype="float32" if rt.dtype == "fp32" else "bfloat16")
            policy = plan.laaq_config_for_stage(rt.rank, base=policy)
            arm.notes.append(plan.explain())
            arm.plan_peaks = [s.activation_peak for s in plan.stages]
    stage_mods = build_stage_modules(model, spec, layers, rt.rank)
    arm.setup_pipeline(stage_mods, spec.virtual_stages)
    if name == "baseline":
        params = list(arm.container.parameters())
        if any(p.dtype != torch.float32 for p in params):
            arm.masters = MasterWeights(params)
            params = arm.masters.fp32
        arm.optimizer = make_optimizer(params, cfg, cfg.optimizer)
    else:
        inner = make_agoq_arm(name, arm.container, rt, cfg, laaq_config=policy, group=singles[rt.rank],
                              laaq_target=model, clip_in_quangrad=False)
        arm.quangrad, arm.optimizer, arm.laaq_report = inner.quangrad, inner.optimizer, inner.laaq_report
        arm.notes += inner.notes
        arm._clip_coef = 1.0
        arm.optimizer.register_step_pre_hook(lambda opt, *_: _scale_grads(opt, arm._clip_coef))
    _share_owners(arm, model, rt)
    arm.notes.append(f"pipeline: {cfg.pp_schedule}, {cfg.pp} stages, {cfg.num_pp_microbatches} micro-batches of "
                     f"{cfg.micro_batch // cfg.num_pp_microbatches}; rank {rt.rank} runs virtual stages "
                     f"{[vs for vs, _ in stage_mods]} = layers {[layers[vs] for vs, _ in stage_mods]}")
    return arm


def _scale_grads(opt: torch.optim.Optimizer, coef: float) -> None:
    if coef == 1.0:
        return
    for group in opt.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                p.grad.mul_(coef)
