"""LAAQ with the microscaling formats: mxfp4 trains a tiny HF LLaMA (loss falls, gradients close to the
plain model's), nvfp4 keeps one tensor scale per saved tensor (no chunking), and the Triton plugin gives the
reference's gradients bit for bit (interpreter in CI)."""
from __future__ import annotations

import pytest
import torch

from agoq_core.backend import list_backends
from agoq_core.laaq import LAAQConfig, apply, storage
from agoq_core.laaq.numerics import gradient_errors
from tests.laaq.conftest import batch, grads, tiny_model


def test_laaq_mxfp4_trains_a_tiny_model():
    model = tiny_model("llama")
    ids = batch(b=2, s=37)
    errs = gradient_errors(model, LAAQConfig.uniform("mxfp4"), ids)
    for t in ("mlp_gate", "mlp_down", "attn_o", "norm"):  # quantized, and close (the int4 bound: 0.16)
        assert 0 < errs.by_type[t]["rel_l2"] < 0.2, (t, errs.by_type)
    rep = apply(model, LAAQConfig.uniform("mxfp4"))
    assert rep.converted
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(6):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    rep.undo()
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0] - 0.05, losses


def test_nvfp4_is_not_chunked(monkeypatch):
    monkeypatch.setattr(storage, "_CHUNK", 64)
    x = torch.randn(4, 96)
    x[3] *= 50.0  # the tensor's absmax lives in the last chunk
    from agoq_core.formats import reference as ref
    from agoq_core.formats.spec import get_format

    q = storage._quantize(x, get_format("nvfp4"), None)
    want_c, want_s = ref.quantize_blocks(x, get_format("nvfp4"))
    assert torch.equal(q.codes, want_c) and torch.equal(q.scales, want_s)


OTHERS = [r["name"] for r in list_backends()["backends"] if r["name"] != "reference" and r["available"]]


@pytest.mark.skipif(not OTHERS, reason="no backend other than reference is available here")
@pytest.mark.parametrize("backend", OTHERS or ["none"])
def test_laaq_mx_bit_identical_across_backends(backend):
    model = tiny_model("llama", dtype=torch.bfloat16, hidden=64, intermediate=176)
    ids = batch(b=1, s=32)
    out = {}
    for be in ("reference", backend):
        rep = apply(model, LAAQConfig(backend=be, norm_input="mxfp4", mlp_act_input="nvfp4",
                                      attn_out_input="mxfp8"))
        out[be] = grads(model, ids)
        rep.undo()
    assert torch.equal(out["reference"][0], out[backend][0])
    g0, g1 = out["reference"][1], out[backend][1]
    assert [n for n in g0 if not torch.equal(g0[n], g1[n])] == []
