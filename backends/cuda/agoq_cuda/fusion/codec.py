"""Block codec on register tiles of whole blocks, for the fused GEMMs' epilogue and prologue.

A tile here is ``R`` whole blocks of a power-of-two ``BLOCK`` (one block per tile row), each with its
*global* block index ``rows[r]`` and a validity flag ``ok[r]``: the fused GEMMs cut their output (or
operand) tile into blocks that are not contiguous in memory, and whole blocks never need element masks.
The block quantizer (docs/formats.md §3), the packing (§5) and the dequantizer are the shared functions of
agoq_triton_kernels.kernels, called on whole-block tiles, so fused and stand-alone codecs compute and
store every code with the same code.
"""
from __future__ import annotations

import triton
import triton.language as tl

from agoq_triton_kernels.kernels import dequantize_tile, quantize_tile, store_codes

__all__ = ["quantize_rows", "store_packed", "dequantize_rows"]


@triton.jit
def quantize_rows(x, KIND: tl.constexpr, BITS: tl.constexpr, QMAX: tl.constexpr, FAST_DIV: tl.constexpr):
    """fp32 [R, BLOCK], one block per row -> (codes int32 [R, BLOCK], scales fp32 [R]): the shared block
    quantizer of the codec kernels (docs/formats.md §3), with the portable encodes (HW=False) and, with
    FAST_DIV (GPU only: libdevice), the scale by div.rn and the scaled values by rcp.rn / mul.rn."""
    return quantize_tile(x, None, KIND, BITS, QMAX, False, False, FAST_DIV)


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
