"""Block codec on register tiles of whole blocks, for the fused GEMMs' epilogue and prologue.

A tile here is ``R`` whole blocks of a power-of-two ``BLOCK`` (one block per tile row), each with its
*global* block index ``rows[r]`` and a validity flag ``ok[r]``: the fused GEMMs cut their output (or
operand) tile into blocks that are not contiguous in memory, and whole blocks never need element masks.
The element-wise numerics (encode, decode, zero code), the packing (docs/formats.md §5) and the
dequantizer are the shared functions of agoq_triton_kernels, called on whole-block tiles, so fused and
stand-alone codecs compute and store every code the same way; the block quantizer steps (§3) are
written here for rows without element masks.
"""
from __future__ import annotations

import triton
import triton.language as tl

from agoq_triton_kernels.codes import _ABS_MASK, _EXP_MASK, _QNAN, _SIGN, encode, zero_code
from agoq_triton_kernels.kernels import _scaled_quotient, dequantize_tile, store_codes

__all__ = ["quantize_rows", "store_packed", "dequantize_rows"]


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
def _whole_blocks(rows, ok, BLOCK: tl.constexpr):
    """Element offsets and mask of whole-block rows, as the shared packers take them."""
    return rows[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :], ok[:, None]


@triton.jit
def store_packed(codes_ptr, c, rows, ok, R: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr):
    """Pack int32 codes [R, BLOCK] into block ``rows[r]`` of the int8 view of the code bytes (docs/formats.md
    §5); rows with ``ok`` False are not written. The shared packer of the codec kernels, on whole blocks."""
    elem, emask = _whole_blocks(rows, ok, BLOCK)
    store_codes(codes_ptr, c, rows, ok, elem, emask, 0, R, BITS, BLOCK, BLOCK, False)


@triton.jit
def dequantize_rows(codes_ptr, scales_ptr, lut_ptr, rows, ok, R: tl.constexpr, KIND: tl.constexpr,
                    BITS: tl.constexpr, BLOCK: tl.constexpr, NF4_LUT: tl.constexpr):
    """fp32 decode(code) * scale [R, BLOCK] for blocks ``rows`` (one fp32 multiply, no other rounding).
    Rows with ``ok`` False read as exactly 0 (scale 0): they must add nothing to a GEMM. The shared
    dequantizer of the codec kernels (portable decode, HW=False), on whole blocks."""
    elem, emask = _whole_blocks(rows, ok, BLOCK)
    return dequantize_tile(codes_ptr, scales_ptr, lut_ptr, rows, ok, elem, emask, 0, R, KIND, BITS, BLOCK, BLOCK,
                           NF4_LUT, False, False)
