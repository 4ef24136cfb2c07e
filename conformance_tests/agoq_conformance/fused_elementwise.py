"""Conformance cases for the optional elementwise fusions: ``rmsnorm_quant``, ``silu_mul_quant``,
``silu_mul_backward`` (docs/fusion.md), built from the reference.

Level ``bit_exact+variant``:
* codes and scales: bit-exact with the reference codec (agoq_core.formats.reference) of the input
  (NaN scales compared as "is NaN");
* the float outputs (RMSNorm ``y``; ``h``; ``h``, ``dgate``, ``dup``): against the unfused composition
  computed with torch on the CPU (HF LlamaRMSNorm's recipe; ``F.silu(g) * u``; autograd's SiLU backward
  of the reference-decoded g and u). How torch sums, and what its ``exp`` and ``rsqrt`` return, differ
  between devices (LAAQ therefore checks the backend's variants against the device's own torch bit for bit
  at run time, agoq_core.laaq.fusion): here the best of the backend's variants must be within
  ``ULPS[op]`` units in the last place of the output dtype everywhere (or within 2**-20 of the largest
  reference magnitude, for gradients that cancel to ~0), NaN exactly where the reference is NaN.
  The record's ``detail`` names the best variant and how many elements differ at all.
"""
from __future__ import annotations

import time
import zlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from agoq_core.formats import reference
from agoq_core.formats.spec import get_format

__all__ = ["ElementwiseCase", "elementwise_cases", "run_elementwise_case", "OPS", "ULPS"]

OPS = ("rmsnorm_quant", "silu_mul_quant", "silu_mul_backward")
#: the largest distance (units in the last place of the output dtype) from the CPU reference: y = w * h
#: turns one rounding step of h into up to two of y.
ULPS = {"rmsnorm_quant": 2, "silu_mul_quant": 1, "silu_mul_backward": 2}
_DT = {"bf16": torch.bfloat16, "f16": torch.float16}


@dataclass(frozen=True, slots=True)
class ElementwiseCase:
    op: str
    fmt: str
    dtype: str
    rows: int
    cols: int
    special: str = ""  # "", "zeros" (a zero block), "nan" (a NaN in one block)

    @property
    def id(self) -> str:
        return f"fusion/{self.op}/{self.fmt}/{self.dtype}/{self.rows}x{self.cols}" + (f"-{self.special}" if self.special else "")


def elementwise_cases() -> list[ElementwiseCase]:
    cases = []
    for op in OPS:
        for fmt in ("nf4", "int4", "fp4_e2m1", "int5", "int8", "fp8_e4m3", "mxfp4"):
            cases.append(ElementwiseCase(op, fmt, "bf16", 16, 256))
        cases.append(ElementwiseCase(op, "nf4", "bf16", 16, 512, "zeros"))
        cases.append(ElementwiseCase(op, "int4", "bf16", 16, 256, "nan"))
        if op != "rmsnorm_quant":
            cases.append(ElementwiseCase(op, "nf4", "f16", 8, 256))
    return cases


def _inputs(case: ElementwiseCase):
    g = torch.Generator().manual_seed(zlib.crc32(case.id.encode()))
    dt = _DT[case.dtype]
    shape = (case.rows, case.cols)
    a = torch.randn(shape, generator=g) * torch.rand(case.rows, 1, generator=g) * 6
    b = torch.randn(shape, generator=g) * 2
    c = torch.randn(shape, generator=g)
    if case.special == "zeros":
        a[1, :128] = 0.0
        b[2, 128:256] = 0.0
    if case.special == "nan":
        a[3, 5] = float("nan")
    return a.to(dt), b.to(dt), c.to(dt)


def _dist_ok(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, ulps: int) -> tuple[bool, int, str]:
    """Every element within ``ulps`` steps of ``dtype`` (or 2**-20 of the largest |want|); NaN where want is NaN."""
    got, want = got.detach().cpu().to(dtype), want.detach().cpu().to(dtype)
    gn, wn = torch.isnan(got), torch.isnan(want)
    if not torch.equal(gn, wn):
        return False, int((gn != wn).sum()), "NaN at different positions"
    g, w = got[~wn].float(), want[~wn].float()
    differ = int((g != w).sum())
    if differ == 0:
        return True, 0, "bit-exact"
    eps = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11  # one step relative to the binade's start
    step = eps * torch.exp2(torch.floor(torch.log2(torch.maximum(g.abs(), w.abs()).clamp_min(2.0 ** -126))))
    floor = 2.0 ** -20 * float(w.abs().max()) if w.numel() else 0.0
    bad = int(((g - w).abs() > torch.maximum(ulps * step, torch.full_like(step, floor))).sum())
    return bad == 0, bad, f"{differ} of {w.numel()} differ from the CPU reference, {bad} by more than {ulps} step(s)"


def _run(case: ElementwiseCase, be, device: torch.device) -> tuple[bool, str, int]:
    spec = get_format(case.fmt)
    dt = _DT[case.dtype]
    a, b, c = _inputs(case)
    n = a.numel()

    def bufs():
        return [torch.empty(spec.code_bytes(n), dtype=torch.uint8, device=device),
                torch.empty(spec.num_blocks(n), dtype=torch.float32, device=device)]

    def codes_equal(codes, scales, x) -> bool:
        rc, rs = reference.quantize_blocks(x, spec)
        s = scales.cpu()
        return torch.equal(codes.cpu(), rc) and torch.equal(torch.isnan(s), torch.isnan(rs)) and \
            torch.equal(s[~torch.isnan(s)], rs[~torch.isnan(rs)])

    if case.op == "rmsnorm_quant":
        w = (1 + 0.1 * c[0]).to(dt)
        why = be.rmsnorm_quant_unsupported(a.to(device), w.to(device), spec)
        if why:
            raise RuntimeError(f"unsupported: {why}")
        xf = a.float()
        want = [w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dt)]
        variants = be.rmsnorm_quant_variants(device)

        def call(v):
            y = torch.empty(a.shape, dtype=dt, device=device)
            cs = bufs()
            be.rmsnorm_quant_into(a.to(device), w.to(device), 1e-5, spec, y, *cs, variant=v)
            return [y], [(cs, a)]
    elif case.op == "silu_mul_quant":
        want = [F.silu(a) * b]
        variants = be.silu_mul_quant_variants(device)

        def call(v):
            h = torch.empty(a.shape, dtype=dt, device=device)
            cg, cu = bufs(), bufs()
            be.silu_mul_quant_into(a.to(device), b.to(device), spec, h, *cg, *cu, variant=v)
            return [h], [(cg, a), (cu, b)]
    else:
        cg, sg = reference.quantize_blocks(a, spec)
        cu, su = reference.quantize_blocks(b, spec)
        g = reference.dequantize_blocks(cg, sg, spec, n).to(dt).view(a.shape).requires_grad_(True)
        u = reference.dequantize_blocks(cu, su, spec, n).to(dt).view(a.shape)
        with torch.enable_grad():
            act = F.silu(g)
        (dg,) = torch.autograd.grad(act, (g,), c * u)
        want = [act.detach() * u, dg, c * act.detach()]
        variants = be.silu_mul_backward_variants(device)

        def call(v):
            outs = [torch.empty(a.shape, dtype=dt, device=device) for _ in range(3)]
            be.silu_mul_backward_into(c.to(device), cg.to(device), sg.to(device), cu.to(device), su.to(device), spec,
                                      *outs, variant=v)
            return outs, []
    best = None
    for v in variants:
        outs, coded = call(v)
        for (codes, scales), x in coded:
            if not codes_equal(codes, scales, x):
                return False, f"variant {v}: codes/scales differ from the reference codec", 1
        res = [_dist_ok(o, w_, dt, ULPS[case.op]) for o, w_ in zip(outs, want)]
        ok, bad = all(r[0] for r in res), sum(r[1] for r in res)
        detail = f"variant {v}: " + "; ".join(r[2] for r in res)
        if best is None or (ok and not best[0]) or (ok == best[0] and bad < best[2]):
            best = (ok, detail, bad)
    if best is None:
        return False, "the backend offers no variant", 1
    return best


def run_elementwise_case(case: ElementwiseCase, be, device: torch.device) -> dict:
    """One case on backend object ``be`` -> a verdict record (pass/fail/skip/error)."""
    rec: dict = {"id": case.id, "op": case.op, "fmt": case.fmt, "block": get_format(case.fmt).block,
                 "level": "bit_exact+variant", "verdict": "skip", "detail": "", "output_sha256": None,
                 "mismatches": None}
    caps = be.capabilities()
    if case.op not in caps.ops:
        rec["detail"] = f"backend does not claim op {case.op!r}"
        return rec
    t0 = time.perf_counter()
    try:
        ok, detail, bad = _run(case, be, device)
        rec.update(verdict="pass" if ok else "fail", detail=detail, mismatches=bad)
    except Exception as exc:  # a crash is a failing case, reported with its error
        rec.update(verdict="error", detail=f"{type(exc).__name__}: {exc}")
    rec["seconds"] = round(time.perf_counter() - t0, 6)
    return rec
