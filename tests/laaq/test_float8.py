"""LAAQ with float8 GEMMs (LAAQConfig(float8_gemms=True)) on a tiny HF Llama whose decoder Linears are torchao
Float8Linear (torchao's CPU emulation): with native storage the loss and every gradient equal torchao's own
float8 training bit for bit (the same casts and products, the inputs rebuilt instead of kept); with nf4 storage
they differ only by LAAQ's storage error; the float8 path runs compiled only (an eager call is a clear error);
without the opt-in Float8Linear modules are skipped with a reason."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from agoq_core.errors import AgoqError
from tests.laaq.conftest import batch, grads, rel_err, tiny_model

float8 = pytest.importorskip("torchao.float8")


def _float8_model(seed=0):
    model = tiny_model("llama", layers=2, hidden=128, intermediate=256, heads=4, kv_heads=2, seed=seed)
    float8.convert_to_float8_training(
        model.model, config=float8.Float8LinearConfig(emulate=True),
        module_filter_fn=lambda m, fqn: isinstance(m, nn.Linear))
    return model


def _compile_layers(model):
    for layer in model.model.layers:
        layer.compile(backend="aot_eager")


def _run(config):
    from agoq_core import laaq

    torch._dynamo.reset()
    ids = batch(b=2, s=32)
    ref = _float8_model()
    _compile_layers(ref)
    l0, g0 = grads(ref, ids)
    model = _float8_model()
    rep = laaq.apply(model, config)
    _compile_layers(model)
    l1, g1 = grads(model, ids)
    torch._dynamo.reset()
    return rep, (l0, g0), (l1, g1)


def test_native_storage_equals_torchao_float8():
    """The last decoder layer (whose incoming gradient is the same tensor in both runs) and the head: bit for
    bit. Below it the layer-input gradient differs in its last bits -- compiled LAAQ sums the Q/K/V input
    gradients inside its recomputed norm's backward, autograd sums them before the norm (the bf16 traced path
    differs from plain there by ~4e-7 relative too) -- and float8's casts of the next gradients turn that
    into at most ~1e-2 relative."""
    from agoq_core.laaq import LAAQConfig

    rep, (l0, g0), (l1, g1) = _run(LAAQConfig.native(float8_gemms=True, convert_final_norm=False))
    kinds = {c.kind for c in rep.converted if c.formats.get("gemm") == "float8"}
    assert kinds == {"linear", "swiglu"} and not rep.skipped, rep
    assert torch.equal(l0, l1)
    assert set(g0) == set(g1)
    exact = [n for n in g0 if n.startswith(("model.layers.1.", "model.norm.", "lm_head."))]
    assert len(exact) == 11
    for n in exact:
        assert torch.equal(g0[n], g1[n]), n
    errs = {n: rel_err(g0[n], g1[n]) for n in g0}
    assert max(errs.values()) <= 2e-2, errs


def test_nf4_storage_within_laaq_error_of_torchao_float8():
    from agoq_core.laaq import LAAQConfig

    _, (l0, g0), (l1, g1) = _run(LAAQConfig(float8_gemms=True, convert_final_norm=False))
    assert torch.equal(l0, l1)  # the forward is float8 training's
    errs = {n: rel_err(g0[n], g1[n]) for n in g0}
    assert 0 < max(errs.values()) <= 0.35, errs


def test_float8_path_runs_compiled_only_and_is_opt_in():
    from agoq_core import laaq
    from agoq_core.laaq import LAAQConfig

    model = _float8_model()
    laaq.apply(model, LAAQConfig(float8_gemms=True))
    with pytest.raises(AgoqError, match="compile.d decoder layers only"):
        grads(model, batch(b=1, s=16))
    with torch.no_grad():  # inference is the module's own forward
        model(input_ids=batch(b=1, s=16))
    other = _float8_model()
    rep = laaq.apply(other, LAAQConfig())
    reasons = {s.path: s.reason for s in rep.skipped}
    assert "model.layers.0.self_attn.q_proj" in reasons and "model.layers.0.mlp" in reasons, reasons
    assert all("Float8Linear" in r and "float8_gemms=True" in r for r in reasons.values()), reasons
    with pytest.raises(TypeError, match="float8_gemms"):
        LAAQConfig(float8_gemms="yes")


def test_policy_with_float8_everywhere():
    """apply_policy(float8=True): torchao float8 on every decoder Linear, LAAQ layers with float8 GEMMs (compiled),
    checkpointed layers running torchao's float8 layers; gradients within LAAQ's error of plain float8 training."""
    from agoq_core.laaq.policy import apply_policy

    torch._dynamo.reset()
    ids = batch(b=2, s=32)
    ref = _float8_model()
    _compile_layers(ref)
    l0, g0 = grads(ref, ids)
    model = tiny_model("llama", layers=2, hidden=128, intermediate=256, heads=4, kv_heads=2)
    with pytest.raises(AgoqError, match="laaq-c:FMT"):
        apply_policy(model, ["laaq:nf4", "bf16"], float8=True)
    rep = apply_policy(model, ["laaq-c:nf4", "ckpt-c"], float8=float8.Float8LinearConfig(emulate=True),
                       compile_backend="aot_eager", convert_final_norm=False)  # CPU: torchao's emulation
    assert type(model.model.layers[0].self_attn.q_proj).__name__ == "Float8Linear"
    assert any(c.formats.get("gemm") == "float8" for c in rep.laaq_reports[0].converted)
    l1, g1 = grads(model, ids)
    g1 = {n.replace("_checkpoint_wrapped_module.", ""): v for n, v in g1.items()}
    assert torch.equal(l0, l1)
    errs = {n: rel_err(g0[n], g1[n]) for n in g0}
    assert max(errs.values()) <= 0.35, errs
    torch._dynamo.reset()


@pytest.mark.parametrize("bias", [False, True])
def test_float8_gemms_equal_torchao_matmul(bias):
    """The three products of Float8Gemms against torchao's own float8 linear (Float8Linear.forward and its
    autograd backward) on one random linear: forward, input gradient and weight gradient bit for bit."""
    from agoq_core.laaq.float8 import Float8Gemms, is_float8_linear

    torch.manual_seed(0)
    lin = nn.Linear(64, 48, bias=bias)
    f8 = float8.convert_to_float8_training(nn.Sequential(lin), config=float8.Float8LinearConfig(emulate=True))[0]
    assert is_float8_linear(f8) and not is_float8_linear(nn.Linear(4, 4))
    x = torch.randn(3, 10, 64, requires_grad=True)
    y = f8(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    g = Float8Gemms.of(f8)
    with torch.no_grad():
        assert torch.equal(g.linear(x, f8.weight, f8.bias), y)
        assert torch.equal(g.input_grad(dy, f8.weight), x.grad)
        assert torch.equal(g.weight_grad(dy, x), f8.weight.grad)
