"""Conformance cases for the optional fused-GEMM capabilities, against the reference composition.

``run_fusion_conformance(backend)`` runs every case on a backend object and returns one verdict record per
case, in the record format of ``conformance_tests/agoq_conformance/runner.py`` (id, op, fmt, block, level,
verdict, detail, output_sha256, mismatches, numel, seconds) plus ``sqnr_db`` / ``sqnr_floor_db``. A
backend that does not claim an op gets ``skip`` records for its cases.

What a case checks (level ``bit_exact+sqnr``):
* ``gemm_quant_epilogue``: the codes and scales the backend wrote are bit-exact (NaN scales compared as
  "is NaN") with the reference codec (agoq_core.formats.reference) applied to the 16-bit output the same
  call returned; the output is within the SQNR floor of the float64 product of the same operands
  (agoq_core.testing.tolerances) and is NaN exactly where that product is NaN.
* ``gemm_dequant_prologue``: X is quantized by the reference codec; the result is within the SQNR floor of
  the float64 product ``dYᵀ · B`` with B = D(X) rounded to dY's dtype as the unfused path materialises it
  (or ``m * D(X)``, torch's 16-bit product, for the ``-mul`` cases), and NaN exactly where that product
  is NaN (a NaN block of X poisons its dW columns). ``-identity`` cases (dY = I) check B bit for bit.
``output_sha256`` is None: the GEMM rounding is device-specific, so outputs are compared by tolerance, not
by hash, and ``agoq conformance compare`` treats these cases by verdict.

Inputs are generated on the CPU from a seed derived from the case id, then moved to the backend's device.
Backend methods used (what a backend claiming the ops implements; see docs/fusion.md):
``gemm_quant_epilogue_unsupported(x, weight, bias, spec)``, ``gemm_quant_epilogue_into(x, weight, bias,
spec, out, codes, scales)``, ``gemm_dequant_prologue_unsupported(grad, spec, k, mul)``,
``gemm_dequant_prologue_into(grad, codes, scales, spec, k, out, mul)`` (``mul`` None or [M, k]).
"""
from __future__ import annotations

import fnmatch
import time
import zlib
from dataclasses import dataclass

import torch

from agoq_core.formats import reference
from agoq_core.formats.spec import FormatSpec, get_format
from agoq_core.testing.tolerances import sqnr_db, sqnr_floor

__all__ = ["FusionCase", "fusion_cases", "run_fusion_case", "run_fusion_conformance", "OPS"]

OPS = ("gemm_quant_epilogue", "gemm_dequant_prologue")
_DT = {"bf16": torch.bfloat16, "f16": torch.float16}


@dataclass(frozen=True, slots=True)
class FusionCase:
    op: str
    fmt: str
    block: int
    dtype: str
    m: int
    n: int
    k: int
    bias: bool = False
    mul: bool = False
    """prologue: dW = dYᵀ · (m ⊙ D(X)) with a dense m (LAAQ's down-projection weight gradient)."""
    special: str = ""
    """"" (random), "nan", "zeros" (an all-zero output row / X row), "tiny" (values below 2**-126),
    "identity" (prologue: dY = I, so dW must equal the 16-bit operand bit for bit)."""

    @property
    def id(self) -> str:
        extra = (("-bias" if self.bias else "") + ("-mul" if self.mul else "")
                 + (f"-{self.special}" if self.special else ""))
        return f"fusion/{self.op}/{self.fmt}/b{self.block}/{self.dtype}/m{self.m}n{self.n}k{self.k}{extra}"

    @property
    def spec(self) -> FormatSpec:
        return get_format(self.fmt, self.block)


def fusion_cases() -> list[FusionCase]:
    """The case list: every activation format in bf16 on a ragged shape, one special value each, fp16 and
    other block sizes for int4. Shapes are LLaMA-like in kind (N, K multiples of the block) but small, and
    ragged against every tile size (M not a multiple of 16, K not a multiple of 64)."""
    cases: list[FusionCase] = []
    fmts = ("int4", "fp4_e2m1", "nf4", "int5", "int6", "int8")
    for fmt in fmts:
        cases.append(FusionCase(op="gemm_quant_epilogue", fmt=fmt, block=128, dtype="bf16", m=37, n=384, k=80,
                                bias=True))
        cases.append(FusionCase(op="gemm_dequant_prologue", fmt=fmt, block=128, dtype="bf16", m=75, n=48, k=256))
    for special in ("nan", "zeros", "tiny"):
        cases.append(FusionCase(op="gemm_quant_epilogue", fmt="int4", block=128, dtype="bf16", m=20, n=256, k=64,
                                special=special))
        cases.append(FusionCase(op="gemm_dequant_prologue", fmt="int4", block=128, dtype="bf16", m=40, n=32, k=256,
                                special=special))
    for fmt in ("int4", "nf4", "fp4_e2m1"):
        cases.append(FusionCase(op="gemm_dequant_prologue", fmt=fmt, block=128, dtype="bf16", m=70, n=40, k=256,
                                mul=True))
    for fmt, mul in (("int4", False), ("nf4", True), ("int5", True)):
        cases.append(FusionCase(op="gemm_dequant_prologue", fmt=fmt, block=128, dtype="bf16", m=48, n=48, k=256,
                                mul=mul, special="identity"))
    cases.append(FusionCase(op="gemm_dequant_prologue", fmt="int4", block=128, dtype="f16", m=32, n=32, k=128,
                            mul=True, special="identity"))
    cases.append(FusionCase(op="gemm_quant_epilogue", fmt="int4", block=128, dtype="f16", m=33, n=256, k=96, bias=True))
    cases.append(FusionCase(op="gemm_dequant_prologue", fmt="int4", block=128, dtype="f16", m=50, n=40, k=128))
    for block in (64, 256):
        cases.append(FusionCase(op="gemm_quant_epilogue", fmt="int4", block=block, dtype="bf16", m=24, n=512, k=64))
        cases.append(FusionCase(op="gemm_dequant_prologue", fmt="nf4", block=block, dtype="bf16", m=33, n=16, k=512))
    return cases


def _gen(case: FusionCase) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(case.id.encode()))


def _epilogue_inputs(case: FusionCase):
    g = _gen(case)
    dt = _DT[case.dtype]
    x = torch.randn(case.m, case.k, generator=g)
    w = torch.randn(case.n, case.k, generator=g) / case.k ** 0.5
    b = torch.randn(case.n, generator=g) if case.bias else None
    if case.special == "nan":
        x[3, 5] = float("nan")          # row 3 of y is NaN: all its blocks get scale NaN
    elif case.special == "zeros":
        x[2].zero_()                     # row 2 of y is 0: scale 0, zero codes
    elif case.special == "tiny":
        x[1] *= 2.0**-70                 # row 1 of y ~2**-130: flushed to 0 by the codec
        w *= 2.0**-50
        x[0] *= 2.0**50                  # keep the other rows' products normal
    return x.to(dt), w.to(dt), (b.to(dt) if b is not None else None)


def _prologue_inputs(case: FusionCase):
    g = _gen(case)
    dt = _DT[case.dtype]
    dy = torch.randn(case.m, case.n, generator=g)
    x = torch.randn(case.m, case.k, generator=g) * 3.0
    if case.special == "nan":
        x[4, case.block + 1] = float("nan")  # block 1 of row 4: dW columns [block, 2*block) become NaN
    elif case.special == "zeros":
        dy[7].zero_()
        x[9].zero_()
    elif case.special == "tiny":
        x[5] *= 2.0**-128                # a block of subnormals: flushed, scale 0
    elif case.special == "identity":
        dy = torch.eye(case.m, case.n)   # dW = dYᵀ B = B: one product per output, exact in fp32
    mul = torch.nn.functional.silu(torch.randn(case.m, case.k, generator=g) * 2).to(dt) if case.mul else None
    return dy.to(dt), x.to(dt), mul


def _bits_mismatch(got: torch.Tensor, want: torch.Tensor) -> tuple[int, str]:
    got, want = got.detach().cpu().reshape(-1), want.detach().cpu().reshape(-1)
    if got.dtype != want.dtype or got.numel() != want.numel():
        return max(got.numel(), want.numel(), 1), f"got {got.dtype}[{got.numel()}], want {want.dtype}[{want.numel()}]"
    if got.dtype == torch.float32:
        bad = (got.view(torch.int32) != want.view(torch.int32)) & ~(torch.isnan(got) & torch.isnan(want))
    else:
        bad = got != want
    idx = bad.nonzero().reshape(-1)
    if idx.numel() == 0:
        return 0, ""
    i = int(idx[0])
    return int(idx.numel()), f"first at [{i}]: got {got[i].item()!r}, want {want[i].item()!r}"


def _nan_mismatch(out: torch.Tensor, ref: torch.Tensor) -> int:
    return int((torch.isnan(out.detach().cpu().double()) != torch.isnan(ref)).sum())


def _run_epilogue(case: FusionCase, be, device: torch.device, rec: dict) -> None:
    spec = case.spec
    x, w, b = _epilogue_inputs(case)
    x, w = x.to(device), w.to(device)
    b = b.to(device) if b is not None else None
    reason = be.gemm_quant_epilogue_unsupported(x, w, b, spec)
    if reason:
        rec.update(verdict="fail",
                   detail=f"backend claims gemm_quant_epilogue but declined a documented case: {reason}")
        return
    n = case.m * case.n
    y = torch.empty(case.m, case.n, dtype=x.dtype, device=device)
    codes = torch.empty(spec.code_bytes(n), dtype=torch.uint8, device=device)
    scales = torch.empty(spec.num_blocks(n), dtype=torch.float32, device=device)
    be.gemm_quant_epilogue_into(x, w, b, spec, y, codes, scales)
    be.synchronize(device)
    want_c, want_s = reference.quantize_blocks(y.cpu(), spec)  # the unfused codec on the y this call wrote
    nc, dc = _bits_mismatch(codes, want_c)
    ns, ds = _bits_mismatch(scales, want_s)
    ref = x.cpu().double() @ w.cpu().double().t() + (b.cpu().double() if b is not None else 0.0)
    nn = _nan_mismatch(y, ref)
    sq, floor = sqnr_db(y, ref), sqnr_floor(x.dtype)
    details = [f"codes: {nc} mismatches, {dc}" if nc else "", f"scales: {ns} mismatches, {ds}" if ns else "",
               f"output NaN pattern differs at {nn} elements" if nn else "",
               f"output SQNR {sq:.1f} dB < floor {floor} dB" if sq < floor else ""]
    rec.update(mismatches=nc + ns + nn, numel=n, sqnr_db=round(sq, 2), sqnr_floor_db=floor)
    rec["verdict"] = "pass" if not any(details) else "fail"
    rec["detail"] = "; ".join(d for d in details if d)


def _run_prologue(case: FusionCase, be, device: torch.device, rec: dict) -> None:
    spec = case.spec
    dy, x, mul = _prologue_inputs(case)
    want_c, want_s = reference.quantize_blocks(x, spec)
    b = reference.dequantize_blocks(want_c, want_s, spec, x.numel(), dy.dtype).view(case.m, case.k)
    if mul is not None:
        b = mul * b                       # torch's 16-bit product: fp32 multiply, one rounding
    ref = dy.double().t() @ b.double()
    dy = dy.to(device)
    mul_d = mul.to(device) if mul is not None else None
    reason = be.gemm_dequant_prologue_unsupported(dy, spec, case.k, mul_d)
    if reason:
        rec.update(verdict="fail",
                   detail=f"backend claims gemm_dequant_prologue but declined a documented case: {reason}")
        return
    out = torch.empty(case.n, case.k, dtype=dy.dtype, device=device)
    be.gemm_dequant_prologue_into(dy, want_c.to(device), want_s.to(device), spec, case.k, out, mul_d)
    be.synchronize(device)
    nn = _nan_mismatch(out, ref)
    sq, floor = sqnr_db(out, ref), sqnr_floor(dy.dtype)
    details = [f"output NaN pattern differs at {nn} elements" if nn else "",
               f"output SQNR {sq:.1f} dB < floor {floor} dB" if sq < floor else ""]
    nb = 0
    if case.special == "identity":  # the operand itself, bit for bit (a GEMM sum cannot keep -0: +0 it)
        nb, db = _bits_mismatch((out.cpu() + 0.0).view(torch.int16),
                                (b[:case.n] + 0.0).contiguous().view(torch.int16))
        details.append(f"operand bits: {nb} mismatches, {db}" if nb else "")
    rec.update(mismatches=nn + nb, numel=out.numel(), sqnr_db=round(sq, 2), sqnr_floor_db=floor)
    rec["verdict"] = "pass" if not any(details) else "fail"
    rec["detail"] = "; ".join(d for d in details if d)


def run_fusion_case(case: FusionCase, be, device: torch.device) -> dict:
    """One case on backend object ``be`` -> a verdict record (pass/fail/skip/error)."""
    rec: dict = {"id": case.id, "op": case.op, "fmt": case.fmt, "block": case.block, "level": "bit_exact+sqnr",
                 "verdict": "skip", "detail": "", "output_sha256": None, "mismatches": None}
    caps = be.capabilities()
    if case.op not in caps.ops:
        rec["detail"] = f"backend does not claim op {case.op!r}"
        return rec
    if case.fmt not in caps.formats:
        rec["detail"] = f"backend does not claim format {case.fmt!r}"
        return rec
    t0 = time.perf_counter()
    try:
        (_run_epilogue if case.op == "gemm_quant_epilogue" else _run_prologue)(case, be, device, rec)
    except Exception as exc:  # a crash is a failing case, reported with its error
        rec.update(verdict="error", detail=f"{type(exc).__name__}: {exc}")
    rec["seconds"] = round(time.perf_counter() - t0, 6)
    return rec


def run_fusion_conformance(backend=None, *, device: str | torch.device | None = None,
                           select: str | None = None) -> list[dict]:
    """Run the fused-GEMM cases (or those whose id matches the fnmatch pattern ``select``) on ``backend``
    (a Backend object, a name, or None for the selected one) and return the verdict records."""
    from agoq_core.backend import get_backend

    be = backend if hasattr(backend, "capabilities") else get_backend(backend)
    if device is None:
        types = sorted(t for t in be.capabilities().device_types if t != "*")
        device = types[0] if types else "cpu"
    device = torch.device(device)
    cases = [c for c in fusion_cases() if select is None or fnmatch.fnmatch(c.id, select)]
    if not cases:
        raise ValueError(f"no fusion conformance case matches {select!r}")
    return [run_fusion_case(c, be, device) for c in cases]
