"""Gradient error of an LAAQ policy against the unmodified model, by layer type (paper Table 13).

``gradient_errors(model, config, input_ids)`` runs the same batch through the plain model and the
model with LAAQ applied, and compares every parameter gradient: normalized L2 error
``||g_laaq - g|| / ||g||`` and cosine similarity, pooled over all parameters of one layer type
(all q_proj weights of all layers together, and so on). Forward losses are returned too (LAAQ does
not change the forward pass, so they must be identical).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.nn as nn

from agoq_core.laaq.config import LAAQConfig

__all__ = ["LAYER_TYPES", "GradientErrors", "gradient_errors", "layer_type"]

# (type, pattern on the parameter name); first match wins. Names follow HF LLaMA-family models.
_TYPE_RULES: tuple[tuple[str, str], ...] = (
    ("norm", r"(layernorm|norm)\.weight$"),
    ("attn_q", r"q_proj\.(weight|bias)$"),
    ("attn_k", r"k_proj\.(weight|bias)$"),
    ("attn_v", r"v_proj\.(weight|bias)$"),
    ("attn_o", r"o_proj\.(weight|bias)$"),
    ("mlp_gate", r"gate_proj\.(weight|bias)$"),
    ("mlp_up", r"up_proj\.(weight|bias)$"),
    ("mlp_down", r"down_proj\.(weight|bias)$"),
    ("embed", r"embed_tokens\.weight$"),
    ("lm_head", r"lm_head\.weight$"),
)
LAYER_TYPES: tuple[str, ...] = tuple(t for t, _ in _TYPE_RULES)


def layer_type(param_name: str) -> str:
    for t, pat in _TYPE_RULES:
        if re.search(pat, param_name):
            return t
    return "other"


@dataclass
class GradientErrors:
    loss_plain: float
    loss_laaq: float
    by_type: dict[str, dict[str, float]]   # type -> {"rel_l2": ..., "cosine": ..., "params": n}
    by_param: dict[str, dict[str, float]]  # name -> {"rel_l2": ..., "cosine": ...}

    def table(self) -> str:
        lines = [f"{'layer type':<10} {'rel L2':>9} {'cosine':>9}"]
        for t, d in self.by_type.items():
            lines.append(f"{t:<10} {d['rel_l2']:>9.4f} {d['cosine']:>9.5f}")
        return "\n".join(lines)


def _grads(model: nn.Module, input_ids: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    out = model(input_ids=input_ids, labels=input_ids)
    out.loss.backward()
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return float(out.loss.detach()), grads


def gradient_errors(model: nn.Module, config: LAAQConfig, input_ids: torch.Tensor) -> GradientErrors:
    """Compare gradients of ``model`` with and without LAAQ ``config`` on one batch (model left as found)."""
    from agoq_core.laaq.integrate import apply

    loss0, g0 = _grads(model, input_ids)
    report = apply(model, config)
    try:
        loss1, g1 = _grads(model, input_ids)
    finally:
        report.undo()
    by_param, pooled = {}, {}
    for name, a in g0.items():
        b = g1[name]
        by_param[name] = {"rel_l2": float((b - a).norm() / a.norm().clamp_min(1e-30)),
                          "cosine": float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0))}
        t = layer_type(name)
        acc = pooled.setdefault(t, [0.0, 0.0, 0.0, 0.0, 0])  # |a|^2, |b-a|^2, a.b, |b|^2, count
        acc[0] += float(a.pow(2).sum())
        acc[1] += float((b - a).pow(2).sum())
        acc[2] += float((a * b).sum())
        acc[3] += float(b.pow(2).sum())
        acc[4] += 1
    by_type = {}
    for t in LAYER_TYPES + ("other",):
        if t in pooled:
            aa, dd, ab, bb, n = pooled[t]
            by_type[t] = {"rel_l2": (dd / aa) ** 0.5 if aa > 0 else 0.0,
                          "cosine": ab / max((aa * bb) ** 0.5, 1e-300), "params": n}
    return GradientErrors(loss0, loss1, by_type, by_param)
