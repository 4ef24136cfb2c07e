"""The four codec kernels: quantize, dequantize, fused accumulate, fused reduce-requantize.

Geometry (the same for every kernel): a tile is ROWS consecutive blocks x BLOCK_P lanes (BLOCK_P =
next power of two >= BLOCK; lanes >= BLOCK are masked). A 1-D grid of any size walks the tiles with a
persistent strided loop (program p takes tiles p, p + P, p + 2P, ...), so each backend chooses the
number of programs P (CUDA: enough CTAs to fill the SMs; the interpreter: one or two, ~8 ms each;
Ascend: one per vector core). A launch covers either whole blocks only (RAGGED=False: rows >=
n_blocks are masked) or the last, partial block of a tensor (RAGGED=True: elements >= n are masked);
launchers split a ragged tensor into two launches. Offsets are int32: launchers pass pieces of at
most layout.MAX_CHUNK_ELEMENTS elements.

Packing (docs/formats.md §5): a tile's codes are regrouped into pack groups of G = 8/gcd(bits, 8)
codes (4-bit: 2 -> 1 byte, 5-bit: 8 -> 5 bytes, 6-bit: 4 -> 3 bytes) with tl.reshape + tl.split /
tl.join, and each byte of a group is a separate (strided) store or load.

Loops are ``while`` loops: Triton 3.6's interpreter cannot take a runtime value as a ``range`` bound
under numpy >= 2.4 (triton-lang/triton#9171, fixed after 3.6), and CPU CI runs these bodies there.

Launch with fp-contraction off (CUDA: ``enable_fp_fusion=False``): ``decode(c) * s + g`` must round
twice, as the reference does, not once as an FMA would.
"""
from __future__ import annotations

import triton
import triton.language as tl

from agoq_triton_kernels.codes import (
    _ABS_MASK, _EXP_MASK, _QNAN, bf16_bits_to_f32, decode, encode, f32_to_bf16_bits, zero_code,
)

__all__ = ["quantize_kernel", "dequantize_kernel", "accumulate_kernel", "reduce_requantize_kernel"]


# ---- loads and stores of float tiles --------------------------------------------------------------------
@triton.jit
def _load_f32(ptr, offs, mask, FLOAT: tl.constexpr):
    if FLOAT == 1:  # bf16 through its int16 view (exact widening, subnormals kept)
        return bf16_bits_to_f32(tl.load(ptr + offs, mask=mask, other=0))
    else:
        return tl.load(ptr + offs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _store_f32(ptr, offs, x, mask, FLOAT: tl.constexpr):
    if FLOAT == 0:
        tl.store(ptr + offs, x, mask=mask)
    elif FLOAT == 1:
        tl.store(ptr + offs, f32_to_bf16_bits(x).to(tl.int16), mask=mask)
    else:
        tl.store(ptr + offs, x.to(tl.float16), mask=mask)  # fptrunc: RNE on GPU and in the interpreter


# ---- tile geometry ------------------------------------------------------------------------------------
@triton.jit
def _tile(t, n, n_blocks, ROWS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_P: tl.constexpr, RAGGED: tl.constexpr):
    rows = t * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_P)
    elem = rows[:, None] * BLOCK + cols[None, :]
    if RAGGED:  # the launch holding the last, partial block: mask element by element
        emask = (cols[None, :] < BLOCK) & (elem < n)
    else:  # whole blocks only: a row mask keeps the loads vectorizable whatever n is
        emask = (cols[None, :] < BLOCK) & (rows[:, None] < n_blocks)
    return rows, elem, emask


@triton.jit
def _group_mask(rows, k, n, n_blocks, G: tl.constexpr, BLOCK: tl.constexpr, RAGGED: tl.constexpr):
    """Pack group k of each row is stored iff it exists (k < BLOCK / G) and its first element is < n."""
    if RAGGED:
        return (k < BLOCK // G) & (rows[:, None] * BLOCK + G * k < n)
    else:
        return (k < BLOCK // G) & (rows[:, None] < n_blocks)


# ---- the block quantizer on a register tile -------------------------------------------------------------
@triton.jit
def _quantize_tile(x, KIND: tl.constexpr, BITS: tl.constexpr, QMAX: tl.constexpr):
    """x: fp32 [ROWS, BLOCK_P] (masked lanes hold 0) -> (codes int32 [ROWS, BLOCK_P], scales fp32 [ROWS]).

    Contract steps: flush |x| < 2**-126 and non-finite lanes to 0 (exponent bits), non-finite flag,
    absmax, scale = absmax / qmax correctly rounded (< 2**-126 -> 0), v = x / scale correctly rounded,
    encode; a non-finite block gets scale NaN and every code = zero_code.
    """
    bits = x.to(tl.int32, bitcast=True)
    expo = bits & _EXP_MASK
    keep = (expo != 0) & (expo != _EXP_MASK)
    bad = tl.max((expo == _EXP_MASK).to(tl.int32), axis=1) > 0
    # absmax on the magnitude bits: for non-negative fp32, integer order is value order (no NaN here).
    amax = tl.max(tl.where(keep, bits & _ABS_MASK, 0), axis=1).to(tl.float32, bitcast=True)
    scale = tl.math.div_rn(amax, QMAX)
    scale = tl.where((scale.to(tl.int32, bitcast=True) & _EXP_MASK) == 0, 0.0, scale)
    zero_s = scale == 0.0
    v = tl.math.div_rn(tl.where(keep, x, 0.0), tl.where(zero_s, 1.0, scale)[:, None])
    v = tl.where(zero_s[:, None], 0.0, v)
    codes = tl.where(bad[:, None], zero_code(KIND, BITS), encode(v, KIND, BITS, QMAX))
    scale = tl.where(bad, _QNAN, scale.to(tl.int32, bitcast=True)).to(tl.float32, bitcast=True)
    return codes, scale


# ---- packing ------------------------------------------------------------------------------------------
@triton.jit
def _store_codes(codes_ptr, c, rows, elem, emask, n, n_blocks, ROWS: tl.constexpr, BITS: tl.constexpr,
                 BLOCK: tl.constexpr, BLOCK_P: tl.constexpr, RAGGED: tl.constexpr):
    """Pack int32 codes [ROWS, BLOCK_P] into the byte stream (int8 view). A pack group is stored iff
    its first element is < n: exactly spec.code_bytes(n) bytes, the tail padded with encode(0)."""
    if BITS == 8:
        tl.store(codes_ptr + elem, c.to(tl.int8), mask=emask)
    elif BITS == 4:
        lo, hi = tl.split(tl.reshape(c, (ROWS, BLOCK_P // 2, 2)))
        k = tl.arange(0, BLOCK_P // 2)[None, :]
        m = _group_mask(rows, k, n, n_blocks, 2, BLOCK, RAGGED)
        tl.store(codes_ptr + rows[:, None] * (BLOCK // 2) + k, (lo | (hi << 4)).to(tl.int8), mask=m)
    elif BITS == 6:
        a, b = tl.split(tl.reshape(c, (ROWS, BLOCK_P // 4, 2, 2)))  # a: codes 0, 2; b: codes 1, 3
        c0, c2 = tl.split(a)
        c1, c3 = tl.split(b)
        word = c0 | (c1 << 6) | (c2 << 12) | (c3 << 18)
        k = tl.arange(0, BLOCK_P // 4)[None, :]
        m = _group_mask(rows, k, n, n_blocks, 4, BLOCK, RAGGED)
        base = codes_ptr + rows[:, None] * (BLOCK // 4 * 3) + 3 * k
        tl.store(base, word.to(tl.int8), mask=m)
        tl.store(base + 1, (word >> 8).to(tl.int8), mask=m)
        tl.store(base + 2, (word >> 16).to(tl.int8), mask=m)
    else:  # 5-bit: 8 codes -> 40 bits, built as two 20-bit halves so int32 suffices
        a, b = tl.split(tl.reshape(c, (ROWS, BLOCK_P // 8, 2, 2, 2)))  # split on bit 0 of the index
        a0, a1 = tl.split(a)  # bit 1
        b0, b1 = tl.split(b)
        c0, c4 = tl.split(a0)  # bit 2
        c2, c6 = tl.split(a1)
        c1, c5 = tl.split(b0)
        c3, c7 = tl.split(b1)
        lo = c0 | (c1 << 5) | (c2 << 10) | (c3 << 15)
        hi = c4 | (c5 << 5) | (c6 << 10) | (c7 << 15)
        k = tl.arange(0, BLOCK_P // 8)[None, :]
        m = _group_mask(rows, k, n, n_blocks, 8, BLOCK, RAGGED)
        base = codes_ptr + rows[:, None] * (BLOCK // 8 * 5) + 5 * k
        tl.store(base, lo.to(tl.int8), mask=m)
        tl.store(base + 1, (lo >> 8).to(tl.int8), mask=m)
        tl.store(base + 2, ((lo >> 16) | (hi << 4)).to(tl.int8), mask=m)
        tl.store(base + 3, (hi >> 4).to(tl.int8), mask=m)
        tl.store(base + 4, (hi >> 12).to(tl.int8), mask=m)


@triton.jit
def _load_byte(ptr, mask):
    return tl.load(ptr, mask=mask, other=0).to(tl.int32) & 0xFF


@triton.jit
def _load_codes(codes_ptr, rows, elem, emask, n, n_blocks, ROWS: tl.constexpr, BITS: tl.constexpr,
                BLOCK: tl.constexpr, BLOCK_P: tl.constexpr, RAGGED: tl.constexpr):
    """Inverse of _store_codes: int32 codes [ROWS, BLOCK_P] (masked lanes are 0)."""
    if BITS == 8:
        return _load_byte(codes_ptr + elem, emask)
    elif BITS == 4:
        k = tl.arange(0, BLOCK_P // 2)[None, :]
        m = _group_mask(rows, k, n, n_blocks, 2, BLOCK, RAGGED)
        byte = _load_byte(codes_ptr + rows[:, None] * (BLOCK // 2) + k, m)
        return tl.reshape(tl.join(byte & 0xF, byte >> 4), (ROWS, BLOCK_P))
    elif BITS == 6:
        k = tl.arange(0, BLOCK_P // 4)[None, :]
        m = _group_mask(rows, k, n, n_blocks, 4, BLOCK, RAGGED)
        base = codes_ptr + rows[:, None] * (BLOCK // 4 * 3) + 3 * k
        word = _load_byte(base, m) | (_load_byte(base + 1, m) << 8) | (_load_byte(base + 2, m) << 16)
        c0 = word & 63
        c1 = (word >> 6) & 63
        c2 = (word >> 12) & 63
        c3 = (word >> 18) & 63
        return tl.reshape(tl.join(tl.join(c0, c2), tl.join(c1, c3)), (ROWS, BLOCK_P))
    else:
        k = tl.arange(0, BLOCK_P // 8)[None, :]
        m = _group_mask(rows, k, n, n_blocks, 8, BLOCK, RAGGED)
        base = codes_ptr + rows[:, None] * (BLOCK // 8 * 5) + 5 * k
        b2 = _load_byte(base + 2, m)
        lo = _load_byte(base, m) | (_load_byte(base + 1, m) << 8) | ((b2 & 0xF) << 16)
        hi = (b2 >> 4) | (_load_byte(base + 3, m) << 4) | (_load_byte(base + 4, m) << 12)
        c0 = lo & 31
        c1 = (lo >> 5) & 31
        c2 = (lo >> 10) & 31
        c3 = (lo >> 15) & 31
        c4 = hi & 31
        c5 = (hi >> 5) & 31
        c6 = (hi >> 10) & 31
        c7 = (hi >> 15) & 31
        even = tl.join(tl.join(c0, c4), tl.join(c2, c6))
        odd = tl.join(tl.join(c1, c5), tl.join(c3, c7))
        return tl.reshape(tl.join(even, odd), (ROWS, BLOCK_P))


@triton.jit
def _dequantize_tile(codes_ptr, scales_ptr, lut_ptr, rows, elem, emask, n, n_blocks, ROWS: tl.constexpr,
                     KIND: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_P: tl.constexpr,
                     NF4_LUT: tl.constexpr, RAGGED: tl.constexpr):
    """fp32 decode(code) * scale for a tile (one rounding: a plain fp32 multiply)."""
    c = _load_codes(codes_ptr, rows, elem, emask, n, n_blocks, ROWS, BITS, BLOCK, BLOCK_P, RAGGED)
    s = tl.load(scales_ptr + rows, mask=rows < n_blocks, other=0.0)
    return decode(c, lut_ptr, KIND, BITS, NF4_LUT) * s[:, None]


# ---- kernels --------------------------------------------------------------------------------------------
# Sizes are not specialized: one compiled kernel per format/dtype/geometry serves every tensor size
# (Triton would otherwise compile again for n % 16 == 0 vs not, n == 1, ...). Vectorization does not
# need them: whole-block launches mask by row (RAGGED=False).
_SIZES = ["n", "n_blocks", "n_tiles"]


@triton.jit(do_not_specialize=_SIZES)
def quantize_kernel(x_ptr, codes_ptr, scales_ptr, n, n_blocks, n_tiles,
                    KIND: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_P: tl.constexpr,
                    QMAX: tl.constexpr, ROWS: tl.constexpr, RAGGED: tl.constexpr, X_FLOAT: tl.constexpr):
    """x (n elements; fp32/fp16, or bf16 as int16) -> codes (int8 view of the uint8 buffer), scales fp32."""
    t = tl.program_id(0)
    while t < n_tiles:
        rows, elem, emask = _tile(t, n, n_blocks, ROWS, BLOCK, BLOCK_P, RAGGED)
        x = _load_f32(x_ptr, elem, emask, X_FLOAT)
        codes, scale = _quantize_tile(x, KIND, BITS, QMAX)
        _store_codes(codes_ptr, codes, rows, elem, emask, n, n_blocks, ROWS, BITS, BLOCK, BLOCK_P, RAGGED)
        tl.store(scales_ptr + rows, scale, mask=rows < n_blocks)
        t += tl.num_programs(0)


@triton.jit(do_not_specialize=_SIZES)
def dequantize_kernel(codes_ptr, scales_ptr, lut_ptr, out_ptr, n, n_blocks, n_tiles,
                      KIND: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_P: tl.constexpr,
                      QMAX: tl.constexpr, ROWS: tl.constexpr, RAGGED: tl.constexpr, OUT_FLOAT: tl.constexpr,
                      NF4_LUT: tl.constexpr):
    """codes + scales -> out (fp32/fp16, or bf16 as int16): fp32 decode * scale, one RNE cast."""
    t = tl.program_id(0)
    while t < n_tiles:
        rows, elem, emask = _tile(t, n, n_blocks, ROWS, BLOCK, BLOCK_P, RAGGED)
        y = _dequantize_tile(codes_ptr, scales_ptr, lut_ptr, rows, elem, emask, n, n_blocks,
                             ROWS, KIND, BITS, BLOCK, BLOCK_P, NF4_LUT, RAGGED)
        _store_f32(out_ptr, elem, y, emask, OUT_FLOAT)
        t += tl.num_programs(0)


@triton.jit(do_not_specialize=_SIZES)
def accumulate_kernel(codes_ptr, scales_ptr, lut_ptr, g_ptr, n, n_blocks, n_tiles,
                      KIND: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_P: tl.constexpr,
                      QMAX: tl.constexpr, ROWS: tl.constexpr, RAGGED: tl.constexpr, G_FLOAT: tl.constexpr,
                      NF4_LUT: tl.constexpr):
    """In place: (codes, scales) <- Q(D(codes, scales) + g), D in fp32 and one fp32 add.

    Each tile reads its own blocks before writing them, so in-place is race-free."""
    t = tl.program_id(0)
    while t < n_tiles:
        rows, elem, emask = _tile(t, n, n_blocks, ROWS, BLOCK, BLOCK_P, RAGGED)
        d = _dequantize_tile(codes_ptr, scales_ptr, lut_ptr, rows, elem, emask, n, n_blocks,
                             ROWS, KIND, BITS, BLOCK, BLOCK_P, NF4_LUT, RAGGED)
        g = _load_f32(g_ptr, elem, emask, G_FLOAT)
        acc = tl.where(emask, d + g, 0.0)  # padding lanes are 0, whatever garbage the pad codes hold
        codes, scale = _quantize_tile(acc, KIND, BITS, QMAX)
        _store_codes(codes_ptr, codes, rows, elem, emask, n, n_blocks, ROWS, BITS, BLOCK, BLOCK_P, RAGGED)
        tl.store(scales_ptr + rows, scale, mask=rows < n_blocks)
        t += tl.num_programs(0)


# The rank strides stay specialized: knowing codes_stride % 16 == 0 keeps the other ranks' loads vectorized.
@triton.jit(do_not_specialize=_SIZES + ["world"])
def reduce_requantize_kernel(codes_ptr, scales_ptr, lut_ptr, codes_out_ptr, scales_out_ptr,
                             n, n_blocks, n_tiles, world, codes_stride, scales_stride,
                             KIND: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_P: tl.constexpr,
                             QMAX: tl.constexpr, ROWS: tl.constexpr, RAGGED: tl.constexpr, NF4_LUT: tl.constexpr):
    """codes[world, codes_stride], scales[world, scales_stride] -> Q(((D0 + D1) + D2) + ...).

    The fp32 sum runs in rank order (a left fold), so every rank and every backend gets the same bits."""
    t = tl.program_id(0)
    while t < n_tiles:
        rows, elem, emask = _tile(t, n, n_blocks, ROWS, BLOCK, BLOCK_P, RAGGED)
        acc = _dequantize_tile(codes_ptr, scales_ptr, lut_ptr, rows, elem, emask, n, n_blocks,
                               ROWS, KIND, BITS, BLOCK, BLOCK_P, NF4_LUT, RAGGED)
        r = 1
        while r < world:
            acc = acc + _dequantize_tile(codes_ptr + r * codes_stride, scales_ptr + r * scales_stride, lut_ptr,
                                         rows, elem, emask, n, n_blocks, ROWS, KIND, BITS, BLOCK, BLOCK_P,
                                         NF4_LUT, RAGGED)
            r += 1
        acc = tl.where(emask, acc, 0.0)
        codes, scale = _quantize_tile(acc, KIND, BITS, QMAX)
        _store_codes(codes_out_ptr, codes, rows, elem, emask, n, n_blocks, ROWS, BITS, BLOCK, BLOCK_P, RAGGED)
        tl.store(scales_out_ptr + rows, scale, mask=rows < n_blocks)
        t += tl.num_programs(0)
