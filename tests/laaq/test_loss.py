"""chunked_linear_cross_entropy against transformers' own causal-LM loss (values and gradients)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from agoq_core.laaq import apply, chunked_linear_cross_entropy, remove
from tests.laaq.conftest import batch, rel_err, tiny_model


def _hf_loss(hidden, weight, labels, bias=None):
    logits = F.linear(hidden, weight, bias).float()
    shifted = F.pad(labels, (0, 1), value=-100)[..., 1:]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), shifted.reshape(-1), ignore_index=-100)


# logits and softmax in fp32, as HF does, so float64 inputs are compared at fp32 precision
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-6), (torch.float32, 2e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_matches_the_plain_loss(dtype, tol, chunk):
    torch.manual_seed(0)
    h = torch.randn(3, 11, 24, dtype=dtype, requires_grad=True)
    w = (torch.randn(50, 24, dtype=dtype) * 0.2).requires_grad_(True)
    b = torch.randn(50, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, 50, (3, 11))
    labels[0, :4] = -100  # ignored tokens
    ref = _hf_loss(h, w, labels, b)
    gh, gw, gb = torch.autograd.grad(ref, (h, w, b))
    got = chunked_linear_cross_entropy(h, w, labels, bias=b, chunk=chunk)
    ch, cw, cb = torch.autograd.grad(got * 1.0, (h, w, b))
    assert got.dtype == torch.float32 or dtype == torch.float64
    assert abs(float(got.detach()) - float(ref.detach())) <= tol * max(1.0, abs(float(ref.detach())))
    for a, c in ((gh, ch), (gw, cw), (gb, cb)):
        assert a.dtype == c.dtype and rel_err(a, c) < tol * 10


def test_grad_scale_and_all_ignored():
    h = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(9, 8, dtype=torch.float64)
    labels = torch.full((2, 5), -100)
    loss = chunked_linear_cross_entropy(h, w, labels)
    loss.backward()
    assert float(loss.detach()) == 0.0 and torch.count_nonzero(h.grad) == 0
    labels = torch.randint(0, 9, (2, 5))
    h.grad = None
    (3 * chunked_linear_cross_entropy(h, w, labels, chunk=3)).backward()
    h2 = h.detach().clone().requires_grad_(True)
    (3 * _hf_loss(h2, w, labels)).backward()
    torch.testing.assert_close(h.grad, h2.grad, rtol=1e-5, atol=1e-7)  # fp32 softmax inside, as HF


def test_bad_input():
    h = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match="labels of shape"):
        chunked_linear_cross_entropy(h, torch.randn(9, 8), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="weight must be"):
        chunked_linear_cross_entropy(h, torch.randn(9, 7), torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="chunk"):
        chunked_linear_cross_entropy(h, torch.randn(9, 8), torch.zeros(2, 5, dtype=torch.long), chunk=0)


def test_with_laaq_it_recomputes_the_final_norm_instead_of_keeping_it():
    model = tiny_model("llama")
    ids = batch()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    g0 = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    apply(model)
    hidden = model.model(input_ids=ids).last_hidden_state
    from agoq_core.laaq.functions import find_source
    assert find_source(hidden)[0] is not None  # the final norm output is registered with its recipe
    loss = chunked_linear_cross_entropy(hidden, model.lm_head.weight, ids, chunk=16)
    assert abs(float(loss.detach()) - float(out.loss.detach())) < 1e-5
    assert loss.grad_fn is not None and len(loss.grad_fn.saved_tensors) == 4  # weight, bias, targets, count
    loss.backward()
    for n, p in model.named_parameters():
        assert rel_err(g0[n], p.grad) < 0.35, n
    remove(model)
