"""The element-wise helpers of agoq_triton_kernels.codes against torch's own casts and the core's
reference encoders, exhaustively where the domain is small (every fp8 code, every 4..8-bit code)."""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from agoq_core.formats import reference as ref
from agoq_core.formats.spec import NF4_LEVELS, get_format, list_formats
from agoq_triton_kernels import codes as C
from agoq_triton_kernels import tables
from agoq_triton_kernels.layout import KIND_IDS, encode_lut

_TO_E4M3, _TO_E5M2, _TO_BF16 = 0, 1, 2
_FROM_E4M3, _FROM_E5M2, _FROM_BF16 = 0, 1, 2


@triton.jit
def _float_to_int(x_ptr, y_ptr, n, OP: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    if OP == 0:
        y = C.f32_to_e4m3_bits(x)
    elif OP == 1:
        y = C.f32_to_e5m2_bits(x)
    else:
        y = C.f32_to_bf16_bits(x)
    tl.store(y_ptr + offs, y, mask=m)


@triton.jit
def _int_to_float(c_ptr, y_ptr, n, OP: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    c = tl.load(c_ptr + offs, mask=m, other=0)
    if OP == 0:
        y = C.e4m3_bits_to_f32(c)
    elif OP == 1:
        y = C.e5m2_bits_to_f32(c)
    else:
        y = C.bf16_bits_to_f32(c.to(tl.int16))
    tl.store(y_ptr + offs, y, mask=m)


@triton.jit
def _encode_decode(v_ptr, c_ptr, lut_ptr, elut_ptr, d_ptr, n, KIND: tl.constexpr, BITS: tl.constexpr,
                   QMAX: tl.constexpr, NF4_LUT: tl.constexpr, HW: tl.constexpr, ENC: tl.constexpr,
                   BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(v_ptr + offs, mask=m, other=0.0)
    if ENC == 0:
        code = C.encode(v, KIND, BITS, QMAX, HW)
    elif ENC == 1:  # the kernels' unclamped encode (inputs stay within qmax (1 + 2**-22))
        code = C.encode(v, KIND, BITS, QMAX, HW, False)
    elif ENC == 2:  # NF4 bucket table
        code = C.bucket_encode(v * 4.0, elut_ptr, 4.0, 16)  # the table's domain: layout.NF4_LUT_DOMAIN
    else:  # FP4 bucket table on |v|
        mag = C.bucket_encode(tl.abs(v), elut_ptr, 4.0, 0)
        code = tl.where((v < 0.0) & (mag > 0), mag | 8, mag)
    tl.store(c_ptr + offs, code, mask=m)
    c = tl.load(c_ptr + offs, mask=m, other=0)
    tl.store(d_ptr + offs, C.decode(c, lut_ptr, KIND, BITS, NF4_LUT, HW), mask=m)


@triton.jit
def _decode_only(c_ptr, lut_ptr, d_ptr, n, KIND: tl.constexpr, BITS: tl.constexpr, NF4_LUT: tl.constexpr,
                 HW: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    c = tl.load(c_ptr + offs, mask=m, other=0)
    tl.store(d_ptr + offs, C.decode(c, lut_ptr, KIND, BITS, NF4_LUT, HW), mask=m)


_BLOCK = 1 << 14
# every format with the default decode, plus NF4's select-tree decode (for devices without cheap gathers)
_FMT_VARIANTS = [(s.name, True) for s in list_formats()] + [("nf4", False)]
_FMT_IDS = [f"{f}-{'lut' if lut else 'select'}" if f == "nf4" else f for f, lut in _FMT_VARIANTS]


def _run_f2i(x: torch.Tensor, op: int, device) -> torch.Tensor:
    x = x.to(device).contiguous()
    y = torch.empty(x.numel(), dtype=torch.int32, device=device)
    _float_to_int[(triton.cdiv(x.numel(), _BLOCK),)](x, y, x.numel(), OP=op, BLOCK=_BLOCK)
    return y.cpu()


def _run_i2f(c: torch.Tensor, op: int, device) -> torch.Tensor:
    c = c.to(torch.int32).to(device).contiguous()
    y = torch.empty(c.numel(), dtype=torch.float32, device=device)
    _int_to_float[(triton.cdiv(c.numel(), _BLOCK),)](c, y, c.numel(), OP=op, BLOCK=_BLOCK)
    return y.cpu()


def _same_bits_nan_aware(a: torch.Tensor, b: torch.Tensor) -> None:
    """Bit-equal except that any NaN matches any NaN (payloads are not part of the contract)."""
    an, bn = torch.isnan(a), torch.isnan(b)
    assert torch.equal(an, bn), f"NaN positions differ at {(an != bn).nonzero().flatten()[:5].tolist()}"
    ai, bi = a[~an].view(torch.int32), b[~bn].view(torch.int32)
    bad = (ai != bi).nonzero().flatten()
    assert bad.numel() == 0, (f"{bad.numel()} mismatches, first {a[~an][bad[0]].item()!r} vs "
                              f"{b[~bn][bad[0]].item()!r}")


def _fp8_probe_values(dt: torch.dtype, qmax: float, seed: int) -> torch.Tensor:
    """Every finite fp8 value, every midpoint (the ties) and +-1 ulp around it, signed zeros,
    fp32 subnormals and random values, all within [-qmax, qmax] as the kernels' callers clamp."""
    allv = torch.arange(256, dtype=torch.uint8).view(dt).float()
    pos = torch.sort(allv[torch.isfinite(allv) & (allv > 0)]).values
    mids = ((pos[:-1].double() + pos[1:].double()) / 2).float()
    pos0 = torch.cat([torch.zeros(1), pos])
    first_mid = (pos0[:2].double().mean()).float().reshape(1)  # between 0 and the smallest subnormal
    mids = torch.cat([first_mid, mids])
    up = torch.nextafter(mids, torch.full_like(mids, 1e9))
    down = torch.nextafter(mids, torch.zeros_like(mids))
    g = torch.Generator().manual_seed(seed)
    rnd = torch.cat([torch.randn(50000, generator=g) * qmax / 4, torch.randn(20000, generator=g) * 1e-3,
                     torch.rand(20000, generator=g) * 2 * qmax - qmax,
                     (torch.randint(-2**31, 2**31 - 1, (50000,), generator=g, dtype=torch.int64)
                      .to(torch.int32).view(torch.float32))])
    rnd = rnd[torch.isfinite(rnd)].clamp(-qmax, qmax)
    tiny = torch.tensor([0.0, -0.0, 1e-45, -1e-45, 1e-40, 1.17e-38, -1.17e-38, 2.0**-126])
    v = torch.cat([pos0, mids, up, down, tiny, rnd])
    return torch.cat([v, -v])


@pytest.mark.parametrize("fmt,op", [("fp8_e4m3", _TO_E4M3), ("fp8_e5m2", _TO_E5M2)])
def test_f32_to_fp8_bits_matches_torch(fmt, op, device):
    dt = torch.float8_e4m3fn if fmt == "fp8_e4m3" else torch.float8_e5m2
    x = _fp8_probe_values(dt, get_format(fmt).qmax, seed=op)
    got = _run_f2i(x, op, device)
    want = x.to(dt).view(torch.uint8).to(torch.int32)
    bad = (got != want).nonzero().flatten()
    assert bad.numel() == 0, f"{bad.numel()} of {x.numel()} differ; x={x[bad[0]].item()!r}: " \
                             f"got {int(got[bad[0]]):#x} want {int(want[bad[0]]):#x}"


@pytest.mark.parametrize("fmt,op", [("fp8_e4m3", _FROM_E4M3), ("fp8_e5m2", _FROM_E5M2)])
def test_fp8_bits_to_f32_every_code(fmt, op, device):
    dt = torch.float8_e4m3fn if fmt == "fp8_e4m3" else torch.float8_e5m2
    codes = torch.arange(256, dtype=torch.int32)
    _same_bits_nan_aware(_run_i2f(codes, op, device), codes.to(torch.uint8).view(dt).float())


def _bf16_probe_values(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-2**31, 2**31 - 1, (200000,), generator=g, dtype=torch.int64).to(torch.int32)
    # exact ties (low 16 bits 0x8000) with even and odd kept lsb, and their neighbours
    ties = (torch.randint(-2**15, 2**15 - 1, (20000,), generator=g, dtype=torch.int64).to(torch.int32) << 16) | 0x8000
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), -float("nan"), 3.4028235e38,
                            -3.4028235e38, 3.3961776e38, 1e-40, -1e-45, 1.1754942e-38]).view(torch.int32)
    return torch.cat([bits, ties, ties + 1, ties - 1, special]).view(torch.float32)


def test_f32_to_bf16_bits_matches_torch_rne(device):
    x = _bf16_probe_values(1)
    got = _run_f2i(x, _TO_BF16, device)
    want = x.to(torch.bfloat16)
    got_bf = got.to(torch.int16).view(torch.bfloat16)
    _same_bits_nan_aware(got_bf.float(), want.float())
    # NaN -> 0x7FC0 exactly, as torch's CPU cast (and the conformance canonical NaN)
    assert torch.all(got[torch.isnan(x)] == 0x7FC0)


def test_bf16_bits_to_f32_keeps_subnormals(device):
    h = torch.arange(-2**15, 2**15, dtype=torch.int32)  # every bf16 bit pattern
    want = h.to(torch.int16).view(torch.bfloat16).float()
    _same_bits_nan_aware(_run_i2f(h, _FROM_BF16, device), want)


def test_nf4_tables_match_the_core():
    assert C.NF4_LEVELS_KERNEL == tables.NF4_LEVELS == tuple(NF4_LEVELS)
    assert C.NF4_THRESHOLDS_KERNEL == tables.NF4_THRESHOLDS == ref.nf4_thresholds()
    for i, t in enumerate(C.NF4_THRESHOLDS_KERNEL):
        assert getattr(C, f"_NF4_T{i}").value == t
    for i, lv in enumerate(C.NF4_LEVELS_KERNEL):
        assert getattr(C, f"_NF4_L{i}").value == lv


def _scaled_probe(spec, seed: int) -> torch.Tensor:
    """Scaled values v for encode: every level, every tie between levels (+-1 ulp), random, +-qmax
    and slightly beyond it (the rounding of absmax/qmax can give |v| a hair above qmax)."""
    table = ref.decode_table(spec)
    lv = torch.unique(table[torch.isfinite(table)])
    lv = lv[lv.abs() <= spec.qmax]
    mids = ((lv[:-1].double() + lv[1:].double()) / 2).float()
    g = torch.Generator().manual_seed(seed)
    q = spec.qmax
    rnd = (torch.rand(30000, generator=g) * 2 - 1) * q
    edge = torch.tensor([q, -q, q * (1 + 2**-23), -q * (1 + 2**-23), 0.0, -0.0, 1e-40, -1e-40])
    return torch.cat([lv, mids, torch.nextafter(mids, torch.full_like(mids, 1e9)),
                      torch.nextafter(mids, torch.full_like(mids, -1e9)), rnd, edge])


# (format, nf4 decode via LUT, hardware conversions, encoder): 0 = encode(), 1 = encode(CLAMP=False) as the
# kernels call it, 2 = the NF4 bucket table, 3 = the FP4 bucket table
_ENC_VARIANTS = ([(s.name, True, hw, enc) for s in list_formats() for hw in (False, True) for enc in (0, 1)]
                 + [("nf4", False, False, 0), ("nf4", True, False, 2), ("fp4_e2m1", True, False, 3)])
_ENC_IDS = [f"{f}-{'lut' if lut else 'select'}-hw{int(hw)}-enc{e}" for f, lut, hw, e in _ENC_VARIANTS]


def _run_encode_decode(v: torch.Tensor, spec, device, *, nf4_lut: bool, hw: bool, enc: int):
    """_encode_decode over ``v``: (codes, decoded values) on the CPU."""
    n = v.numel()
    codes = torch.empty(n, dtype=torch.int32, device=device)
    dec = torch.empty(n, dtype=torch.float32, device=device)
    lut = torch.tensor(C.NF4_LEVELS_KERNEL, dtype=torch.float32, device=device)
    elut = torch.tensor(encode_lut(spec.kind), dtype=torch.int64, device=device)
    _encode_decode[(triton.cdiv(n, _BLOCK),)](v.to(device), codes, lut, elut, dec, n, KIND=KIND_IDS[spec.kind],
                                              BITS=spec.bits, QMAX=spec.qmax, NF4_LUT=nf4_lut, HW=hw, ENC=enc,
                                              BLOCK=_BLOCK)
    return codes.cpu(), dec.cpu()


@pytest.mark.parametrize("fmt,nf4_lut,hw,enc", _ENC_VARIANTS, ids=_ENC_IDS)
def test_encode_decode_match_reference(fmt, nf4_lut, hw, enc, device):
    spec = get_format(fmt)
    if hw and device.type != "cuda" and spec.kind not in ("int", "fp4_e2m1", "nf4"):
        # (int, FP4 and NF4's HW paths are plain fp32/int32 arithmetic, fp32 subnormals included, which the
        # interpreter computes as the GPU does: FP4's HW encoder and decoder run here too)
        pytest.skip("hardware fp8/bf16 conversions are GPU-only (the interpreter's are wrong)")
    v = _scaled_probe(spec, seed=len(fmt))
    if enc == 1:  # unclamped: the kernels only pass |v| <= qmax (1 + 2**-22)
        v = v[v.abs() <= spec.qmax * (1 + 2.0**-22)]
    got, dec = _run_encode_decode(v, spec, device, nf4_lut=nf4_lut, hw=hw, enc=enc)
    want = ref.encode(v, spec).to(torch.int32)
    bad = (got != want).nonzero().flatten()
    assert bad.numel() == 0, (f"{fmt} hw={hw} enc={enc}: v={v[bad[0]].item()!r}: got code {int(got[bad[0]])} "
                              f"want {int(want[bad[0]])}")
    _same_bits_nan_aware(dec, ref.decode_table(spec)[want.long()])


@pytest.mark.parametrize("fmt,nf4_lut", _FMT_VARIANTS, ids=_FMT_IDS)
def test_decode_every_code(fmt, nf4_lut, device):
    """decode() of every possible code, also those quantize never writes (fp8 NaN/inf, FP4 -0,
    int code 0 = -2**(bits-1))."""
    spec = get_format(fmt)
    c = torch.arange(1 << spec.bits, dtype=torch.int32)
    dec = torch.empty(c.numel(), dtype=torch.float32, device=device)
    lut = torch.tensor(C.NF4_LEVELS_KERNEL, dtype=torch.float32, device=device)
    for hw in ([False, True] if device.type == "cuda" or spec.kind in ("int", "fp4_e2m1") else [False]):
        _decode_only[(1,)](c.to(device), lut, dec, c.numel(), KIND=KIND_IDS[spec.kind], BITS=spec.bits,
                           NF4_LUT=nf4_lut, HW=hw, BLOCK=256)
        _same_bits_nan_aware(dec.cpu(), ref.decode_table(spec))


@pytest.mark.parametrize("hw", [False, True])
@pytest.mark.parametrize("clamp", [False, True])
def test_fp4_encoder_on_a_stride_of_every_fp32(clamp, hw, device):
    """codes._encode_fp4 (three rounded lines and their minimum) against the reference's threshold table on
    every 997th fp32 bit pattern of its domain — |v| <= 6 (1 + 2**-21) unclamped, every finite |v| clamped —
    both signs, both forms (HW: FMA and an integer min; portable: fp32 min), plus every pattern within 64 ulps of each E2M1 tie and binade edge (the exhaustive check of
    all 2**30 magnitudes ran in numpy when the encoder was written; this keeps a dense slice of it)."""
    spec = get_format("fp4_e2m1")
    top = (6.0 * (1 + 2.0**-21)) if not clamp else 3.0e38
    hi = int(torch.tensor(top, dtype=torch.float32).view(torch.int32))
    bits = torch.arange(0, hi + 1, 997, dtype=torch.int64)
    edges = torch.tensor([0.25, 0.75, 1.0, 1.25, 1.75, 2.0, 2.5, 3.5, 4.0, 5.0, 6.0], dtype=torch.float32)
    near = (edges.view(torch.int32).to(torch.int64)[:, None] + torch.arange(-64, 65)[None, :]).flatten()
    bits = torch.cat([bits, near[near <= hi]]).to(torch.int32)
    mag = bits.view(torch.float32)
    v = torch.cat([mag, -mag])
    codes, _ = _run_encode_decode(v, spec, device, nf4_lut=False, hw=hw, enc=0 if clamp else 1)
    want = ref.encode(v, spec).to(torch.int32)
    bad = (codes != want).nonzero().flatten()
    assert bad.numel() == 0, f"v={v[bad[0]].item()!r}: got {int(codes[bad[0]])} want {int(want[bad[0]])}"
