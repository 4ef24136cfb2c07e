"""The GPU scaled values of kernels._scaled_values (FAST_DIV, spec version 3) replayed on CPU.

libdevice is not available in Triton's interpreter, so the FAST_DIV path only runs on GPUs; here the same
sequence of fp32 operations (rcp.rn and mul.rn with flush-to-zero, as Triton's libdevice reflection compiles
them) is replayed in numpy and compared, bit for bit where the contract needs it, with RN(x * r), r = 1/scale
rounded to 24 bits, as an exact float64 product rounded once."""
from __future__ import annotations

import numpy as np
import pytest

from agoq_triton_kernels.testing import fma32

f32, f64, i32 = np.float32, np.float64, np.int32


def _ftz(v: np.ndarray) -> np.ndarray:
    return np.where(np.abs(v) < f32(2.0**-126), f32(0.0), v).astype(f32)


def fast_scaled_values(x: np.ndarray, scale: np.ndarray, qmax: float) -> np.ndarray:
    """kernels._scaled_values, operation by operation: per row k, y = rcp.rn(scale * k) (b in [2, 4): an IEEE
    reciprocal), r = y * k (exact, normal for qmax >= 4); per element v = mul.rn.ftz(x, r), or for qmax < 4
    mul.rn.ftz(mul.rn.ftz(x, k), y). The FTZ multiply flushes a subnormal x to +-0 (the contract's step 2)."""
    k = ((255 - ((scale.view(i32) >> 23) & 0xFF)) << 23).astype(i32).view(f32)
    b = (scale * k).astype(f32)
    y = (f32(1.0) / b).astype(f32)
    with np.errstate(under="ignore"):
        if qmax >= 4:
            return _ftz((_ftz(x) * (y * k).astype(f32)).astype(f32))
        return _ftz((_ftz((_ftz(x) * k).astype(f32)) * y).astype(f32))


def v3_scaled_values(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    m, e = np.frexp(scale.astype(f32))
    r = (f32(1.0) / m).astype(f64) * np.ldexp(1.0, -e)
    with np.errstate(under="ignore"):
        return (_ftz(x).astype(f64) * r).astype(f32)


def _check(x, s, qmax) -> None:
    x, s = x.astype(f32), s.astype(f32)
    want = v3_scaled_values(x, s)
    got = fast_scaled_values(x, s, qmax)
    big = np.abs(want) >= 2.0**-125  # below, every code maps the value to zero (FP8 takes the sign from x)
    bad = big & (got.view(i32) != want.view(i32))
    assert not bad.any(), f"{int(bad.sum())} scaled values differ, e.g. {x[bad][0]!r} * 1/{s[bad][0]!r}"
    assert not ((~big) & (np.abs(got) >= 2.0**-17)).any(), "a tiny value came out large"
    assert (np.signbit(got[got != 0]) == np.signbit(x[got != 0])).all()


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
def test_block_like_scaled_values(qmax):
    rng = np.random.default_rng(int(qmax))
    n = 40_000
    for e in (-126, -125, -110, -60, -1, 0, 40, 120, 127):
        amax = np.minimum((rng.random(n) + 1.0) * 2.0**e, np.finfo(f32).max).astype(f32)
        with np.errstate(over="ignore"):
            s = (amax / f32(qmax)).astype(f32)
            s = np.where(np.isinf(s * f32(qmax)), (s.view(i32) - 1).view(f32), s)  # §3 step 5
        s = np.where(s < 2.0**-126, f32(2.0**-126), s).astype(f32)
        x = ((rng.random(n) * 2 - 1) * amax).astype(f32)
        x[::5] = amax[::5]
        _check(x, s, qmax)


def test_ties_and_hard_divisors():
    rng = np.random.default_rng(7)
    n = 100_000
    s = ((rng.random(n) + 1) * 2.0**-3).astype(f32)
    r = (f32(1.0) / s).astype(f64)
    x = ((rng.integers(-127, 127, n) + 0.5) / r).astype(f32)  # products next to half-integers
    for xx in (x, np.nextafter(x, f32(np.inf)), np.nextafter(x, f32(-np.inf))):
        _check(xx, s, 127.0)
    ones = np.full(n, np.nextafter(f32(2.0), f32(0)), f32) * (2.0 ** rng.integers(-120, 120, n)).astype(f32)
    _check(((rng.random(n) * 2 - 1) * 127).astype(f32) * ones, ones, 127.0)  # significand 1.11...1
    _check(((rng.random(n) * 2 - 1) * 448).astype(f32), np.full(n, np.nextafter(f32(1), f32(2)), f32), 448.0)
    bits = rng.integers(0x00800000, 0x7E000000, (2, n), dtype=np.int64).astype(i32).view(f32)
    keep = np.abs(bits[0].astype(f64) / bits[1].astype(f64)) < 6e4
    for qmax in (7.0, 1.0):
        _check(bits[0][keep], bits[1][keep], qmax)


def test_nf4_scales_above_2_126_keep_the_reciprocal_bits():
    """qmax 1: a single multiply by the subnormal (and, with FTZ, flushed) reciprocal would be wrong there;
    the kernel's power-of-two-scaled x is right."""
    rng = np.random.default_rng(8)
    n = 50_000
    s = (rng.uniform(1.0, 2.0, n) * 2.0**127).astype(f32)
    x = ((rng.random(n) * 2 - 1) * s).astype(f32)
    _check(x, s, 1.0)
    with pytest.raises(AssertionError, match="scaled values differ"):  # teeth: one multiply by the subnormal r
        _check(x, s, 7.0)


def test_v2_and_v3_differ():
    """Sanity of the checker: RN(x * RN(1/s)) is not RN(x / s) often (the contract changed); the test can fail."""
    rng = np.random.default_rng(3)
    s = ((rng.random(50_000) + 1) * 0.1).astype(f32)
    x = ((rng.random(50_000) * 2 - 1) * 100).astype(f32)
    assert (v3_scaled_values(x, s).view(i32) != (x / s).astype(f32).view(i32)).mean() > 0.1


def fast_scaled_values_x4(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """kernels._scaled_values_x4 (NF4 with the bucket table on CUDA), operation by operation: per row
    m = min((rcp.rn(scale * k) * 4) * k, largest fp32), per element mul.rn.ftz(x, m)."""
    k = ((255 - ((scale.view(i32) >> 23) & 0xFF)) << 23).astype(i32).view(f32)
    y = (f32(1.0) / (scale * k).astype(f32)).astype(f32)
    with np.errstate(over="ignore", under="ignore"):
        m = np.minimum(((y * f32(4.0)).astype(f32) * k).astype(f32), np.finfo(f32).max).astype(f32)
        return _ftz((_ftz(x) * m).astype(f32))


def _table_codes(v4: np.ndarray) -> np.ndarray:
    """codes.bucket_encode(v4, encode_lut("nf4"), 4.0, 16) in numpy: bucket RNE(v4 * 4) + 16 (& 63)."""
    from agoq_triton_kernels.layout import encode_lut

    table = np.array(encode_lut("nf4"), dtype=np.int64)
    with np.errstate(invalid="ignore"):
        kf = (v4 * f32(4.0)).astype(f32) + f32(12582912.0 + 16)  # exact product, then one rounding add
    w = table[kf.astype(f32).view(i32) & 63]
    t = (w & 0xFFFFFFFF).astype(np.uint32).view(f32)
    return (w >> 32) + (v4 > t)


@pytest.mark.parametrize("e", [-126, -125, -124, -60, 0, 60, 125, 126, 127])
def test_nf4_x4_multiplier_codes_equal_the_contracts(e):
    """The CUDA NF4 path multiplies by m = 4 RN(1/scale) and reads the bucket table in that domain: its codes
    equal those of v = RN(x * RN(1/scale)) for every scale of an nf4 block (qmax 1: scale = absmax), including
    absmax > 2**126 (RN(1/scale) subnormal), absmax just above 2**-126 (m near 2**128) and absmax = 2**-126
    exactly (m = 2**128 overflows and is clamped)."""
    import torch

    from agoq_core.formats import reference as ref
    from agoq_core.formats.spec import get_format

    rng = np.random.default_rng(e + 200)
    n = 60_000
    s = np.minimum((rng.uniform(1.0, 2.0, n) * 2.0**e), np.finfo(f32).max).astype(f32)
    if e == -126:
        s[: n // 2] = f32(2.0**-126)
    x = ((rng.random(n) * 2 - 1) * s).astype(f32)
    x[::7] = s[::7]
    x[1::7] = -s[1::7]
    if e == -126:  # a block with absmax 2**-126 holds only 0, +-2**-126 and flushed subnormals
        x[: n // 2] = rng.choice(np.array([0.0, 2.0**-126, -2.0**-126, 2.0**-130], dtype=f32), n // 2)
    want = ref.encode(torch.from_numpy(v3_scaled_values(x, s)), get_format("nf4")).numpy()
    got = _table_codes(fast_scaled_values_x4(x, s))
    bad = got != want
    assert not bad.any(), f"{int(bad.sum())} codes differ, e.g. x={x[bad][0]!r} scale={s[bad][0]!r}"


# ---- the scale: RN(amax / qmax) without a division (kernels._div_const_rn, CUDA FAST_DIV) ----------------------
def div_const_rn(a: np.ndarray, q: float) -> np.ndarray:
    """kernels._div_const_rn, operation by operation: q0 = RN(a * RN(1/q)) (a plain multiply: FMUL, no FTZ),
    r = fma(-q0, q, a), q1 = fma(r, RN(1/q), q0), then +0 below 2**-126."""
    rq = f32(1.0 / q)
    with np.errstate(under="ignore", over="ignore", invalid="ignore"):
        q0 = (a * rq).astype(f32)
        q1 = fma32(fma32(-q0, f32(q), a), rq, q0)
    return np.where(q1 < f32(2.0**-126), f32(0.0), q1).astype(f32)


def _binade(e: int, step: int = 1) -> np.ndarray:
    m = np.arange(0, 1 << 23, step, dtype=np.int64)
    m = np.unique(np.concatenate([m, np.arange((1 << 23) - 4096, 1 << 23)]))
    return (m | ((e + 127) << 23)).astype(i32).view(f32)


def test_every_registered_qmax_is_one_the_kernel_checked():
    """kernels.quantize_tile takes _div_const_rn only for the qmax listed there (the ones replayed below); a format
    added to the registry with another qmax would fall back to div.rn silently, so it must be added to both."""
    import inspect

    from agoq_core.formats.spec import list_formats
    from agoq_triton_kernels import kernels

    src = inspect.getsource(kernels)
    for spec in list_formats():
        if spec.qmax != 1.0:
            assert f"QMAX == {float(spec.qmax)!r}" in src and spec.qmax in _CHECKED_QMAX, spec.name


_CHECKED_QMAX = [7.0, 15.0, 31.0, 127.0, 6.0, 448.0, 57344.0]


@pytest.mark.parametrize("qmax", _CHECKED_QMAX)
def test_scale_division_by_the_constant_is_correctly_rounded(qmax):
    """The replay against RN(a / qmax) (float64 quotient, then fp32: exact here, no quotient of these divisors lies
    within 2**-53 of an fp32 midpoint) with the contract's flush below 2**-126, for every 61st mantissa and the
    last 4,096 of the binades where a step could leave the scaled pattern: the bottom 31 (the quotient, its first
    guess q0 or the remainder r subnormal), the top 3, and a generic one. Run with every mantissa (step 1) on
    2026-12-07: no input differed. Also: Python's 1 / qmax rounded to fp32 (what the kernel's constexpr becomes) is
    RN(1 / qmax), checked exactly."""
    from fractions import Fraction

    rq = f32(1.0 / qmax)
    near = [np.nextafter(rq, f32(0)), rq, np.nextafter(rq, f32(1))]
    assert min(near, key=lambda t: abs(Fraction(float(t)) - Fraction(1, int(qmax)))) == rq
    for e in list(range(-126, -95)) + [0, 125, 126, 127]:
        a = _binade(e, 61)
        with np.errstate(under="ignore"):
            want = (a.astype(f64) / qmax).astype(f32)
        want = np.where(want < f32(2.0**-126), f32(0.0), want).astype(f32)
        got = div_const_rn(a, qmax)
        bad = got.view(i32) != want.view(i32)
        assert not bad.any(), f"{int(bad.sum())} differ in 2**{e}, e.g. {a[bad][0]!r} / {qmax}"


def test_scale_division_replay_can_fail():
    """Without the correcting FMA the first guess is off by an ulp for some inputs: the check above would see it."""
    a = _binade(0, 61)
    with np.errstate(under="ignore"):
        q0 = (a * f32(1.0 / 7.0)).astype(f32)
    assert (q0.view(i32) != (a.astype(f64) / 7.0).astype(f32).view(i32)).any()
