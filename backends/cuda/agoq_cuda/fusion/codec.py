"""Block codec on register tiles of whole blocks, for the fused GEMMs' epilogue and prologue.

A tile here is ``R`` whole blocks of a power-of-two ``BLOCK`` (one block per tile row), each with its
*global* block index ``rows[r]`` and a validity flag ``ok[r]``: the fused GEMMs cut their output (or
operand) tile into blocks that are not contiguous in memory, and whole blocks never need element masks.
The element-wise numerics (encode, decode, zero code) are the shared contract helpers of
agoq_triton_kernels.codes, so fused and stand-alone codecs compute every code the same way; the block
steps (docs/formats.md §3) and the packing (§5) are restated here for whole-block tiles.
"""
from __future__ import annotations

import triton
import triton.language as tl

from agoq_triton_kernels.codes import decode, encode, zero_code
from agoq_triton_kernels.kernels import _scaled_quotient

__all__ = ["quantize_rows", "store_packed", "load_packed", "dequantize_rows"]

_EXP_MASK = tl.constexpr(0x7F800000)
_ABS_MASK = tl.constexpr(0x7FFFFFFF)
_QNAN = tl.constexpr(0x7FC00000)
_SIGN = tl.constexpr(-0x80000000)  # 0x80000000 as an int32


@triton.jit
def quantize_rows(x, KIND: tl.constexpr, BITS: tl.constexpr, QMAX: tl.constexpr, FAST_DIV: tl.constexpr):
    """fp32 [R, BLOCK], one block per row -> (codes int32 [R, BLOCK], scales fp32 [R]).

    Flush |x| < 2**-126 and non-finite elements to 0 (exponent bits); a block with a non-finite element
    gets scale NaN and zero codes; absmax on the magnitude bits (integer order = value order for
    non-negative floats, and no NaN can win); scale = absmax / qmax correctly rounded (div_rn: Triton's
    '/' is approximate on NVIDIA); scales below 2**-126 become 0. v = x / scale correctly rounded:
    div_rn, or with FAST_DIV (GPU only: needs a true FMA) the shared reciprocal + two Markstein
    corrections of agoq_triton_kernels (6 flops instead of a ~12-instruction division, same result for
    every quotient a code can tell apart)."""
    bits = x.to(tl.int32, bitcast=True)
    expo = bits & _EXP_MASK
    keep = (expo != 0) & (expo != _EXP_MASK)
    bad = tl.max((expo == _EXP_MASK).to(tl.int32), axis=1) > 0
    amax = tl.max(tl.where(keep, bits & _ABS_MASK, 0), axis=1).to(tl.float32, bitcast=True)
    scale = tl.math.div_rn(amax, QMAX)
    scale = tl.where((scale.to(tl.int32, bitcast=True) & _EXP_MASK) == 0, 0.0, scale)
    zero_s = scale == 0.0
    xk = tl.where(keep, x, 0.0)
    if FAST_DIV:
        v = _scaled_quotient(xk, tl.where(zero_s, 1.0, scale), True)
        if KIND >= 3:  # fp8 keeps the sign of a quotient too tiny for the FMA path: sign(x / s) = sign(x)
            v = ((v.to(tl.int32, bitcast=True) & _ABS_MASK)
                 | (xk.to(tl.int32, bitcast=True) & _SIGN)).to(tl.float32, bitcast=True)
    else:
        v = tl.math.div_rn(xk, tl.where(zero_s, 1.0, scale)[:, None])
    v = tl.where(zero_s[:, None], 0.0, v)
    codes = tl.where(bad[:, None], zero_code(KIND, BITS), encode(v, KIND, BITS, QMAX))
    scale = tl.where(bad, _QNAN, scale.to(tl.int32, bitcast=True)).to(tl.float32, bitcast=True)
    return codes, scale


@triton.jit
def store_packed(codes_ptr, c, rows, ok, R: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr):
    """Pack int32 codes [R, BLOCK] little-endian (docs/formats.md §5) into block ``rows[r]`` of the int8
    view of the code bytes (BLOCK * BITS / 8 bytes per block); rows with ``ok`` False are not written.

    Pack groups: 4-bit 2 codes -> 1 byte, 6-bit 4 -> 3 bytes, 5-bit 8 -> 5 bytes. A group's codes are
    pulled apart with reshape + split (element j of a group = bit pattern of j over the split axes)."""
    m = ok[:, None]
    if BITS == 8:
        tl.store(codes_ptr + rows[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :], c.to(tl.int8), mask=m)
    elif BITS == 4:
        lo, hi = tl.split(tl.reshape(c, (R, BLOCK // 2, 2)))
        k = tl.arange(0, BLOCK // 2)[None, :]
        tl.store(codes_ptr + rows[:, None] * (BLOCK // 2) + k, (lo | (hi << 4)).to(tl.int8), mask=m)
    elif BITS == 6:
        a, b = tl.split(tl.reshape(c, (R, BLOCK // 4, 2, 2)))  # a: codes 0, 2 of the group; b: 1, 3
        c0, c2 = tl.split(a)
        c1, c3 = tl.split(b)
        word = c0 | (c1 << 6) | (c2 << 12) | (c3 << 18)
        base = codes_ptr + rows[:, None] * (BLOCK // 4 * 3) + 3 * tl.arange(0, BLOCK // 4)[None, :]
        tl.store(base, word.to(tl.int8), mask=m)
        tl.store(base + 1, (word >> 8).to(tl.int8), mask=m)
        tl.store(base + 2, (word >> 16).to(tl.int8), mask=m)
    else:  # 5-bit: 40 bits per group, built as two 20-bit halves so int32 suffices
        a, b = tl.split(tl.reshape(c, (R, BLOCK // 8, 2, 2, 2)))  # last axis = bit 0 of the index
        a0, a1 = tl.split(a)
        b0, b1 = tl.split(b)
        c0, c4 = tl.split(a0)
        c2, c6 = tl.split(a1)
        c1, c5 = tl.split(b0)
        c3, c7 = tl.split(b1)
        lo = c0 | (c1 << 5) | (c2 << 10) | (c3 << 15)
        hi = c4 | (c5 << 5) | (c6 << 10) | (c7 << 15)
        base = codes_ptr + rows[:, None] * (BLOCK // 8 * 5) + 5 * tl.arange(0, BLOCK // 8)[None, :]
        tl.store(base, lo.to(tl.int8), mask=m)
        tl.store(base + 1, (lo >> 8).to(tl.int8), mask=m)
        tl.store(base + 2, ((lo >> 16) | (hi << 4)).to(tl.int8), mask=m)
        tl.store(base + 3, (hi >> 4).to(tl.int8), mask=m)
        tl.store(base + 4, (hi >> 12).to(tl.int8), mask=m)


@triton.jit
def _byte(ptr, m):
    return tl.load(ptr, mask=m, other=0).to(tl.int32) & 0xFF


@triton.jit
def load_packed(codes_ptr, rows, ok, R: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr):
    """Inverse of :func:`store_packed`: int32 codes [R, BLOCK]; rows with ``ok`` False read code 0."""
    m = ok[:, None]
    if BITS == 8:
        return _byte(codes_ptr + rows[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :], m)
    elif BITS == 4:
        byte = _byte(codes_ptr + rows[:, None] * (BLOCK // 2) + tl.arange(0, BLOCK // 2)[None, :], m)
        return tl.reshape(tl.join(byte & 0xF, byte >> 4), (R, BLOCK))
    elif BITS == 6:
        base = codes_ptr + rows[:, None] * (BLOCK // 4 * 3) + 3 * tl.arange(0, BLOCK // 4)[None, :]
        word = _byte(base, m) | (_byte(base + 1, m) << 8) | (_byte(base + 2, m) << 16)
        c0 = word & 63
        c1 = (word >> 6) & 63
        c2 = (word >> 12) & 63
        c3 = (word >> 18) & 63
        return tl.reshape(tl.join(tl.join(c0, c2), tl.join(c1, c3)), (R, BLOCK))
    else:
        base = codes_ptr + rows[:, None] * (BLOCK // 8 * 5) + 5 * tl.arange(0, BLOCK // 8)[None, :]
        b2 = _byte(base + 2, m)
        lo = _byte(base, m) | (_byte(base + 1, m) << 8) | ((b2 & 0xF) << 16)
        hi = (b2 >> 4) | (_byte(base + 3, m) << 4) | (_byte(base + 4, m) << 12)
        even = tl.join(tl.join(lo & 31, hi & 31), tl.join((lo >> 10) & 31, (hi >> 10) & 31))
        odd = tl.join(tl.join((lo >> 5) & 31, (hi >> 5) & 31), tl.join((lo >> 15) & 31, (hi >> 15) & 31))
        return tl.reshape(tl.join(even, odd), (R, BLOCK))


@triton.jit
def dequantize_rows(codes_ptr, scales_ptr, lut_ptr, rows, ok, R: tl.constexpr, KIND: tl.constexpr,
                    BITS: tl.constexpr, BLOCK: tl.constexpr, NF4_LUT: tl.constexpr):
    """fp32 decode(code) * scale [R, BLOCK] for blocks ``rows`` (one fp32 multiply, no other rounding).
    Rows with ``ok`` False read as exactly 0 (scale 0): they must add nothing to a GEMM."""
    c = load_packed(codes_ptr, rows, ok, R, BITS, BLOCK)
    s = tl.load(scales_ptr + rows, mask=ok, other=0.0)
    return decode(c, lut_ptr, KIND, BITS, NF4_LUT) * s[:, None]
