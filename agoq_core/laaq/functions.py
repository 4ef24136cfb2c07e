"""LAAQ's autograd functions: store inputs (4-bit by default), recompute everything else in backward.

Written once, device-neutral; codecs come from the selected backend (agoq_core.laaq.storage), GEMMs
next to a codec go through agoq_core.laaq.fusion so fused kernels can replace them later.

* :class:`NormFunction` — a norm that keeps only its (quantized) input. Its output is registered
  (a weak side table keyed by the output tensor, never an attribute on it) with a :class:`NormSource`
  that tells the GEMMs reading it how to rebuild it.
* :class:`RecomputedInputLinear` — a Linear whose input is a norm output: it keeps nothing of its
  input; its weight gradient asks the NormSource, which recomputes the norm output once for all the
  GEMMs that read it (Q, K and V share one recomputation) and frees it after the norm's backward.
* :class:`SavedInputLinear` — a Linear that keeps its own input (the attention out-projection).
* :class:`SwiGLUFunction` — gate/up GEMMs, SiLU&Mul and the down GEMM in one function that keeps
  only the (quantized) gate/up outputs and recomputes the SwiGLU output in backward.

Nothing dropped is held anywhere: ctx holds the Stored inputs, the weights and a NormSource (which
holds a Stored input and, only during backward, the recomputation).

A "linear" here is an ``nn.Linear`` or a PEFT LoRA wrapper (agoq_core.laaq.linears): the adapters ride
along the base GEMM on the same rebuilt input. Every function records the autocast state of its
forward and re-enters it in backward (what ``torch.amp.custom_fwd``/``custom_bwd`` do, for any device
type), so recomputations and GEMMs see the dtypes autocast gave them in forward.
"""
from __future__ import annotations

import math
import weakref
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from agoq_core.formats.spec import FormatSpec
from agoq_core.laaq import fusion, storage
from agoq_core.laaq.linears import LinearMeta, adapter_backward, adapter_forward, amp_context, amp_state
from agoq_core.laaq.storage import Stored

__all__ = [
    "NormSource",
    "NormFunction",
    "RecomputedInputLinear",
    "SavedInputLinear",
    "SwiGLUFunction",
    "find_source",
    "register_output",
]

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
                 "norm_in_graph", "_x", "_y", "recomputations", "amp", "module", "__weakref__")

    def __init__(self, norm_fn: Callable[[torch.Tensor], torch.Tensor], spec: FormatSpec | None,
                 layer: int | None, backend: str | None, module: torch.nn.Module | None = None) -> None:
        self.norm_fn = norm_fn
        self.module = module          # the norm module (its weight/eps for the fused RMSNorm kernel), or None
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
        self.amp: tuple = ("cpu", False, None)  # autocast state of the forward (re-entered to recompute)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The norm output, keeping the input: one fused kernel when the backend's ``rmsnorm_quant``
        reproduces ``norm_fn`` bit for bit (agoq_core.laaq.fusion.norm_and_quantize), else norm then codec."""
        fused = None
        if self.module is not None:
            fused = fusion.norm_and_quantize(x, self.module, self.norm_fn, self.spec, role="norm_input",
                                             layer=self.layer, backend=self.backend)
        if fused is None:
            y = self.norm_fn(x)
            self.keep_input(x, y)
        else:
            y, self.stored = fused
            self._keep_meta(x, y)
        return y

    def keep_input(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.stored = storage.store(x, self.spec, role="norm_input", layer=self.layer, backend=self.backend)
        self._keep_meta(x, y)

    def _keep_meta(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.out_meta = (y.shape, y.stride(), y.storage_offset(), y.dtype)
        self.amp = amp_state(x.device.type)

    def add_consumer(self) -> None:
        self.consumers += 1
        self.pending += 1

    def _recompute(self, need_graph: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if self._y is None:
            if self.stored is None:
                raise RuntimeError("LAAQ: a norm output is needed in backward but its input was not kept "
                                   "(the forward ran with autograd disabled)")
            x = storage.load(self.stored, None, self.backend).detach()
            with torch.enable_grad(), amp_context(self.amp):
                x.requires_grad_(need_graph)
                y = self.norm_fn(x)
            shape, stride, offset, dtype = self.out_meta
            if y.shape != shape or y.stride() != stride or y.storage_offset() != offset or y.dtype != dtype:
                raise RuntimeError(f"LAAQ: the recomputed norm output has layout {tuple(y.shape)}/{y.stride()}/"
                                   f"{y.dtype} but forward produced {tuple(shape)}/{stride}/{dtype}; the norm is not "
                                   "deterministic in layout and cannot be converted")
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


# Live norm outputs -> their NormSource. Keyed by id, checked by weak reference (an entry dies with its
# tensor), so nothing is attached to the tensor and nothing keeps it alive.
_live: dict[int, tuple[weakref.ref, NormSource]] = {}


def register_output(y: torch.Tensor, src: NormSource) -> None:
    """Record that ``y`` is ``src``'s norm output (what :func:`find_source` answers)."""
    key = id(y)

    def _gone(ref: weakref.ref, key: int = key) -> None:
        e = _live.get(key)
        if e is not None and e[0] is ref:
            del _live[key]

    _live[key] = (weakref.ref(y, _gone), src)


def _lookup(t: torch.Tensor) -> NormSource | None:
    e = _live.get(id(t))
    return e[1] if e is not None and e[0]() is t else None


def find_source(t: torch.Tensor) -> tuple[NormSource | None, tuple | None]:
    """The NormSource that produced ``t`` (or the tensor ``t`` is a view of), and the view's layout."""
    src = _lookup(t)
    if src is not None:
        return src, None
    base = t._base
    if base is not None:
        src = _lookup(base)
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
        y = src.forward(x)
        ctx.src = src
        ctx.n_params = len(params)
        ctx.params = params  # parameters, not activations: needed as autograd.grad inputs
        return y

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        src: NormSource = ctx.src
        x, y = src._recompute(True)  # under forward's autocast state (NormSource.amp)
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
    register_output(y, src)
    return y


def _split(metas: Sequence[LinearMeta], tensors: Sequence) -> list[tuple]:
    out, i = [], 0
    for m in metas:
        out.append(tuple(tensors[i:i + m.n_tensors]))
        i += m.n_tensors
    return out


def _linear_backward(ctx, grad_out: torch.Tensor, x_dense: Callable[[], torch.Tensor], x_kept: Stored | None,
                     meta: LinearMeta, tensors: Sequence, needs: Sequence[bool], need_x: bool):
    """dX and the gradients of ``tensors`` (base weight, bias, adapters) of ``linear(x)``; ``x_dense()``
    rebuilds the input when a GEMM needs it dense, ``x_kept`` is the kept copy the dW seam may read
    directly (prologue fusion). Runs under forward's autocast state."""
    weight = tensors[0]
    grads: list = [None] * len(tensors)
    dx = fusion.input_grad(grad_out, weight).to(ctx.x_dtype) if need_x else None
    x = x_dense() if (meta.adapters or (needs[0] and x_kept is None)) else None
    if needs[0]:
        grads[0] = fusion.weight_grad(grad_out, x if x is not None else x_kept, backend=ctx.backend)
    if meta.has_bias and needs[1]:
        grads[1] = _bias_grad(grad_out)
    if meta.adapters:
        dxa, ga = adapter_backward(grad_out, x, meta, tensors, ctx.masks, needs, need_x)
        grads = [g if g is not None else a for g, a in zip(grads, ga)]
        if dxa is not None:
            dx = dx + dxa.to(ctx.x_dtype)
    return dx, grads


class RecomputedInputLinear(torch.autograd.Function):
    """out = linear(y) where y (or a view of it) is a converted norm's output; ``linear`` is an
    nn.Linear or a LoRA wrapper (``meta`` + ``tensors``: base weight, bias, adapter weights)."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, src: NormSource, view: tuple | None, meta: LinearMeta,
                *tensors: torch.Tensor | None) -> torch.Tensor:
        out = F.linear(y, tensors[0], tensors[1])
        out, ctx.masks = adapter_forward(y, out, meta, tensors)
        src.add_consumer()
        ctx.src, ctx.view, ctx.meta, ctx.backend = src, view, meta, src.backend
        ctx.x_dtype = y.dtype
        ctx.amp = amp_state(y.device.type)
        ctx.save_for_backward(*tensors)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        tensors = ctx.saved_tensors
        src: NormSource = ctx.src
        with amp_context(ctx.amp):
            dy, grads = _linear_backward(
                ctx, grad_out, lambda: src.output(_Like(ctx.view) if ctx.view is not None else None), None,
                ctx.meta, tensors, ctx.needs_input_grad[4:], ctx.needs_input_grad[0])
        src.consumer_done()
        if not graph_kept():
            ctx.masks = None
        return (dy, None, None, None, *grads)


class SavedInputLinear(torch.autograd.Function):
    """out = linear(x), keeping ``x`` once in ``spec`` (only if a weight needs a gradient), or by
    reference when ``alias`` (the op that produced ``x`` keeps it anyway)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, spec: FormatSpec | None, role: str, layer: int | None, backend: str | None,
                alias: bool, meta: LinearMeta, *tensors: torch.Tensor | None) -> torch.Tensor:
        out = F.linear(x, tensors[0], tensors[1])
        out, ctx.masks = adapter_forward(x, out, meta, tensors)
        need = ctx.needs_input_grad
        need_w = need[7] or (bool(meta.adapters) and (need[0] or any(need[9:])))  # not for the bias alone
        ctx.stored = (storage.store(x, None if alias else spec, role=role, layer=layer, backend=backend)
                      if need_w else None)
        ctx.backend, ctx.meta, ctx.x_dtype = backend, meta, x.dtype
        ctx.amp = amp_state(x.device.type)
        ctx.save_for_backward(*tensors)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        tensors = ctx.saved_tensors
        with amp_context(ctx.amp):
            dx, grads = _linear_backward(
                ctx, grad_out, lambda: fusion.dequantize_for_gemm(ctx.stored, None, ctx.backend), ctx.stored,
                ctx.meta, tensors, ctx.needs_input_grad[7:], ctx.needs_input_grad[0])
        if not graph_kept():
            ctx.stored = ctx.masks = None
        return (dx, None, None, None, None, None, None, *grads)


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


_NS = 9  # SwiGLUFunction.forward's arguments before the tensors


class SwiGLUFunction(torch.autograd.Function):
    """down(act(gate(x)) * up(x)) keeping only gate(x) and up(x) (role mlp_act_input).

    ``x`` is rebuilt from ``src`` (a converted norm) when given, else kept in ``x_spec``
    (role linear_input). ``act`` is the model's own activation module, re-run under autograd in
    backward so its derivative is exactly PyTorch's. The projections are linears (``metas``: nn.Linear
    or LoRA wrappers, their tensors following in order): (gate, up, down), or (gate_up, down) for a
    fused projection whose output halves are gate and up (Phi3: ``gate, up = gate_up(x).chunk(2)``).
    Backward runs over chunks of tokens (BACKWARD_CHUNK_ELEMS; one chunk when adapters are present);
    weight gradients of several chunks are summed in fp32.
    """

    @staticmethod
    def forward(ctx, x, src: NormSource | None, view, act: Callable, act_spec: FormatSpec | None,
                x_spec: FormatSpec | None, layer: int | None, backend: str | None, metas: tuple[LinearMeta, ...],
                *tensors):
        parts = _split(metas, tensors)
        ins, td = list(zip(metas[:-1], parts[:-1])), parts[-1]
        masks = []
        h = None
        # (with the FC1 GEMM epilogue switched on, that writes the codes instead: silu_mul_fusable says no)
        if len(ins) == 2 and not any(m.adapters for m, _ in ins) \
                and fusion.silu_mul_fusable(act, act_spec, backend, x.device):
            # SiLU&Mul with its codec fused in (fusion.silu_mul_and_quantize): gate and up read once
            (_, tg), (_, tu) = ins
            g, u = F.linear(x, tg[0], tg[1]), F.linear(x, tu[0], tu[1])
            h, kg, ku = fusion.silu_mul_and_quantize(g, u, act, act_spec, role="mlp_act_input", layer=layer,
                                                     backend=backend)
            kept, masks = [kg, ku], [[], []]
            del g, u
        elif len(ins) == 2:  # separate gate and up projections
            kept, outs = [], []
            for meta, t in ins:
                if not meta.adapters:
                    y, k = fusion.linear_and_quantize(x, t[0], t[1], act_spec, role="mlp_act_input", layer=layer,
                                                      backend=backend)
                    masks.append([])
                else:
                    y, m = adapter_forward(x, F.linear(x, t[0], t[1]), meta, t)
                    k = storage.store(y, act_spec, role="mlp_act_input", layer=layer, backend=backend)
                    masks.append(m)
                outs.append(y)
                kept.append(k)
            g, u = outs
            del outs
        else:  # one gate_up projection, as the model computes it, then its two halves
            meta, t = ins[0]
            y, m = adapter_forward(x, F.linear(x, t[0], t[1]), meta, t)
            masks.append(m)
            g, u = y.chunk(2, dim=-1)
            del y
            kept = [storage.store(g, act_spec, role="mlp_act_input", layer=layer, backend=backend),
                    storage.store(u, act_spec, role="mlp_act_input", layer=layer, backend=backend)]
        ctx.g, ctx.u = kept
        if h is None:
            h = act(g)
            del g
            # in place when act made a new tensor: same product as `act(g) * u`, one 16-bit buffer less
            h = h.mul_(u) if (h.data_ptr() != u.data_ptr() and not h._is_view()) else h * u
            del u
        out = F.linear(h, td[0], td[1])
        out, md = adapter_forward(h, out, metas[-1], td)
        masks.append(md)
        del h
        if src is not None:
            src.add_consumer()
            ctx.x = None
        else:
            n, off = ctx.needs_input_grad, _NS
            needs_x = False
            for meta, _ in ins:  # a weight of gate/up (not a bias alone), or adapters needing x
                needs_x = needs_x or n[off] or (bool(meta.adapters) and (n[0] or any(n[off + 2:off + meta.n_tensors])))
                off += meta.n_tensors
            ctx.x = storage.store(x, x_spec, role="linear_input", layer=layer, backend=backend) if needs_x else None
        ctx.src, ctx.view, ctx.act, ctx.backend, ctx.metas, ctx.masks = src, view, act, backend, metas, masks
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        ctx.amp = amp_state(x.device.type)
        ctx.save_for_backward(*tensors)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        with amp_context(ctx.amp):
            grads = SwiGLUFunction._backward(ctx, grad_out)
        if ctx.src is not None:
            ctx.src.consumer_done()
        if not graph_kept():
            ctx.g = ctx.u = ctx.x = ctx.masks = None
        return grads

    @staticmethod
    def _unfused_chunk(ctx, go, t0, t1, nd_, od, dmeta, td, w_down, add, dh=None):
        """dgate, dup of one token chunk the unfused way (adding the down projection's dW and bias grads);
        ``dh`` = dY·W_down if the caller has it already."""
        g = storage.load_rows(ctx.g, t0, t1, None, ctx.backend).detach()
        u = storage.load_rows(ctx.u, t0, t1, None, ctx.backend).detach()
        with torch.enable_grad():
            g.requires_grad_(True)
            a = ctx.act(g)
        a_d = a.detach()
        # The SwiGLU output h = act(g) * u is only the down projection's GEMM operand: the gated
        # weight-gradient seam forms it (or a fused prologue never materialises it).
        if nd_[0]:
            add(od, fusion.weight_grad_gated(go, storage.rows(ctx.u, t0, t1), a_d, dense=u,
                                             backend=ctx.backend))
        if dmeta.has_bias and nd_[1]:
            add(od + 1, _bias_grad(go))
        dh = fusion.input_grad(go, w_down) if dh is None else dh
        if dmeta.adapters:
            dha, ga = adapter_backward(go, a_d * u, dmeta, td, ctx.masks[-1], nd_, True)
            for k, gk in enumerate(ga):
                add(od + k, gk)
            dh = dh + dha.to(dh.dtype)
        du = dh * a_d                                              # = torch's mul backward, grad * self
        (dg,) = torch.autograd.grad(a, (g,), dh * u)               # act's own backward of grad * other
        del a, a_d, g, u, dh
        return dg, du

    @staticmethod
    def _backward(ctx, grad_out):
        metas = ctx.metas
        tensors = ctx.saved_tensors
        parts = _split(metas, tensors)
        need = ctx.needs_input_grad
        offs, o = [], 0
        for m in metas:
            offs.append(o)
            o += m.n_tensors
        needs = [need[_NS + a:_NS + a + m.n_tensors] for a, m in zip(offs, metas)]
        ins = list(zip(metas[:-1], parts[:-1], needs[:-1], offs[:-1]))
        dmeta, td, nd_, od = metas[-1], parts[-1], needs[-1], offs[-1]
        fused = len(ins) == 1
        w_down = td[0]
        adapters = any(m.adapters for m in metas)
        hid = ins[0][1][0].shape[1]
        inter = w_down.shape[1]
        go2 = grad_out.reshape(-1, grad_out.shape[-1])
        tokens = go2.shape[0]
        chunk = tokens if adapters else _token_chunk(tokens, inter, (ctx.g, ctx.u, ctx.x))
        need_xw = any(n[0] for _, _, n, _ in ins) or any(m.adapters for m, _, _, _ in ins)
        x2 = None
        if need_xw and ctx.src is not None:
            x2 = ctx.src.output(_Like(ctx.view) if ctx.view is not None else None).reshape(-1, hid)
        elif any(m.adapters for m, _, _, _ in ins):
            x2 = storage.load(ctx.x, None, ctx.backend).reshape(-1, hid)
        acc_t = torch.promote_types(grad_out.dtype, torch.float32)
        acc: list = [None] * len(tensors)
        # one chunk (the usual case): dx is the chunk's own sum, no [tokens, hidden] copy into a buffer
        dx2 = torch.empty(tokens, hid, dtype=ctx.x_dtype, device=grad_out.device) if need[0] and chunk < tokens \
            else None

        def add(i: int, val: torch.Tensor | None) -> None:
            if val is None:
                return
            acc[i] = val if chunk == tokens else (val.to(acc_t) if acc[i] is None else acc[i].add_(val))

        for t0 in range(0, tokens, chunk):
            t1 = min(tokens, t0 + chunk)
            go = go2[t0:t1]
            fused_bw = dh = None
            if not dmeta.adapters and fusion.silu_mul_backward_fusable(ctx.g, ctx.u, ctx.act, ctx.backend):
                # the elementwise backward with the decode inside (fusion.silu_mul_backward)
                dh = fusion.input_grad(go, w_down)
                fused_bw = fusion.silu_mul_backward(dh, storage.rows(ctx.g, t0, t1), storage.rows(ctx.u, t0, t1),
                                                    ctx.act, backend=ctx.backend)
            if fused_bw is not None:
                del dh
                h, dg, du = fused_bw
                del fused_bw
                if nd_[0]:
                    add(od, fusion.weight_grad(go, h))
                del h
                if dmeta.has_bias and nd_[1]:
                    add(od + 1, _bias_grad(go))
            else:
                dg, du = SwiGLUFunction._unfused_chunk(ctx, go, t0, t1, nd_, od, dmeta, td, w_down, add, dh)
                dh = None
            # gradients of the input projection(s): gate and up, or the fused gate_up with [dg, du]
            douts = [torch.cat([dg, du], dim=-1)] if fused else [dg, du]
            del dg, du
            xc = None
            if need_xw:
                # a kept x goes to the weight-gradient seam as is (prologue fusion, else decoded there)
                xc = x2[t0:t1] if x2 is not None else storage.rows(ctx.x, t0, t1)
            d = None
            for j, ((meta, t, n_, off), dy) in enumerate(zip(ins, douts)):
                if n_[0]:
                    add(off, fusion.weight_grad(dy, xc))
                if meta.has_bias and n_[1]:
                    add(off + 1, _bias_grad(dy))
                extra = None
                if meta.adapters:
                    extra, ga = adapter_backward(dy, xc, meta, t, ctx.masks[j], n_, bool(need[0]))
                    for k, gk in enumerate(ga):
                        add(off + k, gk)
                if need[0]:
                    term = fusion.input_grad(dy, t[0]).to(ctx.x_dtype)
                    d = term if d is None else d + term
                    if extra is not None:
                        d = d + extra.to(ctx.x_dtype)
            if need[0]:
                if dx2 is None:
                    dx2 = d.reshape(t1 - t0, hid)
                else:
                    dx2[t0:t1] = d.reshape(t1 - t0, hid)
            del douts, xc, d
        del x2
        out = [(v.to(t.dtype) if v is not None else None) for v, t in zip(acc, tensors)]
        dx = dx2.view(ctx.x_shape) if need[0] else None
        return (dx,) + (None,) * (_NS - 1) + tuple(out)
