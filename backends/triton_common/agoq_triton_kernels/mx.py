"""The block quantizer of the microscaling formats (docs/formats.md §9): OCP MX (SCALE=1, E8M0) and
NVFP4 (SCALE=2, E4M3 block scale x fp32 tensor scale), for the shared codec kernels.

Bit-exact with agoq_core.formats.mx. The division-free part is the point of these formats: an MX scale
is a power of two built from the absmax's exponent bits, and x * 2**-e is exact, so quantizing costs one
multiply, one clamp and the element encode per element — no correctly rounded division, no FMA, nothing
the Ascend compiler could change. NVFP4 divides twice per *block* and multiplies once per element, as
torchao's reference does: with the hardware's correctly rounded division on a GPU (HW), division-free
elsewhere (codes.exact_div: the interpreter, Ascend), same bits.
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice

from agoq_triton_kernels.codes import (
    _ABS_MASK, _EXP_MASK, _MIN_NORMAL_BITS, _MIN_NORMAL_F32, _QNAN, _SIGN, e4m3_bits_to_f32, encode, exact_div,
    f32_to_e4m3_bits,
)

__all__ = ["mx_quantize_tile", "SCALE_IDS"]

#: The ``SCALE`` constexpr of the codec kernels (absent = 0: fp32 absmax / qmax, spec version 1).
SCALE_IDS = {"absmax": 0, "e8m0": 1, "e4m3_tensor": 2}


@triton.jit
def mx_quantize_tile(x, ts_ptr, KIND: tl.constexpr, BITS: tl.constexpr, QMAX: tl.constexpr, HW: tl.constexpr,
                     SCALE: tl.constexpr, RAW: tl.constexpr = False, rowmax=None):
    """x: fp32 [ROWS, BLOCK_P] (masked lanes hold 0) -> (codes int32 [ROWS, BLOCK_P], effective scales [ROWS]).

    SCALE=1 (MX): e = max(exp(absmax) - emax_elem, -126), scale 2**e, v = x * 2**-e (exact).
    SCALE=2 (NVFP4): ts_ptr -> [S, RN(1/S)] (Launcher.tensor_scale);
    s_b = e4m3(clamp(RN(RN(absmax / 6) / S), 2**-9, 448)), v = RN(x * RN(RN(1/S) / s_b)), scale RN(S * s_b);
    S == 0 flushes the tensor. Then saturate to +-QMAX, encode (ties to even), no -0 code; a block holding
    NaN/Inf gets scale NaN and zero codes (RAW: both left to the caller, see quantize_tile). rowmax: quantize_tile's.
    """
    if not HW:
        ax = tl.abs(x)
    if HW or rowmax is not None:  # integer max of the magnitude bits: NaN/Inf sort above every finite value (the
        if rowmax is None:  # non-finite flag); given: the caller's (kernels._words_rowmax, the interpreter's MAX16)
            rowmax = tl.max(x.to(tl.int32, bitcast=True) & _ABS_MASK, axis=1)
        bad = rowmax >= _EXP_MASK
        amax_bits = tl.where(rowmax < _MIN_NORMAL_BITS, 0, rowmax)
    else:  # fp32 compares only (Ascend runs int32 vector compares as scalar code), as quantize_tile's portable
        nf = tl.sum(x - x, axis=1)  # branch: the non-finite flag is a NaN row sum of x - x; a bad row's amax is
        bad = nf != nf  # dropped
        amax = tl.max(ax, axis=1)
        amax_bits = tl.where(amax < _MIN_NORMAL_F32, 0.0, amax).to(tl.int32, bitcast=True)
    if SCALE == 1:
        if KIND == 1:  # E2M1: emax 2 (6 = 1.5 * 2**2)
            e = tl.maximum((amax_bits >> 23) - 129, -126)
        else:  # E4M3: emax 8 (448 = 1.75 * 2**8)
            e = tl.maximum((amax_bits >> 23) - 135, -126)
        zero = amax_bits == 0
        scale = tl.where(zero, 0, (e + 127) << 23).to(tl.float32, bitcast=True)
        inv = tl.where(zero, 0, (127 - e) << 23).to(tl.float32, bitcast=True)
    else:
        s = tl.load(ts_ptr)
        r = tl.load(ts_ptr + 1)
        flush = s == 0.0
        amax = amax_bits.to(tl.float32, bitcast=True)
        s1 = tl.where(flush, 1.0, s)
        r1 = tl.where(flush, 1.0, r)
        if HW:  # correctly rounded hardware division (div.rn)
            t = tl.math.div_rn(tl.math.div_rn(amax, 6.0), s1)
        else:  # the same bits division-free: a quotient below 2**-126 flushes to 0 here, but t is clamped to 2**-9
            t = exact_div(exact_div(amax, tl.zeros_like(amax) + 6.0), s1)
        t = tl.minimum(tl.maximum(t, 0.001953125), 448.0)  # [2**-9, 448]: E4M3's smallest subnormal .. max
        sb = e4m3_bits_to_f32(f32_to_e4m3_bits(t))
        if HW:
            inv = tl.where(flush, 0.0, tl.math.div_rn(r1, sb))
        else:  # RN(1/S) / s_b is normal and finite: 2**-126 < 2688 / FLT_MAX / 448 and 2**100 * 512 < 2**128
            inv = tl.where(flush, 0.0, exact_div(r1, sb))
        scale = tl.where(flush, 0.0, s * sb)
    if HW:  # mul.rn.ftz flushes a subnormal x to +-0 (step 2 of the contract) in the multiply itself
        v = libdevice.mul_rn(x, inv[:, None])
    else:
        xf = tl.where(ax < _MIN_NORMAL_F32, 0.0, x)
        if SCALE == 1:  # a power of two: the product is exact, so no contraction can change it
            v = xf * inv[:, None]
        else:  # NVFP4: |x| * inv, then x's sign by an integer OR, so that no add (the encoder's rounding) ever
            p = tl.abs(xf) * inv[:, None]  # consumes the inexact product itself (kernels._exact_scaled_values)
            v = (p.to(tl.int32, bitcast=True) | (xf.to(tl.int32, bitcast=True) & _SIGN)).to(tl.float32, bitcast=True)
    # saturate to +-QMAX and encode (FP4: one min on |v|), ties to even; encode clears FP8's -0 code unless RAW
    codes = encode(v, KIND, BITS, QMAX, HW, True, not RAW)
    if not RAW:  # RAW: the caller clears -0 and zeroes non-finite blocks on packed words (kernels._store_codes16)
        codes = tl.where(bad[:, None], 0, codes)
    scale = tl.where(bad, _QNAN, scale.to(tl.int32, bitcast=True)).to(tl.float32, bitcast=True)
    return codes, scale
