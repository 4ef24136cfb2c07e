"""The cpu backend's codecs, written in plain torch ops from the numerics contract (docs/formats.md).

Each function works on whole blocks (``x2d[NB, B]``, B a multiple of 8) and is written so that
``torch.compile`` (Inductor's C++ backend) turns it into one fused loop: one read of the input, one
write of the codes and scales. The same functions also run eagerly (no C++ compiler): slower, same bits.

What keeps them bit-exact with the reference under Inductor (checked in tests/test_codegen.py):
* every float step is one IEEE fp32 op (``/`` is a true division on CPU: Inductor's
  multiply-by-reciprocal rewrite of constant divisors is disabled for CPU tensors, and ``qmax`` is a
  tensor argument anyway); the scaled values are one reciprocal per block and one multiply per element
  (spec version 3, ``_scaled_values``); Inductor compiles C++ with ``-ffp-contract=off`` and without
  ``-funsafe-math-optimizations`` (torch._inductor.config.cpp), so ``a * b + c`` is never an FMA;
* round-half-to-even is ``torch.round`` (``nearbyint`` / ``_mm*_round_ps``, both RNE);
* FP8 codes are PyTorch's own ``float32 -> float8`` conversion after the clamp, and FP8 decoding its
  ``float8 -> float32`` conversion: the same c10 functions the reference oracle calls eagerly
  (agoq_core.formats.reference.encode and decode_table), which Inductor's C++ code calls too
  (vectorised). The spec's integer recipe (docs/formats.md §4.2) exists for Triton's interpreter and
  Ascend, whose casts are wrong or missing; on CPU the cast and the recipe agree on every fp32 input
  (tests/test_cpu_codecs.py checks every FP8 midpoint and its neighbours), and the cast is 2x faster to
  encode and 8x faster to decode than the recipe and a 256-entry table gather;
* packing is the core's canonical packer (agoq_core.formats.packing): one copy of the bit order.
"""
from __future__ import annotations

import torch

from agoq_core.formats.packing import pack_codes, unpack_codes
from agoq_core.formats.reference import decode_table, encode, nf4_thresholds
from agoq_core.formats.spec import MIN_NORMAL_F32, FormatSpec, get_format

__all__ = ["prepare", "quantize_blocks", "dequantize_blocks", "accumulate_blocks", "reduce_blocks", "spec_key"]

_F32_MAX = torch.finfo(torch.float32).max
_FP4_THRESHOLDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))
# The torch dtype of each FP8 code kind (its conversions are the oracle's: reference.encode/decode_table).
_FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
# The oracle's NF4 thresholds, as Python floats computed once here: inside a compiled graph they are
# constants (the oracle computes them with tensor ops, which Dynamo cannot turn into constants).
_NF4_THRESHOLDS = nf4_thresholds()
# The oracle's decode tables of the 4-bit float-valued kinds, as Python floats (constants in a graph).
_TABLE4 = {k: tuple(decode_table(get_format(k)).tolist()) for k in ("nf4", "fp4_e2m1")}
assert list(_NF4_THRESHOLDS) == sorted(_NF4_THRESHOLDS) and len(_NF4_THRESHOLDS) == 15


def spec_key(spec: FormatSpec) -> tuple:
    """What these functions read from a spec. Not the block size: it is the tensors' second dimension,
    so one compiled graph serves every block size."""
    return (spec.kind, spec.bits, spec.qmax)


def _threshold(ts: tuple[float, ...], masks: list[torch.Tensor], lo: int, hi: int, depth: int):
    """The binary search's next threshold within ts[lo:hi], selected by the masks found so far. (Module
    level, not a recursive closure: that would be a reference cycle keeping the masks alive until the
    garbage collector runs.)"""
    mid = (lo + hi) // 2
    if depth == len(masks):
        return ts[mid]
    return torch.where(masks[depth], _threshold(ts, masks, mid + 1, hi, depth + 1),
                       _threshold(ts, masks, lo, mid, depth + 1))


def _count_above(v: torch.Tensor, ts: tuple[float, ...]) -> torch.Tensor:
    """#{t in ts : v > t} for thresholds sorted ascending, 2**k - 1 of them, by binary search: k compares
    and 2**k - k - 1 selects of constants instead of 2**k - 1 compares and adds (NF4: 4 and 11 against 15
    and 15). The same count as the oracle's sum of compares, since the thresholds are sorted. Returned
    as exact small floats: Inductor vectorises float selects and the float -> uint8 conversion of the
    packer, but converts int32 -> uint8 one element at a time (nf4 quantize 1.5 -> 0.9 ms at 704K)."""
    masks: list[torch.Tensor] = []
    k = (len(ts) + 1).bit_length() - 1
    code = None
    for d in range(k):
        m = v > _threshold(ts, masks, 0, len(ts), 0)
        masks.append(m)
        bit = torch.where(m, float(1 << (k - 1 - d)), 0.0)
        code = bit if code is None else code + bit
    return code


def _encode(v: torch.Tensor, spec: FormatSpec) -> torch.Tensor:
    """Finite fp32 scaled values -> codes (docs/formats.md §4): integer-valued tensors (int32, uint8, or
    exact small floats where that vectorises better), which the packer converts."""
    if spec.kind == "int":  # offset binary; |q| <= 127 and the sum are exact in fp32
        return torch.round(v).clamp(-spec.qmax, spec.qmax) + float(1 << (spec.bits - 1))
    if spec.kind == "fp4_e2m1":
        m = v.abs()
        idx = sum(((m >= t) if incl else (m > t)).to(torch.int32) for t, incl in _FP4_THRESHOLDS)
        return idx | (((v < 0) & (idx > 0)).to(torch.int32) << 3)
    if spec.kind == "nf4":
        return _count_above(v, _NF4_THRESHOLDS)
    if spec.kind in _FP8:
        # Clamp first (no overflow code), then torch's RNE conversion; 0x80 (-0) becomes 0 (§4.2, v2).
        c = v.clamp(-spec.qmax, spec.qmax).to(_FP8[spec.kind]).view(torch.uint8)
        return torch.where(c == 0x80, 0, c)
    raise ValueError(f"agoq-cpu: no encoder for code kind {spec.kind!r}")


# spec_key -> whether the oracle encodes 0.0 as the zero code (every format today). Then a non-finite
# block needs no select of its own on the codes: that per-block mask applied to uint8 codes compiled
# into a scalar loop that took 80% of the fp8 quantize kernel (perf, 2026-12-01). Filled by prepare()
# outside any graph (Dynamo cannot trace the oracle's .item()); a format not prepared keeps the select.
_ZERO_IS_ZERO_CODE: dict[tuple, bool] = {}


def prepare(spec: FormatSpec) -> None:
    """One-time, per format, outside compiled graphs: the facts about ``spec`` these functions read."""
    key = spec_key(spec)
    if key not in _ZERO_IS_ZERO_CODE:
        _ZERO_IS_ZERO_CODE[key] = int(encode(torch.zeros(1), spec)[0]) == spec.zero_code


def _scaled_values(x: torch.Tensor, scale: torch.Tensor, spec: FormatSpec) -> torch.Tensor:
    """v = RN(x * RN(1/scale)) (docs/formats.md §3 step 6, spec version 3): one fp32 division per block, one fp32
    multiply per element (never an FMA: Inductor compiles with -ffp-contract=off, and no add follows it before
    torch.round / the FP8 cast / the compares). scale [NB, 1] > 0 normal.

    With qmax >= 4, scale * qmax finite means scale < 2**126, so RN(1/scale) is a normal fp32 and the plain
    reciprocal is the contract's. nf4 (qmax 1) can have scales >= 2**126, whose fp32 reciprocal is subnormal;
    there the power of two k = 2**(128 - exponent) puts b = scale * k in [2, 4) and v = RN((x * k) * RN(1/b)):
    the same real product (x * k is exact unless below 2**-126, and then v codes to zero anyway)."""
    if spec.qmax >= 4:
        return x * (1.0 / scale)  # torch: reciprocal(scale), which Inductor's C++ computes as 1 / scale
    k = ((255 - ((scale.view(torch.int32) >> 23) & 0xFF)) << 23).view(torch.float32)
    return (x * k) * (1.0 / (scale * k))


def quantize_blocks(x2d: torch.Tensor, qmax: torch.Tensor, spec: FormatSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """x2d[NB, B] (fp32/bf16/fp16) -> (packed codes uint8[NB * B * bits / 8], scales fp32[NB]).

    ``qmax`` is a 0-d fp32 tensor (spec.qmax): a tensor, so no compiler turns ``/ qmax`` into a
    multiply by its reciprocal (docs/formats.md §3.5).
    """
    if spec.qmax < 1:  # the shortcut below needs subnormal / qmax to stay below MIN_NORMAL_F32
        raise ValueError(f"agoq-cpu: quantize_blocks needs qmax >= 1, {spec.name} has {spec.qmax}")
    x = x2d.to(torch.float32)
    # One reduction pass. The raw absmax is NaN or Inf exactly when the block holds a NaN or Inf (max
    # propagates NaN); for finite blocks it equals the absmax after flushing subnormals (§3) whenever it
    # is normal, and otherwise both give a scale below MIN_NORMAL_F32, hence 0.
    amax = x.abs().amax(dim=1, keepdim=True)
    nonfinite = ~(amax <= _F32_MAX)
    scale = torch.where(nonfinite, 0.0, amax) / qmax
    scale = torch.where(scale < MIN_NORMAL_F32, 0.0, scale)
    # qmax x scale must stay finite (absmax near FLT_MAX): one fp32 step down (docs/formats.md §3 step 5, v2)
    scale = torch.where(torch.isinf(scale * qmax), (scale.view(torch.int32) - 1).view(torch.float32), scale)
    x = torch.where(x.abs() < MIN_NORMAL_F32, 0.0, x)        # flush subnormals and -0 (float compares vectorise)
    zero = scale == 0
    v = torch.where(zero, 0.0, _scaled_values(x, torch.where(zero, 1.0, scale), spec))
    codes = _encode(v, spec)  # v is 0 in a non-finite block (its scale is 0 here): the zero code
    if not _ZERO_IS_ZERO_CODE.get(spec_key(spec), False):
        codes = torch.where(nonfinite, spec.zero_code, codes)
    scale = torch.where(nonfinite, float("nan"), scale)
    return pack_codes(codes, spec), scale.reshape(-1)


def _decode(packed: torch.Tensor, nb: int, spec: FormatSpec, table: torch.Tensor) -> torch.Tensor:
    """Packed codes of NB blocks -> their fp32 values before scaling, [NB, B]."""
    if spec.kind in _FP8:  # one byte per code: torch's exact FP8 -> fp32 conversion, no gather
        return packed.reshape(nb, -1).view(_FP8[spec.kind]).to(torch.float32)
    if spec.bits == 4 and spec.kind in _TABLE4:  # 16 values: selects on the code's bits, no gather
        return _select16(unpack_codes(packed.reshape(nb, -1), spec, dtype=torch.int32).reshape(nb, -1),
                         _TABLE4[spec.kind])
    narrow = spec.kind == "int"  # offset-binary codes: int32 is enough, and lets 5/6-bit unpack use words
    codes = unpack_codes(packed.reshape(nb, -1), spec, dtype=torch.int32 if narrow else torch.int64).reshape(nb, -1)
    if spec.kind == "int":
        return (codes - (1 << (spec.bits - 1))).to(torch.float32)
    return table[codes]  # the oracle's decode table (exact fp32 values of every code)


def _select16(codes: torch.Tensor, values: tuple[float, ...]) -> torch.Tensor:
    """values[codes] for 4-bit int32 codes, as a tree of 15 selects of constants on the code's bits:
    Inductor vectorises it, while a table lookup is a gather it runs one element at a time (nf4
    dequantize 1.5x faster at 704K elements). Not on uint8 codes: their masks select floats one element
    at a time (60x slower)."""
    bits = [(codes & (1 << b)) != 0 for b in range(4)]
    return _pick(values, bits, 0, 16, 4)


def _pick(values: tuple[float, ...], bits: list[torch.Tensor], lo: int, n: int, b: int):
    """values[lo:lo + n] selected by code bits b-1..0 (module level: no closure cycle, see _threshold)."""
    if n == 1:
        return values[lo]
    h = n // 2
    return torch.where(bits[b - 1], _pick(values, bits, lo + h, h, b - 1), _pick(values, bits, lo, h, b - 1))


def dequantize_blocks(codes: torch.Tensor, scales: torch.Tensor, table: torch.Tensor, spec: FormatSpec,
                      dtype: torch.dtype) -> torch.Tensor:
    """Packed codes of NB whole blocks and scales fp32[NB] -> [NB, B] in ``dtype``: one fp32 multiply,
    one round-to-nearest-even cast (docs/formats.md §4.5)."""
    nb = scales.shape[0]
    vals = _decode(codes, nb, spec, table)
    return (vals * scales[:, None]).to(dtype)


def accumulate_blocks(codes: torch.Tensor, scales: torch.Tensor, g2d: torch.Tensor, table: torch.Tensor,
                      qmax: torch.Tensor, spec: FormatSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """QuanGrad accumulate on whole blocks: Q(D_fp32(q) + fp32(g)), one fp32 add (docs/formats.md §6)."""
    acc = dequantize_blocks(codes, scales, table, spec, torch.float32) + g2d.to(torch.float32)
    return quantize_blocks(acc, qmax, spec)


def reduce_blocks(codes: torch.Tensor, scales: torch.Tensor, table: torch.Tensor, qmax: torch.Tensor,
                  spec: FormatSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """codes uint8[W, bytes], scales fp32[W, NB] of whole blocks -> Q(((D0 + D1) + D2) + ...)."""
    total = dequantize_blocks(codes[0], scales[0], table, spec, torch.float32)
    for r in range(1, codes.shape[0]):
        total = total + dequantize_blocks(codes[r], scales[r], table, spec, torch.float32)
    return quantize_blocks(total, qmax, spec)
