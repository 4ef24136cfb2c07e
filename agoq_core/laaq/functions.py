"""LAAQ's autograd functions: store inputs (4-bit by default), recompute everything else in backward.

Written once, device-neutral; codecs come from the selected backend (agoq_core.laaq.storage), GEMMs
next to a codec go through agoq_core.laaq.fusion so fused kernels can replace them later.

* :class:`NormFunction` — a norm that keeps only its (quantized) input. Its output carries a
  :class:`NormSource` (attribute ``_agoq_src``) that tells the GEMMs reading it how to rebuild it.
* :class:`RecomputedInputLinear` — a Linear whose input is a norm output: it keeps nothing of its
  input; its weight gradient asks the NormSource, which recomputes the norm output once for all the
  GEMMs that read it (Q, K and V share one recomputation) and frees it after the norm's backward.
* :class:`SavedInputLinear` — a Linear that keeps its own input (the attention out-projection).
* :class:`SwiGLUFunction` — gate/up GEMMs, SiLU&Mul and the down GEMM in one function that keeps
  only the (quantized) gate/up outputs and recomputes the SwiGLU output in backward.

Nothing dropped is held anywhere: ctx holds the Stored inputs, the weights and a NormSource (which
holds a Stored input and, only during backward, the recomputation).
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from agoq_core.formats.spec import FormatSpec
from agoq_core.laaq import fusion, storage
from agoq_core.laaq.storage import Stored

__all__ = [
    "NormSource",
    "NormFunction",
    "RecomputedInputLinear",
    "SavedInputLinear",
    "SwiGLUFunction",
    "find_source",
]

SRC_ATTR = "_agoq_src"

# Nodes that only re-view their input's storage (walked to find the op that produced a tensor).
_VIEW_NODES = frozenset({"ViewBackward0", "TransposeBackward0", "PermuteBackward0", "UnsafeViewBackward0",
                         "ReshapeAliasBackward0", "AsStridedBackward0", "SliceBackward0", "AliasBackward0",
                         "SqueezeBackward0", "SqueezeBackward1", "UnsqueezeBackward0"})


def graph_kept() -> bool:
    """True while running a backward with retain_graph=True (then nothing may be freed early)."""
    fn = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    return True if fn is None else bool(fn())


def kept_by_producer(x: torch.Tensor, max_hops: int = 6) -> bool:
    """Whether the op that produced ``x`` (looking through views) saved its own output, sharing x's
    storage. Then keeping ``x`` by reference costs no byte: HF's SDPA path hands the out-projection
    a view of the attention output, which the flash/efficient/cuDNN/CPU-flash kernels all keep.
    Only ``_saved_output``/``_saved_result`` are read (reading a saved tensor runs unpack hooks)."""
    fn = x.grad_fn
    key = x.untyped_storage()._cdata
    for _ in range(max_hops):
        if fn is None:
            return False
        if type(fn).__name__ not in _VIEW_NODES:
            for name in ("_saved_output", "_saved_result"):
                t = getattr(fn, name, None)
                if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata == key:
                    return True
            return False
        fn = fn.next_functions[0][0] if fn.next_functions else None
    return False


class NormSource:
    """A converted norm's kept input and the recipe to rebuild its output (and its graph) in backward.

    Consumers register in forward. In backward the first one that needs the output triggers one
    recomputation, under autograd, from the dequantized input; the others reuse it; the norm's own
    backward differentiates that same graph and then frees it.
    """

    __slots__ = ("norm_fn", "spec", "layer", "backend", "stored", "out_meta", "consumers", "pending",
                 "norm_in_graph", "_x", "_y", "recomputations")

    def __init__(self, norm_fn: Callable[[torch.Tensor], torch.Tensor], spec: FormatSpec | None,
                 layer: int | None, backend: str | None) -> None:
        self.norm_fn = norm_fn
        self.spec = spec
        self.layer = layer
        self.backend = backend
        self.stored: Stored | None = None
        self.out_meta: tuple[torch.Size, tuple[int, ...], int] | None = None
        self.consumers = 0            # GEMMs that read the output (registered in forward)
        self.pending = 0              # of those, not yet done in this backward pass
        self.norm_in_graph = False    # the norm's own backward will run (and free the cache)
        self._x: torch.Tensor | None = None
        self._y: torch.Tensor | None = None
        self.recomputations = 0       # how many times the output was rebuilt (tests: once per pass)

    def keep_input(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.stored = storage.store(x, self.spec, role="norm_input", layer=self.layer, backend=self.backend)
        self.out_meta = (y.shape, y.stride(), y.storage_offset())

    def add_consumer(self) -> None:
        self.consumers += 1
        self.pending += 1

    def _recompute(self, need_graph: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if self._y is None:
            if self.stored is None:
                raise RuntimeError("LAAQ: a norm output is needed in backward but its input was not kept "
                                   "(the forward ran with autograd disabled)")
            x = storage.load(self.stored, None, self.backend).detach()
            with torch.enable_grad():
                x.requires_grad_(need_graph)
                y = self.norm_fn(x)
            shape, stride, offset = self.out_meta
            if y.shape != shape or y.stride() != stride or y.storage_offset() != offset:
                raise RuntimeError(f"LAAQ: the recomputed norm output has layout {tuple(y.shape)}/{y.stride()} "
                                   f"but forward produced {tuple(shape)}/{stride}; the norm is not deterministic "
                                   "in layout and cannot be converted")
            self._x, self._y = x, y
            self.recomputations += 1
        return self._x, self._y

    def output(self, like: torch.Tensor | None = None) -> torch.Tensor:
        """The recomputed norm output (detached); ``like`` = the consumer's input if it was a view."""
        _, y = self._recompute(self.norm_in_graph)
        y = y.detach()
        if like is not None and (like.shape != y.shape or like.stride() != y.stride()
                                 or like.storage_offset() != y.storage_offset()):
            y = y.as_strided(like.shape, like.stride(), like.storage_offset())
        return y

    def consumer_done(self) -> None:
        self.pending -= 1
        if self.pending <= 0 and not self.norm_in_graph:
            self.release()

    def release(self) -> None:
        """Drop the recomputation; and the kept input too, unless the graph is retained."""
        self._x = self._y = None
        self.pending = self.consumers
        if not graph_kept():
            self.stored = None


def find_source(t: torch.Tensor) -> tuple[NormSource | None, tuple | None]:
    """The NormSource that produced ``t`` (or the tensor ``t`` is a view of), and the view's layout."""
    src = getattr(t, SRC_ATTR, None)
    if src is not None:
        return src, None
    base = t._base
    if base is not None:
        src = getattr(base, SRC_ATTR, None)
        if src is not None:
            return src, (t.shape, t.stride(), t.storage_offset())
    return None, None


class _Like:
    """Layout of a consumer's input when it is a view of the norm output (for as_strided)."""

    __slots__ = ("shape", "_stride", "_offset")

    def __init__(self, meta: tuple) -> None:
        self.shape, self._stride, self._offset = meta

    def stride(self):
        return self._stride

    def storage_offset(self):
        return self._offset


def _bias_grad(grad_out: torch.Tensor) -> torch.Tensor:
    return grad_out.reshape(-1, grad_out.shape[-1]).sum(0)


class NormFunction(torch.autograd.Function):
    """y = norm_fn(x), keeping only ``x`` (in ``src.spec``); params are the norm's parameters."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, src: NormSource, *params: torch.Tensor) -> torch.Tensor:
        y = src.norm_fn(x)
        src.keep_input(x, y)
        ctx.src = src
        ctx.n_params = len(params)
        ctx.params = params  # parameters, not activations: needed as autograd.grad inputs
        return y

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        src: NormSource = ctx.src
        x, y = src._recompute(True)
        wanted: list[torch.Tensor] = []
        if ctx.needs_input_grad[0]:
            wanted.append(x)
        pmask = ctx.needs_input_grad[2:]
        wanted += [p for p, need in zip(ctx.params, pmask) if need]
        grads = list(torch.autograd.grad(y, wanted, grad_y)) if wanted else []
        del x, y
        src.release()
        dx = grads.pop(0) if ctx.needs_input_grad[0] else None
        dparams = [grads.pop(0) if need else None for need in pmask]
        return (dx, None, *dparams)


def norm_apply(x: torch.Tensor, src: NormSource, params: Sequence[torch.Tensor]) -> torch.Tensor:
    y = NormFunction.apply(x, src, *params)
    src.norm_in_graph = y.requires_grad
    setattr(y, SRC_ATTR, src)
    return y


class RecomputedInputLinear(torch.autograd.Function):
    """out = F.linear(y, W, b) where y (or a view of it) is a converted norm's output."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, src: NormSource,
                view: tuple | None) -> torch.Tensor:
        out = F.linear(y, weight, bias)
        src.add_consumer()
        ctx.src, ctx.view = src, view
        ctx.has_bias = bias is not None
        ctx.save_for_backward(weight)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (weight,) = ctx.saved_tensors
        src: NormSource = ctx.src
        dy = fusion.input_grad(grad_out, weight) if ctx.needs_input_grad[0] else None
        dw = None
        if ctx.needs_input_grad[1]:
            y = src.output(_Like(ctx.view) if ctx.view is not None else None)
            dw = fusion.weight_grad(grad_out, y)
            del y
        db = _bias_grad(grad_out) if ctx.has_bias and ctx.needs_input_grad[2] else None
        src.consumer_done()
        return dy, dw, db, None, None


class SavedInputLinear(torch.autograd.Function):
    """out = F.linear(x, W, b), keeping ``x`` in ``spec`` (only if W needs a gradient), or by
    reference when ``alias_ok`` and the op that produced ``x`` keeps it anyway."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                spec: FormatSpec | None, role: str, layer: int | None, backend: str | None,
                alias: bool) -> torch.Tensor:
        out = F.linear(x, weight, bias)
        ctx.stored = (storage.store(x, None if alias else spec, role=role, layer=layer, backend=backend)
                      if ctx.needs_input_grad[1] else None)
        ctx.backend = backend
        ctx.has_bias = bias is not None
        ctx.save_for_backward(weight)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (weight,) = ctx.saved_tensors
        dx = fusion.input_grad(grad_out, weight) if ctx.needs_input_grad[0] else None
        dw = fusion.weight_grad(grad_out, ctx.stored, backend=ctx.backend) if ctx.needs_input_grad[1] else None
        db = _bias_grad(grad_out) if ctx.has_bias and ctx.needs_input_grad[2] else None
        if not graph_kept():
            ctx.stored = None
        return dx, dw, db, None, None, None, None, None


#: Token-chunk size of SwiGLU's backward, in elements of the intermediate activation. In one piece a
#: LLaMA-2-7B backward (11,008 intermediate) holds ~10 GiB of temporaries at 64K tokens (dequantized
#: gate/up, recomputed SwiGLU output, its graph, dgate/dup: ~8 x tokens x 11,008 x 2 bytes). Chunks of
#: 2**28 elements (24K tokens) hold <= 4 GiB; up to that size the backward is one pass, bit-identical
#: to unchunked and as fast: on the H200 at 16K tokens, chunks of 2**25 (six 3K-token chunks, each
#: weight gradient summed in fp32) cost about 10% of LAAQ's step time.
BACKWARD_CHUNK_ELEMS = 1 << 28


def _token_chunk(tokens: int, inter: int, kept: Sequence[Stored]) -> int:
    rows = max(1, BACKWARD_CHUNK_ELEMS // max(1, inter))
    if rows >= tokens:
        return tokens
    align = 1
    for s in kept:
        if s is not None:
            a = storage.row_alignment(s, s.shape[-1])
            align = align * a // math.gcd(align, a)
    return min(tokens, max(align, rows // align * align))


class SwiGLUFunction(torch.autograd.Function):
    """down(act(gate(x)) * up(x)) keeping only gate(x) and up(x) (role mlp_act_input).

    ``x`` is rebuilt from ``src`` (a converted norm) when given, else kept in ``x_spec``
    (role linear_input). ``act`` is the model's own activation module, re-run under autograd in
    backward so its derivative is exactly PyTorch's. Backward runs over chunks of tokens
    (BACKWARD_CHUNK_ELEMS); weight gradients of several chunks are summed in fp32.
    """

    @staticmethod
    def forward(ctx, x, w_gate, w_up, w_down, b_gate, b_up, b_down, src: NormSource | None, view,
                act: Callable, act_spec: FormatSpec | None, x_spec: FormatSpec | None, layer: int | None,
                backend: str | None):
        g, ctx.g = fusion.linear_and_quantize(x, w_gate, b_gate, act_spec, role="mlp_act_input", layer=layer,
                                              backend=backend)
        u, ctx.u = fusion.linear_and_quantize(x, w_up, b_up, act_spec, role="mlp_act_input", layer=layer,
                                              backend=backend)
        h = act(g)
        del g
        # in place when act made a new tensor: same product as `act(g) * u`, one 16-bit buffer less
        h = h.mul_(u) if (h.data_ptr() != u.data_ptr() and not h._is_view()) else h * u
        del u
        out = F.linear(h, w_down, b_down)
        del h
        if src is not None:
            src.add_consumer()
            ctx.x = None
        else:
            needs_x = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
            ctx.x = storage.store(x, x_spec, role="linear_input", layer=layer, backend=backend) if needs_x else None
        ctx.src, ctx.view, ctx.act, ctx.backend = src, view, act, backend
        ctx.biases = (b_gate is not None, b_up is not None, b_down is not None)
        ctx.x_shape = x.shape
        ctx.save_for_backward(w_gate, w_up, w_down)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        w_gate, w_up, w_down = ctx.saved_tensors
        need = ctx.needs_input_grad
        dtype = grad_out.dtype
        hid, inter = w_gate.shape[1], w_gate.shape[0]
        go2 = grad_out.reshape(-1, grad_out.shape[-1])
        tokens = go2.shape[0]
        chunk = _token_chunk(tokens, inter, (ctx.g, ctx.u, ctx.x))
        need_w = need[1] or need[2]
        x2 = None
        if need_w and ctx.src is not None:
            x2 = ctx.src.output(_Like(ctx.view) if ctx.view is not None else None).reshape(-1, hid)
        acc_t = torch.promote_types(dtype, torch.float32)
        acc = {k: None for k in ("wg", "wu", "wd", "bg", "bu", "bd")}
        dx2 = torch.empty(tokens, hid, dtype=dtype, device=grad_out.device) if need[0] else None

        def add(key: str, val: torch.Tensor) -> None:
            acc[key] = val if chunk == tokens else (val.to(acc_t) if acc[key] is None else acc[key].add_(val))

        for t0 in range(0, tokens, chunk):
            t1 = min(tokens, t0 + chunk)
            go = go2[t0:t1]
            g = storage.load_rows(ctx.g, t0, t1, None, ctx.backend).detach()
            u = storage.load_rows(ctx.u, t0, t1, None, ctx.backend).detach()
            with torch.enable_grad():
                g.requires_grad_(True)
                a = ctx.act(g)
            a_d = a.detach()
            # The SwiGLU output h = act(g) * u is only the down projection's GEMM operand: the gated
            # weight-gradient seam forms it (or a fused prologue never materialises it).
            if need[3]:
                add("wd", fusion.weight_grad_gated(go, storage.rows(ctx.u, t0, t1), a_d, dense=u,
                                                   backend=ctx.backend))
            if ctx.biases[2] and need[6]:
                add("bd", _bias_grad(go))
            dh = fusion.input_grad(go, w_down)
            du = dh * a_d                                              # = torch's mul backward, grad * self
            (dg,) = torch.autograd.grad(a, (g,), dh * u)               # act's own backward of grad * other
            del a, a_d, g, u, dh
            if need_w:
                # a kept x goes to the weight-gradient seam as is (prologue fusion, else decoded there)
                xc = x2[t0:t1] if x2 is not None else storage.rows(ctx.x, t0, t1)
                if need[1]:
                    add("wg", fusion.weight_grad(dg, xc))
                if need[2]:
                    add("wu", fusion.weight_grad(du, xc))
                del xc
            if ctx.biases[0] and need[4]:
                add("bg", _bias_grad(dg))
            if ctx.biases[1] and need[5]:
                add("bu", _bias_grad(du))
            if need[0]:
                dx2[t0:t1] = fusion.input_grad(dg, w_gate) + fusion.input_grad(du, w_up)
            del dg, du
        del x2
        if ctx.src is not None:
            ctx.src.consumer_done()
        if not graph_kept():
            ctx.g = ctx.u = ctx.x = None
        wdt = w_gate.dtype
        cast = {k: (v.to(wdt) if v is not None else None) for k, v in acc.items()}
        dx = dx2.view(ctx.x_shape) if need[0] else None
        return (dx, cast["wg"], cast["wu"], cast["wd"], cast["bg"], cast["bu"], cast["bd"]) + (None,) * 7
