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
tl.join. With CONTIG=False (CUDA) each byte of a 5/6-bit group is a separate store or load with a stride
of 5/3 bytes; with CONTIG=True (Ascend) the group's bytes are joined into a [rows, groups, slots] tile
(slots = 8/4, the last 3/1 masked) and written/read by one access whose addresses are one contiguous run
per block (row + 5k + s, s < 5): Triton-Ascend turns an innermost stride of 3/5 bytes into a discrete,
byte-by-byte transfer. Same bytes either way.

Loops are ``while`` loops: Triton 3.6's interpreter cannot take a runtime value as a ``range`` bound
under numpy >= 2.4 (triton-lang/triton#9171, fixed after 3.6), and CPU CI runs these bodies there.

``decode(c) * s + g`` must round twice, as the reference does, not once as an FMA would: CUDA launches
with ``enable_fp_fusion=False``; with HW=False the product is also materialised through an integer op
(_materialise), because Triton-Ascend accepts but does not honour ``enable_fp_fusion``.

Masks are rectangular (a row range against n_blocks, a lane range against a scalar), never an
expression with a multiply: Triton-Ascend's mask analysis cannot parse those and falls back to
full-block accesses (backends/ascend/scripts/frontend_compile.py checks every kernel for it).

``HW`` (constexpr) selects what the hardware may do: False = integer logic, fp32 compares and
division-free, correctly rounded scales and reciprocals (codes.exact_quotient; the Triton interpreter, and
Ascend, whose division is not known to be correctly rounded), True = CUDA sm_89+: hardware fp8 and bf16
conversions (exact RNE on clamped inputs) and libdevice's rcp.rn / mul.rn for the scaled values
(_scaled_values). Both are bit-exact with the reference; HW=True only needs fewer instructions (these
kernels are ALU-bound on an H200, not memory-bound). Scaled values are spec version 3's v = RN(x * RN(1/scale)):
one reciprocal per block, one multiply per element (docs/formats.md §3 step 6).
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice

from agoq_triton_kernels.codes import (
    _ABS_MASK, _EXP_MASK, _MIN_NORMAL_BITS, _MIN_NORMAL_F32, _QNAN, _SIGN, bf16_bits_to_f32, bucket_encode,
    decode, encode, exact_div, exact_quotient, f32_to_bf16_bits, finite_scale, pow2_scale_to_2_4, recip_2_4, split12,
    zero_code,
)
from agoq_triton_kernels.mx import mx_quantize_tile

__all__ = ["quantize_kernel", "dequantize_kernel", "accumulate_kernel", "reduce_requantize_kernel", "absmax_kernel",
           "tensor_scale_kernel", "quantize_tile", "store_codes", "load_codes", "dequantize_tile"]


# ---- loads and stores of float tiles --------------------------------------------------------------------
@triton.jit
def _load_f32(ptr, offs, mask, FLOAT: tl.constexpr):
    if FLOAT == 1:  # bf16 through its int16 view (exact widening, subnormals kept)
        return bf16_bits_to_f32(tl.load(ptr + offs, mask=mask, other=0))
    else:
        return tl.load(ptr + offs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _store_f32(ptr, offs, x, mask, FLOAT: tl.constexpr, HW: tl.constexpr):
    if FLOAT == 0:
        tl.store(ptr + offs, x, mask=mask)
    elif FLOAT == 1:  # bf16 through its int16 view
        if HW:  # cvt.rn.bf16x2.f32: RNE (NaN payloads differ from torch's CPU cast; not part of the contract)
            tl.store(ptr + offs, x.to(tl.bfloat16).to(tl.int16, bitcast=True), mask=mask)
        else:  # the interpreter's bf16 cast truncates: integer RNE instead
            tl.store(ptr + offs, f32_to_bf16_bits(x).to(tl.int16), mask=mask)
    else:
        tl.store(ptr + offs, x.to(tl.float16), mask=mask)  # fptrunc: RNE on GPU and in the interpreter


# ---- tile geometry ------------------------------------------------------------------------------------
@triton.jit
def _tile(t, n, n_blocks, ROWS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_P: tl.constexpr, RAGGED: tl.constexpr):
    rows = t * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_P)
    elem = rows[:, None] * BLOCK + cols[None, :]
    if RAGGED:  # the launch holding only the last, partial block (n < BLOCK elements, n_blocks = 1):
        # its elements are lanes [0, n) of row 0; a rectangular mask against the scalar n (no multiply in it)
        emask = (rows[:, None] < n_blocks) & (cols[None, :] < n)
    elif BLOCK == BLOCK_P:  # whole power-of-two blocks: one compare per row, loads stay vectorized
        emask = (rows[:, None] < n_blocks) & (cols[None, :] >= 0)
    else:
        emask = (cols[None, :] < BLOCK) & (rows[:, None] < n_blocks)
    return rows, rows < n_blocks, elem, emask


@triton.jit
def _group_mask(rows, row_ok, k, n, G: tl.constexpr, BLOCK: tl.constexpr, RAGGED: tl.constexpr):
    """Pack group k of each row is stored iff it exists (k < BLOCK / G) and its row is valid (row_ok), or,
    in a ragged launch (one block of n < BLOCK elements), iff its first element is < n: k < ceil(n / G),
    a rectangular mask against a scalar."""
    if RAGGED:
        return row_ok[:, None] & (k < (n + (G - 1)) // G)
    else:
        return (k < BLOCK // G) & row_ok[:, None]


# ---- the block quantizer on a register tile -------------------------------------------------------------
# Spec version 3 (docs/formats.md §3 step 6): v = RN(x * r) with r = RN(1/scale), one correctly rounded
# reciprocal per block and one multiply per element. Both paths form r from the scale's mantissa: the power of
# two k puts b = scale * k in [2, 4) (exact), RN(1/b) lies in (1/4, 1/2], and r = RN(1/b) * k exactly whenever
# r is a normal fp32. That is every block of a format with QMAX >= 4 (scale * QMAX is finite, so scale < 2**126
# and r > 2**-126); for QMAX < 4 (nf4: QMAX = 1, r below 2**-126 when absmax > 2**126) the element is scaled
# instead, v = RN((x * k) * RN(1/b)): the same real product (x * k is exact unless it is below 2**-126, and then
# so is v, which every code maps to the zero code), without a subnormal reciprocal for flush-to-zero hardware.
@triton.jit
def _scaled_values(xf, scale, QMAX: tl.constexpr, FAST_RCP: tl.constexpr = True):
    """CUDA (FAST_DIV): RN(xf * RN(1/scale)) per element, scale per row (> 0 normal; rows with scale 0 give
    garbage the caller drops).

    libdevice.rcp_rn(b) and libdevice.mul_rn compile, with Triton's FTZ reflection of libdevice, to rcp.rn.ftz
    and mul.rn.ftz: b is normal, so the reciprocal has no slow path, and the multiply flushes a subnormal x to
    +-0 (the contract's step 2, so the caller needs no select per element; a product below 2**-126 is flushed
    too, and every code maps it to zero). A PTX multiply with an explicit rounding modifier is never contracted
    into an FMA with the add of the encoder (ptxas keeps mul.rn separate; the launchers also pass
    enable_fp_fusion=False). backends/triton_common/tests/test_fast_division.py replays the sequence in numpy.
    One multiply per element instead of the v2 quotient's six flops."""
    k = ((255 - ((scale.to(tl.int32, bitcast=True) >> 23) & 0xFF)) << 23).to(tl.float32, bitcast=True)
    y = _rcp_2_4(scale * k) if FAST_RCP else libdevice.rcp_rn(scale * k)
    if QMAX >= 4.0:
        return libdevice.mul_rn(xf, (y * k)[:, None])  # y * k: exact, a normal fp32 (see above)
    else:
        return libdevice.mul_rn(libdevice.mul_rn(xf, k[:, None]), y[:, None])


@triton.jit
def _rcp_2_4(b):
    """CUDA (FAST_DIV): RN(1/b) for b in [2, 4) (other values: garbage the caller drops): the hardware's
    approximate reciprocal (rcp.approx.ftz, MUFU.RCP) and one Newton step in two FMAs, the fast path of ptxas's own
    rcp.rn without its range check and slow-path branch, which b in [2, 4) never takes (~7 instructions per row and
    thread fewer). The GPU tests check every b of [2, 4) against the reference
    (backends/cuda/tests/test_kernels_bitexact.py::test_reciprocal_2_4_every_mantissa)."""
    y = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [b], dtype=tl.float32, is_pure=True,
                                  pack=1)
    return tl.fma(y, tl.fma(-b, y, 1.0), y)


@triton.jit
def _div_const_rn(a, Q: tl.constexpr):
    """CUDA (FAST_DIV): RN(a / Q) per row for a constant Q (the format's qmax, not a power of two), flushed to +0
    below 2**-126 like div.rn.ftz, with one multiply and two FMAs: q0 = RN(a * RN(1/Q)), r = a - q0 Q (exact in
    one FMA), RN(q0 + r RN(1/Q)) (Markstein's correction). a is 0 or a normal >= 0 (other rows give garbage the
    caller drops). ptxas keeps div.rn by a constant as a general division (a reciprocal refinement, a range check
    and a slow-path branch: ~10 instructions per row and thread, 0.5-0.7 per element of a 16-lane quantize).
    Every qmax of the registry was checked against RN(a / Q) for every a of the binades where any step could
    leave the scaled pattern (the bottom 31, where the quotient, q0 or r is subnormal, and the top 3) and two
    generic ones, with and without flushed products: test_fast_division.py replays it. Python's 1 / Q rounded to
    fp32 is RN(1/Q) for each of them (the same test)."""
    RQ: tl.constexpr = 1.0 / Q
    q0 = a * RQ
    q1 = tl.fma(tl.fma(-q0, Q, a), RQ, q0)
    return tl.where(q1 < 1.1754943508222875e-38, 0.0, q1)


@triton.jit
def _scaled_values_x4(xf, scale, FAST_RCP: tl.constexpr = True):
    """NF4 with a bucket table on CUDA: RN(xf * m), m = 4 RN(1/scale), the table being in that domain
    (layout.NF4_LUT_DOMAIN): 4 v exactly wherever v = RN(xf * RN(1/scale)) is normal, and below 2**-124 (the
    zero code, like v) where v is not. Unlike RN(1/scale) (subnormal for absmax > 2**126), m is a normal fp32
    for every nf4 block (scale in [2**-126, 2**128): m in (2**-126, 2**128]), so one multiply per element
    instead of _scaled_values' two. m = 2**128 (scale exactly 2**-126) is not finite: the min makes it the
    largest fp32, which changes no code (such a block holds only 0 and +-2**-126, whose codes are 7, 0 and 15
    for either multiplier). Same rcp.rn.ftz / mul.rn.ftz as _scaled_values."""
    k = ((255 - ((scale.to(tl.int32, bitcast=True) >> 23) & 0xFF)) << 23).to(tl.float32, bitcast=True)
    y = _rcp_2_4(scale * k) if FAST_RCP else libdevice.rcp_rn(scale * k)
    m = tl.minimum((y * 4.0) * k, 3.4028234663852886e38)
    return libdevice.mul_rn(xf, m[:, None])


@triton.jit
def _encode_tile(v, elut_ptr, KIND: tl.constexpr, BITS: tl.constexpr, QMAX: tl.constexpr, HW: tl.constexpr,
                 LUT: tl.constexpr, NO_NEG0: tl.constexpr = True):
    """encode() without the clamp (see its CLAMP note); NF4 from the bucket table when LUT: one gather
    instead of a 15-threshold search (sm_90 SASS: 45 instead of 66 instructions per element). Ascend,
    where gathers are slow, passes LUT=False. FP4 stays on bit logic: its bucket table measured slower."""
    if LUT:
        if KIND == 2:  # v is in the table's domain: x * 4 RN(1/scale) (_scaled_values_x4, quantize_tile)
            return bucket_encode(v, elut_ptr, 4.0, 16, HW)
        else:
            return encode(v, KIND, BITS, QMAX, HW, False, NO_NEG0)
    else:
        return encode(v, KIND, BITS, QMAX, HW, False, NO_NEG0)


@triton.jit
def _exact_scale(amax, QMAX: tl.constexpr):
    """RN(amax / QMAX) per row without a division (codes.exact_div), 0 where the result is below 2**-126.
    amax >= 0 finite (other rows get garbage the caller drops). Rounding at 24 bits before the subnormal check
    equals IEEE's rounding followed by it for every qmax of the registry (a quotient would have to fall within
    2**-150 below 2**-126; test_exact_division checks the boundary)."""
    return exact_div(amax, tl.zeros_like(amax) + QMAX)


@triton.jit
def _exact_recip(scale):
    """Per row: (k, RN(1/b)) with k the power of two that puts b = scale * k in [2, 4) (exact) and RN(1/b) in
    (1/4, 1/2] correctly rounded without a division (codes.exact_quotient with numerator 1): RN(1/scale) =
    RN(1/b) * k whenever that is a normal fp32. scale > 0 normal (rows with scale 0 pass 1)."""
    k = pow2_scale_to_2_4(scale)
    b = scale * k
    bh, bl = split12(b)
    return k, exact_quotient(tl.zeros_like(b) + 1.0, b, bh, bl, recip_2_4(b))


@triton.jit
def _exact_scaled_values(xf, scale, QMAX: tl.constexpr):
    """RN(xf * RN(1/scale)) per element with IEEE multiplies only (the interpreter, Ascend): the reciprocal by
    _exact_recip, then one multiply of |xf| per element whose bits get xf's sign by an integer OR. The OR is
    what keeps the product from being contracted into an FMA with the encoder's rounding add
    ((v + 1.5 * 2**23) - ...): no add ever consumes the inexact product itself (the principle of §3.1 and
    _materialise; test_exact_division runs this with every multiply-add contracted).
    xf finite or 0; scale > 0 normal (rows with scale 0 pass 1)."""
    k, rb = _exact_recip(scale)
    if QMAX >= 4.0:  # r = rb * k is exact and normal (the comment above _scaled_values)
        p = tl.abs(xf) * (rb * k)[:, None]
    else:  # nf4: (|x| * k) * rb, no subnormal reciprocal
        p = (tl.abs(xf) * k[:, None]) * rb[:, None]
    return (p.to(tl.int32, bitcast=True) | (xf.to(tl.int32, bitcast=True) & _SIGN)).to(tl.float32, bitcast=True)


@triton.jit
def quantize_tile(x, elut_ptr, KIND: tl.constexpr, BITS: tl.constexpr, QMAX: tl.constexpr, HW: tl.constexpr,
                  LUT: tl.constexpr, FAST_DIV: tl.constexpr, SCALE: tl.constexpr = 0, ts_ptr=None,
                  RAW: tl.constexpr = False, VALUES: tl.constexpr = False, FAST_RCP: tl.constexpr = True,
                  rowmax=None):
    """x: fp32 [ROWS, BLOCK_P] (masked lanes hold 0) -> (codes int32 [ROWS, BLOCK_P], scales fp32 [ROWS]).

    The one block quantizer of the Triton backends: the codec kernels (FAST_DIV = HW) and agoq-cuda's
    fused GEMM epilogue (whole blocks per row, FAST_DIV on a GPU with HW=False encodes) call it.
    HW: hardware fp8 encodes (CUDA sm_89+); FAST_DIV: libdevice's division, reciprocal and multiply (GPUs).

    Contract steps: flush |x| < 2**-126, per-block non-finite flag and absmax, scale = absmax / qmax
    correctly rounded (< 2**-126 -> 0), v = x * RN(1/scale) (spec version 3: one correctly rounded reciprocal
    per block, one multiply per element that no FMA may absorb), encode; a block with NaN/Inf
    gets scale NaN, a block with scale 0 all zero codes. Non-finite or zero-scale blocks need no clean-up
    of their lanes: their codes are replaced wholesale at the end.

    FAST_DIV=True (GPUs): absmax on the magnitude bits (integer order = value order for non-negative
    floats; NaN/Inf sort above every finite value, which is exactly the non-finite flag), the scale as
    _div_const_rn's multiply and two FMAs (no division instruction; nf4's qmax 1: the absmax itself), and the
    reciprocal / mul.rn of _scaled_values (whose multiply also flushes subnormal x; FAST_RCP: _rcp_2_4's
    rcp.approx + Newton step instead of libdevice's rcp.rn, same bits, fewer instructions).
    FAST_DIV=False (the interpreter, Ascend): no integer compare per element (Ascend's vector unit runs
    int32 compares as scalar code) and no division instruction: absmax is an fp32 max of |x|, the
    non-finite flag a NaN test on the row sum of x - x (0 for finite x, NaN for NaN and +-Inf; a sum,
    unlike max, propagates NaN on every device), and the scale and the reciprocal are the exact,
    division-free ones above (correct whatever the device's division and multiply-add contraction do).
    SCALE != 0: the microscaling formats' scales (agoq_triton_kernels.mx; ts_ptr: NVFP4's tensor scale).
    RAW: the codes of a zero-scale or non-finite block are left as computed, and FP8's -0 code too: the caller
    fixes both on packed words, a row being all-zero codes iff not (scale > 0) (kernels._store_codes16).
    VALUES (with RAW): return the scaled values v instead of their codes, for a caller that encodes them in
    another layout (_encode16: a table gather in the 16-lane tile's own layout needs no shared-memory shuffle).
    rowmax: int32 [ROWS], the row maxima of x's magnitude bits where the caller already has them (_words_rowmax:
    bf16 words, two magnitudes per integer max; agoq-cuda only, so the portable path takes it in the interpreter);
    None: computed here.
    """
    if SCALE != 0:
        return mx_quantize_tile(x, ts_ptr, KIND, BITS, QMAX, HW, SCALE, RAW, rowmax)
    if FAST_DIV:
        if rowmax is None:
            rowmax = tl.max(x.to(tl.int32, bitcast=True) & _ABS_MASK, axis=1)
        bad = rowmax >= _EXP_MASK
        amax = tl.where(rowmax < _MIN_NORMAL_BITS, 0, rowmax).to(tl.float32, bitcast=True)
        if QMAX == 1.0:  # nf4: RN(amax / 1) is amax, finite on every finite row (ptxas keeps div.rn by 1.0 as a
            scale = amax  # division: ~10 instructions per row and thread, 0.8 per element of sm_90 nf4 quantize)
        elif (QMAX == 6.0 or QMAX == 7.0 or QMAX == 15.0 or QMAX == 31.0 or QMAX == 127.0 or QMAX == 448.0
              or QMAX == 57344.0):  # the registry's qmax, each checked (test_fast_division.py)
            scale = finite_scale(_div_const_rn(amax, QMAX), QMAX)
        else:  # a FormatSpec built by hand with another qmax: the division nobody has to re-check
            scale = finite_scale(libdevice.div_rn(amax, QMAX), QMAX)
        if LUT and KIND == 2:
            v = _scaled_values_x4(x, scale, FAST_RCP)
        else:
            v = _scaled_values(x, scale, QMAX, FAST_RCP)
    else:
        ax = tl.abs(x)
        xf = tl.where(ax < _MIN_NORMAL_F32, 0.0, x)
        if rowmax is None:
            nf = tl.sum(x - x, axis=1)
            bad = nf != nf
            amax = tl.max(ax, axis=1)
            amax = tl.where(bad | (amax < _MIN_NORMAL_F32), 0.0, amax)
        else:  # the caller's integer maxima (the interpreter's MAX16), read as on the FAST_DIV path
            bad = rowmax >= _EXP_MASK
            amax = tl.where(bad | (rowmax < _MIN_NORMAL_BITS), 0, rowmax).to(tl.float32, bitcast=True)
        if QMAX == 1.0:  # nf4: amax itself (flushed above), as on the FAST_DIV path
            scale = amax
        else:
            scale = finite_scale(_exact_scale(amax, QMAX), QMAX)  # qmax x scale stays finite (§3 step 5)
        v = _exact_scaled_values(xf, tl.where(scale == 0.0, 1.0, scale), QMAX)
        if LUT and KIND == 2:
            v = v * 4.0  # the bucket table's domain (exact, or below 2**-124 where v is: the zero code either way)
    if VALUES:
        codes = v
    else:
        codes = _encode_tile(v, elut_ptr, KIND, BITS, QMAX, HW, LUT, not RAW)
    if not RAW:
        codes = tl.where((bad | (scale == 0.0))[:, None], zero_code(KIND, BITS), codes)
    scale = tl.where(bad, _QNAN, scale.to(tl.int32, bitcast=True)).to(tl.float32, bitcast=True)
    return codes, scale


# ---- packing (the one copy: the codec kernels here and agoq-cuda's fused GEMMs call these) -----------------
@triton.jit
def _group_offsets(base, k, NBYTES: tl.constexpr, SLOTS: tl.constexpr):
    """[R, K, SLOTS] byte offsets base + NBYTES * k + s of the slots of pack group k (base: [R, 1] row
    starts, k: [1, K]) and the slot mask s < NBYTES: per row one contiguous run of K * NBYTES bytes."""
    s = tl.arange(0, SLOTS)[None, None, :]
    return (base + NBYTES * k)[:, :, None] + s, s < NBYTES


@triton.jit
def _store_groups(codes_ptr, base, k, m, w_a, w_b, NBYTES: tl.constexpr, SLOTS: tl.constexpr):
    """CONTIG store of pack groups: one masked access, contiguous per row. m: [R, K] group mask.

    Slot s of group k gets bits 24..31 of w * M[s] (a wrapping int32 product, M[s] a power of two), i.e.
    (w << (24 - bit offset)) >> 24 without a per-lane shift, w = w_a for slot 0 and w_b for the others.
    6-bit: w_a = w_b = the group's 24-bit word. 5-bit: w_a = bits 0..31 and w_b = bits 8..39 of its 40-bit
    word. Slots >= NBYTES are masked."""
    s = tl.arange(0, SLOTS)[None, None, :]
    if NBYTES == 3:  # bytes 0, 1, 2 = word bits 0, 8, 16 moved to bit 24
        v = w_a[:, :, None] * tl.where(s == 0, 1 << 24, tl.where(s == 1, 1 << 16, tl.where(s == 2, 1 << 8, 0)))
    else:  # byte 0 = w_a bits 0..7; bytes 1..4 = w_b bits 0, 8, 16, 24
        mult = tl.where(s <= 1, 1 << 24, tl.where(s == 2, 1 << 16, tl.where(s == 3, 1 << 8, tl.where(s == 4, 1, 0))))
        v = tl.where(s == 0, w_a[:, :, None], w_b[:, :, None]) * mult
    offs, slot_ok = _group_offsets(base, k, NBYTES, SLOTS)
    tl.store(codes_ptr + offs, (v >> 24).to(tl.int8), mask=m[:, :, None] & slot_ok)


@triton.jit
def store_codes(codes_ptr, c, rows, row_ok, elem, emask, n, ROWS: tl.constexpr, BITS: tl.constexpr,
                BLOCK: tl.constexpr, BLOCK_P: tl.constexpr, RAGGED: tl.constexpr, CONTIG: tl.constexpr = False):
    """Pack int32 codes [ROWS, BLOCK_P] (row r = block ``rows[r]``) into the byte stream (int8 view),
    little-endian within pack groups (docs/formats.md §5). ``elem``/``emask``: element offsets and mask
    of the tile (8-bit codes are stored element-wise). A pack group is stored iff its row is valid
    (``row_ok``) or, with RAGGED, iff its first element is < n: exactly spec.code_bytes(n) bytes, the
    tail padded with encode(0). Rows need not be consecutive (the fused GEMMs pass the global block
    indices of a GEMM tile, with BLOCK_P == BLOCK and RAGGED=False). CONTIG: 5/6-bit groups stored by
    one access contiguous per row (Ascend) instead of one strided store per byte (module docstring)."""
    if BITS == 8:
        tl.store(codes_ptr + elem, c.to(tl.int8), mask=emask)
    elif BITS == 4:
        lo, hi = tl.split(tl.reshape(c, (ROWS, BLOCK_P // 2, 2)))
        k = tl.arange(0, BLOCK_P // 2)[None, :]
        m = _group_mask(rows, row_ok, k, n, 2, BLOCK, RAGGED)
        tl.store(codes_ptr + rows[:, None] * (BLOCK // 2) + k, (lo | (hi << 4)).to(tl.int8), mask=m)
    elif BITS == 6:
        a, b = tl.split(tl.reshape(c, (ROWS, BLOCK_P // 4, 2, 2)))  # a: codes 0, 2; b: codes 1, 3
        c0, c2 = tl.split(a)
        c1, c3 = tl.split(b)
        word = c0 | (c1 << 6) | (c2 << 12) | (c3 << 18)
        k = tl.arange(0, BLOCK_P // 4)[None, :]
        m = _group_mask(rows, row_ok, k, n, 4, BLOCK, RAGGED)
        if CONTIG:
            _store_groups(codes_ptr, rows[:, None] * (BLOCK // 4 * 3), k, m, word, word, 3, 4)
        else:
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
        m = _group_mask(rows, row_ok, k, n, 8, BLOCK, RAGGED)
        if CONTIG:
            _store_groups(codes_ptr, rows[:, None] * (BLOCK // 8 * 5), k, m, lo | (hi << 20), (lo >> 8) | (hi << 12),
                          5, 8)
        else:
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
def _load_groups(codes_ptr, base, k, m, NBYTES: tl.constexpr, SLOTS: tl.constexpr):
    """CONTIG load of pack groups (inverse of _store_groups): one masked access contiguous per row, then
    the bytes are weighted by powers of two and summed along the slot axis in fp32 (exact: integers below
    2**24 in any order, with or without FMA). 6-bit: (word, word) = bytes 0..2 as a 24-bit word; 5-bit:
    (lo, hi) = bits 0..19 and 20..39 of the 40-bit word."""
    offs, slot_ok = _group_offsets(base, k, NBYTES, SLOTS)
    b = _load_byte(codes_ptr + offs, m[:, :, None] & slot_ok).to(tl.float32)  # [R, K, SLOTS], 0..255; masked: 0
    s = tl.arange(0, SLOTS)[None, None, :]
    if NBYTES == 3:
        w = tl.sum(b * tl.where(s == 0, 1.0, tl.where(s == 1, 256.0, tl.where(s == 2, 65536.0, 0.0))), axis=2)
        return w.to(tl.int32), w.to(tl.int32)
    else:
        lo = tl.sum(b * tl.where(s == 0, 1.0, tl.where(s == 1, 256.0, tl.where(s == 2, 65536.0, 0.0))), axis=2)
        hi = tl.sum(b * tl.where(s == 2, 1.0, tl.where(s == 3, 256.0, tl.where(s == 4, 65536.0, 0.0))), axis=2)
        return lo.to(tl.int32) & 0xFFFFF, hi.to(tl.int32) >> 4


@triton.jit
def load_codes(codes_ptr, rows, row_ok, elem, emask, n, ROWS: tl.constexpr, BITS: tl.constexpr,
               BLOCK: tl.constexpr, BLOCK_P: tl.constexpr, RAGGED: tl.constexpr, CONTIG: tl.constexpr = False):
    """Inverse of store_codes: int32 codes [ROWS, BLOCK_P] (masked lanes and invalid rows read 0)."""
    if BITS == 8:
        return _load_byte(codes_ptr + elem, emask)
    elif BITS == 4:
        k = tl.arange(0, BLOCK_P // 2)[None, :]
        m = _group_mask(rows, row_ok, k, n, 2, BLOCK, RAGGED)
        byte = _load_byte(codes_ptr + rows[:, None] * (BLOCK // 2) + k, m)
        return tl.reshape(tl.join(byte & 0xF, byte >> 4), (ROWS, BLOCK_P))
    elif BITS == 6:
        k = tl.arange(0, BLOCK_P // 4)[None, :]
        m = _group_mask(rows, row_ok, k, n, 4, BLOCK, RAGGED)
        if CONTIG:
            word, _ = _load_groups(codes_ptr, rows[:, None] * (BLOCK // 4 * 3), k, m, 3, 4)
        else:
            base = codes_ptr + rows[:, None] * (BLOCK // 4 * 3) + 3 * k
            word = _load_byte(base, m) | (_load_byte(base + 1, m) << 8) | (_load_byte(base + 2, m) << 16)
        c0 = word & 63
        c1 = (word >> 6) & 63
        c2 = (word >> 12) & 63
        c3 = (word >> 18) & 63
        return tl.reshape(tl.join(tl.join(c0, c2), tl.join(c1, c3)), (ROWS, BLOCK_P))
    else:
        k = tl.arange(0, BLOCK_P // 8)[None, :]
        m = _group_mask(rows, row_ok, k, n, 8, BLOCK, RAGGED)
        if CONTIG:
            lo, hi = _load_groups(codes_ptr, rows[:, None] * (BLOCK // 8 * 5), k, m, 5, 8)
        else:
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
def dequantize_tile(codes_ptr, scales_ptr, lut_ptr, rows, row_ok, elem, emask, n, ROWS: tl.constexpr,
                    KIND: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_P: tl.constexpr,
                    NF4_LUT: tl.constexpr, RAGGED: tl.constexpr, HW: tl.constexpr, CONTIG: tl.constexpr = False):
    """fp32 decode(code) * scale for a tile (one rounding: a plain fp32 multiply). Invalid rows
    (``row_ok`` False) read scale 0, so they are exact zeros."""
    s = tl.load(scales_ptr + rows, mask=row_ok, other=0.0)
    if KIND == 2 and NF4_LUT:
        # NF4 from the table: gather both nibbles' levels in the layout of the byte load, then interleave the
        # fp32 values (as load_codes interleaves codes): a gather after the interleave needs a shared-memory
        # layout change on sm_90 (STS/LDS and barriers per tile)
        k = tl.arange(0, BLOCK_P // 2)[None, :]
        byte = _load_byte(codes_ptr + rows[:, None] * (BLOCK // 2) + k, _group_mask(rows, row_ok, k, n, 2, BLOCK, RAGGED))
        lo = tl.load(lut_ptr + (byte & 0xF))
        hi = tl.load(lut_ptr + (byte >> 4))
        return tl.reshape(tl.join(lo, hi), (ROWS, BLOCK_P)) * s[:, None]
    c = load_codes(codes_ptr, rows, row_ok, elem, emask, n, ROWS, BITS, BLOCK, BLOCK_P, RAGGED, CONTIG)
    return decode(c, lut_ptr, KIND, BITS, NF4_LUT, HW) * s[:, None]


@triton.jit
def _materialise(p, opaque_zero):
    """p itself, but through an integer OR with a zero the compiler cannot see (derived from a runtime
    argument), so no multiply-add contraction can fuse the multiply that made p into a later add:
    Triton-Ascend accepts enable_fp_fusion=False but does not pass it to the NPU compiler. One integer
    op per element; the proof is an FMA-emulating run in the interpreter (test_ascend_numerics_hazards)."""
    return (p.to(tl.int32, bitcast=True) | opaque_zero).to(tl.float32, bitcast=True)


# ---- the 16-lane tile of the GPU quantize kernels (VEC16) ---------------------------------------------------
# Triton gives each thread of a bf16 tile at most 8 contiguous elements (one 16-byte load), so a 4/5/6-bit
# thread packs 8 codes into 4/5/6 bytes and its stores need a shared-memory layout change (and, for 5/6 bits,
# byte stores). VEC16 loads the two halves of every 16-element group with two loads of the same layout, so a
# thread owns 16 consecutive elements of a row: its codes pack in registers into 2 x int32 (4-bit), 3 x int32
# (6-bit) or 5 x int16 (5-bit) stores, no layout conversion, and a 128-element row spans 8 threads instead of
# 16 (one shuffle and half the per-row work less per element). Whole power-of-two blocks of >= 16 elements
# only (the launcher checks that, and the alignment of the code buffer for the wide stores).
@triton.jit
def _tile16(t, n_blocks, ROWS: tl.constexpr, BLOCK: tl.constexpr, GROUP: tl.constexpr = 16):
    """Offsets [BLOCK // GROUP, ROWS, 8] of the first 8 elements of each GROUP-element group (GROUP 16: the second
    half is + 8; GROUP 8: the 4-bit dequantize, one code word per group), the rows, their validity, and the load
    mask (by row only: the loads stay vectorized). The group index comes first: Triton lays threads along the
    dims of equal contiguity in index order, so lanes walk a row's groups (coalesced) and a row's reduction stays
    within a warp."""
    rows = t * ROWS + tl.arange(0, ROWS)
    j = tl.arange(0, BLOCK // GROUP)
    c = tl.arange(0, 8)
    off = rows[None, :, None] * BLOCK + j[:, None, None] * GROUP + c[None, None, :]
    ok = rows < n_blocks
    return rows, ok, off, ok[None, :, None] & (c[None, None, :] >= 0)


@triton.jit
def _load16_f32(ptr, t, n_blocks, ROWS: tl.constexpr, BLOCK: tl.constexpr, FLOAT: tl.constexpr,
                WORDS: tl.constexpr = False):
    """Tile t's two halves [J, ROWS, 8] (_tile16's layout) in fp32, exactly as _load_f32 gives them. WORDS (bf16
    input, agoq-cuda): each half moves as [J, ROWS, 4] int32 words of two elements; the even element is the
    word << 16, the odd one the word & 0xFFFF0000 (one integer op each; through the int16 view the compiler
    extracts the odd half and then shifts it: two, sm_90 SASS), and a join puts them back in memory order in the
    same thread's registers. Only where every thread owns its own 16 elements (CudaGeometry.plan's ``words``): a
    tile smaller than its program's threads gave wrong codes on an H100 with this form (docs/bench/codecs.md,
    twentieth session)."""
    if WORDS and FLOAT == 1:
        wa, wb = _load16_words(ptr, t, n_blocks, ROWS, BLOCK)
        return _words_f32(wa, ROWS, BLOCK), _words_f32(wb, ROWS, BLOCK)
    else:
        rows, ok, off, m = _tile16(t, n_blocks, ROWS, BLOCK)
        return _load_f32(ptr, off, m, FLOAT), _load_f32(ptr, off + 8, m, FLOAT)


@triton.jit
def _load16_words(ptr, t, n_blocks, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """Tile t's two halves of a bf16 input as [J, ROWS, 4] int32 words (_load16_f32's WORDS form; masked rows 0)."""
    rows, ok, off, m = _tile16(t, n_blocks, ROWS, BLOCK)
    j = tl.arange(0, BLOCK // 16)
    k = tl.arange(0, 4)
    woff = rows[None, :, None] * (BLOCK // 2) + j[:, None, None] * 8 + k[None, None, :]
    wm = ok[None, :, None] & (k[None, None, :] >= 0)
    wp = ptr.to(tl.pointer_type(tl.int32))
    return tl.load(wp + woff, mask=wm, other=0), tl.load(wp + woff + 4, mask=wm, other=0)


@triton.jit
def _max_u16x2(a, b):
    """Halfword-wise unsigned maximum of two int32 words (sm_90's max.u16x2: VIMNMX.U16x2, and three-input
    VIMNMX3.U16x2 where ptxas pairs them)."""
    return tl.inline_asm_elementwise("max.u16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.int32, is_pure=True,
                                     pack=1)


@triton.jit
def _max_u15x2(a, b):
    """_max_u16x2 in plain integer ops, for words whose halves are below 2**15 (the interpreter, HW=False)."""
    return tl.maximum(a & -65536, b & -65536) | tl.maximum(a & 0xFFFF, b & 0xFFFF)


@triton.jit
def _words_rowmax(wa, wb, ROWS: tl.constexpr, BLOCK: tl.constexpr, HW: tl.constexpr):
    """The row maxima [ROWS] of |x|'s fp32 bits (quantize_tile's rowmax) from the tile's bf16 words: the
    magnitude bits of both halves of a word at once (one AND), a halfword-wise max over the row (one integer max
    per two elements instead of an AND per element and a max per element), then the larger half << 16, which is
    max(bits(|x|)) of the widened values exactly: widening to fp32 appends 16 zero bits. HW: sm_90's max.u16x2;
    else the same maxima in plain integer ops."""
    ma = wa & 0x7FFF7FFF
    mb = wb & 0x7FFF7FFF
    if HW:
        m = tl.reduce(tl.reshape(tl.permute(_max_u16x2(ma, mb), (1, 0, 2)), (ROWS, BLOCK // 4)), 1, _max_u16x2)
    else:  # the row's halves by tl.max: a reduce with a Python combine made the interpreter's conformance 3x slower
        r = tl.reshape(tl.permute(_max_u15x2(ma, mb), (1, 0, 2)), (ROWS, BLOCK // 4))
        m = tl.max(r & -65536, axis=1) | tl.max(r & 0xFFFF, axis=1)
    return tl.maximum(m & -65536, m << 16)


@triton.jit
def _words_f32(w, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """[J, ROWS, 4] int32 words of two bf16 each -> their [J, ROWS, 8] fp32 values in memory order."""
    return tl.reshape(tl.join((w << 16).to(tl.float32, bitcast=True), (w & -65536).to(tl.float32, bitcast=True)),
                      (BLOCK // 16, ROWS, 8))


@triton.jit
def _rows_of16(xa, xb, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """The two halves [J, ROWS, 8] as one [ROWS, BLOCK] tile (a row's order is (j, c, half), not memory order:
    the block quantizer only reduces over rows and works element-wise). No data moves."""
    return tl.reshape(tl.permute(tl.join(xa, xb), (1, 0, 2, 3)), (ROWS, BLOCK))


@triton.jit
def _halves_of16(codes, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """Inverse of _rows_of16: [ROWS, BLOCK] -> the two halves [J, ROWS, 8]."""
    return tl.split(tl.permute(tl.reshape(codes, (ROWS, BLOCK // 16, 8, 2)), (1, 0, 2, 3)))


@triton.jit
def _pack_in_thread(c, BITS: tl.constexpr, N: tl.constexpr):
    """[A, B, N] codes (N consecutive, in one thread) -> [A, B] int32 with code i at bits BITS * i."""
    sh = (tl.arange(0, N) * BITS)[None, None, :]
    # the fields are disjoint, so a sum is their OR (no carries; int32 wraps). Not tl.reduce with an OR: Triton's
    # interpreter runs a custom combine element by element (quantize ~80x slower on CPU, measured)
    return tl.sum(c << sh, axis=2)


@triton.jit
def _groups4(c, BITS: tl.constexpr, ROWS: tl.constexpr, J: tl.constexpr):
    """[J, ROWS, 8] codes -> two [J, ROWS] int32 of 4 codes each (codes 0-3, 4-7), BITS apart."""
    return tl.split(tl.reshape(_pack_in_thread(tl.reshape(c, (J, ROWS * 2, 4)), BITS, 4), (J, ROWS, 2)))


@triton.jit
def _no_neg0(w):
    """FP8 codes packed four to a word: -0 bytes (0x80) become +0. A byte keeps its sign bit iff its low 7 bits
    are not all zero: (b & 0x7F) + 0x7F carries into bit 7 iff so, and no byte carries into the next."""
    return w & (((w & 0x7F7F7F7F) + 0x7F7F7F7F) | 0x7F7F7F7F)


@triton.jit
def _pack16(ca, cb, ROWS: tl.constexpr, BITS: tl.constexpr, J: tl.constexpr):
    """The words of the 16-code groups (ca: codes 0-7, cb: codes 8-15 of each group; [J, ROWS, 8]) in the byte
    order of docs/formats.md §5: 8-bit [J, ROWS, 2, 2] (half, word), 4-bit [J, ROWS, 2]; 6-bit three [J, ROWS]
    words; 5-bit two [J, ROWS] words and the last halfword (as int32)."""
    if BITS == 8:  # 16 codes -> 4 words
        wa = tl.reshape(_pack_in_thread(tl.reshape(ca, (J, ROWS * 2, 4)), 8, 4), (J, ROWS, 2))
        wb = tl.reshape(_pack_in_thread(tl.reshape(cb, (J, ROWS * 2, 4)), 8, 4), (J, ROWS, 2))
        return tl.permute(tl.join(wa, wb), (0, 1, 3, 2)), wa, wb
    elif BITS == 4:  # 16 codes -> 2 words
        return tl.join(_pack_in_thread(ca, 4, 8), _pack_in_thread(cb, 4, 8)), ca, cb
    elif BITS == 6:  # 16 codes -> 96 bits -> 3 words; g* = 4 codes (24 bits)
        g0, g1 = _groups4(ca, 6, ROWS, J)
        g2, g3 = _groups4(cb, 6, ROWS, J)
        return g0 | (g1 << 24), (g1 >> 8) | (g2 << 16), (g2 >> 16) | (g3 << 8)
    else:  # 16 codes -> 80 bits -> 2 words + 1 halfword; g* = 4 codes (20 bits)
        g0, g1 = _groups4(ca, 5, ROWS, J)
        g2, g3 = _groups4(cb, 5, ROWS, J)
        return g0 | (g1 << 20), (g1 >> 12) | (g2 << 8) | (g3 << 28), g3 >> 4


@triton.jit
def _store_codes16(codes_ptr, ca, cb, rows, ok, zrow, ROWS: tl.constexpr, KIND: tl.constexpr, BITS: tl.constexpr,
                   BLOCK: tl.constexpr):
    """Codes of the two halves (ca: elements 16j + c, cb: 16j + 8 + c; int32 [BLOCK // 16, ROWS, 8]) of a RAW
    quantize_tile -> the byte stream of docs/formats.md §5 (little-endian), packed in registers; rows with
    zrow get the zero code and FP8's -0 becomes +0, both on the packed words (one select and three integer ops
    per word instead of two selects and a compare per code)."""
    J: tl.constexpr = BLOCK // 16
    zc = tl.full((J, ROWS, 8), zero_code(KIND, BITS), tl.int32)  # the zero words: constants after folding
    w0, w1, w2 = _pack16(ca, cb, ROWS, BITS, J)
    z0, z1, z2 = _pack16(zc, zc, ROWS, BITS, J)
    if BITS == 8:  # one 16-byte store per thread
        w = tl.where(zrow[None, :, None, None], z0, _no_neg0(w0) if KIND >= 3 else w0)
        k = (rows[None, :, None, None] * (BLOCK // 4) + tl.arange(0, J)[:, None, None, None] * 4
             + tl.arange(0, 2)[None, None, :, None] * 2 + tl.arange(0, 2)[None, None, None, :])
        tl.store(codes_ptr.to(tl.pointer_type(tl.int32)) + k, w, mask=ok[None, :, None, None])
    elif BITS == 4:
        w = tl.where(zrow[None, :, None], z0, w0)
        k = rows[None, :, None] * (BLOCK // 8) + tl.arange(0, J)[:, None, None] * 2 + tl.arange(0, 2)[None, None, :]
        tl.store(codes_ptr.to(tl.pointer_type(tl.int32)) + k, w, mask=ok[None, :, None])
    elif BITS == 6:
        zr = zrow[None, :]
        wp = codes_ptr.to(tl.pointer_type(tl.int32)) + rows[None, :] * (J * 3) + 3 * tl.arange(0, J)[:, None]
        tl.store(wp, tl.where(zr, z0, w0), mask=ok[None, :])
        tl.store(wp + 1, tl.where(zr, z1, w1), mask=ok[None, :])
        tl.store(wp + 2, tl.where(zr, z2, w2), mask=ok[None, :])
    else:  # 5-bit: a group starts 2-byte aligned: five halfwords
        zr = zrow[None, :]
        w0 = tl.where(zr, z0, w0)
        w1 = tl.where(zr, z1, w1)
        hp = codes_ptr.to(tl.pointer_type(tl.int16)) + rows[None, :] * (J * 5) + 5 * tl.arange(0, J)[:, None]
        m = ok[None, :]
        tl.store(hp, w0.to(tl.int16), mask=m)
        tl.store(hp + 1, (w0 >> 16).to(tl.int16), mask=m)
        tl.store(hp + 2, w1.to(tl.int16), mask=m)
        tl.store(hp + 3, (w1 >> 16).to(tl.int16), mask=m)
        tl.store(hp + 4, tl.where(zr, z2, w2).to(tl.int16), mask=m)


@triton.jit
def _unpack(w, BITS: tl.constexpr, N: tl.constexpr):
    """[A, B] int32 holding N codes BITS apart (code i at bits BITS * i) -> [A, B, N] codes."""
    return (w[:, :, None] >> (tl.arange(0, N) * BITS)[None, None, :]) & ((1 << BITS) - 1)


@triton.jit
def _load_codes16(codes_ptr, rows, ok, off, ROWS: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr):
    """Inverse of _store_codes16: the codes of the two halves [BLOCK // 16, ROWS, 8] of every 16-element group,
    read as words (8-bit: four, 4-bit: two, 6-bit: three) or halfwords (5-bit: five) and unpacked in
    registers. Invalid rows read 0."""
    J: tl.constexpr = BLOCK // 16
    jj = tl.arange(0, J)[:, None]
    m = ok[None, :]
    if BITS == 8:
        ca = _load_byte(codes_ptr + off, ok[None, :, None])
        cb = _load_byte(codes_ptr + off + 8, ok[None, :, None])
    elif BITS == 4:
        wp = codes_ptr.to(tl.pointer_type(tl.int32)) + rows[None, :] * (J * 2) + 2 * jj
        ca = _unpack(tl.load(wp, mask=m, other=0), 4, 8)
        cb = _unpack(tl.load(wp + 1, mask=m, other=0), 4, 8)
    elif BITS == 6:
        wp = codes_ptr.to(tl.pointer_type(tl.int32)) + rows[None, :] * (J * 3) + 3 * jj
        w0 = tl.load(wp, mask=m, other=0)
        w1 = tl.load(wp + 1, mask=m, other=0)
        w2 = tl.load(wp + 2, mask=m, other=0)
        g0 = w0 & 0xFFFFFF
        g1 = ((w0 >> 24) & 0xFF) | ((w1 & 0xFFFF) << 8)
        g2 = ((w1 >> 16) & 0xFFFF) | ((w2 & 0xFF) << 16)
        g3 = (w2 >> 8) & 0xFFFFFF
        ca = tl.reshape(tl.permute(tl.join(_unpack(g0, 6, 4), _unpack(g1, 6, 4)), (0, 1, 3, 2)), (J, ROWS, 8))
        cb = tl.reshape(tl.permute(tl.join(_unpack(g2, 6, 4), _unpack(g3, 6, 4)), (0, 1, 3, 2)), (J, ROWS, 8))
    else:
        hp = codes_ptr.to(tl.pointer_type(tl.int16)) + rows[None, :] * (J * 5) + 5 * jj
        h0 = tl.load(hp, mask=m, other=0).to(tl.int32) & 0xFFFF
        h1 = tl.load(hp + 1, mask=m, other=0).to(tl.int32) & 0xFFFF
        h2 = tl.load(hp + 2, mask=m, other=0).to(tl.int32) & 0xFFFF
        h3 = tl.load(hp + 3, mask=m, other=0).to(tl.int32) & 0xFFFF
        h4 = tl.load(hp + 4, mask=m, other=0).to(tl.int32) & 0xFFFF
        g0 = h0 | ((h1 & 0xF) << 16)
        g1 = (h1 >> 4) | ((h2 & 0xFF) << 12)
        g2 = (h2 >> 8) | ((h3 & 0xFFF) << 8)
        g3 = (h3 >> 12) | (h4 << 4)
        ca = tl.reshape(tl.permute(tl.join(_unpack(g0, 5, 4), _unpack(g1, 5, 4)), (0, 1, 3, 2)), (J, ROWS, 8))
        cb = tl.reshape(tl.permute(tl.join(_unpack(g2, 5, 4), _unpack(g3, 5, 4)), (0, 1, 3, 2)), (J, ROWS, 8))
    return ca, cb


@triton.jit
def _dequantize16(codes_ptr, scales_ptr, lut_ptr, rows, ok, off, ROWS: tl.constexpr, KIND: tl.constexpr,
                  BITS: tl.constexpr, BLOCK: tl.constexpr, NF4_LUT: tl.constexpr, HW: tl.constexpr):
    """The 16-lane tile's fp32 decode(code) * scale, as the two halves [BLOCK // 16, ROWS, 8] (invalid rows:
    scale 0)."""
    ca, cb = _load_codes16(codes_ptr, rows, ok, off, ROWS, BITS, BLOCK)
    s = tl.load(scales_ptr + rows, mask=ok, other=0.0)[None, :, None]
    return decode(ca, lut_ptr, KIND, BITS, NF4_LUT, HW) * s, decode(cb, lut_ptr, KIND, BITS, NF4_LUT, HW) * s


@triton.jit
def _quantize16(xa, xb, elut_ptr, ROWS: tl.constexpr, KIND: tl.constexpr, BITS: tl.constexpr, QMAX: tl.constexpr,
                BLOCK: tl.constexpr, LUT: tl.constexpr, HW: tl.constexpr, SCALE: tl.constexpr, ts_ptr,
                FAST_RCP: tl.constexpr = True, rowmax=None):
    """The RAW quantize_tile of the 16-lane tile's two halves -> (codes of each half, scales). With a bucket
    table (LUT: NF4 on CUDA) the scaled values go back to the halves' layout before they are encoded, so the
    per-element table gathers run in the layout the loads used (sm_90: no shared-memory round trip). rowmax:
    quantize_tile's."""
    x = _rows_of16(xa, xb, ROWS, BLOCK)
    if LUT and SCALE == 0:
        v, scale = quantize_tile(x, elut_ptr, KIND, BITS, QMAX, HW, LUT, HW, SCALE, ts_ptr, True, True, FAST_RCP,
                                 rowmax)
        va, vb = _halves_of16(v, ROWS, BLOCK)
        ca = _encode_tile(va, elut_ptr, KIND, BITS, QMAX, HW, LUT, False)
        cb = _encode_tile(vb, elut_ptr, KIND, BITS, QMAX, HW, LUT, False)
        return ca, cb, scale
    else:
        codes, scale = quantize_tile(x, elut_ptr, KIND, BITS, QMAX, HW, LUT, HW, SCALE, ts_ptr, True,
                                     FAST_RCP=FAST_RCP, rowmax=rowmax)
        ca, cb = _halves_of16(codes, ROWS, BLOCK)
        return ca, cb, scale


@triton.jit
def _dequantize16_store(codes_ptr, scales_ptr, lut_ptr, out_ptr, t, n_blocks, ROWS: tl.constexpr, KIND: tl.constexpr,
                        BITS: tl.constexpr, BLOCK: tl.constexpr, OUT_FLOAT: tl.constexpr, NF4_LUT: tl.constexpr,
                        HW: tl.constexpr):
    """The 16-lane tile's dequantize of tile t. 4-bit codes: one int32 word (8 codes) per thread and group of 8, so
    the code loads and the 16-byte stores are both coalesced; other widths: the two halves of each 16-element group
    (_load_codes16)."""
    if BITS == 4:
        rows, ok, off, m = _tile16(t, n_blocks, ROWS, BLOCK, 8)
        w = tl.load(codes_ptr.to(tl.pointer_type(tl.int32)) + rows[None, :] * (BLOCK // 8)
                    + tl.arange(0, BLOCK // 8)[:, None], mask=ok[None, :], other=0)
        s = tl.load(scales_ptr + rows, mask=ok, other=0.0)[None, :, None]
        _store_f32(out_ptr, off, decode(_unpack(w, 4, 8), lut_ptr, KIND, BITS, NF4_LUT, HW) * s, m, OUT_FLOAT, HW)
    else:
        rows, ok, off, m = _tile16(t, n_blocks, ROWS, BLOCK)
        da, db = _dequantize16(codes_ptr, scales_ptr, lut_ptr, rows, ok, off, ROWS, KIND, BITS, BLOCK, NF4_LUT, HW)
        _store_f32(out_ptr, off, da, m, OUT_FLOAT, HW)
        _store_f32(out_ptr, off + 8, db, m, OUT_FLOAT, HW)


@triton.jit
def _requantize16(acca, accb, codes_ptr, scales_ptr, elut_ptr, rows, ok, ROWS: tl.constexpr, KIND: tl.constexpr,
                  BITS: tl.constexpr, QMAX: tl.constexpr, BLOCK: tl.constexpr, NF4_LUT: tl.constexpr,
                  HW: tl.constexpr, SCALE: tl.constexpr):
    """Quantize the 16-lane tile's two halves and store codes and scales (QuanGrad's kernels)."""
    ca, cb, scale = _quantize16(acca, accb, elut_ptr, ROWS, KIND, BITS, QMAX, BLOCK, NF4_LUT and elut_ptr is not None,
                                HW, SCALE, None)
    _store_codes16(codes_ptr, ca, cb, rows, ok, ~(scale > 0.0), ROWS, KIND, BITS, BLOCK)
    tl.store(scales_ptr + rows, scale, mask=ok)


# ---- kernels --------------------------------------------------------------------------------------------
# Sizes are not specialized: one compiled kernel per format/dtype/geometry serves every tensor size
# (Triton would otherwise compile again for n % 16 == 0 vs not, n == 1, ...). Vectorization does not
# need them: whole-block launches mask by row (RAGGED=False).
_SIZES = ["n", "n_blocks", "n_tiles"]


@triton.jit(do_not_specialize=_SIZES)
def quantize_kernel(x_ptr, codes_ptr, scales_ptr, n, n_blocks, n_tiles,
                    KIND: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_P: tl.constexpr,
                    QMAX: tl.constexpr, ROWS: tl.constexpr, RAGGED: tl.constexpr, X_FLOAT: tl.constexpr,
                    HW: tl.constexpr, elut_ptr=None, NF4_LUT: tl.constexpr = False, SCALE: tl.constexpr = 0,
                    ts_ptr=None, VEC16: tl.constexpr = False, CONTIG: tl.constexpr = False,
                    WORDS: tl.constexpr = False, MAX16: tl.constexpr = False):
    """x (n elements; fp32/fp16, or bf16 as int16) -> codes (int8 view of the uint8 buffer), scales fp32.

    VEC16 (agoq-cuda, whole power-of-two blocks >= 16): the 16-lane tile above; else the generic tile. WORDS: bf16
    read as int32 words on it (_load16_f32). MAX16 (with WORDS): the block absmax from the
    words two magnitudes at a time (_words_rowmax; with HW, sm_90's max.u16x2)."""
    t = tl.program_id(0)
    while t < n_tiles:
        if VEC16:
            rows, ok, off, m = _tile16(t, n_blocks, ROWS, BLOCK)
            rowmax = None  # quantize_tile's own, unless MAX16 reads it from the words
            if MAX16 and WORDS and X_FLOAT == 1:
                wa, wb = _load16_words(x_ptr, t, n_blocks, ROWS, BLOCK)
                # the values before the maxima, as separate statements: passed inline as arguments, Triton 3.6 moved
                # them through shared memory (sm_90 SASS: int4 8.56 -> 13.75 instructions per element)
                xa = _words_f32(wa, ROWS, BLOCK)
                xb = _words_f32(wb, ROWS, BLOCK)
                rowmax = _words_rowmax(wa, wb, ROWS, BLOCK, HW)
            else:
                xa, xb = _load16_f32(x_ptr, t, n_blocks, ROWS, BLOCK, X_FLOAT, WORDS)
            ca, cb, scale = _quantize16(xa, xb, elut_ptr, ROWS, KIND, BITS, QMAX, BLOCK,
                                        NF4_LUT and elut_ptr is not None, HW, SCALE, ts_ptr, rowmax=rowmax)
            _store_codes16(codes_ptr, ca, cb, rows, ok, ~(scale > 0.0), ROWS, KIND, BITS, BLOCK)
        else:
            rows, ok, elem, emask = _tile(t, n, n_blocks, ROWS, BLOCK, BLOCK_P, RAGGED)
            x = _load_f32(x_ptr, elem, emask, X_FLOAT)
            codes, scale = quantize_tile(x, elut_ptr, KIND, BITS, QMAX, HW, NF4_LUT and elut_ptr is not None,
                                         HW, SCALE, ts_ptr)
            store_codes(codes_ptr, codes, rows, ok, elem, emask, n, ROWS, BITS, BLOCK, BLOCK_P, RAGGED, CONTIG)
        tl.store(scales_ptr + rows, scale, mask=ok)
        t += tl.num_programs(0)


@triton.jit(do_not_specialize=_SIZES)
def dequantize_kernel(codes_ptr, scales_ptr, lut_ptr, out_ptr, n, n_blocks, n_tiles,
                      KIND: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_P: tl.constexpr,
                      QMAX: tl.constexpr, ROWS: tl.constexpr, RAGGED: tl.constexpr, OUT_FLOAT: tl.constexpr,
                      NF4_LUT: tl.constexpr, HW: tl.constexpr, SCALE: tl.constexpr = 0,
                      VEC16: tl.constexpr = False, CONTIG: tl.constexpr = False):
    """codes + scales -> out (fp32/fp16, or bf16 as int16): fp32 decode * scale, one RNE cast.

    VEC16 (agoq-cuda, whole power-of-two blocks >= 16): codes read as words and unpacked in registers, a thread
    writing 16 consecutive outputs of a row (kernels._load_codes16); else the generic tile."""
    t = tl.program_id(0)
    while t < n_tiles:
        if VEC16:
            _dequantize16_store(codes_ptr, scales_ptr, lut_ptr, out_ptr, t, n_blocks, ROWS, KIND, BITS, BLOCK,
                                OUT_FLOAT, NF4_LUT, HW)
        else:
            rows, ok, elem, emask = _tile(t, n, n_blocks, ROWS, BLOCK, BLOCK_P, RAGGED)
            y = dequantize_tile(codes_ptr, scales_ptr, lut_ptr, rows, ok, elem, emask, n,
                                ROWS, KIND, BITS, BLOCK, BLOCK_P, NF4_LUT, RAGGED, HW, CONTIG)
            _store_f32(out_ptr, elem, y, emask, OUT_FLOAT, HW)
        t += tl.num_programs(0)


@triton.jit(do_not_specialize=_SIZES)
def accumulate_kernel(codes_ptr, scales_ptr, lut_ptr, g_ptr, n, n_blocks, n_tiles,
                      KIND: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_P: tl.constexpr,
                      QMAX: tl.constexpr, ROWS: tl.constexpr, RAGGED: tl.constexpr, G_FLOAT: tl.constexpr,
                      NF4_LUT: tl.constexpr, HW: tl.constexpr, elut_ptr=None, SCALE: tl.constexpr = 0,
                      VEC16: tl.constexpr = False, CONTIG: tl.constexpr = False, WORDS: tl.constexpr = False):
    """In place: (codes, scales) <- Q(D(codes, scales) + g), D in fp32 and one fp32 add (WORDS: a bf16 g read as
    int32 words on the 16-lane tile, _load16_f32).

    Each tile reads its own blocks before writing them, so in-place is race-free."""
    t = tl.program_id(0)
    while t < n_tiles:
        if VEC16:  # whole blocks: no padding lanes
            rows, ok, off, m = _tile16(t, n_blocks, ROWS, BLOCK)
            da, db = _dequantize16(codes_ptr, scales_ptr, lut_ptr, rows, ok, off, ROWS, KIND, BITS, BLOCK,
                                   NF4_LUT, HW)
            if not HW:
                da = _materialise(da, n_tiles >> 31)
                db = _materialise(db, n_tiles >> 31)
            ga, gb = _load16_f32(g_ptr, t, n_blocks, ROWS, BLOCK, G_FLOAT, WORDS)
            acca = da + ga
            accb = db + gb
            _requantize16(acca, accb, codes_ptr, scales_ptr, elut_ptr, rows, ok, ROWS, KIND, BITS, QMAX, BLOCK,
                          NF4_LUT, HW, SCALE)
        else:
            rows, ok, elem, emask = _tile(t, n, n_blocks, ROWS, BLOCK, BLOCK_P, RAGGED)
            d = dequantize_tile(codes_ptr, scales_ptr, lut_ptr, rows, ok, elem, emask, n,
                                ROWS, KIND, BITS, BLOCK, BLOCK_P, NF4_LUT, RAGGED, HW, CONTIG)
            if not HW:  # no multiply-add contraction of decode * scale + g (see _materialise)
                d = _materialise(d, n_tiles >> 31)
            g = _load_f32(g_ptr, elem, emask, G_FLOAT)
            acc = tl.where(emask, d + g, 0.0)  # padding lanes are 0, whatever garbage the pad codes hold
            codes, scale = quantize_tile(acc, elut_ptr, KIND, BITS, QMAX, HW, NF4_LUT and elut_ptr is not None,
                                         HW, SCALE)
            store_codes(codes_ptr, codes, rows, ok, elem, emask, n, ROWS, BITS, BLOCK, BLOCK_P, RAGGED, CONTIG)
            tl.store(scales_ptr + rows, scale, mask=ok)
        t += tl.num_programs(0)


# The rank strides stay specialized: knowing codes_stride % 16 == 0 keeps the other ranks' loads vectorized.
@triton.jit(do_not_specialize=_SIZES + ["world"])
def reduce_requantize_kernel(codes_ptr, scales_ptr, lut_ptr, codes_out_ptr, scales_out_ptr,
                             n, n_blocks, n_tiles, world, codes_stride, scales_stride,
                             KIND: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_P: tl.constexpr,
                             QMAX: tl.constexpr, ROWS: tl.constexpr, RAGGED: tl.constexpr, NF4_LUT: tl.constexpr,
                             HW: tl.constexpr, elut_ptr=None, SCALE: tl.constexpr = 0, VEC16: tl.constexpr = False,
                             CONTIG: tl.constexpr = False):
    """codes[world, codes_stride], scales[world, scales_stride] -> Q(((D0 + D1) + D2) + ...).

    The fp32 sum runs in rank order (a left fold), so every rank and every backend gets the same bits."""
    t = tl.program_id(0)
    while t < n_tiles:
        if VEC16:
            rows, ok, off, m = _tile16(t, n_blocks, ROWS, BLOCK)
            acca, accb = _dequantize16(codes_ptr, scales_ptr, lut_ptr, rows, ok, off, ROWS, KIND, BITS, BLOCK,
                                       NF4_LUT, HW)
            if not HW:
                acca = _materialise(acca, n_tiles >> 31)
                accb = _materialise(accb, n_tiles >> 31)
            r = 1
            while r < world:
                r64 = tl.cast(r, tl.int64)  # r * codes_stride passes 2**31 for big chunks (W = 8, 2**28 elements)
                da, db = _dequantize16(codes_ptr + r64 * codes_stride, scales_ptr + r64 * scales_stride, lut_ptr,
                                       rows, ok, off, ROWS, KIND, BITS, BLOCK, NF4_LUT, HW)
                if not HW:
                    da = _materialise(da, n_tiles >> 31)
                    db = _materialise(db, n_tiles >> 31)
                acca = acca + da
                accb = accb + db
                r += 1
            _requantize16(acca, accb, codes_out_ptr, scales_out_ptr, elut_ptr, rows, ok, ROWS, KIND, BITS, QMAX,
                          BLOCK, NF4_LUT, HW, SCALE)
        else:
            rows, ok, elem, emask = _tile(t, n, n_blocks, ROWS, BLOCK, BLOCK_P, RAGGED)
            acc = dequantize_tile(codes_ptr, scales_ptr, lut_ptr, rows, ok, elem, emask, n,
                                  ROWS, KIND, BITS, BLOCK, BLOCK_P, NF4_LUT, RAGGED, HW, CONTIG)
            if not HW:
                acc = _materialise(acc, n_tiles >> 31)
            r = 1
            while r < world:
                r64 = tl.cast(r, tl.int64)  # r * codes_stride passes 2**31 for big chunks (W = 8, 2**28 elements)
                d = dequantize_tile(codes_ptr + r64 * codes_stride, scales_ptr + r64 * scales_stride, lut_ptr,
                                    rows, ok, elem, emask, n, ROWS, KIND, BITS, BLOCK, BLOCK_P,
                                    NF4_LUT, RAGGED, HW, CONTIG)
                if not HW:
                    d = _materialise(d, n_tiles >> 31)
                acc = acc + d
                r += 1
            acc = tl.where(emask, acc, 0.0)
            codes, scale = quantize_tile(acc, elut_ptr, KIND, BITS, QMAX, HW, NF4_LUT and elut_ptr is not None,
                                         HW, SCALE)
            store_codes(codes_out_ptr, codes, rows, ok, elem, emask, n, ROWS, BITS, BLOCK, BLOCK_P, RAGGED, CONTIG)
            tl.store(scales_out_ptr + rows, scale, mask=ok)
        t += tl.num_programs(0)


_FLT_MAX = tl.constexpr(3.4028234663852886e38)


@triton.jit(do_not_specialize=_SIZES)
def absmax_kernel(x_ptr, part_ptr, n, n_blocks, n_tiles, BLOCK: tl.constexpr, BLOCK_P: tl.constexpr,
                  ROWS: tl.constexpr, RAGGED: tl.constexpr, X_FLOAT: tl.constexpr):
    """part[p] = max |x| over the finite, normal elements of program p's tiles (0 if none): the input of
    NVFP4's tensor scale (agoq_core.formats.mx.nvfp4_tensor_scale_from_absmax; the launcher takes the max of
    the partials). fp32 compares only (NaN fails both, so NaN, +-Inf and subnormals are skipped; Ascend runs
    int32 vector compares as scalar code); a max of non-negative, non-NaN floats is exact in any order."""
    p = tl.program_id(0)
    t = p
    acc = tl.zeros((ROWS,), dtype=tl.float32)
    while t < n_tiles:
        rows, ok, elem, emask = _tile(t, n, n_blocks, ROWS, BLOCK, BLOCK_P, RAGGED)
        ax = tl.abs(_load_f32(x_ptr, elem, emask, X_FLOAT))
        acc = tl.maximum(acc, tl.max(tl.where((ax >= _MIN_NORMAL_F32) & (ax <= _FLT_MAX), ax, 0.0), axis=1))
        t += tl.num_programs(0)
    tl.store(part_ptr + p, tl.max(acc, axis=0))


@triton.jit(do_not_specialize=["n_parts"])
def tensor_scale_kernel(part_ptr, n_parts, out_ptr, DIVISOR: tl.constexpr, MIN_SCALE: tl.constexpr,
                        BLOCK_P: tl.constexpr):
    """out = [S, RN(1/S)] from absmax_kernel's partial maxima part[0:n_parts], one program: a = their max,
    S = RN(a / DIVISOR) (0 below MIN_SCALE), RN(1/S) (0 for S = 0). Division-free (_exact_scale, _exact_recip),
    so the bits are agoq_core.formats.mx.nvfp4_tensor_scale_from_absmax's on every device whatever its
    division or multiply-add contraction; replaces about ten small torch launches per NVFP4 quantize.
    S >= MIN_SCALE = 2**-100 keeps 1/S <= 2**100 normal; a <= FLT_MAX keeps S normal."""
    offs = tl.arange(0, BLOCK_P)[None, :]
    acc = tl.zeros((1, BLOCK_P), dtype=tl.float32)
    i = 0
    while i < n_parts:
        acc = tl.maximum(acc, tl.load(part_ptr + i + offs, mask=i + offs < n_parts, other=0.0))
        i += BLOCK_P
    s = _exact_scale(tl.max(acc, axis=1), DIVISOR)
    s = tl.where(s < MIN_SCALE, 0.0, s)
    k, rb = _exact_recip(tl.where(s > 0.0, s, 1.0))
    one = tl.arange(0, 1)
    tl.store(out_ptr + one, s)
    tl.store(out_ptr + 1 + one, tl.where(s > 0.0, rb * k, 0.0))
