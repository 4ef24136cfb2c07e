"""Ascend hardware hazards, emulated in Triton's interpreter on the agoq-ascend launch path (risks 1-3 of
docs/backends/ascend.md): the codes must be bit-exact with the reference

* when every fp32 division the interpreter executes comes back one ulp off (the kernels must not divide);
* when every multiply feeding an add is contracted into a single-rounding FMA (spec version 3's scaled value
  x * RN(1/scale) before the encoder's rounding add, accumulate's decode * scale + g, reduce_requantize's sum
  of dequantized chunks) -- and the same emulation does change the result once the kernels' materialisation of
  the product is taken out (the check has teeth; for the scaled values: test_exact_division);
* for partial last blocks of odd sizes, with guard bytes around every output buffer left untouched.
"""
from __future__ import annotations

import pytest
import torch
import triton.language as tl  # noqa: F401  (the interpreter wants it in the globals of the @triton.jit helpers below)

from agoq_core.formats import reference as ref
from agoq_core.formats.spec import get_format
from agoq_triton_kernels.testing import contracting_fma, inexact_division

FORMATS = ["int4", "int5", "int6", "int8", "fp4_e2m1", "nf4", "fp8_e4m3", "fp8_e5m2"]


def _x(n, seed, spread=8):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-spread, spread, (n,), generator=g).float())
    if n > 40:
        x[3] = float("nan")
        x[33:36] = 0.0
    return x


def _quantize(la, x, spec):
    codes = torch.empty(spec.code_bytes(x.numel()), dtype=torch.uint8)
    scales = torch.empty(spec.num_blocks(x.numel()))
    la.quantize(x, spec, codes, scales)
    return codes, scales


def _same(a, b):
    """Bit-identical fp32 tensors, any NaN matching any NaN."""
    return (torch.equal(a.isnan(), b.isnan())
            and torch.equal(a.view(torch.int32).masked_fill(a.isnan(), 0), b.view(torch.int32).masked_fill(b.isnan(), 0)))


@pytest.mark.parametrize("fmt", FORMATS)
def test_codes_do_not_depend_on_hardware_division(interp_backend, fmt):
    spec = get_format(fmt)
    x = _x(3 * spec.block + 5, seed=11)
    g = _x(x.numel(), seed=12)
    la = interp_backend.launcher
    want_c, want_s = ref.quantize_blocks(x, spec)
    acc_c, acc_s = ref.accumulate(want_c, want_s, spec, x.numel(), g)
    for mode in ("up", "alternate"):
        with inexact_division(mode):
            c, s = _quantize(la, x, spec)
            c2, s2 = c.clone(), s.clone()
            la.accumulate(c2, s2, spec, g)
        assert torch.equal(c, want_c) and _same(s, want_s), (fmt, mode)
        assert torch.equal(c2, acc_c) and _same(s2, acc_s), (fmt, mode)


def test_the_inexact_division_is_in_effect():
    """The patch must perturb a division the interpreter executes (or the test above proves nothing)."""
    import triton
    import triton.language as tl

    @triton.jit
    def div(a_ptr, b_ptr, o_ptr):
        i = tl.arange(0, 16)
        tl.store(o_ptr + i, tl.math.div_rn(tl.load(a_ptr + i), tl.load(b_ptr + i)))

    a, b = torch.rand(16) + 1, torch.rand(16) + 1
    o = torch.empty(16)
    with inexact_division() as seen:
        div[(1,)](a, b, o)
    assert seen["divisions"] == 1 and not torch.equal(o, a / b)


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8", "nvfp4"])
def test_microscaling_codes_execute_no_division_and_survive_contraction(interp_backend, fmt):
    """The microscaling formats agoq-ascend claims: MX scales are powers of two; NVFP4's tensor scale
    (tensor_scale_kernel) and its per-block RN(RN(amax / 6) / S) and RN(RN(1/S) / s_b) are division-free
    (codes.exact_div). Counted: not one fp32 division executes in a whole quantize (tensor scale included), and
    the bits stay the reference's with every multiply-add contracted; mxfp4 / mxfp8 accumulate likewise."""
    spec = get_format(fmt)
    x = _x(7 * spec.block + 5, seed=13, spread=30)
    g = _x(x.numel(), seed=14, spread=30)
    la = interp_backend.launcher
    want_c, want_s = ref.quantize_blocks(x, spec)
    with inexact_division("up") as seen:
        c, s = _quantize(la, x, spec)
        if not spec.tensor_scaled:
            c2, s2 = c.clone(), s.clone()
            la.accumulate(c2, s2, spec, g)
    assert seen["divisions"] == 0, f"{fmt}: {seen['divisions']} fp32 divisions executed on the portable path"
    assert torch.equal(c, want_c) and _same(s, want_s), fmt
    if not spec.tensor_scaled:
        acc_c, acc_s = ref.accumulate(want_c, want_s, spec, x.numel(), g)
        assert torch.equal(c2, acc_c) and _same(s2, acc_s), f"{fmt}: accumulate"
    with contracting_fma() as fused:
        c, s = _quantize(la, x, spec)
    assert fused["fused"] > 0 or fmt != "nvfp4"  # exact_div's remainders are multiply-adds
    assert torch.equal(c, want_c) and _same(s, want_s), f"{fmt} under contraction"


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_unchanged_by_fma_contraction(interp_backend, fmt):
    """v = x * RN(1/scale) meets the int encoder's (v + 1.5 * 2**23) and FP8/FP4's subnormal adds: with every
    multiply-add contracted the codes stay the reference's, on the self-test's near-midpoint blocks."""
    from agoq_ascend.selftest import self_test_vectors

    spec = get_format(fmt)
    x, _ = self_test_vectors(spec.block)
    want_c, want_s = ref.quantize_blocks(x, spec)
    with contracting_fma() as seen:
        c, s = _quantize(interp_backend.launcher, x, spec)
    assert seen["fused"] > 0
    assert torch.equal(c, want_c) and _same(s, want_s), fmt


def _accumulate_and_reduce(la, spec, seed):
    n = 4 * spec.block + 3
    q_c, q_s = ref.quantize_blocks(_x(n, seed, spread=4), spec)
    g = _x(n, seed + 1, spread=4) * 0.37
    c, s = q_c.clone(), q_s.clone()
    la.accumulate(c, s, spec, g)
    parts = [ref.quantize_blocks(_x(n, seed + 10 + r, spread=4), spec) for r in range(3)]
    codes = torch.stack([p[0] for p in parts])
    scales = torch.stack([p[1] for p in parts])
    co, so = torch.empty_like(codes[0]), torch.empty_like(scales[0])
    la.reduce_requantize(codes, scales, spec, n, co, so)
    want_acc = ref.accumulate(q_c, q_s, spec, n, g)
    want_red = ref.reduce_requantize(codes, scales, spec, n)
    return (c, s, co, so), (*want_acc, *want_red)


@pytest.mark.parametrize("fmt", FORMATS + ["mxfp4", "mxfp8"])
def test_accumulate_and_reduce_unchanged_by_fma_contraction(interp_backend, fmt):
    spec = get_format(fmt)
    with contracting_fma() as seen:
        got, want = _accumulate_and_reduce(interp_backend.launcher, spec, seed=5)
    # mxfp8 offers the emulation nothing to fuse: the decoded product is materialised, the requantize scale is a
    # power of two and the FP8 encode is integer logic; every other format has some multiply-add
    assert seen["fused"] > 0 or fmt == "mxfp8"
    assert torch.equal(got[0], want[0]) and _same(got[1], want[1]), f"{fmt}: accumulate"
    assert torch.equal(got[2], want[2]) and _same(got[3], want[3]), f"{fmt}: reduce_requantize"


def test_contraction_changes_results_without_the_materialised_product(interp_backend, monkeypatch):
    """Teeth: with the product materialisation replaced by the identity, the emulated contraction does
    change codes (so the test above would catch a kernel that lets the compiler fuse)."""
    import triton

    from agoq_triton_kernels import kernels as K

    @triton.jit
    def identity(p, opaque_zero):
        return p

    monkeypatch.setattr(K, "_materialise", identity)
    differ = 0
    for fmt in ("int8", "fp8_e4m3"):
        spec = get_format(fmt)
        for seed in range(2):
            with contracting_fma():
                got, want = _accumulate_and_reduce(interp_backend.launcher, spec, seed=20 + seed)
            differ += sum(not torch.equal(a, b) for a, b in zip(got, want))
    assert differ > 0


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n", [1, 3, 7, 61, 131, 259])
def test_partial_last_blocks_write_nothing_past_the_end(interp_backend, fmt, n):
    """Odd sizes (a ragged last block, pack groups cut short) for every op; guard bytes before and after
    each output buffer must be untouched, and results bit-exact."""
    spec = get_format(fmt, 128)
    la = interp_backend.launcher
    x = _x(n, seed=n)
    nb, cb, guard = spec.num_blocks(n), spec.code_bytes(n), 64
    cbuf = torch.full((cb + 2 * guard,), 0xA5, dtype=torch.uint8)
    sbuf = torch.full((nb + 2 * guard,), -7.0)
    codes, scales = cbuf[guard:guard + cb], sbuf[guard:guard + nb]
    la.quantize(x, spec, codes, scales)
    wc, ws = ref.quantize_blocks(x, spec)
    assert torch.equal(codes, wc) and _same(scales, ws)
    g = _x(n, seed=n + 1)
    la.accumulate(codes, scales, spec, g)
    ac, as_ = ref.accumulate(wc, ws, spec, n, g)
    assert torch.equal(codes, ac) and _same(scales, as_)
    obuf = torch.full((n + 2 * guard,), -3.0)
    la.dequantize(codes, scales, spec, obuf[guard:guard + n])
    assert _same(obuf[guard:guard + n], ref.dequantize_blocks(ac, as_, spec, n))
    both = torch.stack([codes, wc]), torch.stack([scales, ws])
    la.reduce_requantize(*both, spec, n, codes, scales)
    rc, rs = ref.reduce_requantize(*both, spec, n)
    assert torch.equal(codes, rc) and _same(scales, rs)
    for buf, fill in ((cbuf, 0xA5), (sbuf, -7.0), (obuf, -3.0)):
        assert (buf[:guard] == fill).all() and (buf[-guard:] == fill).all(), "a write went past the buffer"
