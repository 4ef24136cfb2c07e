"""The cpu backend's codecs against the reference, bit for bit: every format eagerly (fast), the
formats `agoq train` uses compiled (int4 activations, fp8_e4m3 gradients), special values included."""
from __future__ import annotations

import pytest
import torch

from agoq_core.formats import reference as ref
from agoq_core.formats.spec import get_format, list_formats

FORMATS = [s.name for s in list_formats()]


def _special(block: int, nblocks: int, seed: int) -> torch.Tensor:
    """Random blocks over 70 decades plus the value classes the contract singles out, and a ragged tail."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(nblocks, block, generator=g) * torch.logspace(-37, 30, nblocks)[:, None]
    f32 = torch.finfo(torch.float32)
    x[0, 3] = float("nan")
    x[1, 0] = float("inf")
    x[2, 5] = -float("inf")
    x[3] = 0.0
    x[4] = -0.0
    x[5, :4] = torch.tensor([1e-40, -1e-45, f32.tiny, -f32.tiny])   # subnormals and the smallest normal
    x[6] = torch.linspace(-f32.max, f32.max, block)                  # +-max
    x[7] = torch.arange(block) * 0.5 - block / 4                     # int ties (x.5 after scaling)
    x[8] = f32.tiny * torch.randn(block, generator=g)                # scale underflows to 0
    x[9, 0] = 1.0
    x[9, 1:] = 1e-30                                                 # fp8 subnormal codes / zero codes
    x[10, 1:] = -1e-30
    tail = torch.randn(block // 2 + 3, generator=g)
    return torch.cat([x.reshape(-1), tail])


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int16) if t.element_size() == 2 else t


def _quantize(be, x, spec):
    n = x.numel()
    codes = torch.empty(spec.code_bytes(n), dtype=torch.uint8)
    scales = torch.empty(spec.num_blocks(n), dtype=torch.float32)
    be.quantize_into(x, spec, codes, scales)
    return codes, scales


def _same_scales(a, b):  # NaN scales: any payload (docs/formats.md §3.7)
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(_bits(a.nan_to_num(0.0)), _bits(b.nan_to_num(0.0)))


def _check_codec(be, spec, x):
    codes, scales = _quantize(be, x, spec)
    rc, rs = ref.quantize_blocks(x, spec)
    assert torch.equal(codes, rc), f"{spec.name}/{x.dtype}: {(codes != rc).sum()} code bytes differ"
    assert _same_scales(scales, rs)
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        out = torch.empty(x.numel(), dtype=dt)
        be.dequantize_into(rc, rs, spec, out)
        want = ref.dequantize_blocks(rc, rs, spec, x.numel(), dt)
        assert torch.equal(out.isnan(), want.isnan()) and torch.equal(_bits(out.nan_to_num(0)), _bits(want.nan_to_num(0)))


def _check_accumulate(be, spec, x, seed):
    g = torch.randn(x.numel(), generator=torch.Generator().manual_seed(seed)) * 3
    codes, scales = ref.quantize_blocks(x, spec)
    rc, rs = ref.accumulate(codes, scales, spec, x.numel(), g)
    be.accumulate_(codes, scales, spec, g)
    assert torch.equal(codes, rc) and _same_scales(scales, rs)
    w = 3
    chunks = [ref.quantize_blocks(x * (r + 1) - r, spec) for r in range(w)]
    cs, ss = torch.stack([c for c, _ in chunks]), torch.stack([s for _, s in chunks])
    rc, rs = ref.reduce_requantize(cs, ss, spec, x.numel())
    co, so = torch.empty_like(rc), torch.empty_like(rs)
    be.reduce_requantize_into(cs, ss, spec, x.numel(), co, so)
    assert torch.equal(co, rc) and _same_scales(so, rs)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_eager_codecs_match_reference(eager, fmt, dtype):
    spec = get_format(fmt)
    _check_codec(eager, spec, _special(spec.block, 16, seed=1).to(dtype))


@pytest.mark.parametrize("fmt", FORMATS)
def test_eager_accumulate_and_reduce_match_reference(eager, fmt):
    spec = get_format(fmt, 32)
    _check_accumulate(eager, spec, _special(32, 12, seed=2), seed=3)


@pytest.mark.parametrize("n", [0, 1, 7, 31, 32, 33, 64 + 5])
def test_small_and_ragged_sizes(eager, n):
    spec = get_format("int5", 32)
    _check_codec(eager, spec, torch.randn(n))


def test_compiled_codecs_match_reference(compiled):
    """The compiled path on the formats the main job uses (the conformance suite covers the rest)."""
    spec = get_format("int4")
    for nblocks, seed in ((16, 4), (12, 5)):      # two sizes: the second reuses the first graph
        _check_codec(compiled, spec, _special(spec.block, nblocks, seed))
    _check_accumulate(compiled, get_format("fp8_e4m3"), _special(256, 12, seed=6), seed=7)


@pytest.mark.parametrize("fmt", ["nf4", "fp4_e2m1", "int5", "int6", "int8"])
def test_compiled_4_to_8_bit_codes(compiled, fmt):
    """NF4 (binary-search encode, select-tree decode), FP4 (select-tree decode, -0 entry) and int8 (float
    codes), int5/int6 (group-word packing) through the compiled graphs."""
    spec = get_format(fmt)
    x = _special(spec.block, 16, seed=9)
    _check_codec(compiled, spec, x)
    if spec.bits in (4, 8):  # the LAAQ / QuanGrad formats also see bf16 inputs (compile time: not all)
        _check_codec(compiled, spec, x.to(torch.bfloat16))


def _fp8_edges(spec) -> torch.Tensor:
    """Every FP8 value of ``spec``, every midpoint between neighbours, and 1-2 fp32 ulps either side of
    both, both signs, plus values beyond qmax and far below the smallest subnormal."""
    dt = torch.float8_e4m3fn if spec.kind == "fp8_e4m3" else torch.float8_e5m2
    vals = torch.arange(256, dtype=torch.uint8).view(dt).float()
    vals = vals[torch.isfinite(vals) & (vals >= 0) & (vals <= spec.qmax)].unique()
    mids = (vals[:-1] + vals[1:]) / 2  # exact in fp32
    pts = torch.cat([vals, mids, torch.tensor([spec.qmax * 1.01, spec.qmax * 4, 1e30, 1e-30, 2.0 ** -30])])
    out = [pts]
    up, down = pts, pts
    for _ in range(2):
        up = torch.nextafter(up, torch.tensor(float("inf")))
        down = torch.nextafter(down, torch.tensor(0.0))
        out += [up, down]
    pos = torch.cat(out)
    return torch.cat([pos, -pos])


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
def test_compiled_fp8_cast_encodes_like_the_spec_integer_recipe(compiled, fmt):
    """The cpu backend encodes FP8 with torch's float8 conversion (compiled, vectorised): on every FP8
    value, midpoint and their neighbours it agrees with the oracle and with docs/formats.md §4.2's
    integer recipe, which is written out here independently."""
    import agoq_cpu.codecs as C

    spec = get_format(fmt)
    C.prepare(spec)
    v = _fp8_edges(spec)
    v = torch.cat([v, torch.zeros(-v.numel() % 256)])
    got = torch.compile(lambda t: C._encode(t, spec), fullgraph=True)(v).to(torch.int64)
    assert torch.equal(got, ref.encode(v, spec))
    shift, bias, magic, magic_exp = {"fp8_e4m3": (20, 120, 16384.0, 141), "fp8_e5m2": (21, 112, 128.0, 134)}[fmt]
    c = v.clamp(-spec.qmax, spec.qmax)
    bits = c.view(torch.int32).to(torch.int64)
    a = bits & 0x7FFFFFFF
    normal = (a - (bias << 23) + ((1 << (shift - 1)) - 1) + ((a >> shift) & 1)) >> shift
    sub = (c.abs() + magic).view(torch.int32).to(torch.int64) - (magic_exp << 23)
    mag = torch.where(a >= ((bias + 1) << 23), normal, sub)
    want = torch.where(mag == 0, 0, mag | ((bits >> 24) & 0x80))
    assert torch.equal(got, want)


def test_compiled_writes_into_byte_payload_views(compiled):
    """QuanGrad's protocol keeps codes and fp32 scales in one byte payload: outputs that are views of a
    differently typed tensor must still be written (aot_autograd cannot mutate those in place)."""
    spec = get_format("int8", 32)
    x = _special(32, 16, seed=8)
    n = x.numel()
    cb, nb = spec.code_bytes(n), spec.num_blocks(n)
    pad = -cb % 4
    payload = torch.zeros(cb + pad + 4 * nb, dtype=torch.uint8)
    codes, scales = payload[:cb], payload[cb + pad:].view(torch.float32)
    compiled.quantize_into(x, spec, codes, scales)
    rc, rs = ref.quantize_blocks(x, spec)
    assert torch.equal(codes, rc) and _same_scales(scales, rs)
