"""LAAQ on transformers 5 mixture-of-experts MLPs (agoq_core.laaq.moe), against the same model without LAAQ.

Mixtral, Qwen2-MoE (with its shared expert, left plain) and Qwen3-MoE, tiny random configs (hidden 128,
4 experts, top-2, 4 x 64 tokens), transformers' default ``grouped_mm`` experts implementation. LAAQ runs
transformers' own experts forward, so the loss is bit-identical; with nothing quantized the gradients
equal PyTorch's to fp32 summation order (the per-expert GEMMs and the routing-weight gradient
<dY Wd, h> are summed in another order); with nf4 they stay within the per-layer-type error.
"""
from __future__ import annotations

import pytest
import torch

from agoq_core.formats.spec import get_format
from agoq_core.laaq import LAAQConfig, SavedBytesMeter, apply, remove
from tests.laaq.conftest import pooled_errors, rel_err

MOE = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", {"num_experts": 4, "num_experts_per_tok": 2,
                                                             "moe_intermediate_size": 176,
                                                             "shared_expert_intermediate_size": 176}),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {"num_experts": 4, "num_experts_per_tok": 2,
                                                             "moe_intermediate_size": 176, "head_dim": 16}),
}
INTER = {"mixtral": 352, "qwen2_moe": 176, "qwen3_moe": 176}
TOKENS, TOP_K = 4 * 64, 2


def build(name: str):
    import transformers

    cfg_name, model_name, extra = MOE[name]
    cfg = getattr(transformers, cfg_name)(vocab_size=128, hidden_size=128, intermediate_size=352, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, use_cache=False, **extra)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * 0.1)
    if model.config._experts_implementation != "grouped_mm":
        pytest.skip(f"torch._grouped_mm not usable here (experts_implementation={model.config._experts_implementation})")
    return model


def grads(model, ids, amp=None):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=amp, enabled=amp is not None):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    g = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), g


def ids_():
    return torch.randint(0, 128, (4, 64), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", sorted(MOE))
def test_moe_experts_train_like_the_plain_model(name):
    model = build(name)
    ids = ids_()
    l0, g0 = grads(model, ids)
    rep = apply(model, LAAQConfig.native())
    assert [c.path for c in rep.converted if c.kind == "moe_experts"] == [
        "model.layers.0.mlp.experts", "model.layers.1.mlp.experts"]
    l1, g1 = grads(model, ids)
    assert torch.equal(l0, l1)
    assert set(g1) == set(g0)  # experts, router and routing weights all get gradients
    errs = {n: rel_err(g0[n], g1[n]) for n in g0}
    assert max(errs.values()) < 1e-5, errs
    remove(model)
    apply(model)  # the default nf4 policy
    l2, g2 = grads(model, ids)
    assert torch.equal(l0, l2)
    pooled = pooled_errors(g0, g2)
    assert max(pooled.values()) <= 0.16, pooled  # measured <= 0.112 (experts: 0.109-0.112)
    remove(model)


def test_moe_experts_under_bf16_autocast():
    """transformers' grouped_mm is not autocast-enabled (it runs in the weights' dtype); LAAQ's backward
    does the same."""
    model = build("mixtral")
    ids = ids_()
    l0, g0 = grads(model, ids, torch.bfloat16)
    apply(model, LAAQConfig.native())
    l1, g1 = grads(model, ids, torch.bfloat16)
    assert torch.equal(l0, l1)
    assert max(rel_err(g0[n], g1[n]) for n in g0) < 1e-2  # bf16 attention/router GEMMs in another order
    remove(model)


def test_moe_experts_keep_only_the_quantized_gate_up_rows():
    """Per layer the experts keep S x 2I values in nf4 (S = tokens x top-k routed rows) and nothing else of
    their own; the decoder layers keep 22% of the plain model's bytes (Mixtral, measured)."""
    model = build("mixtral")
    ids = ids_()
    with SavedBytesMeter(model) as m:
        loss = model(input_ids=ids, labels=ids).loss
        plain = m.result()
    loss.backward()
    apply(model)
    with SavedBytesMeter(model) as m:
        loss = model(input_ids=ids, labels=ids).loss
        laaq = m.result()
    loss.backward()
    want = get_format("nf4").storage_bytes(TOKENS * TOP_K * 2 * INTER["mixtral"])
    for layer in (0, 1):
        assert laaq.per_layer[layer]["act"] == want, (laaq.per_layer[layer], want)
    assert laaq.layers_total < 0.25 * plain.layers_total, (laaq.layers_total, plain.layers_total)
    remove(model)
