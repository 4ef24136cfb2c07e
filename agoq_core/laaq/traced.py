"""LAAQ's training paths under torch.compile: the same storage and recomputation, traceable by Dynamo.

Eager LAAQ (agoq_core.laaq.functions) shares one norm recomputation between Q, K and V through a
Python object held until backward and calls the backend's codecs directly; Dynamo can trace neither.
Here, while ``torch.compiler.is_compiling()``:

* the codecs are the opaque custom ops of agoq_core.laaq.ops (fake implementations give shapes only);
* a converted norm keeps its input (4-bit codes + scales, or the tensor itself for "native") as plain
  tensors and hands them to the GEMMs that read its output through its decoder layer's module state
  (``_Group.traced``: set by the norm, read and removed by its consumers within the same forward, so
  nothing outlives the forward); each consumer recomputes the norm output itself in backward
  (per-consumer recomputation: Q, K and V each rebuild it; AOTAutograd's common-subexpression pass
  may merge them);
* derivatives of the model's own norm and activation come from ``torch.func.vjp`` of the module's
  forward (``_reparametrize_module`` over the saved parameters), i.e. PyTorch's own backward formulas,
  as eager LAAQ's ``torch.autograd.grad`` gives.

Same kept bits as eager (same codec call on the same tensor); gradients equal eager LAAQ's up to the
summation order the compiler picks (tests/laaq/test_compile.py). Not traced (the eager path runs, one
graph break per module): PEFT LoRA wrappers, MoE experts (agoq_core.laaq.moe), the naive attention-core ablation, modules
converted one by one without a decoder-layer group, and the fused GEMM seams (AGOQ_FUSION=1); the
SwiGLU family-row check runs at the first eager training forward only (under compile rows are checked
by shape and by the norm-output identity).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch.nn.utils.stateless import _reparametrize_module

from agoq_core.errors import AgoqError
from agoq_core.formats.spec import FormatSpec
from agoq_core.laaq import fusion, ops
from agoq_core.laaq.linears import amp_context, amp_state

__all__ = ["norm", "linear", "swiglu"]


# ---- kept tensors: (codes, scales) in a spec, or (x,) as is -------------------------------------------
def _keep(x: torch.Tensor, spec: FormatSpec | None, backend: str | None, role: str) -> tuple[torch.Tensor, ...]:
    """No layer index reaches the graph: an int argument of a custom op is a constant of the traced graph
    and Dynamo guards on it, so every LAAQ layer compiled on its own would be a new graph -- past
    ``torch._dynamo.config.recompile_limit`` (8) every later layer, LAAQ or not, silently ran eager
    (2026-12-01, H200: 24 of 32 layers of a compiled policy, 1.8 GB more kept per bf16 layer, out of memory).
    The memory meters attribute kept tensors to layers by module scope (laaq.memory), not by this index."""
    x = x.detach()
    if spec is None:
        return (x,)
    return ops.quantize(x, spec, backend, role, None)


def _load(kept: Sequence[torch.Tensor], spec: FormatSpec | None, backend: str | None, shape,
          dtype: torch.dtype) -> torch.Tensor:
    if spec is None:
        return kept[0]
    return ops.dequantize(kept[0], kept[1], spec, backend, shape, dtype)


def _nkept(spec: FormatSpec | None) -> int:
    return 1 if spec is None else 2


class _Recipe:
    """How to rebuild a norm output: the module, its original forward and parameter names."""

    def __init__(self, mod: torch.nn.Module, orig: Callable, spec: FormatSpec | None, backend: str | None,
                 shape, dtype: torch.dtype, amp: tuple) -> None:
        self.mod, self.orig, self.spec, self.backend = mod, orig, spec, backend
        self.names = [n for n, _ in mod.named_parameters()]
        self.shape, self.dtype, self.amp = shape, dtype, amp

    def fn(self, x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        with _reparametrize_module(self.mod, dict(zip(self.names, params))):
            return self.orig(x)

    def output(self, kept: Sequence[torch.Tensor], params: Sequence[torch.Tensor]) -> torch.Tensor:
        with amp_context(self.amp):
            return self.fn(_load(kept, self.spec, self.backend, self.shape, self.dtype), *params)


def _bias_grad(g: torch.Tensor) -> torch.Tensor:
    return g.reshape(-1, g.shape[-1]).sum(0)


# ---- norm ---------------------------------------------------------------------------------------------
class _NormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, recipe: _Recipe, nk: int, *rest):
        params = rest[nk:]
        y = recipe.orig(x)
        ctx.save_for_backward(*rest)
        ctx.recipe, ctx.nk = recipe, nk
        return y

    @staticmethod
    def backward(ctx, grad_y):
        saved = ctx.saved_tensors
        kept, params = saved[:ctx.nk], saved[ctx.nk:]
        r: _Recipe = ctx.recipe
        with amp_context(r.amp):
            x = _load(kept, r.spec, r.backend, r.shape, r.dtype)
            _, vjp = torch.func.vjp(r.fn, x, *params)
            grads = vjp(grad_y)
        return (grads[0], None, None) + (None,) * ctx.nk + tuple(grads[1:])


def norm(mod: torch.nn.Module, st: Any, x: torch.Tensor) -> torch.Tensor:
    spec = st.fmts["norm_input"]
    params = tuple(mod.parameters())
    recipe = _Recipe(mod, st.orig, spec, st.backend, x.shape, x.dtype, amp_state(x.device.type))
    kept = _keep(x, spec, st.backend, "norm_input")
    y = _NormFn.apply(x, recipe, len(kept), *kept, *params)
    group = st.group
    n = group.expects.get(st.path, 0)
    if n:
        group.traced[st.path] = (y, kept, params, recipe)
        group.left[st.path] = n
    return y


def _reads(x: torch.Tensor, y: torch.Tensor) -> bool:
    """``x`` is ``y``, or a view of all of it with its layout (HF's ``hidden_states[:, slice(-0, None), :]``
    before the LM head). Dynamo cannot trace ``storage_offset``; a full-shape same-stride view has 0."""
    return x is y or (x._base is y and x.shape == y.shape and x.stride() == y.stride())


def _source(st: Any, x: torch.Tensor) -> tuple | None:
    """The kept input of the norm whose output ``x`` is (the group's record, consumed once per reader);
    None when ``x`` is a partial view of it (then the reader keeps its own input)."""
    group = st.group
    e = group.traced.get(st.expect)
    partial = e is not None and not _reads(x, e[0]) and x._base is e[0]
    if e is None or not (partial or _reads(x, e[0])):
        row = group.row.name if group.row is not None else "?"
        raise AgoqError(
            f"LAAQ family row {row!r}: {st.path} should read the output of {group.prefix}{st.expect}, but its "
            "input comes from elsewhere (another norm, or the norm output was changed on the way). The row maps "
            "the wrong module; fix input_norm/post_norm or pass families=[...] with the right LayerFamily")
    left = group.left[st.expect] - 1
    if left <= 0:  # the last reader: the norm output and its kept input leave the module state
        del group.traced[st.expect]
        del group.left[st.expect]
    else:
        group.left[st.expect] = left
    return None if partial else e


# ---- the three GEMMs of a linear: bf16 (LAAQ's seams) or float8 (agoq_core.laaq.float8, torchao's recipe) ----
def _fwd(f8, x, weight, bias):
    return F.linear(x, weight, bias) if f8 is None else f8.linear(x, weight, bias)


def _dx(f8, grad_out, weight):
    return fusion.input_grad(grad_out, weight) if f8 is None else f8.input_grad(grad_out, weight)


def _dw(f8, grad_out, x):
    return fusion.weight_grad(grad_out, x) if f8 is None else f8.weight_grad(grad_out, x)


# ---- linears ------------------------------------------------------------------------------------------
class _RecomputedLinearFn(torch.autograd.Function):
    """linear(y), y a converted norm's output, rebuilt in backward from the norm's kept input."""

    @staticmethod
    def forward(ctx, y, recipe: _Recipe, nk: int, f8, weight, bias, *rest):
        ctx.save_for_backward(weight, *rest)
        ctx.recipe, ctx.nk, ctx.has_bias, ctx.f8 = recipe, nk, bias is not None, f8
        ctx.amp, ctx.y_dtype = amp_state(y.device.type), y.dtype
        return _fwd(f8, y, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        weight, *rest = ctx.saved_tensors
        kept, params = rest[:ctx.nk], rest[ctx.nk:]
        need = ctx.needs_input_grad
        dy = dw = db = None
        with amp_context(ctx.amp):
            if need[0]:
                dy = _dx(ctx.f8, grad_out, weight).to(ctx.y_dtype)
            if need[4]:
                y = ctx.recipe.output(kept, params)
                dw = _dw(ctx.f8, grad_out, y)
            if ctx.has_bias and need[5]:
                db = _bias_grad(grad_out)
        return (dy, None, None, None, dw, db) + (None,) * len(rest)


class _SavedLinearFn(torch.autograd.Function):
    """linear(x) keeping x (quantized in spec, or by reference)."""

    @staticmethod
    def forward(ctx, x, spec, backend, nk: int, f8, weight, bias, *kept):
        ctx.save_for_backward(weight, *kept)
        ctx.spec, ctx.backend, ctx.has_bias, ctx.f8 = spec, backend, bias is not None, f8
        ctx.shape, ctx.x_dtype, ctx.amp = x.shape, x.dtype, amp_state(x.device.type)
        return _fwd(f8, x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        weight, *kept = ctx.saved_tensors
        need = ctx.needs_input_grad
        dx = dw = db = None
        with amp_context(ctx.amp):
            if need[0]:
                dx = _dx(ctx.f8, grad_out, weight).to(ctx.x_dtype)
            if need[5]:
                dw = _dw(ctx.f8, grad_out, _load(kept, ctx.spec, ctx.backend, ctx.shape, ctx.x_dtype))
            if ctx.has_bias and need[6]:
                db = _bias_grad(grad_out)
        return (dx, None, None, None, None, dw, db) + (None,) * len(kept)


def linear(mod: torch.nn.Module, st: Any, x: torch.Tensor, alias: bool) -> torch.Tensor:
    w, b = mod.weight, mod.bias
    e = _source(st, x) if st.expect else None
    if e is not None:
        _, kept, params, recipe = e
        return _RecomputedLinearFn.apply(x, recipe, len(kept), st.float8, w, b, *kept, *params)
    # a partial view of a norm output (logits_to_keep > 0) keeps its own input, in linear_input's format
    spec = None if alias else st.fmts[st.role]
    kept = _keep(x, spec, st.backend, st.role) if w.requires_grad else ()
    return _SavedLinearFn.apply(x, spec, st.backend, len(kept), st.float8, w, b, *kept)


# ---- SwiGLU -------------------------------------------------------------------------------------------
class _SwiGLUFn(torch.autograd.Function):
    """down(act(gate(x)) * up(x)) keeping gate(x) and up(x) (role mlp_act_input); ``x`` rebuilt from a
    norm's kept input (``recipe``) or kept itself (``x_spec``). tensors: gate w/b, up w/b (None: fused
    gate_up), down w/b, then the kept tensors of x, then the norm's parameters."""

    @staticmethod
    def forward(ctx, x, act, recipe, x_spec, act_spec, backend, nkx: int, f8, *tensors):
        wg, bg, wu, bu, wd, bd = tensors[:6]
        rest = tensors[6:]
        fg, fu, fd = f8 or (None, None, None)
        if wu is None:  # one gate_up projection, as the model computes it, then its two halves
            g, u = F.linear(x, wg, bg).chunk(2, dim=-1)
        else:
            g, u = _fwd(fg, x, wg, bg), _fwd(fu, x, wu, bu)
        kg = _keep(g, act_spec, backend, "mlp_act_input")
        ku = _keep(u, act_spec, backend, "mlp_act_input")
        out = _fwd(fd, act(g) * u, wd, bd)
        ctx.save_for_backward(wg, wu, wd, *kg, *ku, *rest)
        ctx.act, ctx.recipe, ctx.x_spec, ctx.act_spec, ctx.backend = act, recipe, x_spec, act_spec, backend
        ctx.nkx, ctx.nka, ctx.f8 = nkx, len(kg), (fg, fu, fd)
        ctx.biases = (bg is not None, bu is not None, bd is not None)
        ctx.g_shape, ctx.a_dtype = g.shape, g.dtype
        ctx.x_shape, ctx.x_dtype, ctx.amp = x.shape, x.dtype, amp_state(x.device.type)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        wg, wu, wd, *rest = ctx.saved_tensors
        na, nkx = ctx.nka, ctx.nkx
        kg, ku, kx, params = rest[:na], rest[na:2 * na], rest[2 * na:2 * na + nkx], rest[2 * na + nkx:]
        need = ctx.needs_input_grad
        nw = need[8:14]  # the six weight/bias slots after x, act, recipe, x_spec, act_spec, backend, nkx, f8
        fused = wu is None
        fg, fu, fd = ctx.f8
        with amp_context(ctx.amp):
            go = grad_out.reshape(-1, grad_out.shape[-1])
            g = _load(kg, ctx.act_spec, ctx.backend, ctx.g_shape, ctx.a_dtype).reshape(go.shape[0], -1)
            u = _load(ku, ctx.act_spec, ctx.backend, ctx.g_shape, ctx.a_dtype).reshape(go.shape[0], -1)
            a, act_vjp = torch.func.vjp(ctx.act, g)
            dwd = _dw(fd, go, a * u) if nw[4] else None
            dbd = _bias_grad(go) if ctx.biases[2] and nw[5] else None
            dh = _dx(fd, go, wd)
            du = dh * a
            (dg,) = act_vjp(dh * u)
            douts = [torch.cat([dg, du], dim=-1)] if fused else [dg, du]
            ws = [wg] if fused else [wg, wu]
            fs = [None] if fused else [fg, fu]
            xc = None
            if nw[0] or (not fused and nw[2]):
                if ctx.recipe is not None:
                    xc = ctx.recipe.output(kx, params)
                else:
                    xc = _load(kx, ctx.x_spec, ctx.backend, ctx.x_shape, ctx.x_dtype)
                xc = xc.reshape(go.shape[0], -1)
            dW, dB = [], []
            for j, dy in enumerate(douts):
                dW.append(_dw(fs[j], dy, xc) if nw[2 * j] else None)
                dB.append(_bias_grad(dy) if ctx.biases[j] and nw[2 * j + 1] else None)
            dx = None
            if need[0]:
                for dy, w, f in zip(douts, ws, fs):
                    term = _dx(f, dy, w).to(ctx.x_dtype)
                    dx = term if dx is None else dx + term
                dx = dx.view(ctx.x_shape)
        if fused:
            dW.append(None)
            dB.append(None)
        grads = (dW[0], dB[0], dW[1], dB[1], dwd, dbd)
        return (dx,) + (None,) * 7 + grads + (None,) * len(rest)


def swiglu(mod: torch.nn.Module, st: Any, x: torch.Tensor, mods: Sequence[torch.nn.Module], act: Callable) -> torch.Tensor:
    if len(mods) == 2:
        (gm, dm), um = mods, None
    else:
        gm, um, dm = mods
    lin = [gm.weight, gm.bias, um.weight if um is not None else None, um.bias if um is not None else None,
           dm.weight, dm.bias]
    x_spec = st.fmts["linear_input"]
    e = _source(st, x) if st.expect else None
    if e is not None:
        _, kept, params, recipe = e
        extra = (*kept, *params)
        nkx = len(kept)
    else:
        recipe, params = None, ()
        need_x = gm.weight.requires_grad or (um is not None and um.weight.requires_grad)
        kept = _keep(x, x_spec, st.backend, "linear_input") if need_x else ()
        extra, nkx = kept, len(kept)
    return _SwiGLUFn.apply(x, act, recipe, x_spec, st.fmts["mlp_act_input"], st.backend, nkx, st.float8, *lin, *extra)
