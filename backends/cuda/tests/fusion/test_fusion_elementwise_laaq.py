"""LAAQ with the elementwise fusions (AGOQ_FUSION=elementwise) on a tiny bf16 HF Llama, cuda backend (the
interpreter on CPU): the fused RMSNorm+quantize, SiLU&Mul+quantize and SwiGLU backward run, and the loss and
every gradient are bit-identical to unfused LAAQ."""
from __future__ import annotations

import collections

import pytest
import torch

transformers = pytest.importorskip("transformers")


def _tiny_llama(device, hidden=256):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=256, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=4, vocab_size=128,
                                   max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).to(device)


def _counting(monkeypatch, calls):
    from agoq_cuda import fused_norm, fused_swiglu

    for mod, name in ((fused_norm, "rmsnorm_quant_into"), (fused_swiglu, "silu_mul_quant_into"),
                      (fused_swiglu, "silu_mul_backward_into")):
        real = getattr(mod, name)

        def wrapped(*a, _real=real, _name=name, **k):
            calls[_name] += 1
            return _real(*a, **k)

        monkeypatch.setattr(mod, name, wrapped)


def test_laaq_elementwise_fusion_is_bit_identical(device, monkeypatch):
    from agoq_core import laaq
    from agoq_core.laaq import fusion

    monkeypatch.setenv("AGOQ_BACKEND", "cuda")
    monkeypatch.setattr(fusion, "TRUST_ELEMENTS", 1)  # trust a variant after one matching call (tiny model)
    monkeypatch.setattr(fusion, "_choices", {})
    calls: collections.Counter = collections.Counter()
    _counting(monkeypatch, calls)
    model = _tiny_llama(device)
    ids = torch.randint(0, 128, (2, 8), device=device)

    def step():
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        return out.loss.detach().clone(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}

    laaq.apply(model)
    monkeypatch.setenv("AGOQ_FUSION", "0")
    loss0, g0 = step()
    assert not calls
    monkeypatch.setenv("AGOQ_FUSION", "elementwise")
    step()  # first call per op: every variant compared with the unfused result, which is returned
    checked = dict(calls)
    calls.clear()
    loss1, g1 = step()  # now the trusted variants run alone
    # 3 norms (2 in the layer + the final norm), one SiLU&Mul forward and one backward
    assert calls == {"rmsnorm_quant_into": 3, "silu_mul_quant_into": 1, "silu_mul_backward_into": 1}, (calls, checked)
    # the norm is accepted within a tolerance (rows whose inverse RMS is 1 ulp apart may differ); on these
    # inputs its check saw no differing row, so the whole step must be bit-identical
    assert all(c.stats.get("rows_differing", 0) == 0 for k, c in fusion._choices.items() if k[0] == "rmsnorm_quant")
    assert torch.equal(loss1, loss0)
    for name in g0:
        assert torch.equal(g1[name], g0[name]), name
    chosen = {k[0]: c.variants[0] for k, c in fusion._choices.items() if c.variants}
    assert set(chosen) == {"rmsnorm_quant", "silu_mul_quant", "silu_mul_backward"}, fusion._choices


def test_a_variant_that_does_not_match_is_never_used(device, monkeypatch):
    """Teeth: a norm whose recipe differs (Gemma-style (1 + w)) fails the check: the norm runs unfused."""
    from agoq_core.laaq import fusion
    from agoq_core.laaq.functions import NormFunction, NormSource
    from agoq_core.formats.spec import get_format

    monkeypatch.setenv("AGOQ_BACKEND", "cuda")
    monkeypatch.setenv("AGOQ_FUSION", "elementwise")
    monkeypatch.setattr(fusion, "TRUST_ELEMENTS", 1)
    monkeypatch.setattr(fusion, "_choices", {})
    calls: collections.Counter = collections.Counter()
    _counting(monkeypatch, calls)

    class OffsetNorm(torch.nn.Module):  # has weight and variance_epsilon, but y = (1 + w) * x * r
        def __init__(self, h):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.full((h,), 0.1, dtype=torch.bfloat16))
            self.variance_epsilon = 1e-6

        def forward(self, x):
            xf = x.float()
            xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
            return ((1.0 + self.weight.float()) * xf).to(x.dtype)

    norm = OffsetNorm(256).to(device)
    x = torch.randn(4, 256, device=device).to(torch.bfloat16).requires_grad_(True)
    spec = get_format("nf4")
    for _ in range(2):
        src = NormSource(norm.forward, spec, 0, None, module=norm)
        y = NormFunction.apply(x, src, norm.weight)
        assert torch.equal(y, norm(x))
    assert calls["rmsnorm_quant_into"] >= 1  # tried on the first call
    assert not next(iter(fusion._choices.values())).variants  # every variant dropped
    n = calls["rmsnorm_quant_into"]
    src = NormSource(norm.forward, spec, 0, None, module=norm)
    NormFunction.apply(x, src, norm.weight)
    assert calls["rmsnorm_quant_into"] == n  # not tried again


def test_a_forward_variant_wrong_only_on_rare_inputs_is_dropped(device, monkeypatch):
    """Teeth for the every-input check: a SiLU&Mul variant that is wrong only where |g| > 64 (never in these
    inputs, so the real-data check alone would trust it) is dropped before use; the next variant runs fused."""
    from agoq_core.backend import get_backend
    from agoq_core.formats.spec import get_format
    from agoq_core.laaq import fusion
    from agoq_cuda import fused_swiglu

    monkeypatch.setenv("AGOQ_BACKEND", "cuda")
    monkeypatch.setenv("AGOQ_FUSION", "elementwise")
    monkeypatch.setattr(fusion, "TRUST_ELEMENTS", 1)
    monkeypatch.setattr(fusion, "_choices", {})
    real, real_variants = fused_swiglu.silu_mul_quant_into, fused_swiglu.silu_mul_quant_variants
    used = []

    def flawed(gate, up, spec, h, *bufs, variant=None):
        used.append(variant)
        real(gate, up, spec, h, *bufs, variant=real_variants(gate.device)[0] if variant == "bad" else variant)
        if variant == "bad":  # one step off wherever |g| > 64
            h.view(torch.int16)[gate.float().abs() > 64] += 1

    monkeypatch.setattr(fused_swiglu, "silu_mul_quant_into", flawed)
    monkeypatch.setattr(fused_swiglu, "silu_mul_quant_variants", lambda d: ("bad",) + real_variants(d))
    be = get_backend("cuda")
    g = torch.randn(4, 256, device=device).to(torch.bfloat16)
    u = torch.randn(4, 256, device=device).to(torch.bfloat16)
    spec = get_format("int4")
    for _ in range(2):
        h, _, _ = fusion.silu_mul_and_quantize(g, u, torch.nn.functional.silu, spec, role="mlp_act_input", layer=0,
                                               backend=None)
        assert torch.equal(h, torch.nn.functional.silu(g) * u)
    (choice,) = fusion._choices.values()
    assert choice.variants and choice.variants[0] != "bad" and "bad" in used
    assert be.silu_mul_quant_variants(g.device)[0] == "bad"  # offered first, and still dropped


def test_fusion_switch_values(monkeypatch):
    from agoq_core.laaq import fusion

    for raw, want in (("0", set()), ("1", {"gemm", "elementwise"}), ("elementwise", {"elementwise"}),
                      ("gemm, elementwise", {"gemm", "elementwise"})):
        monkeypatch.setenv("AGOQ_FUSION", raw)
        assert fusion.fusion_groups() == want
    monkeypatch.setenv("AGOQ_FUSION", "norms")
    for _ in range(2):  # parsed values are cached; a bad one is not, and raises on every call
        with pytest.raises(ValueError, match=r"unknown group\(s\) or op"):
            fusion.fusion_groups()
    for raw, want in (("0", set()), ("elementwise", {"elementwise"}), ("0", set())):  # the cache follows the variable
        monkeypatch.setenv("AGOQ_FUSION", raw)
        assert fusion.fusion_groups() == want


def test_default_is_elementwise_on_cuda_devices_only(monkeypatch):
    """AGOQ_FUSION unset: the elementwise ops run fused for CUDA tensors (each checked at run time), nothing
    on other devices, never the GEMM group; 0 turns everything off; single ops can be chosen."""
    from agoq_core.laaq import fusion

    ew = ("rmsnorm_quant", "silu_mul_quant", "silu_mul_backward")
    for raw in (None, ""):
        if raw is None:
            monkeypatch.delenv("AGOQ_FUSION", raising=False)
        else:
            monkeypatch.setenv("AGOQ_FUSION", raw)
        assert fusion.fusion_groups() is None
        assert all(fusion.fusion_enabled(op, "cuda") for op in ew)
        assert fusion.fusion_enabled("elementwise", torch.device("cuda", 0))
        assert not any(fusion.fusion_enabled(op, d) for op in ew for d in ("cpu", None, "meta"))
        assert not fusion.fusion_enabled("gemm", "cuda") and not fusion.fusion_enabled("gemm_quant_epilogue", "cuda")
    monkeypatch.setenv("AGOQ_FUSION", "0")
    assert not any(fusion.fusion_enabled(op, "cuda") for op in ew)
    monkeypatch.setenv("AGOQ_FUSION", "silu_mul_quant,silu_mul_backward")
    assert [fusion.fusion_enabled(op, "cpu") for op in ew] == [False, True, True]
    assert not fusion.fusion_enabled("elementwise", "cpu")  # a group is on only as a whole
    monkeypatch.setenv("AGOQ_FUSION", "elementwise")
    assert all(fusion.fusion_enabled(op, "cpu") for op in ew) and not fusion.fusion_enabled("gemm_dequant_prologue")
