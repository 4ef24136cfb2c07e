"""Compile-time parameters of the shared kernels, in plain Python (imports neither triton nor torch).

A launcher (agoq_cuda, agoq_ascend, ...) turns a format into the constexpr arguments below with
:func:`format_constexprs` and picks the launch geometry (``ROWS``, grid, warps) itself. Kernel
bodies never decide geometry: that belongs to each backend.
"""
from __future__ import annotations

import functools
import struct
from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "ENCODE_LUT_SIZE", "NF4_LUT_DOMAIN", "encode_lut",
    "KIND_INT", "KIND_FP4_E2M1", "KIND_NF4", "KIND_FP8_E4M3", "KIND_FP8_E5M2", "KIND_IDS",
    "FLOAT_F32", "FLOAT_BF16", "FLOAT_F16", "FLOAT_KINDS",
    "MAX_BLOCK", "MAX_CHUNK_ELEMENTS",
    "format_constexprs", "spec_constexprs", "next_pow2",
]

# Code kinds (the ``KIND`` constexpr). Same names as agoq_core.formats.spec.CodeKind.
KIND_INT = 0
KIND_FP4_E2M1 = 1
KIND_NF4 = 2
KIND_FP8_E4M3 = 3
KIND_FP8_E5M2 = 4
KIND_IDS = {"int": KIND_INT, "fp4_e2m1": KIND_FP4_E2M1, "nf4": KIND_NF4,
            "fp8_e4m3": KIND_FP8_E4M3, "fp8_e5m2": KIND_FP8_E5M2}

# How a float tensor crosses the kernel boundary (the ``X_KIND`` / ``G_KIND`` / ``OUT_KIND``
# constexprs). bf16 travels as its int16 bit pattern and is widened/rounded with integer logic:
# the Triton interpreter flushes bf16 subnormals on load and truncates on the fp32->bf16 cast
# (measured, ../shared/reference/cpu-feasibility.md §2c), and Ascend's bf16 casts are not
# specified bit for bit. fp16 uses the hardware cast (exact RNE on GPU and in the interpreter).
FLOAT_F32 = 0
FLOAT_BF16 = 1   # pass tensor.view(torch.int16)
FLOAT_F16 = 2
FLOAT_KINDS = {"float32": FLOAT_F32, "bfloat16": FLOAT_BF16, "float16": FLOAT_F16}

# A tile holds ROWS whole blocks of next_pow2(block) lanes in registers. 8192 fp32 lanes in one row
# is 32 KiB of registers per tile (64 regs/thread at 4 warps... the launcher raises warps with the
# block): larger blocks would need a two-pass absmax that no format here uses (defaults 128/256).
MAX_BLOCK = 8192

# Offsets inside a kernel are int32. A launcher cuts bigger tensors into chunks of at most this
# many elements (a whole number of blocks) so that row*BLOCK + col never wraps: 2**30 leaves a
# full tile of headroom below 2**31.
MAX_CHUNK_ELEMENTS = 1 << 30


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def format_constexprs(*, kind: str, bits: int, block: int, qmax: float, scale_kind: str = "absmax") -> dict:
    """The format-dependent constexpr arguments every kernel of this package takes.

    KIND, BITS, BLOCK (elements per scale), BLOCK_P (next power of two >= BLOCK: tl.arange needs
    powers of two, lanes >= BLOCK are masked) and QMAX; SCALE (1: OCP MX E8M0, 2: NVFP4) only for the
    microscaling formats, whose kernels take it (agoq_triton_kernels.mx).
    """
    scale = {"absmax": 0, "e8m0": 1, "e4m3_tensor": 2}.get(scale_kind)
    if scale is None:
        raise ValueError(f"unknown scale kind {scale_kind!r}; known: absmax, e8m0, e4m3_tensor")
    if kind not in KIND_IDS:
        raise ValueError(f"unknown code kind {kind!r}; known: {sorted(KIND_IDS)}")
    if bits not in (4, 5, 6, 8):
        raise ValueError(f"bits must be 4, 5, 6 or 8, got {bits}")
    if block <= 0 or block % 8:
        raise ValueError(f"block must be a positive multiple of 8, got {block}")
    if block > MAX_BLOCK:
        raise ValueError(f"block={block} is larger than the kernels' maximum {MAX_BLOCK}; "
                         f"use block <= {MAX_BLOCK} or the reference backend")
    c = {"KIND": KIND_IDS[kind], "BITS": int(bits), "BLOCK": int(block),
         "BLOCK_P": next_pow2(block), "QMAX": float(qmax)}
    if scale:
        c["SCALE"] = scale
    return c


@functools.lru_cache(maxsize=256)
def spec_constexprs(spec) -> Mapping:
    """:func:`format_constexprs` of a FormatSpec, computed once per spec (read-only: it is shared). For the
    launchers called once per layer and step, where the dict cost ~1-2 us of host time a call."""
    return MappingProxyType(format_constexprs(kind=spec.kind, bits=spec.bits, block=spec.block, qmax=spec.qmax,
                                              scale_kind=getattr(spec, "scale_kind", "absmax")))


# ---- bucket tables for encoding NF4 (and FP4) with one table load per element ----------------------------------
# The value axis is cut into buckets of width 1/PER_UNIT (bucket k = RNE(v * PER_UNIT) + OFFSET) narrower
# than the gap between neighbouring decision thresholds, so a bucket holds at most one threshold t_k, and
#     code = base_k + (v > t_k)
# with base_k = number of thresholds below the bucket (t_k = +inf when the bucket holds none). A ">="
# threshold becomes ">" on its predecessor float. The builder checks that no threshold lies within 2**-16
# of a bucket edge, so an off-by-one bucket from rounding v * PER_UNIT cannot change a code. Entries are
# int64: base << 32 | fp32 bits of t_k. The table has 64 entries (the used ones, then padding), so the kernels
# bound the index with one AND (garbage values of non-finite blocks stay in bounds; their codes are replaced).
# The NF4 table is in the domain of v * NF4_LUT_DOMAIN (thresholds and buckets scaled by 4, exactly): agoq-cuda
# multiplies x by 4 * RN(1/scale), which, unlike RN(1/scale), is a normal fp32 for every nf4 block
# (kernels._scaled_values_x4), so one multiply per element instead of two. FP4's table is kept for launchers that
# want it (its bit-logic encoder is cheaper on sm_90).
ENCODE_LUT_SIZE = 64
_LUT_USED = 33  # buckets finite values reach; the rest is padding (0) that only non-finite blocks' garbage reads
NF4_LUT_DOMAIN = 4.0
_NF4_PER_UNIT, _NF4_OFFSET = 4.0, 16     # v * 4 in [-4, 4] (x (1 + 2**-22)) -> k in [0, 32]
_FP4_PER_UNIT, _FP4_OFFSET = 4.0, 0      # |v| in [0, 6] -> k in [0, 24]


def _f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def _pred_f32(x: float) -> float:
    """Largest fp32 below the positive fp32 ``x``."""
    return struct.unpack("<f", struct.pack("<I", _f32_bits(x) - 1))[0]


def _bucket_table(thresholds: list[float], per_unit: float, offset: int) -> list[int]:
    out = []
    for k in range(_LUT_USED):
        lo, hi = (k - offset - 0.5) / per_unit, (k - offset + 0.5) / per_unit
        inside = [t for t in thresholds if lo <= t < hi]
        if len(inside) > 1:
            raise AssertionError(f"bucket {k} [{lo}, {hi}) holds {len(inside)} thresholds")
        base = sum(t < lo for t in thresholds)
        t = inside[0] if inside else float("inf")
        out.append((base << 32) | _f32_bits(t))
    for t in thresholds:
        edge = round(t * per_unit - 0.5) + 0.5
        if abs(t * per_unit - edge) < 2.0**-16 * per_unit:
            raise AssertionError(f"threshold {t} lies on a bucket edge")
    return out + [0] * (ENCODE_LUT_SIZE - _LUT_USED)


def encode_lut(kind: str) -> list[int]:
    """The int64 bucket table the encoder of ``kind`` reads (``"nf4"`` or ``"fp4_e2m1"``; zeros otherwise)."""
    if kind == "nf4":
        from agoq_triton_kernels.tables import NF4_THRESHOLDS
        return _bucket_table([_f32(t) * NF4_LUT_DOMAIN for t in NF4_THRESHOLDS], _NF4_PER_UNIT, _NF4_OFFSET)
    if kind == "fp4_e2m1":
        # E2M1 decision thresholds on |v| with ties to the even mantissa: '>' at 0.25, 1.25, 2.5, 5 and
        # '>=' at 0.75, 1.75, 3.5 (the reference's table), all as strict '>' thresholds
        strict = [0.25, _pred_f32(0.75), 1.25, _pred_f32(1.75), 2.5, _pred_f32(3.5), 5.0]
        return _bucket_table(strict, _FP4_PER_UNIT, _FP4_OFFSET)
    return [0] * ENCODE_LUT_SIZE
