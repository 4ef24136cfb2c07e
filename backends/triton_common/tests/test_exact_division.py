"""The division-free, correctly rounded quotients of the portable kernel path (HW=False: the interpreter and
Ascend), against numpy's IEEE fp32 division, on random, adversarial (near-midpoint) and boundary inputs,
with and without an FMA-contracting interpreter. Runs the @triton.jit helpers themselves (interpreter)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from agoq_core.formats.spec import list_formats
from agoq_triton_kernels import kernels as K
from agoq_triton_kernels.testing import contracting_fma, fma32

f32, f64, i32 = np.float32, np.float64, np.int32


@triton.jit
def _quotient_kernel(x_ptr, s_ptr, o_ptr, N: tl.constexpr):
    # the tile path: one "row" per element here (x [N, 1], scale [N])
    i = tl.arange(0, N)
    x = tl.load(x_ptr + i)[:, None]
    s = tl.load(s_ptr + i)
    tl.store(o_ptr + i, tl.reshape(K._exact_scaled_values(x, s), (N,)))


@triton.jit
def _scale_kernel(a_ptr, o_ptr, N: tl.constexpr, QMAX: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(o_ptr + i, K._exact_scale(tl.load(a_ptr + i), QMAX))


def _interpreted() -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_quotient_kernel, InterpretedFunction)


pytestmark = pytest.mark.skipif(not _interpreted(), reason="interpreter-only check of the portable path")


def _run_quotient(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    n = 1 << max(0, (len(x) - 1).bit_length())
    xp = np.zeros(n, f32)
    sp = np.ones(n, f32)
    xp[: len(x)], sp[: len(s)] = x, s
    out = torch.empty(n)
    _quotient_kernel[(1,)](torch.from_numpy(xp), torch.from_numpy(sp), out, N=n)
    return out.numpy()[: len(x)]


def _check_quotients(x, s) -> None:
    x, s = np.asarray(x, f32), np.asarray(s, f32)
    x = np.where(np.abs(x) < f32(2.0 ** -126), f32(0.0), x)  # the kernels flush subnormal inputs first
    with np.errstate(all="ignore"):
        want = (x / s).astype(f32)
    got = _run_quotient(x, s)
    big = np.abs(want) >= 2.0 ** -80
    bad = big & (got.view(i32) != want.view(i32))
    assert not bad.any(), (f"{int(bad.sum())} quotients differ, e.g. {x[bad][:3]!r} / {s[bad][:3]!r}: "
                           f"{got[bad][:3]!r} != {want[bad][:3]!r}")
    # below 2**-80 every code maps the quotient to a zero magnitude: only the sign and smallness matter
    small = ~big
    assert (np.abs(got[small]) < 2.0 ** -60).all() and (np.signbit(got[small]) == np.signbit(x[small])).all()


def _random_scales(rng, n):
    return (rng.uniform(1.0, 2.0, n) * np.exp2(rng.integers(-125, 110, n))).astype(f32)


def test_random_quotients_over_every_binade():
    rng = np.random.default_rng(1)
    n = 1 << 14
    s = _random_scales(rng, n)
    qmax = rng.choice([1.0, 6.0, 7.0, 15.0, 31.0, 127.0, 448.0, 57344.0], n)
    x = (s.astype(f64) * qmax * rng.uniform(-1.0, 1.0, n)).astype(f32)
    x[::7] = (s[::7].astype(f64) * rng.uniform(-1.0, 1.0, len(x[::7])) * 2.0 ** -40).astype(f32)  # tiny quotients
    _check_quotients(x, s)


def test_quotients_next_to_rounding_midpoints():
    """x = RN((q +- ulp/2) * s) and its neighbours: the quotient lands within an ulp fraction of a midpoint,
    where an approximate division rounds the wrong way."""
    rng = np.random.default_rng(2)
    n = 1 << 12
    s = _random_scales(rng, n)
    q = (rng.uniform(1.0, 2.0, n) * np.exp2(rng.integers(-20, 16, n))).astype(f32)
    ulp = np.spacing(q).astype(f64)
    xs = []
    for frac in (0.5, -0.5, 0.0, 1.0):
        x = (q.astype(f64) + frac * ulp) * s.astype(f64)
        x32 = x.astype(f32)
        xs += [x32, np.nextafter(x32, f32(np.inf)), np.nextafter(x32, f32(-np.inf))]
    x = np.concatenate(xs)
    _check_quotients(np.where(rng.random(len(x)) < 0.5, x, -x), np.tile(s, len(xs)))


def test_quotients_at_binade_edges_and_extreme_scales():
    s = np.array([2.0 ** -126, 2.0 ** -126 * 1.5, 2.0 ** 127, 3.4e38, 1.0, 1.9999999, 2.0, 3.0, 1.0000001], f32)
    rows = []
    for si in s:
        for qv in (1.0, 2.0, 0.5, 1.9999999, 0.99999994, 127.0, 448.0, 57344.0, 7.0, 3.5, 2.0 ** -70):
            for d in (-2, -1, 0, 1, 2):
                x = np.float32(np.float64(si) * qv)
                for _ in range(abs(d)):
                    x = np.nextafter(x, f32(np.inf) if d > 0 else f32(-np.inf))
                if np.isfinite(x):
                    rows.append((x, si))
    x, s = map(np.array, zip(*rows))
    _check_quotients(x.astype(f32), s.astype(f32))


def _reference_scale(amax: np.ndarray, qmax: float) -> np.ndarray:
    with np.errstate(all="ignore"):
        s = (amax / f32(qmax)).astype(f32)  # IEEE fp32 division, subnormal results kept
    return np.where(s < f32(2.0 ** -126), f32(0.0), s)


@pytest.mark.parametrize("qmax", sorted({float(f.qmax) for f in list_formats()}))
def test_scales_exact_including_the_subnormal_boundary(qmax):
    """amax / qmax correctly rounded, and flushed to 0 exactly where IEEE's result is below 2**-126: every
    amax within 2**12 ulps of qmax * 2**-126, plus random amax over the whole range."""
    rng = np.random.default_rng(int(qmax))
    edge = np.float32(qmax * 2.0 ** -126)
    bits = edge.view(i32) + np.arange(-2048, 2048, dtype=i32)
    amax = np.concatenate([bits.view(f32), _random_scales(rng, 4096), np.array([0.0, 2.0 ** -126, 3.4028235e38], f32)])
    n = 1 << (len(amax) - 1).bit_length()
    a = np.zeros(n, f32)
    a[: len(amax)] = amax
    out = torch.empty(n)
    _scale_kernel[(1,)](torch.from_numpy(a), out, N=n, QMAX=qmax)
    got, want = out.numpy()[: len(amax)], _reference_scale(amax, qmax)
    bad = got.view(i32) != want.view(i32)
    assert not bad.any(), f"qmax={qmax}: scales differ for amax {amax[bad][:4]!r}: {got[bad][:4]!r} != {want[bad][:4]!r}"


def test_quotients_unchanged_when_every_multiply_add_is_contracted():
    rng = np.random.default_rng(3)
    n = 1 << 12
    s = _random_scales(rng, n)
    x = (s.astype(f64) * rng.uniform(-127.0, 127.0, n)).astype(f32)
    plain = _run_quotient(x, s)
    with contracting_fma() as seen:
        fused = _run_quotient(x, s)
    assert seen["fused"] > 0, "the FMA emulation fused nothing: it does not test anything"
    assert np.array_equal(plain.view(i32), fused.view(i32))
    _check_quotients(x, s)


def test_fma32_is_a_single_rounding():
    """The emulation's FMA against exact rational arithmetic, on cases where two roundings differ."""
    from fractions import Fraction

    rng = np.random.default_rng(4)
    a = rng.uniform(1, 2, 2000).astype(f32)
    b = rng.uniform(1, 2, 2000).astype(f32)
    c = -(a.astype(f64) * b.astype(f64)).astype(f32)  # a*b + c is the (exact) rounding error of a*b
    got = fma32(a, b, c)
    for i in range(0, 2000, 50):
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        assert Fraction(float(got[i])) == exact  # representable: the error of a product is exact
    assert (got != (a * b + c)).any()  # two roundings would give 0 here
