"""The one tolerance table of the fused GEMMs (the codec parts are bit-exact and have no tolerance).

A fused GEMM result is compared with the float64 product of the *same operands* (x and W as given; for
dW, dY and the dequantized X rounded to dY's dtype, exactly what the unfused path materialises).
SQNR = 10·log10(Σ ref² / Σ (out − ref)²) in dB, over the finite reference elements.

Why these floors: with fp32 accumulation the error is dominated by the single rounding of the result to
16 bits. A value rounded to nearest with p significand bits has a relative error uniform in ±2^-p, whose
RMS over a log-uniform mantissa is ~2^-p/√3/1.44, i.e. an SQNR of ~6.02·p + 7 dB: bf16 (p = 8) ~55 dB,
fp16 (p = 11) ~73 dB; measured on random LLaMA-like operands: 55.6 dB and 73.6 dB (torch's own
matmul: the same to ±0.1 dB). The floors leave 5 dB for accumulation order (fp32 sums of K up to 16K
terms add ~√K·2^-24 relative: > 100 dB) and for input distributions whose mantissas are not uniform.
A kernel that rounds twice (e.g. through bf16 partial sums) or truncates instead of rounding loses
3-6 dB and fails; one that drops a K tile or a token tile loses tens of dB.
"""
from __future__ import annotations

import math

import torch

__all__ = ["SQNR_FLOOR_DB", "sqnr_db", "sqnr_floor"]

#: Minimum SQNR (dB) of a fused GEMM's output against float64 on the same operands, by output dtype.
SQNR_FLOOR_DB: dict[torch.dtype, float] = {
    torch.bfloat16: 50.0,
    torch.float16: 68.0,
}


def sqnr_floor(dtype: torch.dtype) -> float:
    try:
        return SQNR_FLOOR_DB[dtype]
    except KeyError:
        raise ValueError(f"no fused-GEMM tolerance for {dtype}; fused GEMMs produce bfloat16 or float16") from None


def sqnr_db(out: torch.Tensor, ref: torch.Tensor) -> float:
    """SQNR of ``out`` against ``ref`` in dB over the elements where ``ref`` is finite (inf if equal)."""
    dev = out.device if out.device == ref.device else torch.device("cpu")  # big GPU tensors stay on the GPU
    o = out.detach().to(dev, torch.float64).reshape(-1)
    r = ref.detach().to(dev, torch.float64).reshape(-1)
    fin = torch.isfinite(r)
    o, r = o[fin], r[fin]
    noise = (o - r).pow(2).sum().item()
    signal = r.pow(2).sum().item()
    if noise != noise or noise == float("inf"):  # a NaN/Inf where the reference is finite
        return float("-inf")
    if noise == 0.0:
        return float("inf")
    if signal == 0.0:
        return float("-inf")
    return 10.0 * math.log10(signal / noise)
