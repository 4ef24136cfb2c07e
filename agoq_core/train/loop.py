"""Train one arm: the step loop, evaluation, timing and the measured memory of that arm."""
from __future__ import annotations

import contextlib
import gc
import hashlib
import math
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from agoq_core.laaq import SavedBytesMeter
from agoq_core.train.agoq_arm import make_agoq_arm
from agoq_core.train.arms import Arm, ArmUnavailable, make_baseline_arm
from agoq_core.train.config import TrainConfig
from agoq_core.train.data import Corpus
from agoq_core.train.models import build_model, count_parameters
from agoq_core.train.pipeline import make_pipeline_arm
from agoq_core.train.recipes import describe_arm
from agoq_core.train.runtime import Runtime
from agoq_core.train.stepcosts import ManagedGC, StepCosts

__all__ = ["ArmResult", "train_arm", "make_arm", "lr_schedule", "param_digest", "TRAIN_LOSS_WINDOW", "GRAD_ERROR_FIELDS"]

# The "final train loss" of the table is the mean over the last steps: one step's loss on 1K tokens
# swings by ~0.1 nats at this scale, which would hide a 1% difference between arms.
TRAIN_LOSS_WINDOW = 10

#: What each parameter's entry of a "grad_error" record holds (--grad-error-every).
GRAD_ERROR_FIELDS = ("error", "collective_error", "exact_norm")


@dataclass
class ArmResult:
    name: str
    description: str
    status: str = "ok"                     # ok | unavailable | failed
    reason: str = ""
    steps: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    params: int = 0
    tokens_per_s: float | None = None
    train_seconds: float = 0.0
    memory: dict[str, int | None] = field(default_factory=dict)
    activation_detail: dict[str, Any] | None = None   # per layer and part, from LAAQ's meter
    memory_per_rank: list[dict[str, Any]] | None = None  # pipeline runs: each stage's own measurements
    param_digest: str | None = None        # sha256 of the final parameters (names and bytes); None with --pp
    step_costs: dict[str, Any] = field(default_factory=dict)  # GC and device allocator over the timed steps

    @property
    def final_val_loss(self) -> float | None:
        return self.evals[-1]["val_loss"] if self.evals else None

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps not applied because the gradient was not finite."""
        return sum(1 for r in self.steps if r.get("skipped"))

    @property
    def final_train_loss(self) -> float | None:
        tail = [r["loss"] for r in self.steps[-TRAIN_LOSS_WINDOW:]]
        return sum(tail) / len(tail) if tail else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "description": self.description, "status": self.status, "reason": self.reason,
            "params": self.params, "final_train_loss": self.final_train_loss,
            "final_val_loss": self.final_val_loss, "tokens_per_s": self.tokens_per_s,
            "skipped_steps": self.skipped_steps, "train_seconds": self.train_seconds, "memory": dict(self.memory), "notes": list(self.notes),
            "evals": list(self.evals), "activation_detail": self.activation_detail,
            "memory_per_rank": self.memory_per_rank, "param_digest": self.param_digest,
            "step_costs": dict(self.step_costs),
        }


def make_arm(name: str, model: torch.nn.Module, rt: Runtime, cfg: TrainConfig) -> Arm:
    """Set up arm ``name`` around ``model`` (already on rt.device). Raises ArmUnavailable if it cannot run."""
    if cfg.pp > 1:
        return make_pipeline_arm(name, model, rt, cfg)
    if name == "baseline":
        return make_baseline_arm(model, rt, cfg)
    return make_agoq_arm(name, model, rt, cfg)


def lr_schedule(optimizer: torch.optim.Optimizer, cfg: TrainConfig):
    """Linear warm-up to ``lr`` over ``warmup_steps``, then cosine decay to ``lr * min_lr_ratio`` at
    ``steps``: transformers' scheduler, as HF Trainer users run it (step 0 of a warm-up has lr 0)."""
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    return get_cosine_with_min_lr_schedule_with_warmup(optimizer, num_warmup_steps=cfg.warmup_steps,
                                                       num_training_steps=cfg.steps, min_lr_rate=cfg.min_lr_ratio)


def _all_reduce_sum(values: list[float], rt: Runtime) -> list[float]:
    if rt.world == 1:
        return values
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=rt.device if rt.dist_backend != "gloo" else "cpu")
    dist.all_reduce(t)
    return t.tolist()


def _sync(rt: Runtime) -> None:
    if rt.device.type != "cpu":
        torch.get_device_module(rt.device.type).synchronize(rt.device)


@torch.no_grad()
def evaluate(model: torch.nn.Module, corpus: Corpus, cfg: TrainConfig, rt: Runtime) -> float:
    """Mean next-token loss over the held-out windows (split across data-parallel ranks)."""
    was_training = model.training
    model.eval()
    total = count = 0.0
    for i, batch in enumerate(corpus.eval_batches(cfg.micro_batch)):
        if i % rt.world != rt.rank:
            continue
        batch = batch.to(rt.device)
        loss = model(input_ids=batch, labels=batch).loss
        n = batch.shape[0] * (batch.shape[1] - 1)  # HF shifts labels: seq_len - 1 targets per window
        total += float(loss) * n
        count += n
    total, count = _all_reduce_sum([total, count], rt)
    model.train(was_training)
    return total / count


def train_arm(name: str, cfg: TrainConfig, rt: Runtime, corpus: Corpus,
              sink: Callable[[dict[str, Any]], None] | None = None) -> ArmResult:
    """Build the model from the run's seed, set up arm ``name`` and train it for ``cfg.steps`` steps."""
    res = ArmResult(name=name, description=describe_arm(name))
    model = build_model(cfg.model, vocab_size=corpus.vocab_size, seq_len=cfg.seq_len, seed=cfg.seed,
                        device=rt.device)
    res.params = count_parameters(model)
    if rt.dtype == "bf16":  # every arm casts the same fp32 init; the optimizers keep fp32 master copies
        model.to(torch.bfloat16)
    try:
        arm = make_arm(name, model, rt, cfg)
    except ArmUnavailable as exc:
        res.status, res.reason = "unavailable", str(exc)
        return res
    if cfg.compile:  # after LAAQ's conversion: its converted modules run their traceable path in the graph
        from agoq_core.laaq.policy import decoder_layers

        layers = decoder_layers(model)
        for _, _, layer in layers:
            layer.compile(backend=cfg.compile)
        arm.notes.append(f"{len(layers)} decoder layers torch.compile'd (backend {cfg.compile})")
    res.notes += arm.notes
    schedule = lr_schedule(arm.optimizer, cfg)
    model.train()
    emit = sink or (lambda rec: None)
    bar = _progress(name, cfg, rt)
    mem_stats = _device_mem(rt)
    if mem_stats is not None:
        _sync(rt)
        mem_stats.reset_peak_memory_stats(rt.device)
    scale = 1.0 / cfg.grad_accum
    # A pipeline's first step also runs the stages' shape inference, and with --compile the first step traces
    # the layers (not under the meter's saved-tensor hooks: torch.func, which LAAQ's traced backward uses,
    # refuses to trace under them): measure the second step instead.
    measure_step = 1 if ((cfg.pp > 1 or cfg.compile) and cfg.steps > 1) else 0
    timed_seconds, timed_tokens = 0.0, 0
    scope = contextlib.ExitStack()  # closed in the finally below
    costs = scope.enter_context(StepCosts(rt.device))
    managed_gc = scope.enter_context(ManagedGC(cfg.gc_every))
    try:
        for step in range(cfg.steps):
            lr = schedule.get_last_lr()[0]
            # --virtual-ranks W: this process runs the micro-batches of data-parallel ranks 0..W-1 in turn
            ranks = range(cfg.virtual_ranks) if cfg.virtual_ranks else [rt.rank // cfg.pp]
            errors_now = bool(cfg.grad_error_every) and arm.track_grad_errors(step % cfg.grad_error_every == 0)
            timed = step > 0 and step != measure_step  # step 0: one-time costs (optimizer state, lazy init)
            costs.begin(timed)
            _sync(rt)
            t0 = time.perf_counter()
            managed_gc.before_step(step)
            losses = []
            for v in ranks:
                batches = corpus.step_batches(step, seed=cfg.seed, micro_batch=cfg.micro_batch,
                                              grad_accum=cfg.grad_accum, dp=cfg.dp, rank=v)
                arm.begin_rank(v)
                for k, batch in enumerate(batches):
                    last = k == len(batches) - 1
                    if step == measure_step and k == 0 and v == ranks[0]:
                        losses.append(_measured_micro_batch(arm, batch, scale, last, res))
                    else:
                        losses.append(arm.forward_backward(batch, scale=scale, last=last))
                if step == measure_step and v == ranks[0]:  # one rank's gradients, as on a real rank
                    res.memory["gradients"] = arm.grad_storage_bytes()
                arm.end_rank()
            grad_norm, skipped = arm.step(lr)
            schedule.step()
            _sync(rt)
            dt = time.perf_counter() - t0
            step_cost = costs.end()
            if step == measure_step:
                res.memory["optimizer_state"] = arm.optimizer_state_bytes()
                if arm.master_weight_bytes():
                    res.memory["master_weights"] = arm.master_weight_bytes()
            if timed:
                timed_seconds += dt
                timed_tokens += cfg.tokens_per_step
            loss = _all_reduce_sum([sum(losses) / len(losses)], rt)[0] / rt.world
            rec = {"kind": "step", "arm": name, "step": step + 1, "loss": loss, "lr": lr,
                   "grad_norm": grad_norm, "skipped": skipped, "seconds": dt,
                   "tokens": (step + 1) * cfg.tokens_per_step, **step_cost}
            res.steps.append(rec)
            emit(rec)
            if errors_now:
                emit({"kind": "grad_error", "arm": name, "step": step + 1, "fields": list(GRAD_ERROR_FIELDS),
                      "errors": arm.grad_errors()})
            if not math.isfinite(loss):
                raise FloatingPointError(f"arm {name}: loss became {loss} at step {step + 1}")
            if (cfg.eval_every and (step + 1) % cfg.eval_every == 0) or step + 1 == cfg.steps:
                arm.before_eval()
                val = evaluate(arm.model, corpus, cfg, rt)
                ev = {"kind": "eval", "arm": name, "step": step + 1, "val_loss": val,
                      "tokens": (step + 1) * cfg.tokens_per_step}
                res.evals.append(ev)
                emit(ev)
            if bar is not None:
                post = {"loss": f"{loss:.3f}", "gnorm": f"{grad_norm:.2f}"}
                if res.evals:
                    post["val"] = f"{res.evals[-1]['val_loss']:.3f}"
                if timed_seconds:
                    post["tok/s"] = f"{timed_tokens / timed_seconds:,.0f}"
                bar.set_postfix(post, refresh=False)
                bar.update(1)
    except Exception as exc:  # reported in the table; the other arms still run
        res.status = "failed"
        res.reason = f"{type(exc).__name__}: {exc}"
        res.notes.append(traceback.format_exc(limit=6))
    finally:
        scope.close()
        if bar is not None:
            bar.close()
    res.step_costs = costs.summary()
    res.train_seconds = timed_seconds
    res.tokens_per_s = timed_tokens / timed_seconds if timed_seconds else None
    if mem_stats is not None:
        _sync(rt)
        res.memory["peak_device"] = int(mem_stats.max_memory_allocated(rt.device))
    if res.status == "ok" and cfg.pp == 1:
        res.param_digest = param_digest(arm.model)
    if hasattr(arm, "gather_memory") and res.status == "ok":
        res.memory, res.memory_per_rank = arm.gather_memory(res.memory)
    arm.close()
    del arm, model
    gc.collect()
    # The next arm starts from an empty allocator pool, as it would in a process of its own: blocks cut to this
    # arm's sizes would otherwise be split and re-cut for the next one's.
    mod = _device_mem(rt)
    if mod is not None and hasattr(mod, "empty_cache"):
        mod.empty_cache()
    return res


def param_digest(model: torch.nn.Module) -> str:
    """sha256 over every parameter's name and bytes: two runs that trained bit-identical parameters (e.g.
    ``--nproc W`` and ``--virtual-ranks W``) have the same digest."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(p.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def _measured_micro_batch(arm, batch: torch.Tensor, scale: float, last: bool, res: ArmResult) -> float:
    """The first micro-batch runs under LAAQ's meter (agoq_core.laaq.SavedBytesMeter): the arm's
    activation memory. Besides autograd's saved tensors it hears what LAAQ stores itself, including
    what its attention hooks keep (those hooks hide any outer saved_tensors_hooks)."""
    if hasattr(arm, "measured_forward_backward"):  # pipeline arms: peak over the schedule's in-flight batches
        loss, mem = arm.measured_forward_backward(batch, scale=scale, last=last)
        res.memory.update(mem)
        return loss
    return arm.forward_backward(batch, scale=scale, last=last,
                                forward_ctx=_meter(SavedBytesMeter(arm.model, label=res.name), res))


@contextlib.contextmanager
def _meter(meter: SavedBytesMeter, res: ArmResult):
    with meter:
        yield
    saved = meter.result()  # read now: the forward's graph is still alive (backward has not run)
    res.memory["activations"] = saved.total
    res.memory["activations_decoder_layers"] = saved.layers_total
    res.memory["activations_other"] = saved.total - saved.layers_total
    res.activation_detail = saved.to_dict()


def _device_mem(rt: Runtime):
    if rt.device.type == "cpu":
        return None
    mod = torch.get_device_module(rt.device.type)
    return mod if hasattr(mod, "max_memory_allocated") else None


def _progress(name: str, cfg: TrainConfig, rt: Runtime):
    if not (cfg.progress and rt.is_main):
        return None
    from tqdm.auto import tqdm  # the [train] extra: checked at start-up (agoq_core.train.extras)

    return tqdm(total=cfg.steps, desc=f"{name:>20s}", unit="step", file=sys.stderr, dynamic_ncols=True,
                leave=True, mininterval=0.5)
