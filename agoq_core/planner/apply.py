"""Putting a plan to work: LAAQ configs per stage, HF models cut into pipeline stages, torch schedules.

- :func:`laaq_config_for_layers` turns a stage's ``{layer: format}`` into the LAAQConfig that stage
  trains with (LAAQ's per-layer overrides; the roles LAAQ quantizes take the planned format).
- :class:`HFStageModule` is one virtual stage of a Hugging Face LLaMA-family causal LM: the embedding
  (first stage), a run of the model's own decoder-layer modules, the final norm and LM head (last
  stage). It computes RoPE tables itself and calls the layers with ``attention_mask=None`` (SDPA's
  causal path), so it runs under ``torch.distributed.pipelining`` without HF's mask helpers.
- :func:`build_stage_modules` cuts a model by a plan's layer split; :func:`make_schedule` builds the
  matching torch schedule.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn as nn

from agoq_core import laaq
from agoq_core.planner.errors import PlannerError
from agoq_core.planner.schedules import SCHEDULES, PipelineSpec

__all__ = ["laaq_config_for_layers", "HFStageModule", "build_stage_modules", "make_schedule", "causal_lm_loss"]


def laaq_config_for_layers(formats: Mapping[int, str], base: Any = None) -> Any:
    """``base`` (default LAAQ's paper policy) with each listed layer's quantized roles in its format.

    Roles that ``base`` keeps native (the attention core by default) stay native; layers not listed
    (and the final norm) keep ``base``'s formats.
    """
    base = base if base is not None else laaq.LAAQConfig()
    if not isinstance(base, laaq.LAAQConfig):
        raise PlannerError(f"base must be an LAAQConfig, got {type(base).__name__}")
    names = base.plan(None).names()
    roles = [r for r in laaq.ROLES if names[r] != laaq.NATIVE]
    overrides = {k: dict(v) for k, v in base.layer_overrides.items()}
    for layer, fmt in formats.items():
        overrides.setdefault(int(layer), {}).update({r: fmt for r in roles})
    return base.replace(layer_overrides=overrides)


def _decoder(model: nn.Module) -> nn.Module:
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(model, "lm_head"):
        raise PlannerError(f"{type(model).__name__} is not an HF causal LM with .model.layers and .lm_head "
                           f"(LLaMA, Mistral, Qwen2 ...)")
    return inner


class HFStageModule(nn.Module):
    """Virtual stage of an HF causal LM: [embedding] -> decoder layers -> [final norm -> LM head]."""

    def __init__(self, model: nn.Module, layers: Sequence[int], *, first: bool, last: bool) -> None:
        super().__init__()
        inner = _decoder(model)
        n = len(inner.layers)
        bad = [i for i in layers if not 0 <= i < n]
        if bad:
            raise PlannerError(f"layers {bad} do not exist: the model has {n} decoder layers")
        self.embed_tokens = inner.embed_tokens if first else None
        self.layers = nn.ModuleList([inner.layers[i] for i in layers])
        self.rotary_emb = inner.rotary_emb
        self.norm = inner.norm if last else None
        self.lm_head = model.lm_head if last else None
        self.layer_ids = tuple(layers)

    def get_input_embeddings(self) -> nn.Module | None:
        return self.embed_tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(x) if self.embed_tokens is not None else x
        pos = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
        cos_sin = self.rotary_emb(h, pos)
        for layer in self.layers:
            h = layer(h, position_ids=pos, position_embeddings=cos_sin)
            if isinstance(h, tuple):  # transformers < 5 returns (hidden_states, ...)
                h = h[0]
        if self.lm_head is not None:
            h = self.lm_head(self.norm(h))
        return h


def build_stage_modules(model: nn.Module, spec: PipelineSpec, layers: Sequence[Sequence[int]],
                        rank: int) -> list[tuple[int, HFStageModule]]:
    """(virtual stage index, module) for every chunk of ``rank``, in local chunk order."""
    if len(layers) != spec.virtual_stages:
        raise PlannerError(f"layer split has {len(layers)} virtual stages, the schedule {spec.virtual_stages}")
    last = spec.virtual_stages - 1
    return [(vs, HFStageModule(model, layers[vs], first=vs == 0, last=vs == last)) for vs in spec.vstages_of(rank)]


def causal_lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy; ``targets`` are the inputs shifted by one (done by the caller)."""
    return nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_schedule(spec: PipelineSpec, stages: Sequence[Any], loss_fn: Callable | None = None) -> Any:
    """The torch.distributed.pipelining schedule for ``spec`` over this rank's PipelineStage objects."""
    from torch.distributed.pipelining import schedules as sched

    cls = getattr(sched, SCHEDULES[spec.schedule].torch_class)
    if SCHEDULES[spec.schedule].multi_chunk:
        return cls(list(stages), spec.microbatches, loss_fn=loss_fn)
    if len(stages) != 1:
        raise PlannerError(f"{spec.schedule} runs one stage per rank, got {len(stages)}")
    return cls(stages[0], spec.microbatches, loss_fn=loss_fn)
