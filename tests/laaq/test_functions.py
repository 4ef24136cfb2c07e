"""LAAQ's autograd functions on plain PyTorch modules, against oracles written from the definition:

gradients = PyTorch's own backward evaluated at the dequantized kept inputs, with every dropped
tensor (norm output, SwiGLU output) rebuilt from them. The oracles use the reference codec
directly (agoq_core.formats.reference) and float64 models, so the comparison is tight.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from agoq_core.errors import AgoqError
from agoq_core.formats import reference as ref
from agoq_core.formats.spec import get_format
from agoq_core.laaq import LAAQConfig, convert_linear, convert_norm, convert_swiglu, storage


def qdq(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """The reference round trip of the whole tensor (what LAAQ keeps, rebuilt)."""
    spec = get_format(fmt)
    c, s = ref.quantize_blocks(x.detach().reshape(-1), spec)
    return ref.dequantize_blocks(c, s, spec, x.numel(), x.dtype).reshape(x.shape)


class CountingRMSNorm(nn.Module):
    """An RMSNorm of one's own (not HF's), counting how often it runs."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(d, dtype=torch.float64))
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class SwiGLU(nn.Module):
    def __init__(self, d: int, f: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(d, f, bias=False, dtype=torch.float64)
        self.w3 = nn.Linear(d, f, bias=False, dtype=torch.float64)
        self.w2 = nn.Linear(f, d, bias=True, dtype=torch.float64)
        self.act = nn.SiLU()

    def forward(self, x):
        return self.w2(self.act(self.w1(x)) * self.w3(x))


D, FF, T = 40, 72, 19  # ragged: 2*19*40 and 2*19*72 are not multiples of 128


@pytest.fixture
def rng():
    torch.manual_seed(0)


def _dw(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return g.reshape(-1, g.shape[-1]).t() @ x.reshape(-1, x.shape[-1])


def test_norm_feeding_three_linears_matches_oracle_and_recomputes_once(rng):
    norm = CountingRMSNorm(D)
    lins = [nn.Linear(D, D + 8 * i, bias=(i == 0), dtype=torch.float64) for i in range(3)]
    x = torch.randn(2, T, D, dtype=torch.float64, requires_grad=True)
    cs = [torch.randn(2, T, D + 8 * i, dtype=torch.float64) for i in range(3)]
    reports = [convert_norm(norm)] + [convert_linear(l) for l in lins]
    y = norm(x)
    loss = sum((l(y) * c).sum() for l, c in zip(lins, cs))
    assert norm.calls == 1
    del y
    loss.backward()
    assert norm.calls == 2, "the norm output must be recomputed exactly once for its three GEMMs"
    # oracle
    xh = qdq(x, "nf4").requires_grad_(True)
    w = norm.weight.detach().clone().requires_grad_(True)
    yh = w * xh * torch.rsqrt(xh.pow(2).mean(-1, keepdim=True) + 1e-6)
    dy = sum(c @ l.weight for l, c in zip(lins, cs))
    dx, dw = torch.autograd.grad(yh, (xh, w), dy)
    torch.testing.assert_close(x.grad, dx, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(norm.weight.grad, dw, rtol=1e-12, atol=1e-12)
    for l, c in zip(lins, cs):
        torch.testing.assert_close(l.weight.grad, _dw(c, yh.detach()), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lins[0].bias.grad, cs[0].sum((0, 1)), rtol=1e-12, atol=1e-12)
    for r in reports:
        r.undo()


@pytest.mark.parametrize("chunk_elems", [1 << 25, 100, 72 * 16 + 5])  # one pass; chunks of 16 rows
def test_swiglu_standalone_keeps_gate_up_and_its_input(rng, monkeypatch, chunk_elems):
    from agoq_core.laaq import functions

    monkeypatch.setattr(functions, "BACKWARD_CHUNK_ELEMS", chunk_elems)
    mlp = SwiGLU(D, FF)
    cfg = LAAQConfig(mlp_act_input="int5", linear_input="int6")
    rep = convert_swiglu(mlp, cfg, gate="w1", up="w3", down="w2", act="act")
    x = torch.randn(2, T, D, dtype=torch.float64, requires_grad=True)
    c = torch.randn(2, T, D, dtype=torch.float64)
    out = mlp(x)
    with torch.no_grad():
        plain = mlp.w2(F.silu(mlp.w1(x)) * mlp.w3(x))
    assert torch.equal(out, plain), "LAAQ must not change the forward pass"
    (out * c).sum().backward()
    rep.undo()
    # oracle
    gh = qdq(F.linear(x, mlp.w1.weight), "int5").requires_grad_(True)
    uh = qdq(F.linear(x, mlp.w3.weight), "int5").requires_grad_(True)
    xh = qdq(x, "int6")
    hh = F.silu(gh) * uh
    dh = c @ mlp.w2.weight
    dg, du = torch.autograd.grad(hh, (gh, uh), dh)
    torch.testing.assert_close(mlp.w2.weight.grad, _dw(c, hh.detach()), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mlp.w2.bias.grad, c.sum((0, 1)), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mlp.w1.weight.grad, _dw(dg, xh), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mlp.w3.weight.grad, _dw(du, xh), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(x.grad, dg @ mlp.w1.weight + du @ mlp.w3.weight, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk_elems", [1 << 25, 72 * 5])  # one pass; 16-token chunks (nf4 block alignment)
def test_norm_then_swiglu_recomputes_the_mlp_input(rng, monkeypatch, chunk_elems):
    from agoq_core.laaq import functions

    monkeypatch.setattr(functions, "BACKWARD_CHUNK_ELEMS", chunk_elems)
    norm, mlp = CountingRMSNorm(D), SwiGLU(D, FF)
    reps = [convert_norm(norm), convert_swiglu(mlp, gate="w1", up="w3", down="w2", act="act")]
    x = torch.randn(3, T, D, dtype=torch.float64, requires_grad=True)
    c = torch.randn(3, T, D, dtype=torch.float64)
    stored = []
    fn = lambda role, layer, s: stored.append(role)  # noqa: E731
    storage.add_listener(fn)
    try:
        (mlp(norm(x)) * c).sum().backward()
    finally:
        storage.remove_listener(fn)
    assert sorted(stored) == ["mlp_act_input", "mlp_act_input", "norm_input"]  # no linear_input
    xh = qdq(x, "nf4").requires_grad_(True)
    w = norm.weight.detach().clone().requires_grad_(True)
    yh = w * xh * torch.rsqrt(xh.pow(2).mean(-1, keepdim=True) + 1e-6)
    gh = qdq(F.linear(norm.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), mlp.w1.weight), "nf4")
    uh = qdq(F.linear(norm.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), mlp.w3.weight), "nf4")
    gh.requires_grad_(True)
    uh.requires_grad_(True)
    dg, du = torch.autograd.grad(F.silu(gh) * uh, (gh, uh), c @ mlp.w2.weight)
    torch.testing.assert_close(mlp.w1.weight.grad, _dw(dg, yh.detach()), rtol=1e-12, atol=1e-12)
    dx, dw = torch.autograd.grad(yh, (xh, w), dg @ mlp.w1.weight + du @ mlp.w3.weight)
    torch.testing.assert_close(x.grad, dx, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(norm.weight.grad, dw, rtol=1e-12, atol=1e-12)
    for r in reps:
        r.undo()


def test_saved_input_linear_quantizes_or_references(rng):
    lin = nn.Linear(D, 24, dtype=torch.float64)
    rep = convert_linear(lin, LAAQConfig(attn_out_input="int8"), role="attn_out_input")
    a = torch.randn(2, T, D, dtype=torch.float64, requires_grad=True)
    c = torch.randn(2, T, 24, dtype=torch.float64)
    # (1) input from an op that does not keep its output: a quantized copy is kept
    x = a * 2
    (lin(x) * c).sum().backward()
    torch.testing.assert_close(lin.weight.grad, _dw(c, qdq(x, "int8")), rtol=1e-12, atol=1e-12)
    # (2) input = a view of exp()'s output, which exp keeps for its own backward: kept by reference
    lin.weight.grad = None
    heard = []
    fn = lambda role, layer, s: heard.append(s)  # noqa: E731
    storage.add_listener(fn)
    try:
        e = a.exp()
        x2 = e.transpose(0, 1).transpose(0, 1)
        (lin(x2) * c).sum().backward()
    finally:
        storage.remove_listener(fn)
    assert isinstance(heard[0], torch.Tensor) and heard[0].untyped_storage()._cdata == e.untyped_storage()._cdata
    torch.testing.assert_close(lin.weight.grad, _dw(c, e.detach()), rtol=1e-12, atol=1e-12)  # exact input
    rep.undo()


def test_frozen_weight_keeps_nothing_and_inference_runs_the_original(rng):
    lin = nn.Linear(D, 8, dtype=torch.float64)
    lin.weight.requires_grad_(False)
    rep = convert_linear(lin)
    heard = []
    fn = lambda *a: heard.append(a)  # noqa: E731
    storage.add_listener(fn)
    try:
        x = torch.randn(4, D, dtype=torch.float64, requires_grad=True)
        lin(x).sum().backward()
        assert heard == [] and x.grad is not None
        with torch.no_grad():
            lin(x)
        assert heard == []
    finally:
        storage.remove_listener(fn)
    rep.undo()


def test_retain_graph_keeps_what_a_second_backward_needs(rng):
    norm, lin, mlp = CountingRMSNorm(D), nn.Linear(D, D, dtype=torch.float64), SwiGLU(D, FF)
    reps = [convert_norm(norm), convert_linear(lin), convert_swiglu(mlp, gate="w1", up="w3", down="w2", act="act")]
    x = torch.randn(2, T, D, dtype=torch.float64, requires_grad=True)
    loss = (mlp(lin(norm(x)) * 2) ** 2).sum()
    loss.backward(retain_graph=True)
    first = [p.grad.clone() for p in (norm.weight, lin.weight, mlp.w1.weight)] + [x.grad.clone()]
    for p in (norm.weight, lin.weight, mlp.w1.weight, x):
        p.grad = None
    loss.backward()
    second = [p.grad for p in (norm.weight, lin.weight, mlp.w1.weight)] + [x.grad]
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    with pytest.raises(RuntimeError):
        loss.backward()  # graph freed now, as in plain PyTorch
    for r in reps:
        r.undo()


def test_single_module_errors():
    with pytest.raises(AgoqError, match="not nn.Linear"):
        convert_linear(nn.Conv1d(2, 2, 1))
    lin = nn.Linear(2, 2)
    rep = convert_linear(lin)
    with pytest.raises(AgoqError, match="already converted"):
        convert_linear(lin)
    rep.undo()
    with pytest.raises(ValueError, match="role"):
        convert_linear(lin, role="norm_input")
    with pytest.raises(AgoqError, match="w9 not found"):
        convert_swiglu(SwiGLU(4, 8), gate="w9", up="w3", down="w2", act="act")
    with pytest.raises(AgoqError, match="activation"):
        convert_swiglu(SwiGLU(4, 8), gate="w1", up="w3", down="w2", act="nope")

    class Fancy(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2
    with pytest.raises(AgoqError, match="overrides nn.Linear.forward"):
        convert_linear(Fancy(2, 2))
