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


# ---- the study behind docs/laaq.md (python -m agoq_core.laaq.numerics) -------------------------------------
STUDY_POLICIES = ("nf4", "fp4_e2m1", "int4", "int5", "int6", "int8", "naive int4", "naive int8")


def _policy(name: str) -> LAAQConfig:
    if name.startswith("naive "):
        return LAAQConfig.uniform(name.split()[1], include_attention=True)
    return LAAQConfig.uniform(name)


def _tiny_llama(seed: int = 0) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=256, hidden_size=96, intermediate_size=264, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, use_cache=False)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)


def _text_batches(seq: int, batch: int):
    """Byte-level windows of the shipped WikiText-2 validation text (CC BY-SA 3.0), fixed order."""
    from importlib import resources

    data = (resources.files("agoq_core") / "data" / "wikitext-2" / "valid.txt").read_bytes()
    ids = torch.frombuffer(bytearray(data[: 1 << 20]), dtype=torch.uint8).long()
    i = 0
    while True:
        g = torch.Generator().manual_seed(i)
        starts = torch.randint(0, ids.numel() - seq, (batch,), generator=g)
        yield torch.stack([ids[s:s + seq] for s in starts])
        i += 1


def study(train_steps: int = 100, seq: int = 128, batch: int = 8) -> dict[str, dict[str, GradientErrors]]:
    """Gradient errors of STUDY_POLICIES on a tiny HF LLaMA: at init, and after ``train_steps`` AdamW
    steps on WikiText-2 bytes (trained models have larger attention logits, where quantizing Q/K hurts)."""
    model = _tiny_llama()
    batches = _text_batches(seq, batch)
    probe = next(batches)
    out = {"init": {p: gradient_errors(model, _policy(p), probe) for p in STUDY_POLICIES}}
    if train_steps:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for _ in range(train_steps):
            ids = next(batches)
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        out[f"after {train_steps} steps"] = {p: gradient_errors(model, _policy(p), probe) for p in STUDY_POLICIES}
    return out


def markdown(results: dict[str, dict[str, GradientErrors]]) -> str:
    types = [t for t in LAYER_TYPES if t != "embed"]
    lines = []
    for phase, rows in results.items():
        first = next(iter(rows.values()))
        lines += [f"**{phase}** (loss {first.loss_plain:.3f}; normalized L2 error of the gradient, pooled per "
                  "layer type)", "",
                  "| policy | " + " | ".join(types) + " |", "|---" * (len(types) + 1) + "|"]
        for p, r in rows.items():
            cells = [f"{r.by_type[t]['rel_l2']:.4f}" if t in r.by_type else "-" for t in types]
            lines.append(f"| {p} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover - documentation generator
    import argparse

    ap = argparse.ArgumentParser(description="LAAQ gradient-error study (docs/laaq.md)")
    ap.add_argument("--train-steps", type=int, default=100)
    a = ap.parse_args()
    print(markdown(study(a.train_steps)))
