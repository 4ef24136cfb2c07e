"""Element-wise pieces of the numerics contract (docs/formats.md) as @triton.jit helpers.

Portable on purpose (CUDA, the CPU interpreter, Triton-Ascend): all bit work is int32, no libdevice,
no inline asm, no fp8/uint8/uint32 arithmetic, no reliance on float-cast overflow behaviour.
Rounding that has to be exact is done either by one IEEE fp32 add whose result spacing is the target
spacing (round-half-even for free) or by integer add-and-shift with an explicit tie fix.
"""
from __future__ import annotations

import triton
import triton.language as tl

from agoq_triton_kernels.tables import NF4_LEVELS as NF4_LEVELS_KERNEL  # noqa: F401  (launchers' LUT)
from agoq_triton_kernels.tables import NF4_THRESHOLDS as NF4_THRESHOLDS_KERNEL  # noqa: F401

# fp32 bit fields.
_EXP_MASK = tl.constexpr(0x7F800000)
_ABS_MASK = tl.constexpr(0x7FFFFFFF)
_QNAN = tl.constexpr(0x7FC00000)
_SIGN = tl.constexpr(-0x80000000)  # 0x80000000 as an int32
_MIN_NORMAL_BITS = tl.constexpr(0x00800000)  # 2**-126
_MIN_NORMAL_F32 = tl.constexpr(1.1754943508222875e-38)  # 2**-126
_INF_BITS = tl.constexpr(0x7F800000)  # +inf

# 1.5 * 2**23: adding it rounds an fp32 |v| < 2**22 to an integer, half to even (the sum's ulp is 1), and
# leaves that integer in the low mantissa bits: bits(v + magic) - bits(magic) = round(v). No float->int
# conversion instruction (a quarter-rate unit on GPUs). |v| <= qmax <= 127 here.
_RNE_MAGIC = tl.constexpr(12582912.0)
_RNE_MAGIC_BITS = tl.constexpr(0x4B400000)

# NF4 levels (bitsandbytes' fp32 values) and the decision thresholds fp32((L[i] + L[i+1]) * 0.5),
# exactly as agoq_core.formats.reference.nf4_thresholds() computes them; a test checks both tables
# against the core so they cannot drift.
_NF4_L0 = tl.constexpr(-1.0)
_NF4_L1 = tl.constexpr(-0.6961928009986877)
_NF4_L2 = tl.constexpr(-0.5250730514526367)
_NF4_L3 = tl.constexpr(-0.39491748809814453)
_NF4_L4 = tl.constexpr(-0.28444138169288635)
_NF4_L5 = tl.constexpr(-0.18477343022823334)
_NF4_L6 = tl.constexpr(-0.09105003625154495)
_NF4_L7 = tl.constexpr(0.0)
_NF4_L8 = tl.constexpr(0.07958029955625534)
_NF4_L9 = tl.constexpr(0.16093020141124725)
_NF4_L10 = tl.constexpr(0.24611230194568634)
_NF4_L11 = tl.constexpr(0.33791524171829224)
_NF4_L12 = tl.constexpr(0.44070982933044434)
_NF4_L13 = tl.constexpr(0.5626170039176941)
_NF4_L14 = tl.constexpr(0.7229568362236023)
_NF4_L15 = tl.constexpr(1.0)
_NF4_T0 = tl.constexpr(-0.8480963706970215)
_NF4_T1 = tl.constexpr(-0.6106328964233398)
_NF4_T2 = tl.constexpr(-0.4599952697753906)
_NF4_T3 = tl.constexpr(-0.33967941999435425)
_NF4_T4 = tl.constexpr(-0.23460739850997925)
_NF4_T5 = tl.constexpr(-0.13791173696517944)
_NF4_T6 = tl.constexpr(-0.045525018125772476)
_NF4_T7 = tl.constexpr(0.03979014977812767)
_NF4_T8 = tl.constexpr(0.120255246758461)
_NF4_T9 = tl.constexpr(0.2035212516784668)
_NF4_T10 = tl.constexpr(0.2920137643814087)
_NF4_T11 = tl.constexpr(0.3893125355243683)
_NF4_T12 = tl.constexpr(0.5016634464263916)
_NF4_T13 = tl.constexpr(0.6427869200706482)
_NF4_T14 = tl.constexpr(0.8614784479141235)


# ---- division without a division instruction ---------------------------------------------------------
# The contract (docs/formats.md §3) needs RN(a / b) twice per block: the scale absmax / qmax and, since spec
# version 3, the reciprocal 1 / scale that every scaled value is multiplied by (spec versions 1-2 divided
# every element).
# Hardware division cannot be trusted for that on every device (Triton-Ascend lowers tl.math.div_rn to a
# plain arith.divf; its own test checks it to 1e-4 only), and a multiply-add contraction the compiler is
# free to make must not change a result either. So the portable path (HW=False) divides with IEEE add,
# multiply and compare only, each product that meets an add is exact (so an FMA contraction of it rounds
# the same), and the last step is an exact remainder test that makes the quotient correctly rounded
# whatever the approximation before it was (as long as it is faithful, which the Newton step ensures):
#
#   b in [2, 4) (a power-of-two scaling of the divisor, exact), b = bh + bl split at 12 bits by integer
#   add-and-mask on the bits (Veltkamp's split without a multiply); y ~ 1/b by three Newton steps from a
#   linear start (error < 2**-22; per row, cheap);
#   q0 = hi12(a * y)                       (12 significant bits: 2**-11 relative at worst)
#   q1 = q0 + ((a - q0 bh) - q0 bl) y      (q0 bh, q0 bl exact; a - q0 bh exact by Sterbenz) -> faithful
#   r  = a - q1 b  via ((((a - qh bh) - qh bl) - ql bh) - ql bl) with q1 = qh + ql split likewise:
#        every product is exact (12 x 12 bits) and every partial sum is representable, so r is exact
#   RN(a / b) = q1 + ulp  if r >  b ulp(q1) / 2,   q1 - ulp-  if r < -b ulp-(q1) / 2,   else q1
#   (ulp- is the spacing below q1, half of ulp at a power of two; a quotient of two fp32 numbers is never
#   a midpoint, so no tie can occur). Proofs of each step: docs/formats.md §3.1. Tests:
#   backends/triton_common/tests/test_exact_division.py (every step against numpy's correctly rounded
#   division, and the kernels with the interpreter's division replaced by a 1-ulp-off one).
_DIV_MIN_Q = tl.constexpr(8.271806125530277e-25)  # 2**-80: below it quotients are left approximate (codes are 0)
_ONE_MINUS_ULP = tl.constexpr(0.99999994)  # 1 - 2**-24 (exact): q * it lies in the binade below q iff q = 2**k


@triton.jit
def hi12(a):
    """a rounded to 12 significant bits (ties away), by integer add and mask on the bits."""
    return ((a.to(tl.int32, bitcast=True) + 0x800) & -4096).to(tl.float32, bitcast=True)


@triton.jit
def split12(a):
    """a = hi + lo exactly: hi = a rounded to 12 significant bits (integer add and mask on the bits, no
    multiply for a compiler to contract), |lo| <= ulp(hi) / 2 (12 bits). a finite, |a| >= 2**-100."""
    hi = hi12(a)
    return hi, a - hi


@triton.jit
def pow2_scale_to_2_4(b):
    """The power of two k with b * k in [2, 4), for a normal b > 0 (exact; k is normal for every such b)."""
    return ((255 - ((b.to(tl.int32, bitcast=True) >> 23) & 0xFF)) << 23).to(tl.float32, bitcast=True)


@triton.jit
def recip_2_4(b):
    """y ~ 1 / b for b in [2, 4): a linear start (relative error <= 1/17) and three Newton steps
    y <- y + y (1 - b y), relative error < 2**-22 with or without contraction; no division."""
    y = 0.7058823529411765 - 0.11764705882352941 * b  # (48/17 - 32/17 d) / 4 with d = b / 4
    y = y + y * (1.0 - b * y)
    y = y + y * (1.0 - b * y)
    return y + y * (1.0 - b * y)


@triton.jit
def exact_quotient(a, b, bh, bl, y):
    """RN(a / b), correctly rounded, from add, multiply and compare only (see the section comment).

    a >= 0 finite; b in [2, 4) with (bh, bl) = split12(b) and y = recip_2_4(b) (broadcastable to a).
    Exact for quotients >= 2**-80; smaller ones (every code maps them to zero) come out within a few
    ulps, >= 0. Independent of FMA contraction: every product that meets an add is exact."""
    q = hi12(a * y)
    q = q + ((a - q * bh) - q * bl) * y
    qh, ql = split12(q)
    r = (((a - qh * bh) - qh * bl) - ql * bh) - ql * bl
    up = ((q.to(tl.int32, bitcast=True) & _EXP_MASK) - (23 << 23)).to(tl.float32, bitcast=True)
    dn = (((q * _ONE_MINUS_ULP).to(tl.int32, bitcast=True) & _EXP_MASK) - (23 << 23)).to(tl.float32, bitcast=True)
    fixed = tl.where(r > b * (up * 0.5), q + up, tl.where(r < b * (dn * -0.5), q - dn, q))
    return tl.where(q >= _DIV_MIN_Q, fixed, q)


@triton.jit
def exact_div(a, d):
    """RN(a / d) elementwise without a division, for a that is 0 or a normal >= 0 and d a normal > 0 (fp32,
    broadcastable): the mantissas' quotient by exact_quotient (in (1/4, 1)), the exponents added on the bits.
    a == 0 gives +0; a result below 2**-126 is +0 (rounded at 24 bits first: callers must not care about
    the subnormal range); one that rounds to 2**128 or more is +inf, as IEEE's overflow. Per-row use only: the
    exponent arithmetic is int32 (scalar code on Ascend's vector unit)."""
    kd = pow2_scale_to_2_4(d)
    md = d * kd
    mdh, mdl = split12(md)
    abits = a.to(tl.int32, bitcast=True)
    ma = ((abits & 0x7FFFFF) | 0x3F800000).to(tl.float32, bitcast=True)
    q = exact_quotient(ma, md, mdh, mdl, recip_2_4(md))
    qb = q.to(tl.int32, bitcast=True)
    shift = ((abits >> 23) & 0xFF) - ((d.to(tl.int32, bitcast=True) >> 23) & 0xFF) + 1
    e = ((qb >> 23) & 0xFF) + shift
    r = tl.where(e >= 255, _INF_BITS, tl.where(e > 0, qb + (shift << 23), 0)).to(tl.float32, bitcast=True)
    return tl.where(a == 0.0, 0.0, r)


# ---- fp8 <-> fp32 (integer logic; torch's algorithm, measured bit-exact in cpu-feasibility §2c) ----
@triton.jit
def f32_to_e4m3_bits(v):
    """fp32 with |v| <= 448 (callers clamp first) -> E4M3FN code in [0, 255] (int32), RNE."""
    bits = v.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a = bits & _ABS_MASK
    # |v| < 2**-6: one fp32 add of 2**14 leaves exactly E4M3's subnormal spacing 2**-9 (RNE).
    den = (a.to(tl.float32, bitcast=True) + 16384.0).to(tl.int32, bitcast=True) - (141 << 23)
    # normal: rebias 127 -> 7, keep 3 mantissa bits, round half to even via the kept lsb.
    nrm = (a + (-120 << 23) + 0x7FFFF + ((a >> 20) & 1)) >> 20
    return tl.where(tl.abs(v) < 0.015625, den, nrm) | sign  # a < 121 << 23, as an fp32 compare


@triton.jit
def f32_to_e5m2_bits(v):
    """fp32 with |v| <= 57344 (callers clamp first) -> E5M2 code in [0, 255] (int32), RNE."""
    bits = v.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a = bits & _ABS_MASK
    # |v| < 2**-14: adding 128 leaves E5M2's subnormal spacing 2**-16.
    den = (a.to(tl.float32, bitcast=True) + 128.0).to(tl.int32, bitcast=True) - (134 << 23)
    nrm = (a + (-112 << 23) + 0xFFFFF + ((a >> 21) & 1)) >> 21
    return tl.where(tl.abs(v) < 0.00006103515625, den, nrm) | sign  # a < 113 << 23, as an fp32 compare


@triton.jit
def e4m3_bits_to_f32(c):
    """E4M3FN code (int32 in [0, 255]) -> fp32; 0x7F/0xFF are NaN (E4M3FN has no inf)."""
    sign = (c & 0x80) << 24
    e = (c >> 3) & 0xF
    m = c & 7
    sub = (m.to(tl.float32) * 0.001953125).to(tl.int32, bitcast=True)  # m * 2**-9, exact
    mag7 = (c & 0x7F).to(tl.float32)  # fp32 compares below: int32 vector compares are scalar code on Ascend
    mag = tl.where(mag7 < 8.0, sub, ((e + 120) << 23) | (m << 20))  # e == 0
    mag = tl.where(mag7 == 127.0, _QNAN, mag)
    return (mag | sign).to(tl.float32, bitcast=True)


@triton.jit
def e5m2_bits_to_f32(c):
    """E5M2 code (int32 in [0, 255]) -> fp32; exponent 31 is inf (m == 0) or NaN."""
    sign = (c & 0x80) << 24
    e = (c >> 2) & 0x1F
    m = c & 3
    sub = (m.to(tl.float32) * 0.0000152587890625).to(tl.int32, bitcast=True)  # m * 2**-16, exact
    mag7 = (c & 0x7F).to(tl.float32)  # fp32 compares below: int32 vector compares are scalar code on Ascend
    mag = tl.where(mag7 < 4.0, sub, ((e + 112) << 23) | (m << 21))  # e == 0
    mag = tl.where(mag7 >= 124.0, tl.where(mag7 == 124.0, _EXP_MASK, _QNAN), mag)  # e == 31: inf iff m == 0
    return (mag | sign).to(tl.float32, bitcast=True)


# ---- bf16 as int16 bits ------------------------------------------------------------------------------
@triton.jit
def bf16_bits_to_f32(h):
    """bf16 bit pattern (loaded from an int16 view) -> fp32, exact (subnormals kept)."""
    return (h.to(tl.int32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def f32_to_bf16_bits(x):
    """fp32 -> bf16 bit pattern as int32 in [0, 0xFFFF], round half to even; every NaN -> 0x7FC0
    (what torch's CPU cast gives). Works on the magnitude so the int32 add cannot overflow."""
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 16) & 0x8000
    a = bits & _ABS_MASK
    r = (a + 0x7FFF + ((a >> 16) & 1)) >> 16
    return tl.where(x != x, 0x7FC0, r | sign)  # NaN test as an fp32 compare (a > _EXP_MASK)


# ---- block scale ---------------------------------------------------------------------------------------
@triton.jit
def finite_scale(scale, QMAX: tl.constexpr):
    """The scale one fp32 step down where qmax x scale overflows (a multiply only: no FMA can form)."""
    sb = scale.to(tl.int32, bitcast=True)
    over = ((scale * QMAX).to(tl.int32, bitcast=True) & _ABS_MASK) == _EXP_MASK
    return tl.where(over, sb - 1, sb).to(tl.float32, bitcast=True)


# ---- codes --------------------------------------------------------------------------------------------
@triton.jit
def zero_code(KIND: tl.constexpr, BITS: tl.constexpr):
    """Code of 0.0: padding, all-zero and non-finite blocks (FormatSpec.zero_code)."""
    if KIND == 0:
        return 1 << (BITS - 1)
    elif KIND == 2:
        return 7
    else:
        return 0


@triton.jit
def _encode_fp4(v, CLAMP: tl.constexpr = True, HW: tl.constexpr = False):
    """FP4 E2M1 of |v| (clamped to 6 if CLAMP) rounded half to even, like the fp8 encoders; sign bit 8 unless
    the magnitude code is 0. Equal to the reference's threshold table (a test checks every tie; every fp32 |v|
    was checked exhaustively in numpy when this was written).

    The magnitude code of u = |v| is RNE(min(2u, u + 2, u/2 + 4)): the three lines are the code as a function
    of u in E2M1's three spacings (0.5 below 2, 1 in [2, 4), 2 from 4 on), their minimum is the piecewise
    line through every level, and rounding commutes with the minimum (it is monotone; a tie between two codes
    is a tie on the line of that binade, and the even code is the even mantissa). Each line is rounded by one
    fp32 add of M = 2**23 (ulp 1): RN(2u + M), RN(u + (M + 2)), RN(u/2 + (M + 4)) are M + the line rounded
    (2u and u/2 are exact, so the adds are the only roundings, with or without FMA contraction), and the
    minimum of the three sums (in fp32, or on CUDA on their bits: positive floats order as their int32 bits, and
    sm_90 has a three-input integer min) has M's bits + the code as its bits. Only IEEE fp32 adds, multiplies by
    powers of two and a min — no binade extraction per element; the final subtract folds into the packing's
    constants (sm_90 SASS: fp4 quantize 17.6 -> 16.4 loop instructions per element, mxfp4 16.9 -> 15.6). Without
    CLAMP, |v| <= 6 (1 + 2**-21) (the kernels' inputs)."""
    m = tl.abs(v)
    if HW:  # CUDA: one FFMA per line (Triton does not contract here: the codec kernels launch without fp fusion)
        #     and the minimum as one three-input integer min (VIMNMX3) of the bits
        f0 = tl.fma(m, 2.0, 8388608.0)
        f2 = tl.fma(m, 0.5, 8388612.0)
        f1 = (m + 8388610.0).to(tl.int32, bitcast=True)
        f = tl.minimum(tl.minimum(f0.to(tl.int32, bitcast=True), f1), f2.to(tl.int32, bitcast=True))
        if CLAMP:
            f = tl.minimum(f, 0x4B000007)  # code 7 (6.0): saturate
    else:  # the same sums (the products are exact, so contracted or not they round once), the minimum in fp32
        #    (int32 vector compares are scalar code on Ascend's vector unit)
        f = tl.minimum(tl.minimum(m * 2.0 + 8388608.0, m + 8388610.0), m * 0.5 + 8388612.0)
        if CLAMP:
            f = tl.minimum(f, 8388615.0)
        f = f.to(tl.int32, bitcast=True)
    idx = f - 0x4B000000
    return tl.where(v < -0.25, idx | 8, idx)  # |v| > 0.25 iff the magnitude code is not 0


@triton.jit
def _encode_nf4(v):
    """NF4 code = number of thresholds strictly below v, found by a 4-step binary search over the
    sorted thresholds (4 compares and 11 selects of constants instead of 15 compares and adds)."""
    b3 = v > _NF4_T7
    b2 = v > tl.where(b3, _NF4_T11, _NF4_T3)
    b1 = v > tl.where(b3, tl.where(b2, _NF4_T13, _NF4_T9), tl.where(b2, _NF4_T5, _NF4_T1))
    t0 = tl.where(b3, tl.where(b2, tl.where(b1, _NF4_T14, _NF4_T12), tl.where(b1, _NF4_T10, _NF4_T8)),
                  tl.where(b2, tl.where(b1, _NF4_T6, _NF4_T4), tl.where(b1, _NF4_T2, _NF4_T0)))
    b0 = v > t0
    return b3.to(tl.int32) * 8 + b2.to(tl.int32) * 4 + b1.to(tl.int32) * 2 + b0.to(tl.int32)


@triton.jit
def bucket_encode(v, elut_ptr, PER_UNIT: tl.constexpr, OFFSET: tl.constexpr, HW: tl.constexpr = False):
    """code = base_k + (v > t_k), bucket k = RNE(v * PER_UNIT) + OFFSET, read from the 64-entry table
    (layout.encode_lut; entries int64 base << 32 | bits(t_k)). The magic constant carries OFFSET, so the bucket is
    the low 6 bits of the sum's bits: one AND bounds it (garbage v from non-finite blocks stays in bounds).
    v * PER_UNIT (a power of two) is exact, so the fused and the unfused forms give the same bits."""
    if HW:
        kf = tl.fma(v, PER_UNIT, _RNE_MAGIC + OFFSET)
    else:
        kf = v * PER_UNIT + (_RNE_MAGIC + OFFSET)
    w = tl.load(elut_ptr + (kf.to(tl.int32, bitcast=True) & 63))  # _RNE_MAGIC_BITS & 63 == 0
    t = w.to(tl.int32).to(tl.float32, bitcast=True)
    # + (v > t): the sign bit of t - v (its sign is exact: RN keeps it, and 0 only when v == t), one shift-add
    return (w >> 32).to(tl.int32) - ((t - v).to(tl.int32, bitcast=True) >> 31)


@triton.jit
def encode(v, KIND: tl.constexpr, BITS: tl.constexpr, QMAX: tl.constexpr, HW: tl.constexpr = False,
           CLAMP: tl.constexpr = True, NO_NEG0: tl.constexpr = True):
    """Finite scaled fp32 values -> integer codes (int32) of the format's code kind.

    HW=True (CUDA, sm_89+) encodes FP8 with the hardware cvt.rn.satfinite (RNE; exact here because v
    is clamped to +-qmax first). HW=False uses integer logic (the interpreter's fp8 casts are wrong,
    Ascend 910B has no fp8).

    CLAMP=False skips the clamp to +-qmax. Only for v = RN(x * RN(1/scale)), scale = RN(absmax / qmax) (or one
    ulp below it, §3 step 5), with |x| <= absmax: then |v| <= qmax (1 + 2**-21) (four roundings of at most
    2**-24 and the step of 2**-23), which every code rounds back to +-qmax (int: below qmax + 1/2; FP4,
    FP8: far below the next binade), so the clamp cannot change a code there (the kernels of this
    package; one instruction per element saved).

    NO_NEG0=False leaves FP8's -0 code (0x80) in place: for callers that clear it on packed words
    (kernels._store_codes16, four codes per three integer ops).
    """
    if KIND == 0:  # symmetric int, offset binary; RNE via the magic add
        if CLAMP:
            v = tl.minimum(tl.maximum(v, -QMAX), QMAX)
        c = v + _RNE_MAGIC
        return c.to(tl.int32, bitcast=True) - (_RNE_MAGIC_BITS - (1 << (BITS - 1)))
    elif KIND == 1:
        return _encode_fp4(v, CLAMP, HW)
    elif KIND == 2:
        return _encode_nf4(v)
    elif KIND == 3:
        vc = v
        if CLAMP:
            vc = tl.minimum(tl.maximum(v, -QMAX), QMAX)
        if HW:
            c = vc.to(tl.float8e4nv).to(tl.int8, bitcast=True).to(tl.int32) & 0xFF
        else:
            c = f32_to_e4m3_bits(vc)
        if NO_NEG0:
            c = tl.where(c == 0x80, 0, c)  # no -0 code (§4.2): a magnitude that rounds to 0 is +0
        return c
    else:
        vc = v
        if CLAMP:
            vc = tl.minimum(tl.maximum(v, -QMAX), QMAX)
        if HW:
            c = vc.to(tl.float8e5).to(tl.int8, bitcast=True).to(tl.int32) & 0xFF
        else:
            c = f32_to_e5m2_bits(vc)
        if NO_NEG0:
            c = tl.where(c == 0x80, 0, c)  # no -0 code (§4.2)
        return c


@triton.jit
def _nf4_select(c):
    # Binary select tree on the code bits (15 selects, no memory access): for devices where a gather
    # from a 16-entry table is slow (Ascend's vector units have no cheap gather).
    # the code bits as fp32 compares (int32 vector compares are scalar code on Ascend's vector unit)
    b0 = (c & 1).to(tl.float32) > 0.0
    b1 = (c & 2).to(tl.float32) > 0.0
    b2 = (c & 4).to(tl.float32) > 0.0
    b3 = (c & 8).to(tl.float32) > 0.0
    p0 = tl.where(b0, _NF4_L1, _NF4_L0)
    p1 = tl.where(b0, _NF4_L3, _NF4_L2)
    p2 = tl.where(b0, _NF4_L5, _NF4_L4)
    p3 = tl.where(b0, _NF4_L7, _NF4_L6)
    p4 = tl.where(b0, _NF4_L9, _NF4_L8)
    p5 = tl.where(b0, _NF4_L11, _NF4_L10)
    p6 = tl.where(b0, _NF4_L13, _NF4_L12)
    p7 = tl.where(b0, _NF4_L15, _NF4_L14)
    q0 = tl.where(b1, p1, p0)
    q1 = tl.where(b1, p3, p2)
    q2 = tl.where(b1, p5, p4)
    q3 = tl.where(b1, p7, p6)
    r0 = tl.where(b2, q1, q0)
    r1 = tl.where(b2, q3, q2)
    return tl.where(b3, r1, r0).to(tl.float32)


@triton.jit
def decode(c, lut_ptr, KIND: tl.constexpr, BITS: tl.constexpr, NF4_LUT: tl.constexpr, HW: tl.constexpr = False):
    """Integer codes (int32) -> fp32 values before scaling (the reference's decode_table).

    HW=True decodes FP8 with the hardware conversion (exact: every fp8 value is an fp16 value)."""
    if KIND == 0:
        return (c - (1 << (BITS - 1))).to(tl.float32)
    elif KIND == 1:
        if HW:  # E2M1 is a mini-float with gradual underflow laid out like fp32's bottom: the bits (c & 7) << 22
            # are the value * 2**-126 (a subnormal below 1, then exponent e + 1 and the mantissa bit), and the
            # multiply by 2**126 is exact. Needs fp32 subnormals kept (a plain multiply on CUDA; the
            # interpreter too), so not for Ascend. (The mirror-image encoder would round twice below 1.)
            return (((c & 7) << 22) | ((c & 8) << 28)).to(tl.float32, bitcast=True) * 8.507059173023462e37
        else:
            idx = c & 7
            e = idx >> 1
            m = idx & 1
            mag = tl.where(e == 0, m * 0x3F000000, ((e + 126) << 23) | (m << 22))  # 0, 0.5, 1, 1.5, ..., 6
            return (mag | ((c & 8) << 28)).to(tl.float32, bitcast=True)
    elif KIND == 2:
        if NF4_LUT:
            return tl.load(lut_ptr + c)  # 16 fp32 levels, L1-resident
        else:
            return _nf4_select(c)
    elif KIND == 3:
        if HW:
            return c.to(tl.int8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        else:
            return e4m3_bits_to_f32(c)
    else:
        if HW:
            return c.to(tl.int8).to(tl.float8e5, bitcast=True).to(tl.float32)
        else:
            return e5m2_bits_to_f32(c)
