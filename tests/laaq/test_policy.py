"""apply_policy and QuantizedCheckpoint on a real (tiny) HF Llama: losses identical, gradients within the
documented per-format tolerance, state_dict unchanged, saved bytes as the budget planner predicts."""
from __future__ import annotations

import pytest
import torch

from agoq_core.errors import AgoqError
from agoq_core.laaq.policy import apply_policy, decoder_layers
from agoq_core.laaq.qcheckpoint import QuantizedCheckpoint, grad_tolerance
from agoq_core.planner.budget import layer_options, plan_budget
from agoq_core.planner.model import model_shape
from tests.laaq.conftest import batch, grads, rel_err, tiny_model

_P = "_checkpoint_wrapped_module."


def _named(g):
    return {n.replace(_P, ""): v for n, v in g.items()}


@pytest.mark.parametrize("fmt", ["nf4", "int5", "int6", "int8"])
def test_quantized_checkpoint_layer_gradient_within_tolerance(fmt):
    model = tiny_model("llama", layers=1, hidden=128, intermediate=344)
    layer = model.model.layers[0]
    torch.manual_seed(3)
    x = torch.randn(2, 48, 128)
    pos = torch.arange(48)[None]
    pe = model.model.rotary_emb(x, position_ids=pos)
    gy = torch.randn(2, 48, 128)

    def run(mod):
        xi = x.clone().requires_grad_(True)
        mod.zero_grad(set_to_none=True)
        y = mod(xi, attention_mask=None, position_embeddings=pe, position_ids=pos)
        y.backward(gy)
        g = {n.replace(_P, ""): p.grad.clone() for n, p in mod.named_parameters()}
        return y.detach(), xi.grad, g

    y0, dx0, g0 = run(layer)
    wrapped = QuantizedCheckpoint(layer, fmt, layer_index=0)
    y1, dx1, g1 = run(wrapped)
    assert torch.equal(y0, y1)  # forward runs on the real input
    tol = grad_tolerance(fmt)
    errs = {n: rel_err(g0[n], g1[n]) for n in g0} | {"input": rel_err(dx0, dx1)}
    assert max(errs.values()) <= tol, errs
    assert max(errs.values()) > 0  # the input really was quantized
    assert set(wrapped.state_dict()) == set(layer.state_dict())


def test_mixed_policy_on_hf_llama():
    ids = batch(b=2, s=64)
    ref = tiny_model("llama", layers=4, hidden=128, intermediate=344)
    l0, g0 = grads(ref, ids)
    keys = set(ref.state_dict())
    choices = ["laaq:int6", "qckpt:int8", "ckpt", "bf16"]
    model = tiny_model("llama", layers=4, hidden=128, intermediate=344)
    rep = apply_policy(model, choices, convert_final_norm=False)
    assert [type(m).__name__ for _, _, m in decoder_layers(model)] == ["LlamaDecoderLayer"] * 4
    assert isinstance(model.model.layers[1], QuantizedCheckpoint)
    assert set(model.state_dict()) == keys
    l1, g1 = grads(model, ids)
    g1 = _named(g1)
    assert torch.equal(l0, l1)
    assert set(g1) == set(g0)
    for n in g0:  # layers 2 (ckpt) and 3 (bf16) see exact upstream gradients only above layer 1
        if "layers.3." in n:
            assert torch.equal(g0[n], g1[n]), n
    assert max(rel_err(g0[n], g1[n]) for n in g0) <= 0.35  # the LAAQ default-policy bound of test_hf.py
    with torch.no_grad():  # inference runs the layers as they are
        assert torch.equal(ref(input_ids=ids).logits, model(input_ids=ids).logits)
    with pytest.raises(AgoqError, match="already has a memory-budget policy"):
        apply_policy(model, choices)
    rep.undo()
    assert type(model.model.layers[1]).__name__ == "LlamaDecoderLayer"
    l2, g2 = grads(model, ids)
    assert torch.equal(l0, l2) and all(torch.equal(g0[n], g2[n]) for n in g0)


def test_plan_object_applies_and_wrong_length_is_refused():
    model = tiny_model("llama", layers=2, hidden=128, intermediate=344)
    with pytest.raises(AgoqError, match="3 layer choices but LlamaForCausalLM has 2"):
        apply_policy(model, ["bf16"] * 3)
    plan = plan_budget(model.config, budget="1GiB", seq_len=64, batch=2, options="bf16,laaq:nf4,qckpt:nf4")
    rep = apply_policy(model, plan)
    assert len(rep.choices) == 2
    from agoq_core.laaq import chunked_linear_cross_entropy

    ids = batch(b=2, s=64)
    h = model.model(input_ids=ids).last_hidden_state
    loss = chunked_linear_cross_entropy(h, model.lm_head.weight, ids, chunk=32)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    rep.undo()


def test_a_plan_for_more_memory_than_the_device_has_warns(monkeypatch):
    """apply_policy warns when the plan's budget exceeds the memory of the device the model is on (an "80 GB"
    H100 has 79.2 GiB: a plan for 80 GiB ran out of memory there on 2026-12-06). No GPU here: the capacity
    lookup is replaced by an H100's numbers; the CPU itself has no budget to exceed."""
    import warnings

    from agoq_core.laaq import policy

    model = tiny_model("llama", layers=2, hidden=128, intermediate=344)
    assert policy.device_capacity(model) is None  # parameters on the CPU: nothing to compare with
    plan = plan_budget(model.config, budget="80GiB", seq_len=64, batch=2, options="bf16,laaq:nf4")
    monkeypatch.setattr(policy, "device_capacity", lambda m: ("cuda:0", 85_031_714_816))  # 79.2 GiB
    with pytest.warns(RuntimeWarning, match=r"budget of 80.0 GiB but cuda:0 has 79.2 GiB"):
        apply_policy(model, plan).undo()
    fits = plan_budget(model.config, budget="79GiB", seq_len=64, batch=2, options="bf16,laaq:nf4")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        apply_policy(model, fits).undo()


def _live_activation_bytes(choices, ids) -> int:
    """Activation bytes alive after forward of a 2-layer bf16 tiny Llama with ``choices`` applied (torch's
    MemTracker, CPU)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    m = tiny_model("llama", layers=2, hidden=128, intermediate=344, dtype=torch.bfloat16)
    if choices:
        apply_policy(m, choices, convert_final_norm=False)
    mt = MemTracker()
    mt.track_external(m)
    with mt:
        out = m(input_ids=ids, labels=ids)
        snap = mt.get_tracker_snapshot()[torch.device("cpu")]
        del out
    return next(v for k, v in snap.items() if "ACT" in str(k))


def test_saved_bytes_measured_vs_predicted():
    """Live activation bytes after forward (torch's MemTracker, CPU, bf16): the difference each option makes
    against plain layers equals the planner's per-layer bytes (LAAQ exactly; checkpointing keeps the int64
    position ids once more, 8 B x sequence)."""
    b, s = 2, 256
    ids = batch(b=b, s=s)

    def live(choices):
        return _live_activation_bytes(choices, ids)

    cfg = tiny_model("llama", layers=2, hidden=128, intermediate=344).config
    names = ["ckpt", "qckpt:nf4", "qckpt:int8", "laaq:nf4", "laaq:int6", "laaq-mlp:nf4"]
    opts = {o.name: o for o in layer_options(model_shape(cfg), seq_len=s, batch=b, options=["bf16", *names])}
    base = live(None)
    for name in names:
        live([name] * 2)  # warm-up: a backend's one-time per-format constants (agoq-cpu) are not activations
        measured = live([name] * 2) - base
        predicted = 2 * (opts[name].saved_bytes - opts["bf16"].saved_bytes)
        slack = 0 if name.startswith("laaq") else 8 * s
        assert 0 <= measured - predicted <= slack, (name, measured, predicted)


def test_refuses_hf_checkpointing_and_bad_format():
    model = tiny_model("llama", layers=2)
    model.gradient_checkpointing_enable()
    with pytest.raises(AgoqError, match="gradient_checkpointing_disable"):
        apply_policy(model, ["ckpt", "ckpt"])
    with pytest.raises(AgoqError, match="not an activation format"):
        QuantizedCheckpoint(tiny_model("llama", layers=1).model.layers[0], "int3")


def test_sac_and_compiled_options_match_plain_gradients():
    """``sac`` (torchtitan's op-level selective checkpointing) and a compiled layer (``-c``, backend eager
    here) recompute or fuse nothing that changes a value on CPU: loss and gradients equal the plain model's."""
    ids = batch(b=2, s=64)
    ref = tiny_model("llama", layers=3, hidden=128, intermediate=344)
    l0, g0 = grads(ref, ids)
    model = tiny_model("llama", layers=3, hidden=128, intermediate=344)
    rep = apply_policy(model, ["sac", "sac-c", "bf16-c"], convert_final_norm=False, compile_backend="eager")
    assert rep.choices == ("sac", "sac-c", "bf16-c")
    assert model.model.layers[2]._compiled_call_impl is not None
    l1, g1 = grads(model, ids)
    g1 = _named(g1)
    assert torch.equal(l0, l1)
    assert all(torch.equal(g0[n], g1[n]) for n in g0)
    rep.undo()
    assert model.model.layers[2]._compiled_call_impl is None
    assert type(model.model.layers[0]).__name__ == "LlamaDecoderLayer"


def test_sac_saved_bytes_measured_vs_predicted():
    """The planner's bytes for ``sac`` (layer input + q, v, gate, down GEMM outputs + attention output and
    its fp32 logsumexp) against torch's MemTracker on CPU, as for the other options above."""
    b, s = 2, 256
    ids = batch(b=b, s=s)

    def live(choices):
        return _live_activation_bytes(choices, ids)

    cfg = tiny_model("llama", layers=2, hidden=128, intermediate=344).config
    opts = {o.name: o for o in layer_options(model_shape(cfg), seq_len=s, batch=b, options=["bf16", "sac"])}
    measured = live(["sac"] * 2) - live(None)
    predicted = 2 * (opts["sac"].saved_bytes - opts["bf16"].saved_bytes)
    assert 0 <= measured - predicted <= 2 * 8 * s, (measured, predicted)  # + position ids kept per layer


def test_plan_from_measured_costs_picks_the_measured_fastest():
    """With measured per-layer costs the plan uses them (compiled options included) and never exceeds the
    budget; a compiled option without a measurement is a clear error."""
    from agoq_core.planner.errors import PlannerError

    shape = "llama2-7b"
    gib = 1 << 30
    measured = {  # made-up but shaped like bench_layer_profile's costs at 32K
        "bf16-c": {"saved_bytes": 6 * gib, "transient_bytes": 5 * gib, "time_s": 0.115},
        "sac-c": {"saved_bytes": 2 * gib, "transient_bytes": 7 * gib, "time_s": 0.126},
        "laaq:nf4": {"saved_bytes": int(1.5 * gib), "transient_bytes": 6 * gib, "time_s": 0.145},
    }
    p = plan_budget(shape, budget="140GiB", seq_len=32768, options=list(measured) + ["ckpt"], measured=measured)
    assert p.peak_bytes <= p.usable_bytes
    assert set(p.choices) <= {"bf16-c", "sac-c", "laaq:nf4", "ckpt"} and "bf16-c" in p.choices
    by = {o.name: o for o in p.options}
    assert by["sac-c"].time_s == 0.126 and by["bf16-c"].saved_bytes == 6 * gib
    assert p.layer_time_s == pytest.approx(sum(by[c].time_s for c in p.choices))
    with pytest.raises(PlannerError, match="no analytic time model"):
        plan_budget(shape, budget="140GiB", seq_len=32768, options=["bf16-c", "ckpt"])
    with pytest.raises(PlannerError, match="need saved_bytes"):
        plan_budget(shape, budget="140GiB", seq_len=32768, options=["sac-c"], measured={"sac-c": {"time_s": 1}})


def test_laaq_mlp_option_converts_only_the_mlp_half():
    ids = batch(b=2, s=64)
    ref = tiny_model("llama", layers=2, hidden=128, intermediate=344)
    l0, g0 = grads(ref, ids)
    model = tiny_model("llama", layers=2, hidden=128, intermediate=344)
    rep = apply_policy(model, ["laaq-mlp:nf4", "laaq-mlp-c:int8"], convert_final_norm=False, compile_backend="eager")
    layer = model.model.layers[0]
    assert "forward" in layer.mlp.__dict__ and "forward" in layer.post_attention_layernorm.__dict__  # converted
    assert "forward" not in layer.input_layernorm.__dict__ and "forward" not in layer.self_attn.q_proj.__dict__
    l1, g1 = grads(model, ids)
    assert torch.equal(l0, l1)  # the forward is the plain model's
    assert max(rel_err(g0[n], g1[n]) for n in g0) <= 0.35
    assert max(rel_err(g0[n], g1[n]) for n in g0 if "mlp" in n) > 0  # the MLP really kept 4/8-bit copies
    rep.undo()
    assert "forward" not in model.model.layers[0].mlp.__dict__
    l2, g2 = grads(model, ids)
    assert torch.equal(l0, l2) and all(torch.equal(g0[n], g2[n]) for n in g0)


def test_compiled_quantized_checkpoint_compiles_the_layer_not_the_wrapper():
    """``qckpt-c:FMT`` compiles the decoder layer inside the wrapper: Dynamo sees two whole-layer graphs
    (the forward without grad, the recomputation with grad) shared by every such layer, no graph break,
    and the gradients are the eager ``qckpt`` ones (the eager compile backend changes no value)."""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter

    ids = batch(b=2, s=64)
    ref = tiny_model("llama", layers=3, hidden=128, intermediate=344)
    rep0 = apply_policy(ref, ["qckpt:int8"] * 3, convert_final_norm=False)
    l0, g0 = grads(ref, ids)
    g0 = _named(g0)
    rep0.undo()
    torch._dynamo.reset()
    counter = CompileCounter()
    model = tiny_model("llama", layers=3, hidden=128, intermediate=344)
    rep = apply_policy(model, ["qckpt-c:int8"] * 3, convert_final_norm=False, compile_backend=counter)
    assert rep.choices == ("qckpt-c:int8",) * 3
    wrapper = model.model.layers[1]
    assert isinstance(wrapper, QuantizedCheckpoint) and wrapper._compiled_call_impl is None
    assert wrapper._checkpoint_wrapped_module._compiled_call_impl is not None
    l1, g1 = grads(model, ids)
    assert counter.frame_count == 2, counter.frame_count  # forward (no grad) + recomputation (grad)
    assert torch.equal(l0, l1)
    g1 = _named(g1)
    assert all(torch.equal(g0[n], g1[n]) for n in g0)
    rep.undo()
    assert model.model.layers[1]._compiled_call_impl is None and type(model.model.layers[1]).__name__ == "LlamaDecoderLayer"
    torch._dynamo.reset()
