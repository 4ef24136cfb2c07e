"""The 16-lane tile of agoq-cuda's codec kernels (kernels.VEC16: a thread owns 16 consecutive elements and
packs/unpacks its codes in registers into int32/int16 words) against the reference, bit for bit: special
value blocks (zero, non-finite, ties, tiny scales), blocks of 16 and the defaults, and the launcher's choice
of tile: aligned code buffers take VEC16, a code buffer at an odd address (or an odd rank stride) the
generic tile, with the same bits."""
from __future__ import annotations

import pytest
import torch

from agoq_core.formats import reference as ref
from agoq_core.formats.spec import get_format
from agoq_cuda import launch
from cuda_inputs import assert_bits_equal, special_blocks

# (format, block, code buffer at an odd address): every packing width, both tiles
CASES = [("int4", None, False), ("int5", None, False), ("int5", 16, True), ("int6", None, True), ("int6", 16, False),
         ("nf4", 16, False), ("nf4", None, False), ("fp4_e2m1", None, False), ("mxfp4", None, False),
         ("fp8_e4m3", None, True), ("mxfp8", None, False)]


@pytest.fixture
def launched(monkeypatch):
    """The constexprs of every launch of the test (dicts, in order)."""
    seen = []
    run = launch.LAUNCHER._run

    def spy(kernel, la, args, consts, replan=None):
        seen.append(consts(la))
        return run(kernel, la, args, consts, replan)

    monkeypatch.setattr(launch.LAUNCHER, "_run", spy)
    monkeypatch.setattr(launch.LAUNCHER, "fast", False)  # on a GPU the fast path would launch past the spy
    # the tile itself is under test: asked for in every op (the per-(op, format) defaults would pick the generic
    # tile for some dequantizes); cached plans made under other rules are set aside
    monkeypatch.setattr(launch.LAUNCHER.geometry, "vec16_rules", launch.parse_vec16("1"))
    monkeypatch.setattr(launch.LAUNCHER, "_plans", {})
    return seen


def _seen(launched, name: str) -> list[bool]:
    """Constexpr ``name`` of every launch so far."""
    return [bool(c.get(name)) for c in launched]


def _spec(fmt, block):
    spec = get_format(fmt)
    return spec if block is None or spec.scale_kind != "absmax" else get_format(fmt, block)


def _odd(t: torch.Tensor, odd: bool) -> torch.Tensor:
    """t's bytes, copied to an address that is odd when ``odd`` (a view into a bigger buffer)."""
    if not odd:
        return t.clone()
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    buf[1:] = t
    return buf[1:]


@pytest.mark.parametrize("fmt,block,odd", CASES, ids=[f"{f}-b{b or 'default'}-{'odd' if o else 'aligned'}"
                                                     for f, b, o in CASES])
def test_quantize_dequantize_accumulate(fmt, block, odd, launched, device):
    spec = _spec(fmt, block)
    x = special_blocks(spec, spec.block, seed=spec.block)
    x = x[: x.numel() // spec.block * spec.block]  # whole blocks: one launch each
    n = x.numel()
    want_c, want_s = ref.quantize_blocks(x, spec)
    codes = _odd(torch.zeros(spec.code_bytes(n), dtype=torch.uint8, device=device), odd)
    scales = torch.empty(spec.num_blocks(n), device=device)
    launch.quantize(x.to(device), spec, codes, scales)
    assert_bits_equal(codes.cpu(), want_c, "codes")
    assert_bits_equal(scales.cpu(), want_s, "scales")
    out = torch.empty(n, dtype=torch.bfloat16, device=device)
    launch.dequantize(codes, scales, spec, out)
    assert_bits_equal(out.cpu(), ref.dequantize_blocks(want_c, want_s, spec, n, torch.bfloat16), "dequantized")
    g = (torch.randn(n, generator=torch.Generator().manual_seed(1)) * 1e-3).to(torch.bfloat16)
    launch.accumulate(codes, scales, spec, g.to(device))
    acc_c, acc_s = ref.accumulate(want_c, want_s, spec, n, g)
    assert_bits_equal(codes.cpu(), acc_c, "accumulated codes")
    assert_bits_equal(scales.cpu(), acc_s, "accumulated scales")
    # packed words (int32/int16) at an odd address take the generic tile; 8-bit codes are read as bytes (dequantize
    # keeps the tile) but written as int32 words (quantize and accumulate do not)
    assert _seen(launched, "VEC16") == ([not odd, True, not odd] if spec.bits == 8 else [not odd] * 3)


@pytest.mark.parametrize("fmt", ["int4", "int5", "nf4", "fp4_e2m1", "mxfp4", "fp8_e4m3", "mxfp8", "nvfp4"])
def test_bf16_input(fmt, launched, device):
    """bf16 input on the 16-lane tile: the codes and scales of quantize, and of accumulate's bf16 gradient, equal
    the reference's bit for bit, with non-finite, zero and tiny blocks among the Gaussian ones (a load that mixed up
    a word's two halves would move every other value: the bf16-as-int32-words variant tried on 2026-12-07 was
    checked here, docs/bench/codecs.md)."""
    spec = get_format(fmt)
    x = special_blocks(spec, spec.block, seed=7)
    x = x[: x.numel() // spec.block * spec.block].to(torch.bfloat16)
    n = x.numel()
    want_c, want_s = ref.quantize_blocks(x, spec)
    codes = torch.zeros(spec.code_bytes(n), dtype=torch.uint8, device=device)
    scales = torch.empty(spec.num_blocks(n), device=device)
    launch.quantize(x.to(device), spec, codes, scales)
    assert_bits_equal(codes.cpu(), want_c, "codes")
    assert_bits_equal(scales.cpu(), want_s, "scales")
    if not spec.tensor_scaled:  # accumulate takes block-local formats (nvfp4's scale is per tensor too)
        g = torch.randn(n, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
        launch.accumulate(codes, scales, spec, g.to(device))
        acc_c, acc_s = ref.accumulate(want_c, want_s, spec, n, g)
        assert_bits_equal(codes.cpu(), acc_c, "accumulated codes")
        assert_bits_equal(scales.cpu(), acc_s, "accumulated scales")
    assert launched and all(_seen(launched, "VEC16"))
    # quantize (and accumulate): the default tiles give every thread its own 16 elements
    assert _seen(launched, "WORDS") == [True] * (1 if spec.tensor_scaled else 2)


def _peak_blocks(block: int, seed: int) -> torch.Tensor:
    """bf16 blocks whose largest magnitude sits at every position once (block i: position i % block), with either
    sign, a negative of almost the same magnitude beside it (an absmax that let a sign bit through would pick it)
    and Gaussian values below."""
    g = torch.Generator().manual_seed(seed)
    n_blocks = 2 * block
    x = torch.randn(n_blocks, block, generator=g).clamp(-1.0, 1.0)
    i = torch.arange(n_blocks)
    peak = torch.where(i % 2 == 0, 2.0, -2.0) * 2.0 ** (i % 7 - 3).float()
    x[i, i % block] = peak
    x[i, (i + 1) % block] = -peak.abs() * 0.99
    return x.flatten().to(torch.bfloat16)


@pytest.mark.parametrize("fmt", ["int4", "int5", "int6", "int8", "nf4", "fp4_e2m1", "fp8_e4m3", "mxfp4", "mxfp8",
                                 "nvfp4"])
def test_packed_absmax_changes_no_bit(fmt, launched, device, monkeypatch):
    """quantize's block absmax from the bf16 words two magnitudes per integer max (kernels.MAX16: sm_90's
    max.u16x2 on a GPU, plain integer ops in the interpreter) gives the reference's codes and scales, as the
    per-element maximum does: the peak of each block at every position of its words (even and odd halves, every
    thread of a block), next to a negative of almost its magnitude, plus the special blocks (NaN and Inf in either
    half, subnormals, zeros)."""
    spec = get_format(fmt)
    special = special_blocks(spec, spec.block, seed=11)
    x = torch.cat([_peak_blocks(spec.block, seed=3), special[: special.numel() // spec.block * spec.block].bfloat16()])
    want_c, want_s = ref.quantize_blocks(x, spec)
    for packed in (True, False):
        monkeypatch.setattr(launch.LAUNCHER.geometry, "packed_max", packed)
        monkeypatch.setattr(launch.LAUNCHER, "_plans", {})
        codes = torch.zeros(spec.code_bytes(x.numel()), dtype=torch.uint8, device=device)
        scales = torch.empty(spec.num_blocks(x.numel()), device=device)
        launch.quantize(x.to(device), spec, codes, scales)
        assert_bits_equal(codes.cpu(), want_c, f"codes (packed absmax {packed})")
        assert_bits_equal(scales.cpu(), want_s, f"scales (packed absmax {packed})")
    assert _seen(launched, "MAX16") == [launch.has_max_u16x2(torch.device(device)), False]


def test_words_only_where_every_thread_owns_its_elements(monkeypatch):
    """CudaGeometry.plan reads bf16 as words (Launch.words) for the 16-lane quantize and accumulate only, only for
    bf16, and on a GPU only where the tile has a 16-element group per thread (the default tiles: 2,048 elements for
    128 threads); a 2-block tile (16 groups for 128 threads) takes the int16 view there, but not in the interpreter,
    which has no threads. AGOQ_CUDA_BF16_WORDS=0 turns it off."""
    spec = get_format("int4")
    gpu, cpu = torch.device("cuda"), torch.device("cpu")

    def words(op="quantize", dtype=torch.bfloat16, dev=gpu, rows=None, vec16="1"):
        return launch.CudaGeometry(vec16=vec16).plan(op, spec, 1 << 20, dtype, dev, rows=rows, programs=None).words

    assert words() and words("accumulate")
    assert not words("dequantize") and not words("reduce_requantize")
    assert not words(dtype=torch.float32) and not words(dtype=torch.float16)
    assert not words(rows=2) and words(rows=2, dev=cpu)
    assert not words(vec16="0")
    assert launch.words_unreplicated(128, 16, 4, gpu) and not launch.words_unreplicated(128, 8, 4, gpu)
    assert not launch.words_unreplicated(128, 2, 8, gpu)  # the fused norm's 256-column row: 16 groups, 256 threads
    monkeypatch.setenv("AGOQ_CUDA_BF16_WORDS", "0")
    assert not words()


def test_packed_absmax_only_for_quantize_words(monkeypatch):
    """Launch.max16 (quantize's absmax on the words' halves, kernels.MAX16) rides on the words, for quantize only,
    where the device has a halfword-wise max: the interpreter, and on a GPU sm_90+ (max.u16x2; none on sm_80 /
    sm_89). On by default (unset, auto or 1) wherever the device has it; AGOQ_CUDA_PACKED_MAX=0 off everywhere."""
    spec = get_format("int4")
    cpu = torch.device("cpu")

    def plan(op="quantize", dtype=torch.bfloat16, rows=None):
        return launch.CudaGeometry(vec16="1").plan(op, spec, 1 << 20, dtype, cpu, rows=rows, programs=None)

    assert plan().max16 and plan().words
    assert not plan("accumulate").max16 and plan("accumulate").words
    assert not plan(dtype=torch.float32).max16
    assert launch.has_max_u16x2(cpu)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu = torch.device("cuda")
    for cap, has in (((8, 0), False), ((8, 9), False), ((9, 0), True), ((10, 0), True)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, cap=cap: cap)
        launch.has_max_u16x2.cache_clear()  # cached per device: the fused norm asks on every launch
        assert launch.has_max_u16x2(gpu) is has
        for env, on_gpu in (("", has), ("auto", has), ("1", has), ("0", False)):
            monkeypatch.setenv("AGOQ_CUDA_PACKED_MAX", env)
            geo = launch.CudaGeometry()
            assert geo.packs_max(gpu) is on_gpu and geo.packs_max(cpu) is (env != "0")
    launch.has_max_u16x2.cache_clear()  # no answer of the faked GPUs outlives the test
    monkeypatch.setenv("AGOQ_CUDA_PACKED_MAX", "0")
    assert not plan().max16 and plan().words
    monkeypatch.setenv("AGOQ_CUDA_PACKED_MAX", "maybe")
    with pytest.raises(ValueError, match="AGOQ_CUDA_PACKED_MAX"):
        launch.CudaGeometry()


@pytest.mark.parametrize("odd_stride", [False, True], ids=["stride16", "odd-stride"])
@pytest.mark.parametrize("fmt", ["fp8_e4m3", "mxfp8"])
def test_reduce_requantize(fmt, odd_stride, launched, device):
    spec = get_format(fmt)
    g = torch.Generator().manual_seed(5)
    nc = 9 * spec.block
    w = 3
    parts = [ref.quantize_blocks(torch.randn(nc, generator=g) * 10.0 ** -r, spec) for r in range(w)]
    cin = torch.stack([c for c, _ in parts])
    sin = torch.stack([s for _, s in parts])
    if odd_stride:  # rank rows one byte apart from a multiple of 16
        wide = torch.zeros(w, cin.shape[1] + 1, dtype=torch.uint8)
        wide[:, :-1] = cin
        cdev = wide.to(device)[:, :-1]
    else:
        cdev = cin.to(device)
    cout = torch.empty(spec.code_bytes(nc), dtype=torch.uint8, device=device)
    sout = torch.empty(spec.num_blocks(nc), device=device)
    launch.reduce_requantize(cdev, sin.to(device), spec, nc, cout, sout)
    want_c, want_s = ref.reduce_requantize(cin, sin, spec, nc)
    assert_bits_equal(cout.cpu(), want_c, "codes")
    assert_bits_equal(sout.cpu(), want_s, "scales")
    assert _seen(launched, "VEC16") == [True]  # 8-bit codes read as bytes (any stride), written to an aligned buffer

