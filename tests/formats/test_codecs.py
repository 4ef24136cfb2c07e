"""The format contract checked against an independent float64/numpy oracle (tests/formats/oracle.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import agoq_core
from agoq_core.formats.spec import MIN_NORMAL_F32, get_format, list_formats
from tests.formats import oracle

FORMATS = [s.name for s in list_formats()]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _flush(x32: np.ndarray) -> np.ndarray:
    x = x32.copy()
    x[np.abs(x) < np.float32(MIN_NORMAL_F32)] = 0
    return x


def _expected_scales(x32: np.ndarray, fmt: str, block: int) -> np.ndarray:
    n = x32.size
    nb = -(-n // block)
    xp = np.zeros(nb * block, dtype=np.float32)
    xp[:n] = _flush(x32)
    amax = np.abs(xp.reshape(nb, block)).max(axis=1).astype(np.float32)
    s = (amax / np.float32(oracle.QMAX[fmt])).astype(np.float32)  # IEEE fp32 division
    s[s < np.float32(MIN_NORMAL_F32)] = 0
    return s


def _inputs(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g)
    x[::7] /= torch.rand(len(x[::7]), generator=g).clamp_min(1e-2)  # heavy tail
    return x


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_roundtrip_is_nearest_grid_point_with_exact_scales(fmt, dtype):
    spec = get_format(fmt)
    x = _inputs(3 * spec.block + 29, seed=FORMATS.index(fmt)).to(dtype).reshape(-1)
    q = agoq_core.quantize(x, fmt)
    x32 = x.float().numpy()
    want_scales = _expected_scales(x32, fmt, spec.block)
    assert np.array_equal(q.scales.numpy().view(np.uint32), want_scales.view(np.uint32))
    x_hat = agoq_core.dequantize(q, torch.float32).numpy()
    codes, vals = oracle.levels(fmt)
    xf = _flush(x32).astype(np.float64)
    for i in range(x32.size):
        s = np.float32(want_scales[i // spec.block])
        if s == 0:
            assert x_hat[i] == 0
            continue
        grid = (vals.astype(np.float32) * s).astype(np.float32)  # what dequantize can produce
        d = np.abs(xf[i] - vals * np.float64(s))
        order = np.argsort(d, kind="stable")
        best, second = order[0], order[1]
        # v = RN(x * RN(1/s)) (spec v3) is within 2^-23 of x/s: closer than that to a tie, either side is right
        # (test_spec_v3 checks the exact v3 codes)
        if d[second] - d[best] > 2.0**-21 * abs(xf[i]):     # clear winner
            assert x_hat[i] == grid[best], (i, x32[i], x_hat[i], grid[best])
        elif d[second] == d[best]:                          # exact tie: the contract's tie rule
            pair = sorted([best, second], key=lambda k: vals[k])
            if fmt == "nf4":
                want = pair[0] if codes[pair[0]] < codes[pair[1]] else pair[1]
            else:
                want = next(k for k in pair if oracle.is_even_tiebreak(fmt, int(codes[k])))
            assert x_hat[i] == grid[want], (i, x32[i])
        else:                                               # within fp32 rounding of a tie: either
            assert x_hat[i] in (grid[best], grid[second])


@pytest.mark.parametrize("fmt", ["int4", "int5", "int6", "int8", "fp4_e2m1", "fp8_e4m3", "fp8_e5m2"])
def test_exact_ties_round_half_to_even(fmt):
    """Values exactly half-way between two codes (scale a power of two) go to the even code."""
    spec = get_format(fmt, 32)
    codes, vals = oracle.levels(fmt)
    pos = np.sort(vals[vals >= 0])
    mids = ((pos[:-1] + pos[1:]) / 2)[:31]
    s = 2.0**-3
    x = np.zeros(32, dtype=np.float32)
    x[0] = oracle.QMAX[fmt] * s  # makes scale exactly s
    x[1:1 + len(mids)] = mids * s
    q = agoq_core.quantize(torch.from_numpy(x), spec)
    assert q.scales.item() == s
    x_hat = agoq_core.dequantize(q).numpy()
    for j, m in enumerate(mids):
        lo, hi = [k for k in range(len(vals)) if vals[k] in (pos[j], pos[j + 1])][:2]
        even = lo if oracle.is_even_tiebreak(fmt, int(codes[lo])) else hi
        assert x_hat[1 + j] == np.float32(vals[even] * s), (fmt, m)


def test_fp8_codec_matches_torch_cast_and_integer_logic():
    """Every in-range value: our quantize (scale 1) == torch's float8 cast == the bit-logic oracle."""
    for fmt, dt in (("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)):
        qmax = oracle.QMAX[fmt]
        finite = torch.arange(256, dtype=torch.uint8).view(dt).float()
        finite = finite[torch.isfinite(finite)].unique()
        mids = (finite[:-1].double() + finite[1:].double()).div(2).float()
        g = torch.Generator().manual_seed(1)
        vals = torch.cat([finite, mids, torch.nextafter(mids, mids + 1), torch.nextafter(mids, mids - 1),
                          (torch.randn(3000, generator=g) * qmax / 4).clamp(-qmax, qmax),
                          torch.randn(1000, generator=g) * 1e-3])
        vals = vals[vals.abs() >= MIN_NORMAL_F32]
        block = 256
        n = -(-vals.numel() // (block - 1)) * (block - 1)
        vals = torch.cat([vals, torch.zeros(n - vals.numel())]).reshape(-1, block - 1)
        x = torch.cat([torch.full((vals.shape[0], 1), float(qmax)), vals], dim=1).reshape(-1)  # scale == 1
        q = agoq_core.quantize(x, fmt, block=block)
        assert torch.all(q.scales == 1.0)
        torch_bits = x.to(dt).view(torch.uint8)
        assert np.array_equal(oracle.f32_to_fp8_bits(x.numpy(), fmt), torch_bits.numpy())
        # the contract has no -0 code: torch's 0x80 (a negative that rounds to zero) is our 0x00
        assert (torch_bits == 0x80).any()  # the case occurs in this input
        assert torch.equal(q.codes, torch.where(torch_bits == 0x80, 0, torch_bits))
        assert np.array_equal(oracle.fp8_code(x.numpy(), fmt), q.codes.numpy())


@pytest.mark.parametrize("bits", [4, 5, 6, 8])
def test_packing_is_little_endian_bit_stream(bits):
    fmt = {4: "int4", 5: "int5", 6: "int6", 8: "int8"}[bits]
    spec = get_format(fmt, 8)
    g = torch.Generator().manual_seed(bits)
    codes = torch.randint(0, 2**bits, (64,), generator=g)
    from agoq_core.formats.packing import pack_codes, unpack_codes

    stream = "".join(format(int(c), f"0{bits}b")[::-1] for c in codes)  # LSB first per code
    want = bytes(int(stream[i:i + 8][::-1], 2) for i in range(0, len(stream), 8))
    assert pack_codes(codes, spec).numpy().tobytes() == want
    assert torch.equal(unpack_codes(pack_codes(codes, spec), spec), codes)
    # narrow codes (4 bits: the word path the cpu backend compiles) and float-valued codes (its encoders)
    assert torch.equal(unpack_codes(pack_codes(codes, spec), spec, dtype=torch.int32), codes.to(torch.int32))
    assert pack_codes(codes.float(), spec).numpy().tobytes() == want


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n", [1, 7, 8, 128, 1000, 4096])
def test_nbytes_is_real_storage(fmt, n):
    spec = get_format(fmt)
    q = agoq_core.quantize(torch.randn(n), fmt)
    nb = math.ceil(n / spec.block)
    assert q.nbytes == q.codes.numel() + 4 * q.scales.numel() == spec.storage_bytes(n)
    assert q.scales.numel() == nb
    if n % 8 == 0:
        assert q.nbytes == n * spec.bits // 8 + 4 * nb


@pytest.mark.parametrize("fmt", FORMATS)
def test_nonfinite_block_dequantizes_to_nan_and_spares_other_blocks(fmt):
    spec = get_format(fmt)
    x = torch.randn(4 * spec.block)
    x[spec.block + 3] = float("nan")
    x[3 * spec.block] = float("inf")
    q = agoq_core.quantize(x, fmt)
    assert q.has_nonfinite()
    y = agoq_core.dequantize(q).reshape(4, spec.block)
    assert torch.isnan(y[1]).all() and torch.isnan(y[3]).all()
    assert torch.isfinite(y[0]).all() and torch.isfinite(y[2]).all()
    assert torch.equal(y[0], agoq_core.dequantize(agoq_core.quantize(x[: spec.block], fmt)))


@pytest.mark.parametrize("fmt", FORMATS)
def test_zero_subnormal_and_empty(fmt):
    spec = get_format(fmt)
    x = torch.zeros(2 * spec.block)
    x[spec.block:] = 1e-40  # subnormal fp32: flushed, block becomes all-zero
    q = agoq_core.quantize(x, fmt)
    assert torch.all(q.scales == 0)
    assert torch.all(agoq_core.dequantize(q) == 0)
    e = agoq_core.quantize(torch.empty(0, 5), fmt)
    assert e.nbytes == 0 and agoq_core.dequantize(e).shape == (0, 5)


def test_shape_and_dtype_are_restored():
    x = torch.randn(3, 5, 7, dtype=torch.bfloat16)
    q = agoq_core.quantize(x, "int8")
    y = agoq_core.dequantize(q)
    assert y.shape == x.shape and y.dtype == torch.bfloat16
    assert agoq_core.dequantize(q, torch.float32).dtype == torch.float32


def test_non_contiguous_input_uses_logical_order():
    x = torch.randn(64, 48).t()
    assert torch.equal(agoq_core.dequantize(agoq_core.quantize(x, "int8")),
                       agoq_core.dequantize(agoq_core.quantize(x.contiguous(), "int8")))


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_has_no_negative_zero_code(fmt):
    """docs/formats.md §4.2: a magnitude that rounds to zero is code 0x00, whatever its sign (issue 15 §4)."""
    x = torch.tensor([1.0, -1e-6, -1e-30, -0.0, -2.0**-12, -1e-38, 0.0, -3e-45] * 4)
    q = agoq_core.quantize(x, fmt, block=32)
    assert not (q.codes == 0x80).any(), q.codes
    y = agoq_core.dequantize(q)
    assert torch.equal(y[2:4].view(torch.int32), torch.zeros(2, dtype=torch.int32))  # +0.0, not -0.0
    assert not (y.view(torch.int32) == -2**31).any()  # no -0.0 anywhere


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_finite_max_gives_finite_output(fmt, dtype):
    """Finite in, finite out: +-max of the dtype must not decode to +-Inf (issue 15 §8: int6/int8 did)."""
    big = torch.finfo(dtype).max
    spec = get_format(fmt)
    x = torch.zeros(spec.block + 8, dtype=dtype)
    x[0], x[1], x[2], x[spec.block] = big, -big, 1.0, -big
    q = agoq_core.quantize(x, fmt)
    y = agoq_core.dequantize(q)
    assert y.dtype == dtype and torch.isfinite(y).all(), (fmt, y[:3], y[spec.block])
    assert y[0] > 0.99 * big and y[1] < -0.99 * big  # still the extreme value, not clipped
    assert torch.isfinite(q.scales).all() and torch.isfinite(q.scales * spec.qmax).all()
