"""The seams where LAAQ's GEMMs meet its codecs, and where fused kernels take over.

LAAQ's autograd functions never put a GEMM next to a codec themselves; they call these helpers:

* :func:`linear_and_quantize` — the gate/up (FC1) GEMM that produces the SiLU&Mul input and the
  quantized copy LAAQ keeps of it. Fused: capability ``gemm_quant_epilogue``.
* :func:`weight_grad` — dW = dYᵀ·X where X is a kept (possibly quantized) tensor. Fused:
  ``gemm_dequant_prologue``.
* :func:`weight_grad_gated` — dW = dYᵀ·(M ⊙ X) with X kept quantized (the down projection: M =
  act(gate), X = up; the SwiGLU output is then never materialised). Fused: ``gemm_dequant_prologue``
  with its ``mul`` operand.
* :func:`dequantize_for_gemm` — a kept tensor rebuilt to feed a GEMM or a recomputation.

Fusion into the memory-bound neighbours (group ``elementwise``; docs/fusion.md):

* :func:`norm_and_quantize` — RMSNorm forward that also writes its input's kept copy (``rmsnorm_quant``).
* :func:`silu_mul_and_quantize` — ``h = act(gate) * up`` and the kept copies of gate and up
  (``silu_mul_quant``).
* :func:`silu_mul_backward` — SwiGLU's elementwise backward reading the kept codes (``silu_mul_backward``).

Their outputs must equal the unfused path bit for bit, and how torch rounds them (summation order,
``exp``, contraction) differs between devices: the backend offers numerics variants, and the first
calls of each (op, device, dtype, shape class) compare every variant with the unfused computation until
one has matched on at least :data:`TRUST_ELEMENTS` elements; until then the unfused result is returned,
and if none matches the op runs unfused from then on (logged once).

Dispatch (docs/fusion.md): when fusion is switched on (``AGOQ_FUSION=1``), the selected backend claims
the op and the backend's ``*_unsupported`` check returns None, the fused kernel runs; otherwise
the unfused composition (a torch GEMM plus the backend's codec) runs and the reason is logged once.
A failing kernel is never caught. The unfused weight-gradient GEMM is ``(Xᵀ·dY)ᵀ`` on the flattened
tokens, the product PyTorch's own Linear backward computes, so LAAQ with native storage reproduces
its gradients bit for bit (tested).
"""
from __future__ import annotations

import logging
import os

import torch
import torch.nn.functional as F

from agoq_core.backend import get_backend
from agoq_core.formats.spec import FormatSpec
from agoq_core.formats.tensor import QuantizedTensor
from agoq_core.laaq import storage
from agoq_core.laaq.storage import Stored

__all__ = ["linear_and_quantize", "weight_grad", "weight_grad_gated", "dequantize_for_gemm", "input_grad",
           "fusion_enabled", "fusion_groups", "norm_and_quantize", "silu_mul_fusable", "silu_mul_and_quantize",
           "silu_mul_backward", "silu_mul_backward_fusable", "TRUST_ELEMENTS"]

log = logging.getLogger("agoq.laaq")
_logged: set[tuple[str, str]] = set()


GROUPS = ("gemm", "elementwise")


def fusion_groups() -> frozenset[str]:
    """What ``AGOQ_FUSION`` switches on: ``0``/unset nothing, ``1``/``all`` everything, or a comma list of
    ``gemm`` (the codec in the FC1 GEMM epilogue / dW GEMM prologues) and ``elementwise`` (the codec in
    RMSNorm and SiLU&Mul forward and the SwiGLU backward)."""
    raw = os.environ.get("AGOQ_FUSION", "0").strip().lower()
    if raw in ("", "0", "none", "off"):
        return frozenset()
    if raw in ("1", "all", "on"):
        return frozenset(GROUPS)
    parts = frozenset(p.strip() for p in raw.split(",") if p.strip())
    bad = sorted(parts - set(GROUPS))
    if bad:
        raise ValueError(f"AGOQ_FUSION={raw!r}: unknown group(s) {bad}; use 0, 1 (all), or a comma list of "
                         f"{', '.join(GROUPS)}")
    return parts


def fusion_enabled(group: str = "gemm") -> bool:
    """True when ``AGOQ_FUSION`` switches ``group`` on (``1`` switches on every group).

    Opt-in because on the H200 (docs/benchmarks.md §4, 2026-11-29) the fused FC1 epilogue was at
    break-even (0.93-1.03x the unfused cuBLAS + codec path) and the dequantizing-prologue dW GEMMs were
    7-15x slower than cuBLAS + a separate dequantize: the unfused path is the faster default. The
    elementwise group is opt-in until the H200 run of benchmarks/bench_fusion.py --elementwise measures it.
    """
    return group in fusion_groups()


def _fused_backend(op: str, backend: str | None, check, group: str = "gemm") -> object | None:
    """The backend if it claims ``op`` and ``check(backend)`` finds nothing against this call."""
    if not fusion_enabled(group):
        return None
    be = get_backend(backend)
    if op not in be.capabilities().ops:
        return None
    reason = check(be)
    if reason is None:
        return be
    _log_once(op, be.name, reason)
    return None


def _log_once(op: str, backend: str, reason: str) -> None:
    if (op, reason) not in _logged:
        _logged.add((op, reason))
        log.info("agoq: %s not fused on backend %r: %s (running the unfused composition)", op, backend, reason)


def linear_and_quantize(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                        spec: FormatSpec | None, *, role: str, layer: int | None,
                        backend: str | None) -> tuple[torch.Tensor, Stored]:
    """``y = x Wᵀ + b`` and the stored copy of ``y`` (quantized in ``spec``, or ``y`` itself)."""
    if spec is not None and x.numel():
        x2 = x.reshape(-1, x.shape[-1])
        be = _fused_backend("gemm_quant_epilogue", backend,
                            lambda b: b.gemm_quant_epilogue_unsupported(x2, weight, bias, spec))
        if be is not None:
            m, n = x2.shape[0], weight.shape[0]
            out = torch.empty(m, n, dtype=x.dtype, device=x.device)
            codes = torch.empty(spec.code_bytes(m * n), dtype=torch.uint8, device=x.device)
            scales = torch.empty(spec.num_blocks(m * n), dtype=torch.float32, device=x.device)
            be.gemm_quant_epilogue_into(x2, weight, bias, spec, out, codes, scales)
            q = QuantizedTensor(codes, scales, (*x.shape[:-1], n), x.dtype, spec)
            return out.view(*x.shape[:-1], n), storage.record(q, role=role, layer=layer)
    y = F.linear(x, weight, bias)
    return y, storage.store(y, spec, role=role, layer=layer, backend=backend)


def dequantize_for_gemm(s: Stored, dtype: torch.dtype | None = None, backend: str | None = None) -> torch.Tensor:
    """A kept tensor back in ``dtype``, ready to be a GEMM operand."""
    return storage.load(s, dtype, backend)


def _prologue(grad_out: torch.Tensor, x: QuantizedTensor, mul: torch.Tensor | None,
              backend: str | None) -> torch.Tensor | None:
    g2 = grad_out.reshape(-1, grad_out.shape[-1])
    k = x.shape[-1]
    m2 = mul.reshape(-1, k) if mul is not None else None
    be = _fused_backend("gemm_dequant_prologue", backend,
                        lambda b: b.gemm_dequant_prologue_unsupported(g2, x.spec, k, m2))
    if be is None:
        return None
    out = torch.empty(g2.shape[1], k, dtype=grad_out.dtype, device=grad_out.device)
    be.gemm_dequant_prologue_into(g2, x.codes, x.scales, x.spec, k, out, m2)
    return out


def weight_grad(grad_out: torch.Tensor, x: torch.Tensor | Stored, *, backend: str | None = None) -> torch.Tensor:
    """dW[out, in] = Σ_tokens dY[t, out] · X[t, in], with X given dense or as a kept tensor."""
    if isinstance(x, QuantizedTensor):
        fused = _prologue(grad_out, x, None, backend) if x.numel else None
        if fused is not None:
            return fused
        x = dequantize_for_gemm(x, grad_out.dtype, backend)
    g2 = grad_out.reshape(-1, grad_out.shape[-1])
    x2 = x.reshape(-1, x.shape[-1])
    return x2.t().mm(g2).t()


def weight_grad_gated(grad_out: torch.Tensor, x: Stored, mul: torch.Tensor, *, dense: torch.Tensor | None = None,
                      backend: str | None = None) -> torch.Tensor:
    """dW = dYᵀ · (mul ⊙ X) for a kept X (``dense``: X already decoded, if the caller has it).

    Unfused: h = mul * X (the same product, in the same order, as the forward's ``act(gate) * up``),
    then :func:`weight_grad`."""
    if isinstance(x, QuantizedTensor) and x.numel:
        fused = _prologue(grad_out, x, mul, backend)
        if fused is not None:
            return fused
    if dense is None:
        dense = dequantize_for_gemm(x, mul.dtype, backend) if isinstance(x, QuantizedTensor) else x
    return weight_grad(grad_out, mul * dense.reshape(mul.shape))


def input_grad(grad_out: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """dX = dY · W (shape of the forward input)."""
    return grad_out.matmul(weight)


# ---- fusion into the memory-bound neighbours: variants checked against the unfused path -----------------
#: Elements a numerics variant must have reproduced bit for bit before its results are used (a 4K-token
#: LLaMA-2-7B norm input is 16M elements: trusted at the first call; tiny test inputs take a few calls).
TRUST_ELEMENTS = 1 << 20


class _Choice:
    __slots__ = ("variants", "checked")

    def __init__(self, variants: tuple[str, ...]) -> None:
        self.variants = list(variants)  # candidates still matching, in the backend's order
        self.checked = 0                # elements the first candidate has matched so far


_choices: dict[tuple, _Choice] = {}


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical, any NaN equal to any NaN (NaN payloads are not part of the contract)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    ia = a.reshape(-1).view(torch.int16 if a.element_size() == 2 else torch.int32)
    ib = b.reshape(-1).view(torch.int16 if b.element_size() == 2 else torch.int32)
    return bool(((ia == ib) | (torch.isnan(a.reshape(-1)) & torch.isnan(b.reshape(-1)))).all())


def _checked_call(op: str, be, key: tuple, variants, numel: int, run, unfused):
    """``run(variant)`` -> outputs, once a variant is trusted; until then also ``unfused()`` (the result
    returned), dropping every variant whose outputs differ. None: no variant matches (run unfused)."""
    ch = _choices.get(key)
    if ch is None:
        ch = _choices[key] = _Choice(tuple(variants))
    if ch.variants and ch.checked >= TRUST_ELEMENTS:
        return run(ch.variants[0])
    if not ch.variants:
        return None
    want = unfused()
    match = None
    for i, v in enumerate(ch.variants):
        if all(_same_bits(g, w) for g, w in zip(run(v), want)):
            match = i
            break
    if match is None:
        ch.variants = []
        _log_once(op, be.name, f"no numerics variant of the backend reproduces the unfused result here ({key})")
        return want
    ch.checked = ch.checked + numel if match == 0 else numel
    ch.variants = ch.variants[match:]
    if ch.checked >= TRUST_ELEMENTS:
        log.info("agoq: %s fused on backend %r with variant %r (bit-identical to the unfused path on %d "
                 "elements)", op, be.name, ch.variants[0], ch.checked)
    return want


def _norm_params(module) -> tuple[torch.Tensor, float] | None:
    """(weight, eps) of a LLaMA-style RMSNorm (HF's ``variance_epsilon``), else None. The bit-for-bit
    check of the first calls decides whether the module really computes that recipe."""
    w = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 1 or not isinstance(eps, float):
        return None
    return w, eps


def norm_and_quantize(x: torch.Tensor, module, norm_fn, spec: FormatSpec | None, *, role: str, layer: int | None,
                      backend: str | None) -> tuple[torch.Tensor, Stored] | None:
    """RMSNorm ``y = norm_fn(x)`` and the kept copy of ``x`` from one kernel (op ``rmsnorm_quant``), or None:
    the caller runs the norm and the codec itself."""
    if spec is None or not x.numel() or not fusion_enabled("elementwise"):
        return None
    params = _norm_params(module)
    if params is None:
        return None
    w, eps = params
    x2 = x.reshape(-1, x.shape[-1]) if x.is_contiguous() else x
    be = _fused_backend("rmsnorm_quant", backend, lambda b: b.rmsnorm_quant_unsupported(x2, w, spec), "elementwise")
    if be is None:
        return None
    n = x.numel()
    codes = torch.empty(spec.code_bytes(n), dtype=torch.uint8, device=x.device)
    scales = torch.empty(spec.num_blocks(n), dtype=torch.float32, device=x.device)

    def run(v):
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        be.rmsnorm_quant_into(x2, w, eps, spec, y.view(x2.shape), codes, scales, variant=v)
        return (y,)

    key = ("rmsnorm_quant", be.name, x.device, x.dtype, w.dtype, x.shape[-1], eps, type(module), spec.name, spec.block)
    ref: list = []

    def want():
        ref.append(norm_fn(x))
        return (ref[0],)

    got = _checked_call("rmsnorm_quant", be, key, be.rmsnorm_quant_variants(x.device), n, run, want)
    if got is None:
        return None
    if ref:  # this call compared: the unfused output, and the codec run separately
        return ref[0], storage.store(x, spec, role=role, layer=layer, backend=backend)
    q = QuantizedTensor(codes, scales, x.shape, x.dtype, spec)
    return got[0], storage.record(q, role=role, layer=layer)


def _is_silu(act) -> bool:
    """F.silu, torch.nn.SiLU or a module class named SiLU / SiLUActivation (HF's ACT2FN["silu"]) anywhere in
    its hierarchy; the bit-for-bit check of the first calls catches one that computes something else."""
    if act is F.silu or isinstance(act, torch.nn.SiLU):
        return True
    return isinstance(act, torch.nn.Module) and any(c.__name__ in ("SiLU", "SiLUActivation") for c in type(act).__mro__)


def silu_mul_fusable(act, spec: FormatSpec | None, backend: str | None) -> bool:
    """Cheap pre-check (no tensors yet): may :func:`silu_mul_and_quantize` fuse for this activation?"""
    if spec is None or not _is_silu(act) or not fusion_enabled("elementwise"):
        return False
    return "silu_mul_quant" in get_backend(backend).capabilities().ops


def silu_mul_and_quantize(g: torch.Tensor, u: torch.Tensor, act, spec: FormatSpec, *, role: str, layer: int | None,
                          backend: str | None) -> tuple[torch.Tensor, Stored, Stored]:
    """``h = act(g) * u`` and the kept copies of g and u: one kernel (op ``silu_mul_quant``) when it can run and
    reproduces the unfused result, else the unfused composition (the codec twice, then act and multiply)."""

    def unfused() -> tuple[torch.Tensor, Stored, Stored]:
        kg = storage.store(g, spec, role=role, layer=layer, backend=backend)
        ku = storage.store(u, spec, role=role, layer=layer, backend=backend)
        h = act(g)
        h = h.mul_(u) if (h.data_ptr() != u.data_ptr() and not h._is_view()) else h * u
        return h, kg, ku

    be = _fused_backend("silu_mul_quant", backend, lambda b: b.silu_mul_quant_unsupported(g, u, spec), "elementwise") \
        if g.numel() and _is_silu(act) else None
    if be is None:
        return unfused()
    n = g.numel()
    bufs = [torch.empty(spec.code_bytes(n), dtype=torch.uint8, device=g.device),
            torch.empty(spec.num_blocks(n), dtype=torch.float32, device=g.device),
            torch.empty(spec.code_bytes(n), dtype=torch.uint8, device=g.device),
            torch.empty(spec.num_blocks(n), dtype=torch.float32, device=g.device)]

    def run(v):
        h = torch.empty_like(g)
        be.silu_mul_quant_into(g, u, spec, h, *bufs, variant=v)
        return (h,)

    key = ("silu_mul_quant", be.name, g.device, g.dtype, type(act), spec.name, spec.block)
    ref: list = []

    def want():
        ref[:] = unfused()
        return (ref[0],)

    got = _checked_call("silu_mul_quant", be, key, be.silu_mul_quant_variants(g.device), n, run, want)
    if got is None:
        return unfused()
    if ref:  # this call compared: the unfused result (and its kept copies) is what is returned
        return ref[0], ref[1], ref[2]
    qg = QuantizedTensor(bufs[0], bufs[1], g.shape, g.dtype, spec)
    qu = QuantizedTensor(bufs[2], bufs[3], u.shape, u.dtype, spec)
    return got[0], storage.record(qg, role=role, layer=layer), storage.record(qu, role=role, layer=layer)


def silu_mul_backward_fusable(kg: Stored, ku: Stored, act, backend: str | None) -> bool:
    """Cheap pre-check: may :func:`silu_mul_backward` fuse for these kept tensors and this activation?"""
    if not (isinstance(kg, QuantizedTensor) and isinstance(ku, QuantizedTensor)) or not _is_silu(act):
        return False
    return fusion_enabled("elementwise") and "silu_mul_backward" in get_backend(backend).capabilities().ops


def silu_mul_backward(dh: torch.Tensor, kg: Stored, ku: Stored, act, *,
                      backend: str | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(h, dgate, dup) of ``h = act(g) * u`` from dh = dL/dh and the kept g and u, in one kernel that
    decodes the kept codes itself (op ``silu_mul_backward``); None: the caller runs the unfused path.

    The unfused path (SwiGLUFunction._backward): g, u decoded; a = act(g) under autograd; h = a * u;
    dup = dh * a; dgate = act's backward of dh * u."""
    if not (isinstance(kg, QuantizedTensor) and isinstance(ku, QuantizedTensor)) or kg.spec != ku.spec \
            or not _is_silu(act) or not kg.numel or kg.dtype != dh.dtype:
        return None
    spec = kg.spec
    dh2 = dh.reshape(kg.shape) if dh.numel() == kg.numel else None
    if dh2 is None:
        return None
    be = _fused_backend("silu_mul_backward", backend, lambda b: b.silu_mul_backward_unsupported(dh2, spec),
                        "elementwise")
    if be is None:
        return None

    def run(v):
        h, dg, du = (torch.empty(kg.shape, dtype=dh.dtype, device=dh.device) for _ in range(3))
        be.silu_mul_backward_into(dh2, kg.codes, kg.scales, ku.codes, ku.scales, spec, h, dg, du, variant=v)
        return h, dg, du

    def unfused():
        g = storage.load(kg, dh.dtype, backend).detach()
        u = storage.load(ku, dh.dtype, backend)
        with torch.enable_grad():
            g.requires_grad_(True)
            a = act(g)
        a_d = a.detach()
        du = dh2 * a_d
        (dg,) = torch.autograd.grad(a, (g,), dh2 * u)
        return a_d * u, dg, du

    key = ("silu_mul_backward", be.name, dh.device, dh.dtype, type(act), spec.name, spec.block)
    return _checked_call("silu_mul_backward", be, key, be.silu_mul_backward_variants(dh.device), dh.numel(), run,
                         unfused)
