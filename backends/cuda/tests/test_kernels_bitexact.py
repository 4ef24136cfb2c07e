"""The Triton codecs against the reference oracle, bit for bit: every format x dtype x odd shapes x
special values; dequantize to every output dtype; fused accumulate and reduce-requantize."""
from __future__ import annotations

import pytest
import torch

from agoq_core.formats import reference as ref
from agoq_core.formats.spec import get_format, list_formats
from agoq_cuda import launch
from cuda_inputs import assert_bits_equal, assert_roundtrip_bitexact, poisoned_q, special_blocks

FORMATS = [s.name for s in list_formats()]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
_DT_IDS = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


def _blocks(fmt: str) -> list[int]:
    # the default, the smallest legal block, and two non-powers of two (lanes padded to 32 and 512)
    return sorted({get_format(fmt).block, 8, 24, 264})


CASES = [(f, b) for f in FORMATS for b in _blocks(f)]


@pytest.mark.parametrize("dtype", DTYPES, ids=_DT_IDS.get)
@pytest.mark.parametrize("fmt,block", CASES, ids=[f"{f}-b{b}" for f, b in CASES])
def test_quantize_dequantize_special_values(fmt, block, dtype, device):
    spec = get_format(fmt, block)
    assert_roundtrip_bitexact(launch, special_blocks(spec, block, seed=block).to(dtype), spec, device, DTYPES)


@pytest.mark.parametrize("fmt", ["int4", "int5", "int6", "nf4", "fp8_e4m3"])
@pytest.mark.parametrize("n", [1, 7, 23, 24, 25, 3 * 24 + 5, 40 * 24 + 13])
def test_odd_shapes_and_many_tiles(fmt, n, device):
    """Ragged tails, a single element, partial pack groups; tiles of one block on three programs so
    the persistent loop strides over many tiles."""
    spec = get_format(fmt, 24)
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * 2
    codes, scales = poisoned_q(spec, n, device)
    launch.quantize(x.to(device), spec, codes, scales, rows=1, programs=3)
    want_c, want_s = ref.quantize_blocks(x, spec)
    assert_bits_equal(codes, want_c, "codes")
    assert_bits_equal(scales, want_s, "scales")
    out = torch.empty(n, device=device)
    launch.dequantize(codes, scales, spec, out, rows=2, programs=3)
    assert_bits_equal(out, ref.dequantize_blocks(want_c, want_s, spec, n), "dequantize")


def test_float64_input_is_rounded_like_the_reference(device):
    spec = get_format("int8")
    x = torch.randn(1000, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 10
    codes, scales = poisoned_q(spec, x.numel(), device)
    launch.quantize(x.to(device), spec, codes, scales)
    want_c, want_s = ref.quantize_blocks(x, spec)
    assert_bits_equal(codes, want_c, "codes")
    assert_bits_equal(scales, want_s, "scales")


ACC_CASES = [(f, b) for f in FORMATS for b in sorted({get_format(f).block, 24})]


@pytest.mark.parametrize("gdtype", DTYPES, ids=_DT_IDS.get)
@pytest.mark.parametrize("fmt,block", ACC_CASES, ids=[f"{f}-b{b}" for f, b in ACC_CASES])
def test_accumulate_matches_reference(fmt, block, gdtype, device):
    spec = get_format(fmt, block)
    g0 = torch.Generator().manual_seed(block + len(fmt))
    n = 6 * block + 5
    a = torch.randn(n, generator=g0) * 1e-2
    a[block: 2 * block] = 0.0                                          # an all-zero block stays exact
    a[5 * block: 6 * block] *= spec.qmax * 2.0**-126 / a[5 * block: 6 * block].abs().max()  # subnormal products
    grad = torch.randn(n, generator=g0) * 3e-3
    grad[3] = float("nan")                                             # poisons block 0 only
    grad[2 * block + 1] = 1e-40                                        # subnormal gradient (kept, then flushed)
    grad[5 * block: 6 * block] *= 2.0**-120                            # tiny: the sum keeps subnormal parts
    grad[3 * block + 2] = -3e38                                        # d + g stays finite
    grad = grad.to(gdtype)
    c0, s0 = ref.quantize_blocks(a, spec)
    s0[4] = float("nan")                                               # an already-poisoned block stays NaN
    want_c, want_s = ref.accumulate(c0, s0, spec, n, grad)
    codes, scales = c0.clone().to(device), s0.clone().to(device)
    if spec.pack_group > 1 and n % spec.pack_group:
        # garbage in the padding bits of the last pack group must not leak into the result
        codes[-1] = codes[-1] | (0xF0 if spec.bits == 4 else 0x80)
    launch.accumulate(codes, scales, spec, grad.to(device))
    assert_bits_equal(codes, want_c, "codes")
    assert_bits_equal(scales, want_s, "scales")


def test_accumulate_twice_is_two_requantizations(device):
    """QuanGrad's micro-batch loop: each call requantizes (no hidden fp32 state)."""
    spec = get_format("fp8_e4m3")
    g = torch.Generator().manual_seed(11)
    n = 3 * spec.block + 17
    c, s = ref.quantize_blocks(torch.zeros(n), spec)
    codes, scales = c.clone().to(device), s.clone().to(device)
    for _ in range(3):
        grad = torch.randn(n, generator=g).to(torch.bfloat16)
        c, s = ref.accumulate(c, s, spec, n, grad)
        launch.accumulate(codes, scales, spec, grad.to(device))
    assert_bits_equal(codes, c, "codes")
    assert_bits_equal(scales, s, "scales")


@pytest.mark.parametrize("world", [1, 2, 5])
@pytest.mark.parametrize("fmt", FORMATS)
def test_reduce_requantize_matches_reference(fmt, world, device):
    spec = get_format(fmt)
    g = torch.Generator().manual_seed(world)
    n = 4 * spec.block + 24 + 3
    qs = [ref.quantize_blocks(torch.randn(n, generator=g) * (r + 1) * 1e-3, spec) for r in range(world)]
    codes = torch.stack([c for c, _ in qs])
    scales = torch.stack([s for _, s in qs])
    if world > 1:
        scales[1, 2] = float("nan")  # one rank's non-finite block poisons that block of the sum
    want_c, want_s = ref.reduce_requantize(codes, scales, spec, n)
    out_c, out_s = poisoned_q(spec, n, device)
    launch.reduce_requantize(codes.to(device), scales.to(device), spec, n, out_c, out_s)
    assert_bits_equal(out_c, want_c, "codes")
    assert_bits_equal(out_s, want_s, "scales")


def test_reduce_sums_in_rank_order(device):
    """fp32 addition is not associative: a left fold (d0 + d1) + d2 differs from d0 + (d1 + d2) here,
    and the kernel must give the left fold."""
    spec = get_format("fp8_e4m3", 8)
    big, small = 2.0**24, 1.0
    rows = [torch.tensor([big] + [0.0] * 7), torch.tensor([small] + [0.0] * 7), torch.tensor([small] + [0.0] * 7)]
    qs = [ref.quantize_blocks(r, spec) for r in rows]
    codes = torch.stack([c for c, _ in qs])
    scales = torch.stack([s for _, s in qs])
    left = (ref.dequantize_blocks(codes[0], scales[0], spec, 8) + ref.dequantize_blocks(codes[1], scales[1], spec, 8)) \
        + ref.dequantize_blocks(codes[2], scales[2], spec, 8)
    right = ref.dequantize_blocks(codes[0], scales[0], spec, 8) + (
        ref.dequantize_blocks(codes[1], scales[1], spec, 8) + ref.dequantize_blocks(codes[2], scales[2], spec, 8))
    assert left[0] != right[0]  # the case really distinguishes the orders
    out_c, out_s = poisoned_q(spec, 8, device)
    launch.reduce_requantize(codes.to(device), scales.to(device), spec, 8, out_c, out_s)
    want_c, want_s = ref.quantize_blocks(left, spec)
    assert_bits_equal(out_c, want_c, "codes")
    assert_bits_equal(out_s, want_s, "scales")


@pytest.mark.parametrize("fmt", ["int5", "int6", "fp8_e5m2"])
def test_chunking_of_huge_tensors(fmt, device, monkeypatch):
    """Tensors above 2**30 elements are cut into whole-block chunks; shrink the limit to check it."""
    spec = get_format(fmt, 24)
    from agoq_triton_kernels import launch as shared

    monkeypatch.setattr(shared, "MAX_CHUNK_ELEMENTS", 5 * 24 + 7)  # -> chunks of 5 blocks
    g = torch.Generator().manual_seed(5)
    n = 17 * 24 + 11
    x = torch.randn(n, generator=g)
    codes, scales = poisoned_q(spec, n, device)
    launch.quantize(x.to(device), spec, codes, scales)
    want_c, want_s = ref.quantize_blocks(x, spec)
    assert_bits_equal(codes, want_c, "codes")
    assert_bits_equal(scales, want_s, "scales")
    out = torch.empty(n, dtype=torch.bfloat16, device=device)
    launch.dequantize(codes, scales, spec, out)
    assert_bits_equal(out, ref.dequantize_blocks(want_c, want_s, spec, n, torch.bfloat16), "dequantize")
    grad = torch.randn(n, generator=g)
    launch.accumulate(codes, scales, spec, grad.to(device))
    acc_c, acc_s = ref.accumulate(want_c, want_s, spec, n, grad)
    assert_bits_equal(codes, acc_c, "accumulate codes")
    assert_bits_equal(scales, acc_s, "accumulate scales")
    both_c, both_s = torch.stack([want_c, acc_c]), torch.stack([want_s, acc_s])
    out_c, out_s = poisoned_q(spec, n, device)
    launch.reduce_requantize(both_c.to(device), both_s.to(device), spec, n, out_c, out_s)
    red_c, red_s = ref.reduce_requantize(both_c, both_s, spec, n)
    assert_bits_equal(out_c, red_c, "reduce codes")
    assert_bits_equal(out_s, red_s, "reduce scales")


@pytest.mark.parametrize("fmt", FORMATS)
def test_portable_variant_on_the_gpu(fmt, device):
    """HW=False (integer fp8/bf16 logic, div_rn) is what the interpreter and Ascend run; on a GPU it must
    give the same bits as the default HW=True kernels and the reference."""
    if device.type != "cuda":
        pytest.skip("on CPU every test above already runs the portable variant")
    spec = get_format(fmt)
    x = special_blocks(spec, spec.block, seed=3)
    n = x.numel()
    want_c, want_s = ref.quantize_blocks(x, spec)
    codes, scales = poisoned_q(spec, n, device)
    launch.quantize(x.to(device), spec, codes, scales, hw=False)
    assert_bits_equal(codes, want_c, "codes")
    assert_bits_equal(scales, want_s, "scales")
    out = torch.empty(n, dtype=torch.bfloat16, device=device)
    launch.dequantize(codes, scales, spec, out, hw=False)
    assert_bits_equal(out, ref.dequantize_blocks(want_c, want_s, spec, n, torch.bfloat16), "dequantize")


def test_hw_variant_is_refused_where_it_cannot_run(device):
    if device.type == "cuda" and launch._hw_conversions(device):
        pytest.skip("this GPU runs HW=True")
    spec = get_format("int8")
    x = torch.ones(8, device=device)
    codes, scales = poisoned_q(spec, 8, device)
    with pytest.raises(ValueError, match="compute capability >= 8.9"):
        launch.quantize(x, spec, codes, scales, hw=True)


# ---- the FAST_DIV path's per-row arithmetic, every input (GPU only: inline PTX and libdevice) ----------------
_GPU_ONLY = pytest.mark.skipif(not torch.cuda.is_available(), reason="rcp.approx and libdevice need a GPU")


def _binade(e: int) -> torch.Tensor:
    """Every fp32 of [2**e, 2**(e + 1))."""
    return ((torch.arange(1 << 23, dtype=torch.int64) | ((e + 127) << 23)).to(torch.int32)).view(torch.float32)


def _elementwise(fn_name: str, x: torch.Tensor, q: float = 0.0) -> torch.Tensor:
    import triton
    import triton.language as tl

    from agoq_triton_kernels import kernels as K

    @triton.jit
    def rcp_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + i, K._rcp_2_4(tl.load(x_ptr + i, mask=i < n, other=2.0)), mask=i < n)

    @triton.jit
    def div_kernel(x_ptr, out_ptr, n, Q: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + i, K._div_const_rn(tl.load(x_ptr + i, mask=i < n, other=0.0), Q), mask=i < n)

    xd = x.cuda()
    out = torch.empty_like(xd)
    grid = (triton.cdiv(x.numel(), 1024),)
    if fn_name == "rcp":
        rcp_kernel[grid](xd, out, x.numel(), BLOCK=1024)
    else:
        div_kernel[grid](xd, out, x.numel(), Q=q, BLOCK=1024)
    return out.cpu()


@_GPU_ONLY
def test_reciprocal_2_4_every_mantissa():
    """kernels._rcp_2_4 (rcp.approx + one Newton step in two FMAs) is RN(1/b) for every fp32 b in [2, 4), the
    only range the quantizers call it on (b = scale * k); the reference is the CPU's IEEE division."""
    for e in (1,):
        b = _binade(e)
        assert_bits_equal(_elementwise("rcp", b), (1.0 / b.double()).float(), f"1/b, b in [2**{e}, 2**{e + 1})")


@_GPU_ONLY
@pytest.mark.parametrize("qmax", [7.0, 15.0, 31.0, 127.0, 6.0, 448.0, 57344.0])
def test_scale_division_every_input(qmax):
    """kernels._div_const_rn(a, qmax) is RN(a / qmax), flushed to 0 below 2**-126, for every a of the binades where
    the hardware's products could leave the scaled pattern (the bottom ones, where the quotient, its first guess or
    the remainder is subnormal), the top two and two generic ones. The reference: the quotient in float64 (exact to
    within 2**-53, and no quotient of these divisors lies that close to an fp32 midpoint), then fp32."""
    for e in list(range(-126, -100, 5)) + [-126 + int(qmax).bit_length() - 1, 0, 1, 126, 127]:
        a = _binade(e)
        want = (a.double() / qmax).float()
        want = torch.where(want < 2.0 ** -126, torch.zeros_like(want), want)
        assert_bits_equal(_elementwise("div", a, qmax), want, f"a / {qmax}, a in [2**{e}, 2**{e + 1})")
