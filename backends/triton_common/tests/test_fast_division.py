"""The GPU quotient of kernels._scaled_quotient (FAST_DIV) checked on CPU with an exact FMA.

The interpreter's tl.fma rounds twice, so the FAST_DIV path only runs on GPUs; here the same sequence of
fp32 operations is replayed in numpy with a correctly rounded fma (float64 product, TwoSum, and the one
double-rounding case fixed) and compared with IEEE division, bit for bit, where the contract needs it."""
from __future__ import annotations

import numpy as np
import pytest

from agoq_triton_kernels.testing import fma32

f32, f64, i32 = np.float32, np.float64, np.int32


def _ftz(v: np.ndarray) -> np.ndarray:
    return np.where(np.abs(v) < f32(2.0**-126), f32(0.0), v).astype(f32)


def fast_quotient(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """kernels._scaled_quotient(FAST_DIV=True), operation by operation. Its x2 = x * k is libdevice's
    mul_rn compiled with Triton's FTZ reflection (PTX mul.rn.ftz.f32: a subnormal input or result is +-0),
    which is the contract's flush of subnormal x (§3 step 2) for free."""
    k = ((255 - ((scale.view(i32) >> 23) & 0xFF)) << 23).astype(i32).view(f32)
    b = (scale * k).astype(f32)
    y = (f32(1.0) / b).astype(f32)  # libdevice.rcp_rn(b) (rcp.rn.ftz.f32; b in [2, 4)): IEEE reciprocal
    x2 = _ftz((_ftz(x) * k).astype(f32))
    q = (x2 * y).astype(f32)
    q = fma32(fma32(-b, q, x2), y, q)
    return fma32(fma32(-b, q, x2), y, q)


def _check(x, s) -> None:
    x, s = x.astype(f32), s.astype(f32)
    with np.errstate(all="ignore"):
        want = (_ftz(x) / s).astype(f32)  # the contract flushes subnormal x first
        got = fast_quotient(x, s)
    big = np.abs(want) >= 2.0**-100  # below, every code maps the quotient to zero (sign taken from x)
    bad = big & (got.view(i32) != want.view(i32))
    assert not bad.any(), f"{int(bad.sum())} quotients differ, e.g. {x[bad][0]!r} / {s[bad][0]!r}"
    assert not ((~big) & (np.abs(got) >= 2.0**-17)).any(), "a tiny quotient came out large"


def _rn32_exact(v) -> np.float32:
    """Round a Fraction to fp32, nearest-even, from exact comparisons (the ground truth for fma32)."""
    from fractions import Fraction

    c = np.float32(float(v))
    if Fraction(float(c)) == v:
        return c
    other = np.nextafter(c, np.float32(np.inf) if Fraction(float(c)) < v else np.float32(-np.inf))
    dc, do = abs(Fraction(float(c)) - v), abs(Fraction(float(other)) - v)
    if dc != do:
        return c if dc < do else other
    return c if int(np.array(c).view(np.int32)) % 2 == 0 else other


def test_fma_emulation_rounds_once():
    from fractions import Fraction

    rng = np.random.default_rng(11)
    n = 3000
    a = ((rng.random(n) + 1) * 2.0 ** rng.integers(-20, 20, n)).astype(f32)
    b = ((rng.random(n) + 1) * 2.0 ** rng.integers(-20, 20, n)).astype(f32)
    p = a.astype(f64) * b.astype(f64)
    # c near -p (cancellation), near half an fp32 ulp of p (ties) and far below p (wide exponent gaps)
    c = np.concatenate([(-p[:1000]).astype(f32), (p[1000:2000] * 2.0**-24 * (1 + 2.0**-20)).astype(f32),
                        (p[2000:] * 2.0 ** -rng.integers(25, 60, 1000)).astype(f32)])
    got = fma32(a, b, c)
    for i in range(n):
        want = _rn32_exact(Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i])))
        assert got[i] == want, (a[i], b[i], c[i], got[i], want)


@pytest.mark.parametrize("qmax", [7.0, 15.0, 31.0, 127.0, 6.0, 1.0, 448.0, 57344.0])
def test_block_like_quotients(qmax):
    rng = np.random.default_rng(int(qmax))
    n = 40_000
    for e in (-126, -125, -110, -60, -1, 0, 40, 120, 127):
        amax = np.minimum((rng.random(n) + 1.0) * 2.0**e, np.finfo(f32).max).astype(f32)
        s = (amax / f32(qmax)).astype(f32)
        s = np.where(s < 2.0**-126, f32(2.0**-126), s).astype(f32)
        x = ((rng.random(n) * 2 - 1) * amax).astype(f32)
        x[::5] = amax[::5]
        _check(x, s)


def test_ties_and_hard_divisors():
    rng = np.random.default_rng(7)
    n = 100_000
    s = ((rng.random(n) + 1) * 2.0**-3).astype(f32)
    x = ((rng.integers(-127, 127, n) + 0.5) * s).astype(f32)  # quotients at half-integers
    for xx in (x, np.nextafter(x, f32(np.inf)), np.nextafter(x, f32(-np.inf))):
        _check(xx, s)
    ones = np.full(n, np.nextafter(f32(2.0), f32(0)), f32) * (2.0 ** rng.integers(-120, 120, n)).astype(f32)
    _check(((rng.random(n) * 2 - 1) * 127).astype(f32) * ones, ones)  # significand 1.11...1
    _check(((rng.random(n) * 2 - 1) * 448).astype(f32), np.full(n, np.nextafter(f32(1), f32(2)), f32))
    bits = rng.integers(0x00800000, 0x7F000000, (2, n), dtype=np.int64).astype(i32).view(f32)
    keep = np.abs(bits[0].astype(f64) / bits[1].astype(f64)) < 6e4
    _check(bits[0][keep], bits[1][keep])


def test_one_correction_is_not_always_enough_without_the_second():
    """Sanity of the checker: without corrections the quotient is wrong often; the test can fail."""
    rng = np.random.default_rng(3)
    s = ((rng.random(50_000) + 1) * 0.1).astype(f32)
    x = ((rng.random(50_000) * 2 - 1) * 100).astype(f32)
    y = (f32(1.0) / s).astype(f32)
    naive = (x * y).astype(f32)
    assert (naive.view(i32) != (x / s).astype(f32).view(i32)).mean() > 0.1
