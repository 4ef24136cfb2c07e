"""LAAQ on unmodified HF transformers models: Llama, Mistral, Qwen2, Qwen3 (tiny configs, CPU)."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from agoq_core.errors import AgoqError
from agoq_core.laaq import LAAQConfig, LayerFamily, apply, is_converted, remove
from tests.laaq.conftest import batch, grads, rel_err, tiny_model

FAMILIES = ["llama", "mistral", "qwen2", "qwen3"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_converts_trains_and_undoes(family, dtype):
    model = tiny_model(family, dtype=dtype)
    ids = batch()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    loss0, g0 = grads(model, ids)
    report = apply(model)
    # what was converted: per layer 2 norms, q/k/v/o, the MLP; plus the final norm and the LM head
    kinds = [c.kind for c in report.converted]
    assert kinds.count("norm") == 2 * 2 + 1 and kinds.count("swiglu") == 2 and kinds.count("linear") == 4 * 2 + 1
    assert report.skipped == [] and report.layers == [0, 1]
    assert "2 decoder layers" in str(report)
    loss1, g1 = grads(model, ids)
    assert torch.equal(loss0, loss1), "LAAQ must not change the forward pass"
    assert g0.keys() == g1.keys()
    for name in g0:  # loose here; test_numerics holds the per-layer-type thresholds
        assert rel_err(g0[name], g1[name]) < 0.35, name
    report.undo()
    assert not any(is_converted(m) for m in model.modules())
    assert all("forward" not in vars(m) for m in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    loss2, g2 = grads(model, ids)
    assert torch.equal(loss0, loss2) and all(torch.equal(g0[n], g2[n]) for n in g0)


@pytest.mark.parametrize("family", FAMILIES)
def test_native_policy_reproduces_pytorch_bit_for_bit_in_bf16(family):
    # With nothing quantized, recomputation must give PyTorch's gradients exactly (bf16: every
    # accumulation has two terms, so the order cannot matter; in fp32 HF's RMSNorm sums three).
    model = tiny_model(family, dtype=torch.bfloat16)
    ids = batch()
    loss0, g0 = grads(model, ids)
    rep = apply(model, LAAQConfig.native())
    loss1, g1 = grads(model, ids)
    rep.undo()
    assert torch.equal(loss0, loss1)
    assert [n for n in g0 if not torch.equal(g0[n], g1[n])] == []


def test_native_policy_fp32_is_within_rounding():
    model = tiny_model("llama")
    ids = batch()
    _, g0 = grads(model, ids)
    rep = apply(model, LAAQConfig.native())
    _, g1 = grads(model, ids)
    rep.undo()
    assert max(rel_err(g0[n], g1[n]) for n in g0) < 1e-5


def test_state_dict_and_checkpoint_round_trip_unchanged(tmp_path):
    model = tiny_model("llama")
    keys = list(model.state_dict())
    apply(model)
    assert list(model.state_dict()) == keys
    torch.save(model.state_dict(), tmp_path / "ck.pt")
    other = tiny_model("llama", seed=5)
    other.load_state_dict(torch.load(tmp_path / "ck.pt"))
    ids = batch()
    assert torch.equal(grads(model, ids)[0], grads(other, ids)[0])
    remove(model)


def test_deepcopy_of_a_converted_model_is_independent():
    model = tiny_model("llama")
    apply(model)
    twin = copy.deepcopy(model)
    ids = batch()
    l0, g0 = grads(model, ids)
    l1, g1 = grads(twin, ids)
    assert torch.equal(l0, l1) and all(torch.equal(g0[n], g1[n]) for n in g0)
    with torch.no_grad():
        twin.model.layers[0].mlp.up_proj.weight.mul_(2)  # must not leak into the original
    assert torch.equal(grads(model, ids)[0], l0)
    remove(twin)
    remove(model)


def test_per_layer_overrides_reach_the_layers():
    model = tiny_model("llama", layers=3)
    cfg = LAAQConfig(layer_overrides={1: {"norm_input": "int8", "mlp_act_input": "int6"}})
    rep = apply(model, cfg)
    by = {(c.path, c.layer): c.formats for c in rep.converted}
    assert by[("model.layers.1.input_layernorm", 1)] == {"norm_input": "int8"}
    assert by[("model.layers.1.mlp", 1)] == {"mlp_act_input": "int6"}
    assert by[("model.layers.2.mlp", 2)] == {"mlp_act_input": "nf4"}
    assert by[("model.norm", None)] == {"norm_input": "nf4"}
    remove(model)


def test_naive_policy_wraps_the_attention_call():
    model = tiny_model("llama")
    rep = apply(model, LAAQConfig.uniform("int4", include_attention=True))
    assert [c.path for c in rep.converted if c.kind == "attention_core"] == ["model.layers.0.self_attn",
                                                                              "model.layers.1.self_attn"]
    ids = batch()
    loss, g = grads(model, ids)
    assert torch.isfinite(loss) and all(torch.isfinite(v).all() for v in g.values())
    remove(model)


def test_eager_attention_also_works():
    model = tiny_model("llama", attn="eager")
    ids = batch()
    l0, _ = grads(model, ids)
    apply(model, LAAQConfig.uniform("int8", include_attention=True))
    l1, g1 = grads(model, ids)
    assert torch.equal(l0, l1) and all(torch.isfinite(v).all() for v in g1.values())
    remove(model)


def test_inference_is_untouched():
    model = tiny_model("llama")
    ids = batch()
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    apply(model)
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, ref)
    remove(model)


def test_errors():
    model = tiny_model("llama")
    apply(model)
    with pytest.raises(AgoqError, match="already has LAAQ applied"):
        apply(model)
    remove(model)
    with pytest.raises(AgoqError, match="not applied"):
        remove(model)
    with pytest.raises(AgoqError, match="no decoder layer of a known family"):
        apply(nn.Sequential(nn.Linear(2, 2)))
    with pytest.raises(TypeError, match="LAAQConfig"):
        apply(tiny_model("llama"), {"norm_input": "int4"})


def test_a_custom_family_row_and_skips_with_reasons():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.RMSNorm(16)
            self.attn = nn.Module()
            self.attn.wq, self.attn.wk, self.attn.wv = (nn.Linear(16, 16) for _ in range(3))
            self.attn.wo = nn.Conv1d(16, 16, 1)  # not a Linear: skipped with a reason
            self.ln2 = nn.RMSNorm(16)
            self.ff = nn.Module()
            self.ff.w1, self.ff.w3, self.ff.w2 = nn.Linear(16, 32), nn.Linear(16, 32), nn.Linear(32, 16)
            self.ff.act = nn.SiLU()
            self.ff.forward = lambda x: self.ff.w2(self.ff.act(self.ff.w1(x)) * self.ff.w3(x))

        def forward(self, x):
            y = self.ln1(x)
            h = x + self.attn.wq(y) * torch.sigmoid(self.attn.wk(y)) + self.attn.wv(y)
            return h + self.ff(self.ln2(h))

    row = LayerFamily(name="mine", layer_classes=("Block",), input_norm="ln1", post_norm="ln2", attention="attn",
                      q_proj="wq", k_proj="wk", v_proj="wv", o_proj="wo", mlp="ff", gate_proj="w1", up_proj="w3",
                      down_proj="w2", act_fn="act", layer_index_attr="", final_norm=(), lm_head=())
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block())
    x = torch.randn(3, 5, 16, requires_grad=True)
    out0 = model(x)
    out0.square().sum().backward()
    g0 = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    rep = apply(model, families=[row])
    assert [s.path for s in rep.skipped] == ["0.attn.wo", "1.attn.wo"]
    assert "not nn.Linear" in rep.skipped[0].reason
    assert rep.layers == [0, 1]
    out1 = model(x)
    assert torch.equal(out0, out1)
    out1.square().sum().backward()
    for n, p in model.named_parameters():
        if n in g0:
            assert rel_err(g0[n], p.grad) < 0.3, n
    rep.undo()
