"""RMSNorm forward that also writes the 4-bit (any format) codes of its input: one read of x, not two.

LAAQ keeps a norm's *input* quantized and recomputes the output in backward, so the forward pass reads x
twice when the codec runs separately (norm, then quantize). Here one program takes one token row of H
elements as a [H / block, block] register tile, quantizes it with the shared block quantizer
(agoq_triton_kernels.kernels.quantize_tile: codes and scales bit-exact with the codec kernels and the
reference), and normalises it:

    y = round_dtype(weight * round_dtype(x * 1/sqrt(sum(x*x) / H + eps)))      (HF LlamaRMSNorm's recipe)

The codes are bit-exact (conformance: optional capability ``rmsnorm_quant``). ``y`` is RMSNorm to within one
rounding of the output dtype: its sum of squares is a tree reduction in fp32 (torch's order differs, and
torch's CUDA rsqrt is not correctly rounded), so y is checked against torch within a tolerance, not bit for
bit. Rows: x [M, H] contiguous, H a power-of-two multiple of a power-of-two block (every LLaMA size).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from agoq_triton_kernels.buffers import check_codec_buffers, float_view
from agoq_triton_kernels.codes import bf16_bits_to_f32, f32_to_bf16_bits
from agoq_triton_kernels.kernels import _load_f32, _store_f32, quantize_tile, store_codes
from agoq_triton_kernels.layout import format_constexprs, next_pow2

__all__ = ["rmsnorm_quant_unsupported", "rmsnorm_quant_into"]


@triton.jit(do_not_specialize=["M"])
def _rmsnorm_quant_kernel(x_ptr, w_ptr, y_ptr, codes_ptr, scales_ptr, M, eps, ts_ptr,
                          H: tl.constexpr, NBR: tl.constexpr, KIND: tl.constexpr, BITS: tl.constexpr,
                          BLOCK: tl.constexpr, BLOCK_P: tl.constexpr, QMAX: tl.constexpr, HW: tl.constexpr,
                          FLOAT: tl.constexpr, SCALE: tl.constexpr = 0):
    j = tl.arange(0, NBR)
    lanes = tl.arange(0, BLOCK_P)
    col = j[:, None] * BLOCK + lanes[None, :]
    w = _load_f32(w_ptr, col, col < H, FLOAT)
    t = tl.program_id(0)
    while t < M:
        rows = t * NBR + j  # global block indices of this token row
        ok = j < NBR
        elem = rows[:, None] * BLOCK + lanes[None, :]
        x = _load_f32(x_ptr, elem, col < H, FLOAT)
        codes, scale = quantize_tile(x, None, KIND, BITS, QMAX, HW, False, HW, SCALE, ts_ptr)
        store_codes(codes_ptr, codes, rows, ok, elem, col < H, M * H, NBR, BITS, BLOCK, BLOCK_P, False)
        tl.store(scales_ptr + rows, scale)
        ss = tl.sum(tl.sum(x * x, axis=1), axis=0)
        r = tl.math.div_rn(1.0, tl.math.sqrt_rn(tl.math.div_rn(ss, H * 1.0) + eps))
        h = x * r
        if FLOAT == 1:  # round to bf16 like h.to(input_dtype), then the bf16 x bf16 product
            h = bf16_bits_to_f32(f32_to_bf16_bits(h))
        elif FLOAT == 2:
            h = h.to(tl.float16).to(tl.float32)
        _store_f32(y_ptr, elem, w * h, col < H, FLOAT, HW)
        t += tl.num_programs(0)


def rmsnorm_quant_unsupported(x: torch.Tensor, weight: torch.Tensor, spec) -> str | None:
    """Why the fused RMSNorm + quantize cannot run here (None: it can). Launches nothing."""
    if x.dim() < 1 or not x.is_contiguous():
        return "x must be contiguous"
    h = x.shape[-1]
    if weight.shape != (h,) or weight.dtype != x.dtype or weight.device != x.device:
        return f"weight must be [{h}] of {x.dtype} on {x.device}, got {tuple(weight.shape)} {weight.dtype}"
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"x is {x.dtype}; the fused norm takes float32, bfloat16 or float16"
    if spec.block & (spec.block - 1) or h % spec.block or next_pow2(h // spec.block) != h // spec.block:
        return (f"hidden size {h} must be a power-of-two number of power-of-two blocks (block {spec.block}); "
                "run the norm and the codec separately")
    if h > 16384:
        return f"hidden size {h} > 16384 does not fit one register tile"
    return None


def rmsnorm_quant_into(x: torch.Tensor, weight: torch.Tensor, eps: float, spec, y: torch.Tensor,
                       codes: torch.Tensor, scales: torch.Tensor, *, hw: bool | None = None,
                       programs: int | None = None) -> None:
    """y = RMSNorm(x) * weight (x.dtype), (codes, scales) = Q_spec(x flattened), in one pass over x."""
    why = rmsnorm_quant_unsupported(x, weight, spec)
    if why:
        raise ValueError(f"rmsnorm_quant: {why}")
    from agoq_cuda.launch import LAUNCHER  # the plugin's geometry decides HW
    from agoq_triton_kernels.launch import _tensor_scale, ts_arg

    n, h = x.numel(), x.shape[-1]
    check_codec_buffers(spec, n, codes, scales, x.device, "rmsnorm_quant")
    xv, fk = float_view(x.reshape(-1), "rmsnorm_quant")
    yv, _ = float_view(y.reshape(-1), "rmsnorm_quant")
    wv, _ = float_view(weight, "rmsnorm_quant")
    c = format_constexprs(kind=spec.kind, bits=spec.bits, block=spec.block, qmax=spec.qmax,
                          scale_kind=spec.scale_kind)
    m = n // h
    hw_ = LAUNCHER.geometry.hw(x.device, hw)
    nprog = programs or (2 if x.device.type == "cpu" else min(m, 132 * 8))
    warps = 4 if h <= 2048 else 8 if h <= 8192 else 16
    extra = {"num_warps": warps} if x.device.type != "cpu" else {}
    _rmsnorm_quant_kernel[(max(1, nprog),)](
        xv, wv, yv, codes.view(torch.int8), scales, m, float(eps), _tensor_scale(spec, x) if spec.tensor_scaled
        else None, H=h, NBR=h // spec.block, KIND=c["KIND"], BITS=c["BITS"], BLOCK=c["BLOCK"],
        BLOCK_P=c["BLOCK_P"], QMAX=c["QMAX"], HW=hw_, FLOAT=fk, SCALE=c.get("SCALE", 0),
        enable_fp_fusion=False, **extra)
