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

Their outputs must equal the unfused path bit for bit — except the RMSNorm's ``y``, accepted within a
documented tolerance (:func:`norm_within_tolerance`: rows whose fp32 inverse RMS is one ulp apart may
differ by <= 2 steps of the dtype; its codes are bit-exact) — and how torch rounds them (summation
order, ``exp``, contraction) differs between devices: the backend offers numerics variants, and the
first calls of each (op, device, dtype, shape class) compare every variant with the unfused computation
until one has passed on at least :data:`TRUST_ELEMENTS` elements; until then the unfused result is
returned, and if none passes the op runs unfused from then on (logged once).

Dispatch (docs/fusion.md): when an op is switched on (:func:`fusion_enabled`: ``AGOQ_FUSION``; unset, the
elementwise group on CUDA devices), the selected backend claims the op and the backend's
``*_unsupported`` check returns None, the fused kernel runs; otherwise
the unfused composition (a torch GEMM plus the backend's codec) runs and the reason is logged once.
A failing kernel is never caught. The unfused weight-gradient GEMM is ``dYᵀ·X`` on the flattened
tokens, the product (and the contiguous layout) PyTorch's own Linear backward computes, so LAAQ with
native storage reproduces its gradients bit for bit (tested).
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
#: The ops of each group (also accepted one by one in ``AGOQ_FUSION``).
GROUP_OPS = {"gemm": ("gemm_quant_epilogue", "gemm_dequant_prologue"),
             "elementwise": ("rmsnorm_quant", "silu_mul_quant", "silu_mul_backward")}
#: What runs fused when ``AGOQ_FUSION`` is unset: the elementwise group, for tensors on a CUDA device
#: (H200, 2026-12-01: each fused kernel faster than its unfused ops, docs/fusion.md); nothing elsewhere
#: (the Triton interpreter on CPU is a test vehicle, not a fast path).
DEFAULT_GROUPS = {"cuda": frozenset({"elementwise"})}


def _group_of(name: str) -> str | None:
    return next((g for g, ops in GROUP_OPS.items() if name in ops), None)


def fusion_groups() -> frozenset[str] | None:
    """What ``AGOQ_FUSION`` switches on: None when unset or empty (the default: :data:`DEFAULT_GROUPS`, by
    device type), ``0``/``off`` nothing, ``1``/``all`` everything, or a comma list of groups — ``gemm``
    (the codec in the FC1 GEMM epilogue / dW GEMM prologues), ``elementwise`` (the codec in RMSNorm and
    SiLU&Mul forward and the SwiGLU backward) — and single ops (e.g. ``silu_mul_quant,silu_mul_backward``:
    the bit-exact elementwise ops without the RMSNorm, whose ``y`` is accepted within a tolerance)."""
    raw = os.environ.get("AGOQ_FUSION", "")
    if raw not in _parsed:  # asked on every fused call: parse each value once (host time, issue 17)
        if len(_parsed) > 64:
            _parsed.clear()
        _parsed[raw] = _parse_groups(raw)
    return _parsed[raw]


_parsed: dict[str, frozenset[str] | None] = {}


def _parse_groups(raw: str) -> frozenset[str] | None:
    raw = raw.strip().lower()
    if raw == "":
        return None
    if raw in ("0", "none", "off"):
        return frozenset()
    if raw in ("1", "all", "on"):
        return frozenset(GROUPS)
    parts = frozenset(p.strip() for p in raw.split(",") if p.strip())
    known = set(GROUPS) | {op for ops in GROUP_OPS.values() for op in ops}
    bad = sorted(parts - known)
    if bad:
        raise ValueError(f"AGOQ_FUSION={raw!r}: unknown group(s) or op(s) {bad}; use 0, 1 (all), or a comma list "
                         f"of {', '.join(GROUPS)} or ops {', '.join(sorted(known - set(GROUPS)))}")
    return parts


def fusion_enabled(name: str = "gemm", device: torch.device | str | None = None) -> bool:
    """Whether ``name`` (a group of :data:`GROUP_OPS`, or one op) runs fused for tensors on ``device``.

    ``AGOQ_FUSION`` unset: the groups of :data:`DEFAULT_GROUPS` for the device's type (the elementwise
    group on CUDA devices). The GEMM group stays opt-in: on the H200 (docs/benchmarks.md §4, 2026-11-29)
    the fused FC1 epilogue was at break-even (0.93-1.03x the unfused cuBLAS + codec path) and the
    dequantizing-prologue dW GEMMs were 7-15x slower than cuBLAS + a separate dequantize."""
    parts = fusion_groups()
    if parts is None:
        dtype = torch.device(device).type if device is not None else None
        parts = DEFAULT_GROUPS.get(dtype, frozenset())
    if name in parts:
        return True
    return name not in GROUPS and _group_of(name) in parts


def _fused_backend(op: str, backend: str | None, check, device: torch.device) -> object | None:
    """The backend if ``op`` is switched on for ``device``, the backend claims it, and ``check(backend)``
    finds nothing against this call."""
    if not fusion_enabled(op, device):
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
                            lambda b: b.gemm_quant_epilogue_unsupported(x2, weight, bias, spec), x.device)
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
                        lambda b: b.gemm_dequant_prologue_unsupported(g2, x.spec, k, m2), grad_out.device)
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
    # dYᵀ·X, the GEMM PyTorch's own Linear backward runs (autograd's mm_mat2_backward for the column-major
    # weight.t()): a contiguous [out, in] gradient. (Xᵀ·dY)ᵀ, used before, is the same product but a
    # transposed view, which AccumulateGrad then copies (or adds with strided reads) on every step.
    return g2.t().mm(x2)


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
#: Elements a numerics variant must have reproduced (bit for bit, or within the op's documented tolerance)
#: before its results are used (a 4K-token LLaMA-2-7B norm input is 16M elements: trusted at the first
#: call; tiny test inputs take a few calls).
TRUST_ELEMENTS = 1 << 20

#: The fused RMSNorm's tolerance (docs/fusion.md "RMSNorm: y within one ulp of the inverse RMS"): a row of
#: ``y`` may differ from the model's own norm only if the model's row equals ``round(w * round(x * r'))`` for
#: an ``r'`` at most this many fp32 ulps from the kernel's inverse RMS ``r`` (its sum of squares is summed
#: in another order, so its last bit can differ); then no element is more than NORM_MAX_STEPS steps of the
#: output dtype away. Codes and scales are always bit-exact.
NORM_RINV_ULPS = 1
NORM_MAX_STEPS = 2


class _Choice:
    __slots__ = ("variants", "checked", "stats")

    def __init__(self, variants: tuple[str, ...]) -> None:
        self.variants = list(variants)  # candidates still matching, in the backend's order
        self.checked = 0                # elements the first candidate has matched so far
        self.stats: dict = {}           # what the checks of the first candidate saw (tolerance ops)


_choices: dict[tuple, _Choice] = {}


def _ordered(t: torch.Tensor) -> torch.Tensor:
    """Float bits as integers in the order of the values (adjacent floats differ by 1; +0 and -0 equal)."""
    i = t.reshape(-1).view(torch.int16 if t.element_size() == 2 else torch.int32).to(torch.int64)
    mag = i & (0x7FFF if t.element_size() == 2 else 0x7FFFFFFF)
    return torch.where(i < 0, -mag, mag)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical, any NaN equal to any NaN (NaN payloads are not part of the contract)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not a.dtype.is_floating_point:
        return torch.equal(a, b)
    return bool(_same_mask(a, b).all())


def _same_mask(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    ia = a.reshape(-1).view(torch.int16 if a.element_size() == 2 else torch.int32)
    ib = b.reshape(-1).view(torch.int16 if b.element_size() == 2 else torch.int32)
    return (ia == ib) | (torch.isnan(a.reshape(-1)) & torch.isnan(b.reshape(-1)))


def _checked_call(op: str, be, key: tuple, variants, numel: int, run, unfused, accept=None):
    """``run(variant, False)`` -> outputs, once a variant is trusted; until then ``run(variant, True)`` is
    compared with ``unfused()`` (the result returned) by ``accept(got, want, stats)`` (default: every
    output bit-identical), dropping every variant that fails. None: no variant passes (run unfused)."""
    ch = _choices.get(key)
    if ch is None:
        ch = _choices[key] = _Choice(tuple(variants))
    if ch.variants and ch.checked >= TRUST_ELEMENTS:
        return run(ch.variants[0], False)
    if not ch.variants:
        return None
    want = unfused()
    match = None
    stats: dict = {}
    for i, v in enumerate(ch.variants):
        stats = {}
        got = run(v, True)
        if accept(got, want, stats) if accept is not None else all(_same_bits(g, w) for g, w in zip(got, want)):
            match = i
            break
    if match is None:
        ch.variants = []
        _log_once(op, be.name, f"no numerics variant of the backend reproduces the unfused result here ({key})")
        return want
    if match == 0:
        ch.checked += numel
        for k, val in stats.items():
            ch.stats[k] = max(ch.stats.get(k, 0), val) if k.startswith("max") else ch.stats.get(k, 0) + val
    else:
        ch.checked, ch.stats = numel, dict(stats)
    ch.variants = ch.variants[match:]
    if ch.checked >= TRUST_ELEMENTS:
        # The trusted calls run without the check's extra outputs (the RMSNorm's inverse RMS): another kernel
        # specialisation, compiled at its first use. Run it once now, so that compilation happens in this
        # (warm-up) step instead of the next one -- 0.6-0.8 s of Triton JIT in the second training step of a
        # compiled LAAQ model on the H200 (2026-12-02) -- and check it reproduces the checked kernel bit for bit.
        again = run(ch.variants[0], False)
        if not all(_same_bits(a, g) for a, g in zip(again, got) if a is not None and g is not None):
            _log_once(op, be.name, f"variant {ch.variants[0]!r} gives other bits without its check outputs ({key})")
            ch.variants.pop(0)
            ch.checked, ch.stats = 0, {}
            return want
        log.info("agoq: %s fused on backend %r with variant %r (checked against the unfused path on %d "
                 "elements: %s)", op, be.name, ch.variants[0], ch.checked, ch.stats or "bit-identical")
    return want


def _norm_params(module) -> tuple[torch.Tensor, float] | None:
    """(weight, eps) of a LLaMA-style RMSNorm (HF's ``variance_epsilon``), else None. The check of the
    first calls decides whether the module really computes that recipe."""
    w = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 1 or not isinstance(eps, float):
        return None
    return w, eps


def norm_rows(x: torch.Tensor, w: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """``round(w * round(x * r))`` per row in x's dtype, r fp32 [rows]: HF LlamaRMSNorm's output for a given
    inverse RMS (``x * r`` in fp32, rounded to x's dtype; the product with w rounded once: a 16-bit x 16-bit
    product is exact in fp32)."""
    h = (x.float() * r[:, None]).to(x.dtype)
    return (w.float() * h.float()).to(x.dtype)


def norm_within_tolerance(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, r: torch.Tensor,
                          y_ref: torch.Tensor, stats: dict | None = None) -> bool:
    """Whether the fused norm's ``y`` (computed with per-row inverse RMS ``r``) may stand for the unfused
    ``y_ref``: equal bit for bit, except in rows where (1) ``y`` is exactly :func:`norm_rows` of ``r`` and
    (2) ``y_ref`` is exactly :func:`norm_rows` of an r' within :data:`NORM_RINV_ULPS` fp32 ulps of ``r``, and
    (3) no element is more than :data:`NORM_MAX_STEPS` steps of the dtype apart. x, y, y_ref [M, H]."""
    x2, y2, ref2 = (t.reshape(-1, x.shape[-1]) for t in (x, y, y_ref))
    same = _same_mask(y2, ref2).view(y2.shape)
    bad = ~same.all(dim=1)
    rows = bad.nonzero().flatten()
    if stats is not None:
        stats["rows_differing"] = int(rows.numel())
        stats["elements_differing"] = int((~same).sum())
        stats["max_steps"] = 0
    if rows.numel() == 0:
        return True
    xs, ys, refs, rs = x2[rows], y2[rows], ref2[rows], r.reshape(-1)[rows].float()
    steps = int((_ordered(ys) - _ordered(refs)).abs().max())
    if stats is not None:
        stats["max_steps"] = steps
    if steps > NORM_MAX_STEPS or not bool(torch.isfinite(rs).all()):
        return False
    if not _same_bits(norm_rows(xs, w, rs), ys):  # the kernel's y is its own r's
        return False
    explained = torch.zeros(rows.numel(), dtype=torch.bool, device=x.device)
    lo = hi = rs
    for _ in range(NORM_RINV_ULPS):
        lo = torch.nextafter(lo, torch.zeros_like(lo))
        hi = torch.nextafter(hi, torch.full_like(hi, float("inf")))
        for r2 in (lo, hi):
            explained |= _same_mask(norm_rows(xs, w, r2), refs).view(refs.shape).all(dim=1)
    return bool(explained.all())


def norm_and_quantize(x: torch.Tensor, module, norm_fn, spec: FormatSpec | None, *, role: str, layer: int | None,
                      backend: str | None) -> tuple[torch.Tensor, Stored] | None:
    """RMSNorm ``y = norm_fn(x)`` and the kept copy of ``x`` from one kernel (op ``rmsnorm_quant``), or None:
    the caller runs the norm and the codec itself.

    Accepted on its first calls when the codes and scales are bit-exact with the backend's codec and ``y``
    is :func:`norm_within_tolerance` of ``norm_fn(x)``: equal except in rows where the two fp32 inverse RMS
    are one ulp apart (a different summation order), by <= 2 steps of the dtype there."""
    if spec is None or not x.numel() or not fusion_enabled("rmsnorm_quant", x.device):
        return None
    params = _norm_params(module)
    if params is None:
        return None
    w, eps = params
    x2 = x.reshape(-1, x.shape[-1]) if x.is_contiguous() else x
    be = _fused_backend("rmsnorm_quant", backend, lambda b: b.rmsnorm_quant_unsupported(x2, w, spec), x.device)
    if be is None:
        return None
    n = x.numel()
    codes = torch.empty(spec.code_bytes(n), dtype=torch.uint8, device=x.device)
    scales = torch.empty(spec.num_blocks(n), dtype=torch.float32, device=x.device)

    def run(v, check):
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        r = torch.empty(x2.shape[0], dtype=torch.float32, device=x.device) if check else None
        be.rmsnorm_quant_into(x2, w, eps, spec, y.view(x2.shape), codes, scales, variant=v,
                              **({"rinv": r} if check else {}))
        return y, r

    key = ("rmsnorm_quant", be.name, x.device, x.dtype, w.dtype, x.shape[-1], eps, type(module), spec.name, spec.block)
    ref: list = []

    def want():
        ref.append(norm_fn(x))
        ref.append(storage.store(x, spec, role=role, layer=layer, backend=backend))
        return ref

    def accept(got, want_, stats):
        (y, r), (y_ref, kept) = got, want_
        if not (isinstance(kept, QuantizedTensor) and _same_bits(codes, kept.codes) and _same_bits(scales, kept.scales)):
            stats["codes_differ"] = 1
            return False
        return y_ref.shape == y.shape and y_ref.dtype == y.dtype and norm_within_tolerance(x2, w, y, r, y_ref, stats)

    got = _checked_call("rmsnorm_quant", be, key, be.rmsnorm_quant_variants(x.device), n, run, want, accept)
    if got is None:
        return None
    if ref:  # this call compared: the unfused output and the codec's kept copy
        return ref[0], ref[1]
    q = QuantizedTensor(codes, scales, x.shape, x.dtype, spec)
    return got[0], storage.record(q, role=role, layer=layer)


def _is_silu(act) -> bool:
    """F.silu, torch.nn.SiLU or a module class named SiLU / SiLUActivation (HF's ACT2FN["silu"]) anywhere in
    its hierarchy; the bit-for-bit check of the first calls catches one that computes something else."""
    if act is F.silu or isinstance(act, torch.nn.SiLU):
        return True
    return isinstance(act, torch.nn.Module) and any(c.__name__ in ("SiLU", "SiLUActivation") for c in type(act).__mro__)


def silu_mul_fusable(act, spec: FormatSpec | None, backend: str | None,
                     device: torch.device | str | None = None) -> bool:
    """Cheap pre-check (no gate/up yet): may :func:`silu_mul_and_quantize` fuse for this activation on
    ``device`` (and not the FC1 GEMM epilogue write the codes instead)?"""
    if spec is None or not _is_silu(act) or not fusion_enabled("silu_mul_quant", device) \
            or fusion_enabled("gemm_quant_epilogue", device):
        return False
    return "silu_mul_quant" in get_backend(backend).capabilities().ops


def _every_input_variants(be, variants, act, spec: FormatSpec, dtype: torch.dtype, device: torch.device) -> tuple:
    """The forward variants whose ``h = act(g) * 1`` equals the model's ``act(g)`` bit for bit for every one of
    the 65,536 16-bit inputs (the kernel's activation is elementwise, so this covers every input the fused
    kernel can see; the multiply by ``u`` is one IEEE fp32 product and a rounding on both paths). A variant
    that passes is exact on this device whatever the data; the first calls' check on real data still runs."""
    g = torch.arange(-32768, 32768, dtype=torch.int32, device=device).to(torch.int16).view(dtype)
    u = torch.ones_like(g)
    if be.silu_mul_quant_unsupported(g, u, spec):
        return tuple(variants)
    want = act(g)
    n = g.numel()
    kept = []
    for v in variants:
        h = torch.empty_like(g)
        bufs = [torch.empty(spec.code_bytes(n), dtype=torch.uint8, device=device),
                torch.empty(spec.num_blocks(n), dtype=torch.float32, device=device)] * 2
        be.silu_mul_quant_into(g, u, spec, h, *bufs, variant=v)
        if _same_bits(h, want):
            kept.append(v)
        else:
            log.info("agoq: silu_mul_quant variant %r on backend %r differs from the model's activation on %d of "
                     "the 65,536 %s inputs; not used", v, be.name, int((~_same_mask(h, want)).sum()), dtype)
    if not kept:
        _log_once("silu_mul_quant", be.name, f"no numerics variant reproduces the activation on every {dtype} input")
    return tuple(kept)


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

    be = _fused_backend("silu_mul_quant", backend, lambda b: b.silu_mul_quant_unsupported(g, u, spec), g.device) \
        if g.numel() and _is_silu(act) else None
    if be is None:
        return unfused()
    n = g.numel()
    bufs = [torch.empty(spec.code_bytes(n), dtype=torch.uint8, device=g.device),
            torch.empty(spec.num_blocks(n), dtype=torch.float32, device=g.device),
            torch.empty(spec.code_bytes(n), dtype=torch.uint8, device=g.device),
            torch.empty(spec.num_blocks(n), dtype=torch.float32, device=g.device)]

    def run(v, check):
        h = torch.empty_like(g)
        be.silu_mul_quant_into(g, u, spec, h, *bufs, variant=v)
        return (h,)

    key = ("silu_mul_quant", be.name, g.device, g.dtype, type(act), spec.name, spec.block)
    ref: list = []

    def want():
        ref[:] = unfused()
        return (ref[0],)

    variants = be.silu_mul_quant_variants(g.device)
    if key not in _choices:
        variants = _every_input_variants(be, variants, act, spec, g.dtype, g.device)
    got = _checked_call("silu_mul_quant", be, key, variants, n, run, want)
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
    return fusion_enabled("silu_mul_backward", kg.codes.device) \
        and "silu_mul_backward" in get_backend(backend).capabilities().ops


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
                        dh.device)
    if be is None:
        return None

    def run(v, check):
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
