"""The block codec and QuanGrad's wire protocol written from docs/formats.md and docs/quangrad.md in
numpy, for the property tests. It calls nothing in agoq_core's codecs or protocol: scales are numpy float32
arithmetic (IEEE, correctly rounded), scaled values spec version 3's RN(x * RN(1/scale)) as an exact float64
product rounded once (tests/formats/oracle.py), codes come from brute-force nearest-level search
(tests/formats/oracle.py) or the spec's threshold and bit rules, packing is a literal bit stream.
"""
from __future__ import annotations

import numpy as np

from tests.formats import oracle

F32_MAX = np.float32(np.finfo(np.float32).max)
MIN_NORMAL = np.float32(2.0**-126)
BITS = {"int4": 4, "int5": 5, "int6": 6, "int8": 8, "fp4_e2m1": 4, "nf4": 4, "fp8_e4m3": 8, "fp8_e5m2": 8}
ZERO_CODE = {"int4": 8, "int5": 16, "int6": 32, "int8": 128, "fp4_e2m1": 0, "nf4": 7, "fp8_e4m3": 0, "fp8_e5m2": 0}
PACK_GROUP = {4: 2, 5: 8, 6: 4, 8: 1}  # codes per whole-byte group (§5)
_NF4_T = ((oracle.NF4[:-1] + oracle.NF4[1:]) * np.float32(0.5)).astype(np.float32)  # fp32 add, exact halving


def _encode(v: np.ndarray, fmt: str) -> np.ndarray:
    """§4: finite fp32 scaled values -> codes (int64)."""
    qmax = oracle.QMAX[fmt]
    if fmt.startswith("int"):
        b = BITS[fmt]
        return np.clip(np.round(v.astype(np.float64)), -qmax, qmax).astype(np.int64) + 2 ** (b - 1)  # np.round: half-even
    if fmt == "nf4":
        return (v[:, None] > _NF4_T[None, :]).sum(axis=1).astype(np.int64)
    if fmt == "fp4_e2m1":
        mags = np.minimum(np.abs(v.astype(np.float64)), 6.0)
        lv = oracle.FP4.astype(np.float64)
        d = np.abs(mags[:, None] - lv[None, :])
        best = d.min(axis=1, keepdims=True)
        cand = d == best
        # a tie goes to the even mantissa bit, i.e. the even index
        idx = np.where(cand.sum(axis=1) > 1, np.argmax(cand & (np.arange(8) % 2 == 0)[None, :], axis=1),
                       np.argmax(cand, axis=1))
        return np.where((v < 0) & (idx > 0), idx | 8, idx).astype(np.int64)
    clamped = np.clip(v, -qmax, qmax).astype(np.float32)
    return oracle.fp8_code(clamped, fmt).astype(np.int64)


def decode(codes: np.ndarray, fmt: str) -> np.ndarray:
    """Code -> fp32 value before scaling."""
    if fmt.startswith("int"):
        return (codes - 2 ** (BITS[fmt] - 1)).astype(np.float32)
    if fmt == "nf4":
        return oracle.NF4[codes]
    if fmt == "fp4_e2m1":
        return np.where(codes & 8, -1.0, 1.0).astype(np.float32) * oracle.FP4[codes & 7]
    return np.array([oracle.fp8_value(int(c), fmt) for c in codes], dtype=np.float32)


def pack(codes: np.ndarray, bits: int) -> bytes:
    """§5: little-endian bit stream; code k at stream bits [k b, (k+1) b)."""
    stream = 0
    for k, c in enumerate(codes.tolist()):
        stream |= int(c) << (k * bits)
    return stream.to_bytes(len(codes) * bits // 8, "little")


def quantize(x32: np.ndarray, fmt: str, block: int) -> tuple[bytes, np.ndarray]:
    """§2-§5 on the flat fp32 values: (packed code bytes, fp32 scales)."""
    n = x32.size
    nb = -(-n // block)
    xp = np.zeros(nb * block, dtype=np.float32)
    xp[:n] = x32
    bits = xp.view(np.uint32)
    expo = bits & 0x7F800000
    nonfinite = (expo == 0x7F800000).reshape(nb, block).any(axis=1)
    xp = np.where((expo == 0) | (expo == 0x7F800000), np.float32(0), xp).reshape(nb, block)   # steps 2-3
    amax = np.abs(xp).max(axis=1)                                                            # step 4
    with np.errstate(over="ignore"):
        scale = (amax / np.float32(oracle.QMAX[fmt])).astype(np.float32)                     # step 5
        scale[scale < MIN_NORMAL] = 0
        over = np.isinf(scale * np.float32(oracle.QMAX[fmt]))
    scale = np.where(over, (scale.view(np.uint32) - 1).view(np.float32), scale)
    safe = np.where(scale == 0, np.float32(1), scale)
    v = np.where((scale == 0)[:, None], np.float32(0), oracle.scaled_values_v3(xp, safe[:, None]))  # step 6 (v3)
    codes = _encode(v.reshape(-1), fmt).reshape(nb, block)
    codes[nonfinite] = ZERO_CODE[fmt]                                                         # step 7
    scale = np.where(nonfinite, np.float32(np.nan), scale).astype(np.float32)
    b = BITS[fmt]
    g = PACK_GROUP[b]
    n_codes = -(-n // g) * g
    return pack(codes.reshape(-1)[:n_codes], b), scale


def dequantize_f32(code_bytes: bytes, scales: np.ndarray, fmt: str, block: int, n: int) -> np.ndarray:
    """§4.5 up to the fp32 product (the caller casts once to the output dtype)."""
    b = BITS[fmt]
    stream = int.from_bytes(code_bytes, "little")
    codes = np.array([(stream >> (k * b)) & ((1 << b) - 1) for k in range(n)], dtype=np.int64)
    s = np.repeat(scales.astype(np.float32), block)[:n]
    with np.errstate(over="ignore", invalid="ignore"):
        return (decode(codes, fmt) * s).astype(np.float32)


def all_reduce(ranks: list[np.ndarray], fmt: str, block: int) -> tuple[list[bytes], np.ndarray]:
    """docs/quangrad.md wire protocol: per rank the all-to-all send buffer, and the fp32 values of the
    result every rank ends with (before the cast to the tensor's dtype)."""
    w, n = len(ranks), ranks[0].size
    unit = w * block
    p = -(-n // unit) * unit
    c = p // w
    cb = c * BITS[fmt] // 8
    qs = []
    for x in ranks:
        xp = np.zeros(p, dtype=np.float32)
        xp[:n] = x
        qs.append(quantize(xp, fmt, block))
    sends = [b"".join(q[0][r * cb:(r + 1) * cb] + q[1][r * (c // block):(r + 1) * (c // block)].astype("<f4").tobytes()
                      for r in range(w)) for q in qs]
    out = []
    for r in range(w):
        total = None
        for i in range(w):  # dequantize each rank's chunk r in fp32, sum left to right in rank order
            codes = qs[i][0][r * cb:(r + 1) * cb]
            sc = qs[i][1][r * (c // block):(r + 1) * (c // block)]
            d = dequantize_f32(codes, sc, fmt, block, c)
            with np.errstate(over="ignore", invalid="ignore"):
                total = d if total is None else (total + d).astype(np.float32)
        rc, rs = quantize(total, fmt, block)
        out.append(dequantize_f32(rc, rs, fmt, block, c))
    return sends, np.concatenate(out)[:n]
