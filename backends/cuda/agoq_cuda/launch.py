"""Launchers: buffers -> kernel arguments and launch geometry for CUDA (and Triton's interpreter).

Every launcher takes keyword overrides for tests and tuning: ``rows`` (blocks per tile), ``programs``
(grid size) and ``hw`` (False runs the portable integer/div_rn kernel variant on a GPU).

The kernel bodies live in agoq_triton_kernels; everything device-specific is here: tile rows, grid
size, warps, chunking of tensors above 2**30 elements, and how tensors are viewed (codes as int8,
bf16 as int16).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from agoq_core.formats.spec import FormatSpec
from agoq_triton_kernels import kernels as K
from agoq_triton_kernels.buffers import check_codec_buffers as _check
from agoq_triton_kernels.buffers import float_view
from agoq_triton_kernels.codes import NF4_LEVELS_KERNEL
from agoq_triton_kernels.layout import (
    MAX_BLOCK, MAX_CHUNK_ELEMENTS, encode_lut, format_constexprs,
)

__all__ = ["Geometry", "geometry", "quantize", "dequantize", "accumulate", "reduce_requantize", "is_interpreted"]



def is_interpreted() -> bool:
    """Whether the kernels were decorated under TRITON_INTERPRET (decided once, at import)."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(K.quantize_kernel, InterpretedFunction)


@dataclass(frozen=True, slots=True)
class Geometry:
    """How one launch is cut: ROWS blocks per tile, ``programs`` persistent programs, warps."""

    rows: int
    programs: int
    num_warps: int


# GPU (measured on the H200, 2026-11-29, docs/bench/codecs.md): these kernels are bound by instruction
# issue, not DRAM. Tiles of 2048 lanes on 4 warps (16 elements per thread), one tile per program, were the
# best or within 5% of the best of {1024, 2048, 4096} lanes (and of 8 programs/SM vs one tile/program) for
# int4, int5 dequantize and fp8_e4m3. Exception: 5-bit quantize, 197 us with 1024 lanes vs 328 us with
# 2048 and 1140 us with 4096 (256 MiB); 6-bit quantize likely shares the cliff but was not swept.
# Interpreter: each program instance costs ~8 ms of Python (cpu-feasibility.md §2), a tile of 2**15
# lanes ~1 ms of numpy, so one or two big programs are fastest; two exercise the strided loop.
_GPU_TILE_LANES = 2048
_GPU_TILE_LANES_5BIT_QUANTIZE = 1024
_GPU_MAX_PROGRAMS = (1 << 31) - 1
_INTERP_TILE_LANES = 1 << 15
_INTERP_PROGRAMS = 2


def geometry(block_p: int, n_blocks: int, device: torch.device, *, rows: int | None = None,
             programs: int | None = None, lanes: int = _GPU_TILE_LANES) -> Geometry:
    """Default launch geometry for ``n_blocks`` blocks of ``block_p`` lanes (overridable for tests/tuning)."""
    if device.type == "cpu":
        r = rows or max(1, _INTERP_TILE_LANES // block_p)
        tiles = -(-n_blocks // r)
        return Geometry(r, max(1, min(tiles, programs or _INTERP_PROGRAMS)), 4)
    r = rows or max(1, lanes // block_p)
    tiles = -(-n_blocks // r)
    lanes = r * block_p
    warps = 4 if lanes <= 2048 else 8 if lanes <= 4096 else 16
    return Geometry(r, max(1, min(tiles, programs or _GPU_MAX_PROGRAMS)), warps)


@functools.cache
def _hw_conversions(device: torch.device) -> bool:
    """HW=True kernels (hardware fp8/bf16 conversions, FMA quotient) need CUDA sm_89+ (fp8 cvt)."""
    if device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


def _hw(hw: bool | None, device: torch.device) -> bool:
    """The HW constexpr: the device default, or False on request (tests run the portable path on a GPU)."""
    if hw is None:
        return _hw_conversions(device)
    if hw and not _hw_conversions(device):
        raise ValueError(f"hw=True needs a CUDA device of compute capability >= 8.9, got {device}")
    return bool(hw)


@functools.cache
def _nf4_lut(device: torch.device) -> torch.Tensor:
    return torch.tensor(NF4_LEVELS_KERNEL, dtype=torch.float32, device=device)


@functools.cache
def _encode_lut(kind: str, device: torch.device) -> torch.Tensor:
    return torch.tensor(encode_lut(kind), dtype=torch.int64, device=device)


def _consts(spec: FormatSpec) -> dict:
    if spec.block > MAX_BLOCK:
        raise ValueError(f"agoq-cuda kernels take blocks up to {MAX_BLOCK}, got {spec.name} block={spec.block}")
    return format_constexprs(kind=spec.kind, bits=spec.bits, block=spec.block, qmax=spec.qmax)


def _segments(spec: FormatSpec, n: int):
    """Pieces of one tensor, each one launch: runs of whole blocks (<= 2**30 elements) with RAGGED=False,
    then the last, partial block (if any) with RAGGED=True.

    Yields (element offset, elements, code-byte offset, block offset, ragged)."""
    full = n // spec.block * spec.block
    step = max(spec.block, MAX_CHUNK_ELEMENTS // spec.block * spec.block)
    for off in range(0, full, step):
        yield off, min(step, full - off), off // spec.block * (spec.block * spec.bits // 8), off // spec.block, False
    if full < n:
        yield full, n - full, full // spec.block * (spec.block * spec.bits // 8), full // spec.block, True


def _launch(kernel, geo: Geometry, args: tuple, **constexprs) -> None:
    # enable_fp_fusion=False: decode(c) * s + g must round twice like the reference, never as one FMA.
    kernel[(geo.programs,)](*args, **constexprs, num_warps=geo.num_warps, enable_fp_fusion=False)


def quantize(x: torch.Tensor, spec: FormatSpec, codes: torch.Tensor, scales: torch.Tensor, *,
             rows: int | None = None, programs: int | None = None, hw: bool | None = None) -> None:
    """x flat [N] -> codes uint8[code_bytes(N)], scales fp32[NB]. float64 is rounded to fp32 by torch first
    (the reference does the same)."""
    n = x.numel()
    _check(spec, n, codes, scales, x.device, "quantize")
    if x.dtype == torch.float64:
        x = x.to(torch.float32)
    xv, xk = float_view(x.reshape(-1), "quantize", "agoq-cuda")
    c = _consts(spec)
    cv = codes.view(torch.int8)
    elut = _encode_lut(spec.kind, x.device)
    for off, m, boff, soff, ragged in _segments(spec, n):
        nb = spec.num_blocks(m)
        geo = geometry(c["BLOCK_P"], nb, x.device, rows=rows, programs=programs,
                       lanes=_GPU_TILE_LANES_5BIT_QUANTIZE if spec.bits == 5 else _GPU_TILE_LANES)
        _launch(K.quantize_kernel, geo,
                (xv[off:off + m], cv[boff:boff + spec.code_bytes(m)], scales[soff:soff + nb], m, nb,
                 -(-nb // geo.rows)), **c, ROWS=geo.rows, RAGGED=ragged, X_FLOAT=xk, elut_ptr=elut, NF4_LUT=True,
                HW=_hw(hw, x.device))


def dequantize(codes: torch.Tensor, scales: torch.Tensor, spec: FormatSpec, out: torch.Tensor, *,
               rows: int | None = None, programs: int | None = None, hw: bool | None = None) -> None:
    """codes + scales -> out flat [N] (fp32, bf16 or fp16)."""
    n = out.numel()
    _check(spec, n, codes, scales, out.device, "dequantize")
    ov, ok = float_view(out.reshape(-1), "dequantize", "agoq-cuda")
    c = _consts(spec)
    cv = codes.view(torch.int8)
    lut = _nf4_lut(out.device)
    for off, m, boff, soff, ragged in _segments(spec, n):
        nb = spec.num_blocks(m)
        geo = geometry(c["BLOCK_P"], nb, out.device, rows=rows, programs=programs)
        _launch(K.dequantize_kernel, geo,
                (cv[boff:boff + spec.code_bytes(m)], scales[soff:soff + nb], lut, ov[off:off + m], m, nb,
                 -(-nb // geo.rows)), **c, ROWS=geo.rows, RAGGED=ragged, OUT_FLOAT=ok, NF4_LUT=True,
                HW=_hw(hw, out.device))


def accumulate(codes: torch.Tensor, scales: torch.Tensor, spec: FormatSpec, g: torch.Tensor, *,
               rows: int | None = None, programs: int | None = None, hw: bool | None = None) -> None:
    """In place: (codes, scales) <- Q(D(codes, scales) + g), g flat [N] (fp32, bf16, fp16; fp64 via fp32)."""
    n = g.numel()
    _check(spec, n, codes, scales, g.device, "accumulate_")
    if g.dtype == torch.float64:
        g = g.to(torch.float32)
    gv, gk = float_view(g.reshape(-1), "accumulate_", "agoq-cuda")
    c = _consts(spec)
    cv = codes.view(torch.int8)
    lut = _nf4_lut(g.device)
    elut = _encode_lut(spec.kind, g.device)
    for off, m, boff, soff, ragged in _segments(spec, n):
        nb = spec.num_blocks(m)
        geo = geometry(c["BLOCK_P"], nb, g.device, rows=rows, programs=programs)
        _launch(K.accumulate_kernel, geo,
                (cv[boff:boff + spec.code_bytes(m)], scales[soff:soff + nb], lut, gv[off:off + m], m, nb,
                 -(-nb // geo.rows)), **c, ROWS=geo.rows, RAGGED=ragged, G_FLOAT=gk, NF4_LUT=True, elut_ptr=elut,
                HW=_hw(hw, g.device))


def reduce_requantize(codes: torch.Tensor, scales: torch.Tensor, spec: FormatSpec, numel: int,
                      codes_out: torch.Tensor, scales_out: torch.Tensor, *, rows: int | None = None,
                      programs: int | None = None, hw: bool | None = None) -> None:
    """codes uint8[W, code_bytes], scales fp32[W, NB] -> Q(sum_r D_r) into codes_out, scales_out."""
    if codes.dim() != 2 or scales.dim() != 2 or codes.shape[0] != scales.shape[0] or codes.shape[0] < 1:
        raise ValueError(f"reduce_requantize: want codes[W, B] and scales[W, NB] with W >= 1, got "
                         f"{tuple(codes.shape)} and {tuple(scales.shape)}")
    n, w = numel, codes.shape[0]
    _check(spec, n, codes_out, scales_out, codes.device, "reduce_requantize")
    _check(spec, n, codes[0], scales[0], codes.device, "reduce_requantize (input row)")
    if codes.stride(1) != 1 or scales.stride(1) != 1:
        raise ValueError("reduce_requantize: rows of codes and scales must be contiguous")
    c = _consts(spec)
    cv, cov = codes.view(torch.int8), codes_out.view(torch.int8)
    lut = _nf4_lut(codes.device)
    elut = _encode_lut(spec.kind, codes.device)
    for off, m, boff, soff, ragged in _segments(spec, n):
        nb = spec.num_blocks(m)
        cb = spec.code_bytes(m)
        geo = geometry(c["BLOCK_P"], nb, codes.device, rows=rows, programs=programs)
        _launch(K.reduce_requantize_kernel, geo,
                (cv[:, boff:boff + cb], scales[:, soff:soff + nb], lut, cov[boff:boff + cb],
                 scales_out[soff:soff + nb], m, nb, -(-nb // geo.rows), w, codes.stride(0), scales.stride(0)),
                **c, ROWS=geo.rows, RAGGED=ragged, NF4_LUT=True, HW=_hw(hw, codes.device), elut_ptr=elut)
