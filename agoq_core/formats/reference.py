"""The pure-torch reference codecs: THE oracle every backend is compared against.

Written from the contract in docs/formats.md, not from any kernel. Runs on any device torch has
(the arithmetic is IEEE fp32 with correctly rounded division and round-half-to-even; no float64, which
Ascend A2/A3 lack), so the ``reference`` backend is simply these functions.

Shape legend: N = numel, NB = number of blocks, B = block size, W = number of ranks.
"""
from __future__ import annotations

import functools

import torch

from agoq_core.formats.packing import pack_codes, unpack_codes
from agoq_core.formats.spec import FP4_E2M1_LEVELS, MIN_NORMAL_F32, NF4_LEVELS, FormatSpec

__all__ = [
    "quantize_blocks",
    "dequantize_blocks",
    "encode",
    "decode_table",
    "nf4_thresholds",
    "scaled_values",
    "accumulate",
    "reduce_requantize",
]

_F32_EXP_MASK = 0x7F800000
# FP4 E2M1 decision thresholds on |v| with round-half-to-even: a tie goes to the level with an even
# mantissa bit. Strict '>' keeps the tie at the lower level, '>=' moves it up (docs/formats.md §4.3).
_FP4_THRESHOLDS: tuple[tuple[float, bool], ...] = (
    (0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False),
)


@functools.cache
def nf4_thresholds() -> tuple[float, ...]:
    """Decision thresholds between neighbouring NF4 levels: fp32((L[i] + L[i+1]) * 0.5).

    The sum is computed in fp32 (as a kernel would) and halved exactly. A value equal to a
    threshold takes the lower code.
    """
    lv = torch.tensor(NF4_LEVELS, dtype=torch.float32)
    return tuple(((lv[:-1] + lv[1:]) * 0.5).tolist())


@functools.cache
def _decode_table_cpu(kind: str, bits: int) -> torch.Tensor:
    n = 1 << bits
    if kind == "int":
        return torch.arange(n, dtype=torch.float32) - float(1 << (bits - 1))
    if kind == "nf4":
        return torch.tensor(NF4_LEVELS, dtype=torch.float32)
    if kind == "fp4_e2m1":
        mags = torch.tensor(FP4_E2M1_LEVELS, dtype=torch.float32)
        return torch.cat([mags, -mags])
    if kind in ("fp8_e4m3", "fp8_e5m2"):
        dt = torch.float8_e4m3fn if kind == "fp8_e4m3" else torch.float8_e5m2
        return torch.arange(n, dtype=torch.uint8).view(dt).to(torch.float32)
    raise ValueError(f"no decode table for kind {kind!r}")


def decode_table(spec: FormatSpec, device: torch.device | str = "cpu") -> torch.Tensor:
    """fp32 value of every code (``2**bits`` entries) before scaling."""
    return _decode_table_cpu(spec.kind, spec.bits).to(device)


def encode(v: torch.Tensor, spec: FormatSpec) -> torch.Tensor:
    """Map finite fp32 scaled values (|v| <= qmax up to rounding) to int64 codes."""
    if spec.kind == "int":
        q = torch.round(v).clamp_(-spec.qmax, spec.qmax)  # torch.round is half-to-even
        return q.to(torch.int64) + (1 << (spec.bits - 1))
    if spec.kind == "fp4_e2m1":
        m = v.abs()
        idx = torch.zeros_like(m, dtype=torch.int64)
        for t, inclusive in _FP4_THRESHOLDS:
            idx += (m >= t if inclusive else m > t).to(torch.int64)
        sign = ((v < 0) & (idx > 0)).to(torch.int64) << 3  # no negative-zero code
        return idx | sign
    if spec.kind == "nf4":
        code = torch.zeros_like(v, dtype=torch.int64)
        for t in nf4_thresholds():
            code += (v > t).to(torch.int64)
        return code
    if spec.kind in ("fp8_e4m3", "fp8_e5m2"):
        dt = torch.float8_e4m3fn if spec.kind == "fp8_e4m3" else torch.float8_e5m2
        # Clamp BEFORE the cast: torch<=2.11 turns e4m3 overflow into NaN, 2.13 saturates.
        c = v.clamp(-spec.qmax, spec.qmax).to(dt).view(torch.uint8).to(torch.int64)
        return torch.where(c == 0x80, 0, c)  # no -0 code: a magnitude that rounds to 0 is +0 (§4.2)
    raise ValueError(f"unknown code kind {spec.kind!r}")


# Above this scale RN(1/scale) would be subnormal. Only nf4 (qmax 1) has such blocks (absmax > 2**126); every
# format with qmax >= 4 has scale < 2**126, since scale * qmax is finite (§3 step 5).
_HUGE_SCALE = 2.0**126
_TWO_M64 = 2.0**-64


def scaled_values(xb: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """v = RN(x * RN(1/scale)) per element (spec version 3, docs/formats.md §3 step 6): one correctly rounded
    fp32 division per block, one fp32 multiply per element. xb fp32 [NB, B], scale fp32 [NB] (> 0 normal).

    For a scale above 2**126 (nf4 only) the contract keeps the reciprocal's 24 bits instead of a subnormal
    fp32: v = RN((x * 2**-64) * RN(2**64 / scale)), the same real product x * r (x * 2**-64 is exact unless it
    is below 2**-126, and then |v| < 2**-62, which every code maps to zero).
    """
    one = torch.ones_like(scale)
    v = xb * (one / scale)[:, None]
    huge = scale > _HUGE_SCALE
    v_huge = (xb * _TWO_M64) * (one / (scale * _TWO_M64))[:, None]
    return torch.where(huge[:, None], v_huge, v)


def quantize_blocks(x: torch.Tensor, spec: FormatSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize the flattened ``x`` -> (packed uint8 codes, fp32 scales[NB]).

    Steps (docs/formats.md §3): fp32 -> flush subnormals -> per-block non-finite flag and absmax ->
    scale = absmax / qmax (scales below 2**-126 become 0, one step down if qmax x scale overflows) ->
    v = x * RN(1/scale) (spec version 3; x / scale before) -> encode -> pack.
    """
    n = x.numel()
    nb = spec.num_blocks(n)
    xf = x.reshape(-1).to(torch.float32)
    if n == 0:
        return (torch.empty(0, dtype=torch.uint8, device=x.device),
                torch.empty(0, dtype=torch.float32, device=x.device))
    if spec.scale_kind != "absmax":  # OCP MX / NVFP4 scales: docs/formats.md §9
        from agoq_core.formats.mx import quantize_scaled

        return quantize_scaled(xf, spec)
    pad = nb * spec.block - n
    if pad:
        xf = torch.cat([xf, xf.new_zeros(pad)])
    xb = xf.view(nb, spec.block)
    expo = xb.view(torch.int32) & _F32_EXP_MASK
    nonfinite = (expo == _F32_EXP_MASK).any(dim=1)
    xb = torch.where((expo == 0) | (expo == _F32_EXP_MASK), torch.zeros_like(xb), xb)
    amax = xb.abs().amax(dim=1)
    scale = amax / torch.full((), float(spec.qmax), dtype=torch.float32, device=x.device)  # no host copy
    scale = torch.where(scale < MIN_NORMAL_F32, torch.zeros_like(scale), scale)
    # qmax x scale must stay finite so that every decoded value does (absmax near FLT_MAX: int6 and
    # int8 round the quotient up); take the next fp32 below (§3 step 5).
    over = torch.isinf(scale * spec.qmax)
    scale = torch.where(over, (scale.view(torch.int32) - 1).view(torch.float32), scale)
    divisor = torch.where(scale == 0, torch.ones_like(scale), scale)
    v = scaled_values(xb, divisor)
    v = torch.where((scale == 0)[:, None], torch.zeros_like(v), v)
    codes = encode(v, spec)
    codes[nonfinite] = spec.zero_code
    scale = torch.where(nonfinite, torch.full_like(scale, float("nan")), scale)
    n_codes = -(-n // spec.pack_group) * spec.pack_group
    return pack_codes(codes.reshape(-1)[:n_codes], spec), scale


def dequantize_blocks(
    codes: torch.Tensor, scales: torch.Tensor, spec: FormatSpec, numel: int,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Flat ``decode(code) * scale`` in fp32, then one round-to-nearest-even cast to ``dtype``."""
    if numel == 0:
        return torch.empty(0, dtype=dtype, device=codes.device)
    c = unpack_codes(codes, spec, numel)
    vals = decode_table(spec, codes.device)[c]
    s = scales.to(torch.float32).repeat_interleave(spec.block)[:numel]
    return (vals * s).to(dtype)


def _check_block_local(spec: FormatSpec, op: str) -> None:
    if spec.tensor_scaled:
        from agoq_core.errors import FormatError

        raise FormatError(f"{op}: {spec.name} scales every block by a per-tensor scale, which a block-wise "
                          "requantize cannot keep; use a format with block-local scales (mxfp8, fp8_e4m3, int8)")


def accumulate(
    codes: torch.Tensor, scales: torch.Tensor, spec: FormatSpec, numel: int, g: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """QuanGrad accumulation: requantize(dequantize(q) + g), the add done in fp32.

    The paper adds in 16-bit; adding in fp32 registers costs no memory and is never less precise.
    ``dequantize`` yields fp32 (no 16-bit rounding) and the sum is one fp32 add (no FMA).
    """
    _check_block_local(spec, "accumulate")
    acc = dequantize_blocks(codes, scales, spec, numel, torch.float32) + g.reshape(-1).to(torch.float32)
    return quantize_blocks(acc, spec)


def reduce_requantize(
    codes: torch.Tensor, scales: torch.Tensor, spec: FormatSpec, numel: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum W quantized chunks in FP32 in rank order and requantize the sum.

    ``codes``: uint8[W, code_bytes(numel)], ``scales``: fp32[W, NB]. The sum is the left fold
    ``((d0 + d1) + d2) + ...`` so every backend and every rank gets the same bits.
    """
    _check_block_local(spec, "reduce_requantize")
    w = codes.shape[0]
    total = dequantize_blocks(codes[0], scales[0], spec, numel, torch.float32)
    for r in range(1, w):
        total = total + dequantize_blocks(codes[r], scales[r], spec, numel, torch.float32)
    return quantize_blocks(total, spec)
