"""QuanGrad's wire compression inside HF Trainer and Accelerate (DDP), through DDP's comm-hook slot.

``QuanGradDDP`` owns the optimizer step, so it cannot live inside Trainer; the DDP comm hook
(agoq_core.quangrad.comm_hook) can. Trainer wraps the model in DDP itself, after callbacks are
built, so the hook is registered by a callback at the first training step::

    trainer = Trainer(model=model, args=args, train_dataset=ds)
    hook = agoq_core.quangrad.hf.install(trainer, fmt="fp8_e4m3")
    trainer.train(); print(hook.state.summary())

With Accelerate, register the hook on what ``prepare`` returns::

    model, opt = accelerator.prepare(model, opt)
    state = agoq_core.quangrad.register_comm_hook(model)   # a DistributedDataParallel on >1 process

Buckets smaller than ``min_compress_bytes`` (default 1 MiB) go through the vendor all-reduce; the
hook logs the split of the first step once (and summary() has the totals), so a threshold that
compresses nothing is visible. A single process has nothing to reduce: the callback says so once.
Imports transformers only when ``install`` is called.
"""
from __future__ import annotations

import logging
from typing import Any

import torch

from agoq_core.errors import AgoqError
from agoq_core.quangrad.comm_hook import QuanGradHookState, register_comm_hook

__all__ = ["install", "QuanGradTrainerHook"]

log = logging.getLogger("agoq")


class QuanGradTrainerHook:
    """What :func:`install` returns: ``state`` (the comm hook's counters, None until the first step
    of a multi-process run), ``callback`` (the TrainerCallback added to the trainer)."""

    def __init__(self, trainer: Any, kwargs: dict) -> None:
        self.trainer, self.kwargs = trainer, kwargs
        self.state: QuanGradHookState | None = None
        self.callback: Any = None
        self._done = False

    def _attach(self) -> None:
        if self._done:
            return
        self._done = True
        wrapped = getattr(self.trainer, "model_wrapped", None)
        if isinstance(wrapped, torch.nn.parallel.DistributedDataParallel):
            self.state = register_comm_hook(wrapped, **self.kwargs)
            log.info("agoq QuanGrad: comm hook registered on the Trainer's DDP model (%s, min_compress_bytes=%s)",
                     self.state.spec.name, f"{self.state.min_compress_bytes:,}")
            return
        world = self.trainer.args.world_size
        if world <= 1:
            log.warning("agoq QuanGrad: single process (world_size=1): no gradient all-reduce to compress")
            return
        raise AgoqError(f"agoq QuanGrad's Trainer hook needs the model wrapped in DistributedDataParallel, but the "
                        f"Trainer runs {type(wrapped).__name__} on {world} processes (FSDP/DeepSpeed); use DDP "
                        "(the default for multi-process Trainer runs without fsdp/deepspeed settings)")


def install(trainer: Any, *, fmt: str = "fp8_e4m3", block: int | None = None, min_compress_bytes: int | None = None,
            backend: Any = None) -> QuanGradTrainerHook:
    """Add a callback to ``trainer`` that registers QuanGrad's DDP comm hook on the DDP model Trainer
    builds (at the first step). Returns the handle; read ``handle.state.summary()`` after training."""
    from transformers import TrainerCallback

    handle = QuanGradTrainerHook(trainer, dict(fmt=fmt, block=block, min_compress_bytes=min_compress_bytes,
                                               backend=backend))

    class QuanGradCallback(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            handle._attach()

        def on_train_end(self, args, state, control, **kwargs):
            if handle.state is not None:
                log.info("%s", handle.state.summary())

    handle.callback = QuanGradCallback()
    trainer.add_callback(handle.callback)
    return handle
