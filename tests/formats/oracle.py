"""An independent oracle for the format contract, written from docs/formats.md in float64/numpy.

It does not call agoq_core.formats.reference: it enumerates every grid point of a block's scale and
picks the nearest by brute force, encodes FP8 with integer bit logic, and forms spec version 3's scaled
values as the exact float64 product of x and the 24-bit reciprocal, rounded once to fp32.
"""
from __future__ import annotations

import numpy as np

NF4 = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], dtype=np.float32)
FP4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
QMAX = {"int4": 7, "int5": 15, "int6": 31, "int8": 127, "fp4_e2m1": 6, "nf4": 1, "fp8_e4m3": 448, "fp8_e5m2": 57344}


def reciprocal24(scale: np.ndarray) -> np.ndarray:
    """1/scale rounded to 24 significant bits, exponent unbounded (§3 step 6, spec version 3), as float64:
    numpy's IEEE fp32 division of the mantissa m in [0.5, 1) (frexp is exact), times 2**-e exactly. Equal to
    fp32 1/scale whenever that is normal (scale <= 2**126)."""
    m, e = np.frexp(np.asarray(scale, dtype=np.float32))
    return (np.float32(1.0) / m.astype(np.float32)).astype(np.float64) * np.ldexp(1.0, -e)


def scaled_values_v3(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """v = RN(x * RN(1/scale)) in fp32 (scale > 0 normal, broadcast against x): the float64 product of 24-bit
    x and 24-bit r is exact (48 bits, far from float64's range limits), so one cast is the one rounding."""
    with np.errstate(under="ignore"):
        return (np.asarray(x, np.float32).astype(np.float64) * reciprocal24(scale)).astype(np.float32)


def nearest_codes(v: np.ndarray, fmt: str) -> np.ndarray:
    """Brute force: the code whose value is nearest to each finite scaled value v (fp32), ties by the contract's
    rule (even integer / even mantissa bit); NF4 by its thresholds fp32(L[i] + L[i+1]) * 0.5, a value equal to a
    threshold taking the lower code (§4.4: NF4 does not round to the nearest level)."""
    v = np.asarray(v, np.float32)
    if fmt == "nf4":
        t = ((NF4[:-1] + NF4[1:]) * np.float32(0.5)).astype(np.float32)
        return (v[:, None] > t[None, :]).sum(axis=1)
    codes, vals = levels(fmt)
    d = np.abs(v.astype(np.float64)[:, None] - vals[None, :])
    best = d.min(axis=1, keepdims=True)
    cand = d == best
    even = np.array([is_even_tiebreak(fmt, int(c)) for c in codes])
    pick = np.where(cand.sum(axis=1) > 1, np.argmax(cand & even[None, :], axis=1), np.argmax(cand, axis=1))
    return codes[pick]


def fp8_value(code: int, kind: str) -> float:
    """Decode an FP8 byte from its bit fields (OCP E4M3FN / E5M2)."""
    s = -1.0 if code & 0x80 else 1.0
    if kind == "fp8_e4m3":
        e, m, bias, mb = (code >> 3) & 0xF, code & 7, 7, 3
        if e == 15 and m == 7:
            return float("nan")
    else:
        e, m, bias, mb = (code >> 2) & 0x1F, code & 3, 15, 2
        if e == 31:
            return float("nan") if m else s * float("inf")
    if e == 0:
        return s * m * 2.0 ** (1 - bias - mb)
    return s * (1 + m / 2**mb) * 2.0 ** (e - bias)


def levels(fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """(codes, fp64 values) of every finite code of a format, before scaling."""
    if fmt.startswith("int"):
        b = int(fmt[3:])
        codes = np.arange(1, 2**b)  # offset binary; code 0 (= -2^(b-1)) is never produced
        return codes, (codes - 2 ** (b - 1)).astype(np.float64)
    if fmt == "nf4":
        return np.arange(16), NF4.astype(np.float64)
    if fmt == "fp4_e2m1":
        codes = np.array([i for i in range(16) if i != 8])  # no negative zero
        vals = np.array([(-1.0 if c & 8 else 1.0) * FP4[c & 7] for c in codes])
        return codes, vals
    codes = np.arange(256)
    vals = np.array([fp8_value(int(c), fmt) for c in codes])
    ok = np.isfinite(vals) & ~((vals == 0) & (codes == 0x80))  # drop NaN/inf and -0
    return codes[ok], vals[ok]


def is_even_tiebreak(fmt: str, code: int) -> bool:
    """The code a tie must go to under the contract's tie rule."""
    if fmt.startswith("int"):
        return (code - 2 ** (int(fmt[3:]) - 1)) % 2 == 0
    if fmt == "fp4_e2m1" or fmt.startswith("fp8"):
        return code % 2 == 0  # even mantissa LSB
    raise AssertionError("nf4 ties go to the lower code, handled by the caller")


def f32_to_fp8_bits(x: np.ndarray, kind: str) -> np.ndarray:
    """fp32 -> FP8 bits with round-half-to-even, integer logic only (inputs already clamped, finite)."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.int64)
    sign = (bits >> 24) & 0x80
    a = bits & 0x7FFFFFFF
    if kind == "fp8_e4m3":
        mbits, bias, min_exp = 3, 7, -6
    else:
        mbits, bias, min_exp = 2, 15, -14
    exp = (a >> 23) - 127
    out = np.zeros_like(a)
    for i in range(a.size):
        ai = int(a.flat[i])
        if ai == 0:
            continue
        e = int(exp.flat[i])
        mant = (ai & 0x7FFFFF) | (0x800000 if (ai >> 23) else 0)  # 24-bit significand
        if (ai >> 23) == 0:
            e = -126
        if e < min_exp:  # subnormal in fp8: quantum 2^(min_exp - mbits)
            shift = 23 + (min_exp - e) - mbits
        else:
            shift = 23 - mbits
        if shift >= 48:
            q = 0
        else:
            q, rem = mant >> shift, mant & ((1 << shift) - 1)
            half = 1 << (shift - 1)
            if rem > half or (rem == half and (q & 1)):
                q += 1
        if e < min_exp:
            code = q  # subnormal codes (q may carry into the first normal: still correct bits)
        else:
            # q in [2^mbits, 2^(mbits+1)]: a carry to 2^(mbits+1) bumps the exponent
            ee = e
            if q == 1 << (mbits + 1):
                q >>= 1
                ee += 1
            code = ((ee + bias) << mbits) | (q & ((1 << mbits) - 1))
        out.flat[i] = code
    return (out | sign).astype(np.uint8)


def fp8_code(x: np.ndarray, kind: str) -> np.ndarray:
    """The contract's FP8 code (§4.2): the rounded bits, but no -0 code (a zero magnitude is 0x00)."""
    bits = f32_to_fp8_bits(x, kind)
    return np.where(bits == 0x80, 0, bits).astype(np.uint8)
