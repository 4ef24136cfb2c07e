"""LAAQ's fusion seams dispatch to a backend's fused GEMMs (docs/fusion.md interface) and fall back to
the unfused composition, with the reason logged, when the backend declines a call.

The fake backend implements the fused ops with the unfused operations, so gradients must be bit-identical
either way; what is tested is the dispatch, the buffers handed over, and the accounting of what is kept.
"""
from __future__ import annotations

import collections
import logging

import pytest
import torch
import torch.nn.functional as F

from agoq_core.backend.reference import ReferenceBackend
from agoq_core.backend.types import Capabilities
from agoq_core.formats import reference as ref
from agoq_core.laaq import LAAQConfig, apply, fusion, measure_saved_bytes
from tests.laaq.conftest import batch, grads, tiny_model


class FusedReference(ReferenceBackend):
    name = "fused-reference"

    def __init__(self, decline: str | None = None) -> None:
        self.calls = collections.Counter()
        self.decline = decline

    def capabilities(self) -> Capabilities:
        c = super().capabilities()
        return Capabilities(formats=c.formats, device_types=c.device_types,
                            ops=c.ops | {"gemm_quant_epilogue", "gemm_dequant_prologue"},
                            collectives=c.collectives, input_dtypes=c.input_dtypes)

    def gemm_quant_epilogue_unsupported(self, x, weight, bias, spec):
        assert x.dim() == 2 and weight.shape[1] == x.shape[1]
        return self.decline

    def gemm_quant_epilogue_into(self, x, weight, bias, spec, out, codes, scales):
        self.calls["epilogue"] += 1
        out.copy_(F.linear(x, weight, bias))
        c, s = ref.quantize_blocks(out.reshape(-1), spec)
        codes.copy_(c)
        scales.copy_(s)

    def gemm_dequant_prologue_unsupported(self, grad, spec, k, mul=None):
        return self.decline

    def gemm_dequant_prologue_into(self, grad, codes, scales, spec, k, out, mul=None):
        self.calls["prologue+mul" if mul is not None else "prologue"] += 1
        x = ref.dequantize_blocks(codes, scales, spec, grad.shape[0] * k, grad.dtype).reshape(-1, k)
        if mul is not None:
            x = mul * x
        out.copy_(x.t().mm(grad).t())


@pytest.fixture
def fused(monkeypatch):
    monkeypatch.setenv("AGOQ_FUSION", "1")  # fusion is opt-in
    be = FusedReference()
    monkeypatch.setattr(fusion, "get_backend", lambda name=None: be)
    return be


def test_fused_path_is_used_and_changes_nothing(fused, monkeypatch):
    model = tiny_model("llama", dtype=torch.bfloat16, hidden=64, intermediate=176)
    ids = batch(b=2, s=32)
    rep = apply(model)  # (with SDPA the out-projection keeps a reference: no plain prologue call)
    monkeypatch.setenv("AGOQ_FUSION", "0")
    l0, g0 = grads(model, ids)
    assert not fused.calls
    monkeypatch.setenv("AGOQ_FUSION", "1")
    l1, g1 = grads(model, ids)
    # 2 layers: gate + up epilogues in forward, the down projection's gated dW in backward
    assert fused.calls == {"epilogue": 4, "prologue+mul": 2}
    assert torch.equal(l0, l1) and [n for n in g0 if not torch.equal(g0[n], g1[n])] == []
    kept = measure_saved_bytes(model, batch=1, seq=32)  # the epilogue's QuantizedTensors are accounted
    assert kept.per_layer[0]["act"] == 2 * LAAQConfig().plan(0)["mlp_act_input"].storage_bytes(32 * 176)
    rep.undo()


def test_plain_prologue_for_a_kept_linear_input(fused):
    lin = torch.nn.Linear(64, 32, dtype=torch.bfloat16)
    from agoq_core.laaq import convert_linear

    rep = convert_linear(lin)
    x = torch.randn(3, 40, 64, dtype=torch.bfloat16, requires_grad=True)
    (lin(x * 2) ** 2).sum().backward()
    assert fused.calls == {"prologue": 1}
    rep.undo()


def test_declined_calls_run_unfused_and_say_why(monkeypatch, caplog):
    monkeypatch.setenv("AGOQ_FUSION", "1")
    be = FusedReference(decline="inputs not bfloat16 / float16")
    monkeypatch.setattr(fusion, "get_backend", lambda name=None: be)
    model = tiny_model("llama", hidden=64, intermediate=176)  # fp32
    fusion._logged.clear()
    with caplog.at_level(logging.INFO, logger="agoq.laaq"):
        rep = apply(model)
        grads(model, batch(b=1, s=16))
        grads(model, batch(b=1, s=16))
        rep.undo()
    assert not be.calls
    msgs = [r.getMessage() for r in caplog.records if "not fused" in r.getMessage()]
    assert len(msgs) == 2 and all("inputs not bfloat16" in m for m in msgs)  # once per op, not per call


def test_fusion_is_opt_in(monkeypatch):
    """Fused GEMMs did not beat cuBLAS + codec on the H200 (docs/benchmarks.md §4): off unless asked."""
    monkeypatch.delenv("AGOQ_FUSION", raising=False)
    assert fusion.fusion_enabled() is False
    monkeypatch.setenv("AGOQ_FUSION", "1")
    assert fusion.fusion_enabled() is True


def test_weight_gradients_are_contiguous_like_plain_linear():
    """The unfused weight-gradient seam runs PyTorch's own Linear-backward GEMM (dYᵀ·X): every LAAQ weight
    gradient has its parameter's layout, so AccumulateGrad keeps it without a weight-sized copy (a transposed
    (Xᵀ·dY)ᵀ was copied, or added with strided reads, on every step), and the bits equal plain PyTorch's."""
    model = tiny_model("llama", dtype=torch.bfloat16, layers=1, hidden=64, intermediate=176)
    ids = batch(b=1, s=32)
    model.zero_grad(set_to_none=True)
    model(input_ids=ids, labels=ids).loss.backward()
    plain = {n: p.grad.clone() for n, p in model.named_parameters()}
    rep = apply(model, LAAQConfig(norm_input="native", mlp_act_input="native", attn_out_input="native"))
    model.zero_grad(set_to_none=True)
    with torch.profiler.profile(record_shapes=True) as prof:
        model(input_ids=ids, labels=ids).loss.backward()
    for n, p in model.named_parameters():
        assert p.grad.stride() == p.stride(), (n, p.grad.stride(), p.stride())
        assert torch.equal(p.grad, plain[n]), n
    weight_shapes = {str([list(p.shape), list(p.shape)]) for n, p in model.named_parameters() if p.dim() == 2}
    copies = [e for e in prof.key_averages(group_by_input_shape=True)
              if e.key == "aten::copy_" and str(e.input_shapes[:2]) in weight_shapes]
    assert not copies, [(e.key, e.input_shapes, e.count) for e in copies]
    rep.undo()
    # teeth: the transposed product is a non-contiguous gradient, which AccumulateGrad copies
    x, g = torch.randn(32, 64).to(torch.bfloat16), torch.randn(32, 176).to(torch.bfloat16)
    assert not x.t().mm(g).t().is_contiguous() and fusion.weight_grad(g, x).is_contiguous()
