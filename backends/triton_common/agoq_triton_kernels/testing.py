"""Hostile arithmetic for Triton's CPU interpreter: prove that kernel results do not depend on it.

Two hardware behaviours the numerics contract must survive (docs/backends/ascend.md, risks 1 and 2), emulated
by patching the interpreter's builder for the duration of a ``with`` block:

* :func:`inexact_division` -- every fp32 division (``/``, ``tl.math.div_rn``) comes back one ulp off (towards
  +inf, or alternating), as a device whose divide is not correctly rounded might give;
* :func:`contracting_fma` -- every fp32 multiply whose result feeds an add or subtract directly is fused into
  it with a single rounding (a correctly rounded FMA, :func:`fma32`), as a compiler that contracts
  ``a * b + c`` regardless of ``enable_fp_fusion`` would do.

Both only work in interpreter mode (``TRITON_INTERPRET=1`` set before the kernels were imported). Imports
numpy and triton lazily; nothing here runs in production code.
"""
from __future__ import annotations

import contextlib

import numpy as np

__all__ = ["fma32", "inexact_division", "contracting_fma"]

_F32, _F64 = np.float32, np.float64


def fma32(a, b, c) -> np.ndarray:
    """RN_fp32(a * b + c) with a single rounding, elementwise on fp32 arrays (exact: the float64 product
    of two fp32 numbers is exact; the one double-rounding case of RN32(RN64(.)) is fixed with TwoSum)."""
    a, b, c = (np.asarray(t, dtype=_F32) for t in (a, b, c))
    p = a.astype(_F64) * b.astype(_F64)
    c64 = c.astype(_F64)
    s = p + c64
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)  # TwoSum: s + err == p + c exactly
    with np.errstate(over="ignore", invalid="ignore"):
        r = s.astype(_F32)
        r64 = r.astype(_F64)
        other = np.nextafter(r, np.where(s > r64, _F32(np.inf), _F32(-np.inf)).astype(_F32))
        # RN32(RN64(x)) != RN32(x) only when RN64(x) is an fp32 midpoint and the lost bits (err) break the tie
        tie = (r64 != s) & ((other.astype(_F64) + r64) / 2 == s) & (err != 0)
        return np.where(tie & ((other.astype(_F64) - s) * err > 0), other, r)


def _builder_class():
    from triton.runtime.interpreter import InterpreterBuilder

    return InterpreterBuilder


@contextlib.contextmanager
def inexact_division(mode: str = "up"):
    """Within the block, the interpreter's fp32 divisions are one ulp off: ``mode="up"`` always towards +inf,
    ``"alternate"`` up and down by element parity. Yields a dict counting the divisions it perturbed."""
    from triton.runtime.interpreter import TensorHandle

    cls = _builder_class()
    saved = {name: cls.__dict__[name] for name in ("create_fdiv", "create_precise_divf")}
    seen = {"divisions": 0}

    def off_by_one_ulp(self, lhs, rhs):
        with np.errstate(all="ignore"):
            q = np.divide(lhs.data, rhs.data)
        if q.dtype == _F32:
            seen["divisions"] += 1
            if mode == "up":
                q = np.nextafter(q, _F32(np.inf))
            else:
                flat = np.arange(q.size).reshape(q.shape) if q.ndim else np.array(0)
                q = np.where(flat % 2 == 0, np.nextafter(q, _F32(np.inf)), np.nextafter(q, _F32(-np.inf)))
            q = q.astype(_F32)
        return TensorHandle(q, lhs.dtype.scalar)

    try:
        for name in saved:
            setattr(cls, name, off_by_one_ulp)
        yield seen
    finally:
        for name, fn in saved.items():
            setattr(cls, name, fn)


@contextlib.contextmanager
def contracting_fma():
    """Within the block, ``x = a * b`` followed directly by ``x + c``, ``c + x``, ``x - c`` or ``c - x`` (fp32)
    is computed as one fused multiply-add with a single rounding. Yields a dict counting the fusions."""
    from triton.runtime.interpreter import TensorHandle

    cls = _builder_class()
    saved = {name: cls.__dict__[name] for name in ("create_fmul", "create_fadd", "create_fsub")}
    seen = {"fused": 0}
    mul, add, sub = saved["create_fmul"], saved["create_fadd"], saved["create_fsub"]

    def fmul(self, lhs, rhs):
        out = mul(self, lhs, rhs)
        if out.data.dtype == _F32:
            out.attr["agoq_product"] = (lhs.data, rhs.data)
        return out

    def fused(self, lhs, rhs, sign):
        # a product operand is fused; the right one first (LLVM's order), else the left one
        pr, pl = rhs.attr.get("agoq_product"), lhs.attr.get("agoq_product")
        if rhs.data.dtype != _F32 or (pr is None and pl is None):
            return None
        seen["fused"] += 1
        with np.errstate(all="ignore"):
            if pr is not None:  # lhs +- a*b
                a, b = pr
                return TensorHandle(fma32(a if sign > 0 else -a, b, lhs.data), lhs.dtype.scalar)
            a, b = pl  # a*b +- rhs
            return TensorHandle(fma32(a, b, rhs.data if sign > 0 else -rhs.data), lhs.dtype.scalar)

    def fadd(self, lhs, rhs):
        out = fused(self, lhs, rhs, +1)
        return add(self, lhs, rhs) if out is None else out

    def fsub(self, lhs, rhs):
        out = fused(self, lhs, rhs, -1)
        return sub(self, lhs, rhs) if out is None else out

    try:
        cls.create_fmul, cls.create_fadd, cls.create_fsub = fmul, fadd, fsub
        yield seen
    finally:
        for name, fn in saved.items():
            setattr(cls, name, fn)
