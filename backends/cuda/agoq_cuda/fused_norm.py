"""RMSNorm forward that also writes the 4-bit (any format) codes of its input: one read of x, not two.

LAAQ keeps a norm's *input* quantized and recomputes the output in backward, so the forward pass reads x
twice when the codec runs separately (norm, then quantize). Here one program takes one token row of H
elements as a [H / block, block] register tile, quantizes it with the shared block quantizer
(agoq_triton_kernels.kernels.quantize_tile: codes and scales bit-exact with the codec kernels and the
reference), and normalises it:

    y = round_dtype(weight * round_dtype(x * 1/sqrt(sum(x*x) / H + eps)))      (HF LlamaRMSNorm's recipe)

The codes are bit-exact (conformance: optional capability ``rmsnorm_quant``). ``y``'s sum of squares and
rsqrt come in variants (VARIANTS): Triton's tree, torch's CUDA reduction order with a correctly rounded
1/sqrt, or that order with rsqrt.approx (HF's norm on a GPU). LAAQ keeps the fastest whose ``y`` equals the
model's own norm except in rows whose fp32 inverse RMS is one ulp apart (<= 2 steps of the output dtype
there; agoq_core.laaq.fusion, docs/fusion.md), checked on its first calls with the ``rinv`` output. Rows: x [M, H]
contiguous, H a power-of-two multiple of a power-of-two block, 256 <= H <= 16384 (every LLaMA size).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from agoq_cuda.fused_swiglu import _round, _round_pair  # RNE to the activation dtype, in registers
# the plugin's geometry decides HW, the tile, the register caps and the prefetch
from agoq_cuda.launch import LAUNCHER, fused_maxnreg, fused_vec16, norm_prefetch, norm_prefetch_words, norm_programs
from agoq_triton_kernels.buffers import check_codec_buffers, float_view
from agoq_triton_kernels.codes import bf16_bits_to_f32
from agoq_triton_kernels.kernels import (_load16_f32, _load16_words, _load_f32, _quantize16, _store_codes16, _store_f32,
                                         _tile16, _words_f32, _words_rowmax,
                                         quantize_tile, store_codes)
from agoq_triton_kernels.layout import next_pow2, spec_constexprs

__all__ = ["rmsnorm_quant_unsupported", "rmsnorm_quant_into", "rmsnorm_quant_variants", "VARIANTS"]


@triton.jit
def _rsqrt(v, RSQRT: tl.constexpr):
    """1/sqrt(v): RSQRT=0 correctly rounded sqrt then correctly rounded division (torch's CPU rsqrt);
    RSQRT=1 the GPU's rsqrt.approx.f32 (what CUDA's rsqrtf, hence torch's CUDA rsqrt, compiles to)."""
    if RSQRT == 1:
        return tl.inline_asm_elementwise("rsqrt.approx.f32 $0, $1;", "=r,r", [v], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return tl.math.div_rn(1.0, tl.math.sqrt_rn(v))


@triton.jit
def _row_sum_squares(x_ptr, x, base, H: tl.constexpr, FLOAT: tl.constexpr, ORDER: tl.constexpr,
                     LANES: tl.constexpr, LOG_LANES: tl.constexpr):
    """sum(x*x) over one row, in fp32, in a fixed order.

    ORDER=0: Triton's tree over the register tile ``x`` (fast; order is Triton's).
    ORDER=1: the order of torch's CUDA reduction kernel for ``x.float().pow(2).mean(-1)`` on a contiguous
    row of H > 128 elements and >= 16 rows (ATen Reduce.cuh: vectorised loads of 4, one warp of LANES =
    min(H/4, 32) threads per row): lane l keeps 4 accumulators, acc_j += x[4 LANES k + 4 l + j]**2 for
    k = 0, 1, ... in order; then ((acc_0 + acc_1) + acc_2) + acc_3; then the warp's shfl_down tree
    (offsets 1, 2, 4, ...: adjacent lanes first). Reloads the row in LANES*4-element slices (L1/L2 hits
    after the tile load) so the sequential part is a sequence of vector adds."""
    if ORDER == 1:
        c = tl.arange(0, 4 * LANES)
        acc = tl.zeros([4 * LANES], dtype=tl.float32)
        for k in tl.static_range(H // (4 * LANES)):
            v = _load_f32(x_ptr, base + k * (4 * LANES) + c, c >= 0, FLOAT)
            acc = acc + v * v
        p, q = tl.split(tl.reshape(acc, [LANES, 2, 2]))  # p: j = 0, 2; q: j = 1, 3
        a0, a2 = tl.split(p)
        a1, a3 = tl.split(q)
        s = ((a0 + a1) + a2) + a3
        for _ in tl.static_range(LOG_LANES):
            s0, s1 = tl.split(tl.reshape(s, [s.shape[0] // 2, 2]))
            s = s0 + s1
        return tl.sum(s, axis=0)  # one element: exact
    else:
        return tl.sum(tl.sum(x * x, axis=1), axis=0)


@triton.jit
def _load_raw(ptr, offs, mask, FLOAT: tl.constexpr):
    """The 16/32-bit values as stored (bf16 as its int16 view): half the registers of _load_f32's fp32 while a
    prefetched row waits (PREFETCH). (An evict-first hint on these loads was timed on an H100, 2026-12-06: no gain.)"""
    if FLOAT == 1:
        return tl.load(ptr + offs, mask=mask, other=0)
    else:
        return tl.load(ptr + offs, mask=mask, other=0.0)


@triton.jit
def _widen(raw, FLOAT: tl.constexpr):
    """_load_raw's values in fp32, exactly as _load_f32 would have returned them."""
    if FLOAT == 1:
        return bf16_bits_to_f32(raw)
    else:
        return raw.to(tl.float32)


@triton.jit
def _normalized(x, r, w, FLOAT: tl.constexpr, HW: tl.constexpr):
    """w * round_dtype(x * r) in fp32 (HF LlamaRMSNorm: h.to(input_dtype), then the 16-bit product)."""
    return w * _round(x * r, FLOAT, HW)


@triton.jit(do_not_specialize=["M"])
def _rmsnorm_quant_kernel(x_ptr, w_ptr, y_ptr, codes_ptr, scales_ptr, M, eps, ts_ptr, r_ptr,
                          H: tl.constexpr, NBR: tl.constexpr, KIND: tl.constexpr, BITS: tl.constexpr,
                          BLOCK: tl.constexpr, BLOCK_P: tl.constexpr, QMAX: tl.constexpr, HW: tl.constexpr,
                          FLOAT: tl.constexpr, SCALE: tl.constexpr = 0, ORDER: tl.constexpr = 0,
                          RSQRT: tl.constexpr = 0, LANES: tl.constexpr = 32, LOG_LANES: tl.constexpr = 5,
                          WRITE_R: tl.constexpr = 0, elut_ptr=None, NF4_LUT: tl.constexpr = False,
                          VEC16: tl.constexpr = False, PREFETCH: tl.constexpr = False, WORDS: tl.constexpr = False,
                          MAX16: tl.constexpr = False):
    j = tl.arange(0, NBR)
    if VEC16:  # the codec kernels' 16-lane tile: [BLOCK // 16, NBR, 8] halves of each 16-element group
        _, _, wcol, _ = _tile16(0, NBR, NBR, BLOCK)
        wa = _load_f32(w_ptr, wcol, wcol < H, FLOAT)
        wb = _load_f32(w_ptr, wcol + 8, wcol < H, FLOAT)
    else:
        lanes = tl.arange(0, BLOCK_P)
        col = j[:, None] * BLOCK + lanes[None, :]
        w = _load_f32(w_ptr, col, col < H, FLOAT)
    t = tl.program_id(0)
    if PREFETCH:  # this program's first row, loaded before the loop
        if VEC16 and MAX16 and WORDS and FLOAT == 1:
            xra, xrb = _load16_words(x_ptr, t, M * NBR, NBR, BLOCK)
        elif VEC16:
            _, _, off0, m0 = _tile16(t, M * NBR, NBR, BLOCK)
            xra = _load_raw(x_ptr, off0, m0, FLOAT)
            xrb = _load_raw(x_ptr, off0 + 8, m0, FLOAT)
        else:
            xr = _load_raw(x_ptr, (t * NBR + j)[:, None] * BLOCK + lanes[None, :], (col < H) & (t < M), FLOAT)
    while t < M:
        if VEC16:
            rows, ok, off, m = _tile16(t, M * NBR, NBR, BLOCK)  # the NBR blocks of token row t
            rowmax = None  # quantize_tile's own, unless MAX16 reads it from the words
            if PREFETCH and MAX16 and WORDS and FLOAT == 1:  # the prefetched row as words (half the registers of
                xa = _words_f32(xra, NBR, BLOCK)  # its values while it waits, as the int16 view below)
                xb = _words_f32(xrb, NBR, BLOCK)
                rowmax = _words_rowmax(xra, xrb, NBR, BLOCK, HW)
                xra, xrb = _load16_words(x_ptr, t + tl.num_programs(0), M * NBR, NBR, BLOCK)
            elif PREFETCH:  # as on the generic tile: the next row's halves are loaded before this row's work
                xa = _widen(xra, FLOAT)
                xb = _widen(xrb, FLOAT)
                _, _, offn, mn = _tile16(t + tl.num_programs(0), M * NBR, NBR, BLOCK)
                xra = _load_raw(x_ptr, offn, mn, FLOAT)
                xrb = _load_raw(x_ptr, offn + 8, mn, FLOAT)
            elif MAX16 and WORDS and FLOAT == 1:  # bf16 words, and the absmax from them as quantize's (MAX16)
                qa, qb = _load16_words(x_ptr, t, M * NBR, NBR, BLOCK)
                xa = _words_f32(qa, NBR, BLOCK)
                xb = _words_f32(qb, NBR, BLOCK)
                rowmax = _words_rowmax(qa, qb, NBR, BLOCK, HW)
            else:  # WORDS: bf16 as int32 words, where every thread owns its 16 elements (launch.words_unreplicated)
                xa, xb = _load16_f32(x_ptr, t, M * NBR, NBR, BLOCK, FLOAT, WORDS)
            # FAST_RCP=False: libdevice's rcp.rn here; the inline one raised the prefetching int4 norm from 64 to 77
            # registers and nf4's loop from 26.25 to 26.88 instructions per element (sm_90, codec_isa)
            ca, cb, scale = _quantize16(xa, xb, elut_ptr, NBR, KIND, BITS, QMAX, BLOCK, NF4_LUT, HW, SCALE, ts_ptr,
                                        FAST_RCP=False, rowmax=rowmax)
            _store_codes16(codes_ptr, ca, cb, rows, ok, ~(scale > 0.0), NBR, KIND, BITS, BLOCK)
            if ORDER == 1:
                ss = _row_sum_squares(x_ptr, xa, t * H, H, FLOAT, ORDER, LANES, LOG_LANES)
            else:  # Triton's tree over the tile (like ORDER 0 of the generic tile, in this tile's order)
                ss = tl.sum(tl.sum(tl.sum(xa * xa + xb * xb, axis=2), axis=1), axis=0)
        else:
            rows = t * NBR + j  # global block indices of this token row
            ok = j < NBR
            elem = rows[:, None] * BLOCK + lanes[None, :]
            if PREFETCH:  # the next row's load is issued before this row's work: two rows in flight per program
                x = _widen(xr, FLOAT)
                tn = t + tl.num_programs(0)
                xr = _load_raw(x_ptr, (tn * NBR + j)[:, None] * BLOCK + lanes[None, :], (col < H) & (tn < M), FLOAT)
            else:
                x = _load_f32(x_ptr, elem, col < H, FLOAT)
            codes, scale = quantize_tile(x, elut_ptr, KIND, BITS, QMAX, HW, NF4_LUT, HW, SCALE, ts_ptr, FAST_RCP=False)
            store_codes(codes_ptr, codes, rows, ok, elem, col < H, M * H, NBR, BITS, BLOCK, BLOCK_P, False)
            ss = _row_sum_squares(x_ptr, x, t * H, H, FLOAT, ORDER, LANES, LOG_LANES)
        tl.store(scales_ptr + rows, scale)
        # mean = ss / H (H a power of two: exact, = torch's ss * (1/H)); + eps in fp32; then the rsqrt
        r = _rsqrt(tl.math.div_rn(ss, H * 1.0) + eps, RSQRT)
        if WRITE_R == 1:  # the per-row inverse RMS, for LAAQ's run-time check (agoq_core.laaq.fusion)
            tl.store(r_ptr + t, r)
        if VEC16:
            # x * r rounded a pair per instruction where x came as words (MAX16's gate: its sm_90 forms passed the
            # GPU tests together on an H100); on the int16 view the pairing costs more than it saves (codec_isa)
            ha, hb = _round_pair(xa * r, xb * r, FLOAT, HW, MAX16 and WORDS)
            _store_f32(y_ptr, off, wa * ha, m, FLOAT, HW)
            _store_f32(y_ptr, off + 8, wb * hb, m, FLOAT, HW)
        else:
            _store_f32(y_ptr, elem, _normalized(x, r, w, FLOAT, HW), col < H, FLOAT, HW)
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
    if h < 256:
        return f"hidden size {h} < 256 (torch reduces rows of <= 128 elements in another order)"
    return None


#: Numerics variants of ``y`` (the codes never vary), name -> (ORDER, RSQRT).
#:   tree           Triton's tree reduction, correctly rounded 1/sqrt (the fastest: 2.22x the eager pair on
#:                  the H200, docs/fusion.md)
#:   torch_cuda_rn  torch's CUDA reduction order with a correctly rounded 1/sqrt
#:   torch_cuda     torch's CUDA reduction order and rsqrt.approx.f32 (CUDA's rsqrtf)
#: LAAQ tries them in the order of :func:`rmsnorm_quant_variants` (fastest first) and keeps the first whose
#: codes are bit-exact and whose ``y`` equals the model's own norm except in rows where the inverse RMS is
#: one fp32 ulp apart (agoq_core.laaq.fusion.norm_within_tolerance); otherwise the norm runs unfused.
VARIANTS = {"tree": (0, 0), "torch_cuda_rn": (1, 0), "torch_cuda": (1, 1)}


def rmsnorm_quant_variants(device: torch.device) -> tuple[str, ...]:
    """The variants that can run on ``device``, fastest first (rsqrt.approx needs a GPU)."""
    if device.type == "cpu":  # the interpreter: no inline PTX
        return ("tree", "torch_cuda_rn")
    return ("tree", "torch_cuda_rn", "torch_cuda")


def rmsnorm_quant_into(x: torch.Tensor, weight: torch.Tensor, eps: float, spec, y: torch.Tensor,
                       codes: torch.Tensor, scales: torch.Tensor, *, variant: str | None = None,
                       rinv: torch.Tensor | None = None, hw: bool | None = None, programs: int | None = None,
                       vec16: bool | None = None, warps: int | None = None, prefetch: bool | None = None) -> None:
    """y = RMSNorm(x) * weight (x.dtype), (codes, scales) = Q_spec(x flattened), in one pass over x.
    ``variant``: how y's sum of squares and rsqrt are computed (VARIANTS; default: the first of
    rmsnorm_quant_variants). ``rinv``: if given, a float32 [rows] tensor that receives each row's inverse
    RMS ``r`` (y = round(w * round(x * r))): what LAAQ's run-time check explains a differing row with.
    ``vec16``: the codec kernels' 16-lane tile (None: the launcher's rules; off unless AGOQ_CUDA_VEC16 asks for
    ``rmsnorm_quant``, not yet timed on a GPU). Same codes, and the same ``y`` for the torch-order variants; ``tree``
    sums in the tile's order, so its ``y`` may differ from the generic tile's where the sum rounds differently.
    ``programs`` / ``warps``: tuning overrides of the persistent grid and the warps per program (GPU).
    ``prefetch``: load each program's next row before working on this one (None: the formats of
    agoq_cuda.launch.NORM_PREFETCH for the tile in use, on a GPU; AGOQ_CUDA_NORM_PREFETCH overrides; a prefetching
    launch takes no register cap). Same bits either way."""
    why = rmsnorm_quant_unsupported(x, weight, spec)
    if why:
        raise ValueError(f"rmsnorm_quant: {why}")
    variant = variant or rmsnorm_quant_variants(x.device)[0]
    if variant not in VARIANTS:
        raise ValueError(f"rmsnorm_quant: unknown variant {variant!r}; known: {sorted(VARIANTS)}")
    order, rsq = VARIANTS[variant]
    if rsq and x.device.type == "cpu":
        raise ValueError(f"rmsnorm_quant: variant {variant!r} needs a GPU (rsqrt.approx.f32)")
    n, h = x.numel(), x.shape[-1]
    check_codec_buffers(spec, n, codes, scales, x.device, "rmsnorm_quant")
    if y.shape != x.shape or y.dtype != x.dtype or not y.is_contiguous():
        raise ValueError(f"rmsnorm_quant: y must be contiguous {tuple(x.shape)} {x.dtype}, got "
                         f"{tuple(y.shape)} {y.dtype}")
    m = n // h if h else 0
    if rinv is not None and (rinv.shape != (m,) or rinv.dtype != torch.float32 or not rinv.is_contiguous()
                             or rinv.device != x.device):
        raise ValueError(f"rmsnorm_quant: rinv must be a contiguous float32 [{m}] tensor on {x.device}, got "
                         f"{tuple(rinv.shape)} {rinv.dtype} on {rinv.device}")
    if n == 0:
        return
    xv, fk = float_view(x.reshape(-1), "rmsnorm_quant")
    yv, _ = float_view(y.reshape(-1), "rmsnorm_quant")
    wv, _ = float_view(weight, "rmsnorm_quant")
    c = spec_constexprs(spec)
    lanes = min(h // 4, 32)
    hw_ = LAUNCHER.geometry.hw(x.device, hw)
    warps = warps or (4 if h <= 2048 else 8 if h <= 8192 else 16)
    tile = fused_vec16("rmsnorm_quant", spec, (codes,), writes=True, vec16=vec16)
    nprog = programs or norm_programs(spec, x.device, bool(tile), m)
    pf = norm_prefetch(spec, x.device, bool(tile)) if prefetch is None else bool(prefetch)
    extra = {} if x.device.type == "cpu" else {"num_warps": warps}
    # the table's caps were timed without the prefetch (with it fp4's spills, codec_isa); AGOQ_CUDA_MAXNREG's own apply
    extra.update(fused_maxnreg("rmsnorm_quant", spec, tile, x.device, table=not pf))
    words = bool(tile) and LAUNCHER.geometry.reads_words(x.dtype, c["BLOCK_P"], h // spec.block, warps, x.device)
    packed = words and LAUNCHER.geometry.packs_max(x.device)
    if words and (not pf or (packed and norm_prefetch_words(spec.name))):  # bf16 read as int32 words, as the
        tile = {**tile, "WORDS": True, "MAX16": packed}  # codec tiles, the absmax from them (MAX16) where it can
    elut = LAUNCHER.encode_table(spec, x.device)  # NF4: the bucket table (one gather per element), as the codec kernels
    LAUNCHER.launch(_rmsnorm_quant_kernel, max(1, nprog), (
        xv, wv, yv, codes.view(torch.int8), scales, m, float(eps), LAUNCHER.tensor_scale(spec, x), rinv), dict(
        H=h, NBR=h // spec.block, KIND=c["KIND"], BITS=c["BITS"], BLOCK=c["BLOCK"],
        BLOCK_P=c["BLOCK_P"], QMAX=c["QMAX"], HW=hw_, FLOAT=fk, SCALE=c.get("SCALE", 0), ORDER=order,
        RSQRT=rsq, LANES=lanes, LOG_LANES=lanes.bit_length() - 1, WRITE_R=int(rinv is not None),
        elut_ptr=elut, NF4_LUT=elut is not None, PREFETCH=pf, enable_fp_fusion=False,
        **tile, **extra))
