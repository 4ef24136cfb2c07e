"""Tiny HF models of each LLaMA-family class, random init, fixed seeds (CPU, a few ms per step)."""
from __future__ import annotations

import pytest
import torch

FAMILY_CONFIGS = {
    # odd-ish sizes on purpose: hidden 96 and intermediate 264 leave ragged 128-element blocks
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 24}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": True}),  # q/k/v biases, tied head
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 24}),                # q_norm/k_norm on heads
}


def tiny_model(family: str = "llama", *, dtype: torch.dtype = torch.float32, layers: int = 2, hidden: int = 96,
               intermediate: int = 264, heads: int = 4, kv_heads: int = 2, vocab: int = 160, attn: str = "sdpa",
               seed: int = 0):
    import transformers

    cfg_name, model_name, extra = FAMILY_CONFIGS[family]
    cfg = getattr(transformers, cfg_name)(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512, use_cache=False,
        **extra)
    cfg._attn_implementation = attn
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(cfg).to(dtype)
    # HF initialises norm weights to exactly 1; perturb them so norm-weight gradients are not degenerate
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def batch(vocab: int = 160, b: int = 2, s: int = 37, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (b, s), generator=g)


def grads(model, ids) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    g = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out.loss.detach(), g


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / a.norm().clamp_min(1e-300))


@pytest.fixture
def llama():
    return tiny_model("llama")


# ---- the training-stack tests (test_autocast, test_peft, test_checkpointing, test_wrappers, ...) ------
SMALL = dict(hidden=64, intermediate=176, vocab=128)  # hidden 64, 2 layers; sequences of 32


def small_model(family: str = "llama", **kw):
    return tiny_model(family, **{**SMALL, **kw})


def small_batch(b: int = 2, s: int = 32, seed: int = 1) -> torch.Tensor:
    return batch(vocab=SMALL["vocab"], b=b, s=s, seed=seed)


def pooled_errors(g0: dict, g1: dict) -> dict[str, float]:
    """rel. L2 error of g1 vs g0 pooled per layer type (as docs/laaq.md reports it)."""
    from agoq_core.laaq.numerics import layer_type

    num: dict[str, float] = {}
    den: dict[str, float] = {}
    for n in g0:
        t = layer_type(n)
        num[t] = num.get(t, 0.0) + float((g1[n].double() - g0[n].double()).pow(2).sum())
        den[t] = den.get(t, 0.0) + float(g0[n].double().pow(2).sum())
    return {t: (num[t] / max(den[t], 1e-300)) ** 0.5 for t in num}


#: Gradient-error ceiling of the default policy (nf4) per layer type, as tests/laaq/test_numerics.py
#: holds it at init on tiny Llama models (docs/laaq.md, "Numerics").
NF4_REL_L2 = 0.16
