"""The division-free, correctly rounded arithmetic of the portable kernel path (HW=False: the interpreter and
Ascend): block scales RN(amax / qmax), per-block reciprocals RN(1/scale) and spec version 3's scaled values
RN(x * RN(1/scale)), against numpy's IEEE fp32 division and an exact float64 product, on random, adversarial
(near-midpoint) and boundary inputs, with and without an FMA-contracting interpreter. Runs the @triton.jit
helpers themselves (interpreter)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from agoq_core.formats.spec import list_formats
from agoq_triton_kernels import codes as C
from agoq_triton_kernels import kernels as K
from agoq_triton_kernels.testing import contracting_fma, fma32

f32, f64, i32 = np.float32, np.float64, np.int32


@triton.jit
def _scaled_kernel(x_ptr, s_ptr, o_ptr, N: tl.constexpr, QMAX: tl.constexpr):
    # the tile path: one "row" per element here (x [N, 1], scale [N])
    i = tl.arange(0, N)
    x = tl.load(x_ptr + i)[:, None]
    s = tl.load(s_ptr + i)
    tl.store(o_ptr + i, tl.reshape(K._exact_scaled_values(x, s, QMAX), (N,)))


@triton.jit
def _recip_kernel(s_ptr, k_ptr, r_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    k, r = K._exact_recip(tl.load(s_ptr + i))
    tl.store(k_ptr + i, k)
    tl.store(r_ptr + i, r)


@triton.jit
def _scale_kernel(a_ptr, o_ptr, N: tl.constexpr, QMAX: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(o_ptr + i, K._exact_scale(tl.load(a_ptr + i), QMAX))


@triton.jit
def _div_kernel(a_ptr, d_ptr, o_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(o_ptr + i, C.exact_div(tl.load(a_ptr + i), tl.load(d_ptr + i)))


def _interpreted() -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_scaled_kernel, InterpretedFunction)


pytestmark = pytest.mark.skipif(not _interpreted(), reason="interpreter-only check of the portable path")


def _pad(a: np.ndarray, fill: float) -> tuple[np.ndarray, int]:
    n = 1 << max(0, (len(a) - 1).bit_length())
    out = np.full(n, fill, f32)
    out[: len(a)] = a
    return out, n


def _run_scaled(x: np.ndarray, s: np.ndarray, qmax: float) -> np.ndarray:
    xp, n = _pad(x, 0.0)
    sp, _ = _pad(s, 1.0)
    out = torch.empty(n)
    _scaled_kernel[(1,)](torch.from_numpy(xp), torch.from_numpy(sp), out, N=n, QMAX=qmax)
    return out.numpy()[: len(x)]


def v3_scaled_values(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    """RN(x * r), r = 1/s rounded to 24 bits (its fp32 value when normal), as an exact float64 product rounded
    once: numpy only, written from docs/formats.md §3 step 6."""
    m, e = np.frexp(s.astype(f32))
    r = (f32(1.0) / m).astype(f64) * np.ldexp(1.0, -e)
    with np.errstate(under="ignore"):
        return (x.astype(f64) * r).astype(f32)


def _check_scaled(x, s, qmax: float) -> None:
    x, s = np.asarray(x, f32), np.asarray(s, f32)
    x = np.where(np.abs(x) < f32(2.0 ** -126), f32(0.0), x)  # the kernels flush subnormal inputs first
    want = v3_scaled_values(x, s)
    got = _run_scaled(x, s, qmax)
    big = np.abs(want) >= 2.0 ** -125
    bad = big & (got.view(i32) != want.view(i32))
    assert not bad.any(), (f"qmax={qmax}: {int(bad.sum())} scaled values differ, e.g. {x[bad][:3]!r} * 1/{s[bad][:3]!r}: "
                           f"{got[bad][:3]!r} != {want[bad][:3]!r}")
    # below 2**-125 every code maps the scaled value to a zero magnitude: only the sign and smallness matter
    small = ~big
    assert (np.abs(got[small]) < 2.0 ** -100).all() and (np.signbit(got[small]) == np.signbit(x[small])).all()


def _random_scales(rng, n, qmax):
    """Normal scales whose qmax multiple is finite (the contract's §3 step 5)."""
    top = int(np.floor(np.log2(np.finfo(f32).max / qmax)))  # s < 2**top: 125 for qmax 7, 127 for qmax 1
    return (rng.uniform(1.0, 2.0, n) * np.exp2(rng.integers(-126, top, n))).astype(f32)


QMAXES = [7.0, 1.0]  # one multiply per element (every qmax >= 4), and nf4's power-of-two-scaled x (qmax 1)


@pytest.mark.parametrize("qmax", QMAXES)
def test_random_scaled_values_over_every_binade(qmax):
    rng = np.random.default_rng(1)
    n = 1 << 14
    s = _random_scales(rng, n, qmax)
    x = (s.astype(f64) * qmax * rng.uniform(-1.0, 1.0, n)).astype(f32)
    x[::7] = (s[::7].astype(f64) * rng.uniform(-1.0, 1.0, len(x[::7])) * 2.0 ** -40).astype(f32)  # tiny values
    _check_scaled(x, s, qmax)


@pytest.mark.parametrize("qmax", QMAXES)
def test_scaled_values_next_to_rounding_midpoints(qmax):
    """x with x * RN(1/s) within an ulp fraction of a midpoint of v: where a reciprocal that is not correctly
    rounded, or a product rounded twice, lands on the other side."""
    rng = np.random.default_rng(2)
    n = 1 << 12
    s = _random_scales(rng, n, qmax)
    r = (f32(1.0) / s).astype(f64)
    q = (rng.uniform(1.0, 2.0, n) * np.exp2(rng.integers(-20, 16, n))).astype(f32)
    ulp = np.spacing(q).astype(f64)
    xs = []
    for frac in (0.5, -0.5, 0.0, 1.0):
        with np.errstate(over="ignore"):
            x32 = ((q.astype(f64) + frac * ulp) / np.where(r > 0, r, 1.0)).astype(f32)
        xs += [x32, np.nextafter(x32, f32(np.inf)), np.nextafter(x32, f32(-np.inf))]
    x, st = np.concatenate(xs), np.tile(s, len(xs))
    ok = np.abs(x) <= f32(np.finfo(f32).max)  # v up to 2**17 times the largest scales: drop the overflows
    _check_scaled(np.where(rng.random(len(x)) < 0.5, x, -x)[ok], st[ok], qmax)


def test_scaled_values_at_binade_edges_and_extreme_scales():
    s_all = np.array([2.0 ** -126, 2.0 ** -126 * 1.5, 2.0 ** 125, 2.0 ** 126, 2.0 ** 127, 3.4e38, 1.0, 1.9999999,
                      2.0, 3.0, 1.0000001], f32)
    for qmax in QMAXES:
        rows = []
        for si in s_all:
            if qmax >= 4 and si > 2.0 ** 126 / qmax:
                continue  # scale * qmax would overflow: not a scale of such a format
            for qv in (1.0, 2.0, 0.5, 1.9999999, 0.99999994, 127.0, 448.0, 57344.0, 7.0, 3.5, 2.0 ** -70):
                for d in (-2, -1, 0, 1, 2):
                    with np.errstate(over="ignore"):
                        x = np.float32(np.float64(si) * qv)
                        for _ in range(abs(d)):
                            x = np.nextafter(x, f32(np.inf) if d > 0 else f32(-np.inf))
                    if np.isfinite(x):
                        rows.append((x, si))
        x, s = map(np.array, zip(*rows))
        _check_scaled(x.astype(f32), s.astype(f32), qmax)


def test_reciprocals_are_correctly_rounded():
    """The per-block reciprocal RN(1/b) of b = scale * k in [2, 4), and RN(1/scale) = RN(1/b) * k where normal:
    random scales over every binade, every b within 2**11 ulps of 2 and of 4, and significands of all ones."""
    rng = np.random.default_rng(5)
    near2 = (np.float32(2.0).view(i32) + np.arange(0, 2048, dtype=i32)).view(f32)
    near4 = (np.float32(4.0).view(i32) - np.arange(1, 2049, dtype=i32)).view(f32)
    ones = (np.nextafter(f32(2.0), f32(0)) * np.exp2(np.arange(-126, 127, dtype=f64))).astype(f32)  # 1.11...1 x 2**e
    s = np.concatenate([_random_scales(rng, 1 << 13, 1.0), near2, near4, ones]).astype(f32)
    sp, n = _pad(s, 1.0)
    k, r = torch.empty(n), torch.empty(n)
    _recip_kernel[(1,)](torch.from_numpy(sp), k, r, N=n)
    k, r = k.numpy()[: len(s)], r.numpy()[: len(s)]
    b = (s * k).astype(f32)
    assert ((b >= 2.0) & (b < 4.0)).all()
    assert np.array_equal(r.view(i32), (f32(1.0) / b).astype(f32).view(i32))
    with np.errstate(all="ignore"):
        want = (f32(1.0) / s).astype(f32)
        got = (r * k).astype(f32)
    normal = want >= f32(2.0 ** -126)
    assert np.array_equal(got[normal].view(i32), want[normal].view(i32))


@pytest.mark.parametrize("qmax", QMAXES)
def test_scaled_values_unchanged_when_every_multiply_add_is_contracted(qmax):
    rng = np.random.default_rng(3)
    n = 1 << 12
    s = _random_scales(rng, n, qmax)
    x = (s.astype(f64) * rng.uniform(-qmax, qmax, n)).astype(f32)
    plain = _run_scaled(x, s, qmax)
    with contracting_fma() as seen:
        fused = _run_scaled(x, s, qmax)
    assert seen["fused"] > 0, "the FMA emulation fused nothing: it does not test anything"
    assert np.array_equal(plain.view(i32), fused.view(i32))
    _check_scaled(x, s, qmax)


# ---- the contraction hazard of spec version 3: the product x * r meets the encoder's rounding add ------------
@triton.jit
def _quantize_int8_kernel(x_ptr, c_ptr, s_ptr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.arange(0, ROWS)
    x = tl.load(x_ptr + rows[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :])
    codes, scale = K.quantize_tile(x, None, 0, 8, 127.0, False, False, False)
    tl.store(c_ptr + rows[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :], codes)
    tl.store(s_ptr + rows, scale)


def _contraction_sensitive_blocks(rows: int, block: int, seed: int) -> np.ndarray:
    """int8 blocks (absmax first) whose other elements have x * r within half an ulp of a tie k + 1/2 but not on
    it: RN(x * r) is the tie (rounded to even by the magic add), while a fused RN(x * r + 1.5 * 2**23) rounds the
    exact product to its side -- different codes exactly where the product is not rounded on its own."""
    rng = np.random.default_rng(seed)
    out = np.zeros((rows, block), f32)
    for i in range(rows):
        while True:
            amax = f32(rng.uniform(1.0, 2.0) * 2.0 ** int(rng.integers(-30, 30)))
            s = f32(amax / f32(127.0))
            r = f32(1.0) / s
            t = rng.integers(-126, 126, 4 * block) + 0.5
            cand = (t / np.float64(r)).astype(f32)
            cand = np.concatenate([cand, np.nextafter(cand, f32(np.inf)), np.nextafter(cand, f32(-np.inf))])
            p = cand.astype(f64) * np.float64(r)  # exact
            tie = np.concatenate([t, t, t])
            keep = ((p.astype(f32) == tie) & (p != tie) & (np.abs(cand) <= amax))
            if keep.sum() >= block - 1:
                break
        out[i, 0] = amax
        out[i, 1:] = cand[keep][: block - 1]
    return out


def _quantize_int8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows, block = x.shape
    c = torch.empty(rows, block, dtype=torch.int32)
    s = torch.empty(rows)
    _quantize_int8_kernel[(1,)](torch.from_numpy(x), c, s, ROWS=rows, BLOCK=block)
    return c.numpy(), s.numpy()


def test_scaled_values_meet_the_rounding_add_unfused_under_contraction():
    """The portable quantizer with every multiply-add contracted gives the reference's int8 codes on inputs where
    a fused x * r + 1.5 * 2**23 would round differently (the sign OR on the product's bits keeps it separate)."""
    from agoq_core.formats import reference as ref
    from agoq_core.formats.packing import unpack_codes
    from agoq_core.formats.spec import get_format

    x = _contraction_sensitive_blocks(4, 32, seed=7)
    spec = get_format("int8", 32)
    want_c, want_s = ref.quantize_blocks(torch.from_numpy(x.reshape(-1)), spec)
    want = unpack_codes(want_c, spec, x.size).numpy().reshape(x.shape)
    with contracting_fma() as seen:
        got, s = _quantize_int8(x)
    assert seen["fused"] > 0
    assert np.array_equal(s.view(i32), want_s.numpy().view(i32))
    assert np.array_equal(got, want)


def test_contraction_changes_codes_without_the_sign_or(monkeypatch):
    """Teeth: with the product handed to the encoder as is (no integer op on its bits), the emulated contraction
    changes codes on the same inputs (so the test above would catch a kernel that lets the compiler fuse)."""
    @triton.jit
    def naive_scaled_values(xf, scale, QMAX: tl.constexpr):
        k, rb = K._exact_recip(scale)
        return xf * (rb * k)[:, None]

    x = _contraction_sensitive_blocks(4, 32, seed=7)
    plain, _ = _quantize_int8(x)
    monkeypatch.setattr(K, "_exact_scaled_values", naive_scaled_values)
    unfused, _ = _quantize_int8(x)
    assert np.array_equal(unfused, plain)  # without contraction the naive product is the same value
    with contracting_fma():
        fused, _ = _quantize_int8(x)
    # each element sits on a tie of RN(x * r) whose even neighbour is the fused side about half the time
    assert (fused != plain).sum() >= x.size // 4


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
    amax = np.concatenate([bits.view(f32), _random_scales(rng, 4096, 1.0), np.array([0.0, 2.0 ** -126, 3.4028235e38], f32)])
    n = 1 << (len(amax) - 1).bit_length()
    a = np.zeros(n, f32)
    a[: len(amax)] = amax
    out = torch.empty(n)
    _scale_kernel[(1,)](torch.from_numpy(a), out, N=n, QMAX=qmax)
    got, want = out.numpy()[: len(amax)], _reference_scale(amax, qmax)
    bad = got.view(i32) != want.view(i32)
    assert not bad.any(), f"qmax={qmax}: scales differ for amax {amax[bad][:4]!r}: {got[bad][:4]!r} != {want[bad][:4]!r}"


def _run_div(a: np.ndarray, d: np.ndarray) -> np.ndarray:
    ap, n = _pad(a, 0.0)
    dp, _ = _pad(d, 1.0)
    out = torch.empty(n)
    _div_kernel[(1,)](torch.from_numpy(ap), torch.from_numpy(dp), out, N=n)
    return out.numpy()[: len(a)]


def _check_div(a, d) -> None:
    """exact_div against numpy's IEEE fp32 a / d: the same bits wherever that is normal or +inf; +0 where it
    is below 2**-126 (exact_div's documented flush)."""
    a, d = np.asarray(a, f32), np.asarray(d, f32)
    with np.errstate(all="ignore"):
        want = (a / d).astype(f32)
    want = np.where(want < f32(2.0 ** -126), f32(0.0), want)
    got = _run_div(a, d)
    bad = got.view(i32) != want.view(i32)
    assert not bad.any(), f"{int(bad.sum())} quotients differ, e.g. {a[bad][:3]!r} / {d[bad][:3]!r}: {got[bad][:3]!r} != {want[bad][:3]!r}"


def test_exact_div_over_every_binade_and_its_edges():
    """codes.exact_div (NVFP4's per-block RN(amax / 6), RN(t / S), RN(RN(1/S) / s_b) on the portable path):
    random normal a and d over the whole exponent range (overflow to +inf and the flush below 2**-126 both
    reached), a = 0, quotients next to rounding midpoints (a = d * (1 + (2k + 1) 2**-24) for d in [1, 2),
    rounded), next to 2**-126 and next to FLT_MAX, and the NVFP4 operands: amax / 6, t / S over the E4M3
    clamp's range, and RN(1/S) / s_b for every E4M3 value s_b."""
    rng = np.random.default_rng(17)
    n = 1 << 13

    def normals(k, lo=-126, hi=127):
        return (rng.uniform(1.0, 2.0, k) * np.exp2(rng.integers(lo, hi, k).astype(f64))).astype(f32)

    a, d = [normals(n), np.zeros(64, f32)], [normals(n), normals(64)]
    dm = rng.uniform(1.0, 2.0, 4096).astype(f32)  # midpoints: a = d * q with q one half-ulp off a representable
    q = (1.0 + (2 * rng.integers(0, 1 << 22, 4096) + 1) * 2.0 ** -24) * np.exp2(rng.integers(-20, 20, 4096))
    a.append((dm.astype(f64) * q).astype(f32)), d.append(dm)
    for edge in (2.0 ** -126, 3.4028234663852886e38):  # quotients within a few ulps of the bounds
        dd = normals(2048, -20, 20)
        aa = (edge * dd.astype(f64) * (1 + rng.integers(-8, 9, 2048) * 2.0 ** -23)).astype(f32)
        ok = np.isfinite(aa) & (aa >= f32(2.0 ** -126))
        a.append(aa[ok]), d.append(dd[ok])
    amax = normals(2048)
    a.append(amax), d.append(np.full(2048, 6.0, f32))  # RN(amax / 6)
    a.append(normals(2048, -20, 40)), d.append(normals(2048, -100, 115))  # t / S
    e4m3 = torch.arange(1, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    e4m3 = e4m3[e4m3 >= 2.0 ** -9]
    r = (f32(1.0) / normals(len(e4m3) * 8, -100, 115)).astype(f32)  # RN(1/S)
    a.append(r), d.append(np.tile(e4m3, 8).astype(f32))
    _check_div(np.concatenate(a), np.concatenate(d))


def test_exact_div_unchanged_when_every_multiply_add_is_contracted():
    rng = np.random.default_rng(18)
    a = (rng.uniform(1.0, 2.0, 4096) * np.exp2(rng.integers(-60, 60, 4096))).astype(f32)
    d = (rng.uniform(1.0, 2.0, 4096) * np.exp2(rng.integers(-60, 60, 4096))).astype(f32)
    plain = _run_div(a, d)
    with contracting_fma() as seen:
        fused = _run_div(a, d)
    assert seen["fused"] > 0, "the FMA emulation fused nothing: it does not test anything"
    assert np.array_equal(plain.view(i32), fused.view(i32))
    _check_div(a, d)


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
