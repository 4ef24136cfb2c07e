"""SiLU&Mul with its codec fused in: one pass over the tensors in forward and in backward.

LAAQ keeps the SiLU&Mul input (the gate and up GEMM outputs) quantized. Unfused, the forward reads
gate and up once for the codec and again for ``h = silu(gate) * up`` (plus a 16-bit ``silu(gate)``
written and read back); the backward decodes both into 16-bit tensors, recomputes ``silu(gate)`` and
``h`` and forms the two gradients in four more elementwise passes. Here:

* ``silu_mul_quant``: one program takes ROWS blocks of gate and up, writes their codes and scales
  (the shared block quantizer ``agoq_triton_kernels.kernels.quantize_tile`` and packer ``store_codes``:
  bit-exact with the codec kernels) and ``h = round(round(silu(g)) * u)`` in the activation dtype.
* ``silu_mul_backward``: decodes gate and up (``dequantize_tile``, rounded to the activation dtype as
  ``dequantize`` writes them) and, from ``dh``, writes ``h`` (the down projection's weight-gradient
  operand), ``dup = round(dh * round(silu(g)))`` and ``dgate = silu_backward(round(dh * u), g)``.

Every step is the unfused path's: torch's SiLU is ``x / (1 + exp(-x))`` in fp32 (a correctly rounded
division), torch's ``silu_backward`` is ``dy * s * (1 + x * (1 - s))`` with ``s = 1 / (1 + exp(-x))``.
What a device's ``exp`` (and the compiler's multiply-add contraction) does differs, so each kernel has
numerics *variants* (``*_variants(device)``, most likely match first); LAAQ keeps the first whose outputs
equal the unfused path bit for bit on its first call (agoq_core.laaq.fusion), else runs unfused:

    forward  libdevice  exp = libdevice __nv_expf (what nvcc's expf is)        GPU
             fast_exp   exp = tl.exp (ex2.approx)                                GPU
             exp        exp = tl.exp (numpy's exp in the interpreter: equal to torch's CPU SiLU after
                        the bf16 rounding for all 65,536 bf16 inputs; checked in the tests)
    backward table*     s from a 65,536-entry fp32 table of torch.sigmoid over every 16-bit input, built
                        on the device by torch itself (so s is torch's, whatever its exp is)
             libdevice* s computed with __nv_expf
             *_fma      1 + x * (1 - s) as one fused multiply-add (nvcc contracts it by default)
             table_fma64  the same single rounding computed in fp64 (the interpreter, whose tl.fma rounds
                        twice; torch's CPU kernel is contracted by the compiler too: measured)

Flat tensors of whole blocks (N % block == 0), bf16 or fp16, block-local formats (not NVFP4).
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from agoq_cuda.launch import LAUNCHER, backward_pairs, fused_maxnreg, fused_vec16
from agoq_triton_kernels.buffers import check_codec_buffers, float_view
from agoq_triton_kernels.codes import bf16_bits_to_f32, f32_to_bf16_bits
from agoq_triton_kernels.kernels import (_dequantize16, _load16_f32, _load16_words, _load_f32, _quantize16,
                                         _store_codes16, _store_f32, _tile, _tile16, _words_f32, _words_rowmax,
                                         dequantize_tile, quantize_tile, store_codes)
from agoq_triton_kernels.layout import spec_constexprs

__all__ = ["silu_mul_quant_unsupported", "silu_mul_quant_into", "silu_mul_quant_variants",
           "silu_mul_backward_unsupported", "silu_mul_backward_into", "silu_mul_backward_variants",
           "FORWARD_VARIANTS", "BACKWARD_VARIANTS"]

#: forward variant -> SILU (0: computed with tl.exp, 1: computed with libdevice exp, 2: from the table)
FORWARD_VARIANTS = {"libdevice": 1, "fast_exp": 0, "exp": 0, "table": 2}
#: backward variant -> (SILU of the recomputed silu(g), SIG: 0 computed with SILU's exp / 1 from the table, FMA)
BACKWARD_VARIANTS = {"libdevice_fma": (1, 0, 1), "libdevice": (1, 0, 0), "table_fma": (2, 1, 1),
                     "table": (2, 1, 0), "table_fma64": (2, 1, 2)}


def silu_mul_quant_variants(device: torch.device) -> tuple[str, ...]:
    """Forward variants runnable on ``device``, fastest first. LAAQ keeps the first that reproduces the model's
    activation on all 65,536 16-bit inputs (agoq_core.laaq.fusion). On the H200 ``fast_exp`` did, for bf16, and ran
    0.178 ms against ``libdevice``'s 0.227 ([4096, 11008] nf4, bench_fusion_elementwise.py, 2026-12-02 19:00)."""
    return ("exp", "table") if device.type == "cpu" else ("fast_exp", "libdevice", "table")


def silu_mul_backward_variants(device: torch.device) -> tuple[str, ...]:
    """Backward variants runnable on ``device``, the likeliest match first, then the faster (a true FMA and libdevice
    need a GPU). On a GPU ``table_fma`` first: s is torch.sigmoid's own value and the multiply-add contracted as nvcc
    contracts torch's kernel, and on the H200 it ran 0.353 / 0.387 ms against ``libdevice_fma``'s 0.440 / 0.402
    (two runs of bench_fusion_elementwise.py, [4096, 11008], docs/fusion.md)."""
    return ("table_fma64", "table") if device.type == "cpu" else ("table_fma", "libdevice_fma", "table", "libdevice")


@triton.jit
def _round(x, FLOAT: tl.constexpr, HW: tl.constexpr = False):
    """x rounded (RNE) to the activation dtype, back in fp32. HW (sm_89+): bf16 by cvt.rn.bf16.f32, as the stores
    round (kernels._store_f32; NaN payloads are not part of the contract); else the integer RNE (the interpreter's
    bf16 cast truncates)."""
    if FLOAT == 1:
        if HW:
            return x.to(tl.bfloat16).to(tl.float32)
        return bf16_bits_to_f32(f32_to_bf16_bits(x))
    elif FLOAT == 2:
        return x.to(tl.float16).to(tl.float32)
    else:
        return x


@triton.jit
def _cvt_bf16x2(a, b):
    """The word (bf16(b) << 16) | bf16(a), each rounded to nearest even: PTX cvt.rn.bf16x2.f32 (its first source
    goes to the upper half), one F2FP for two values where x.to(tl.bfloat16) is one F2F each."""
    return tl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [a, b], dtype=tl.int32,
                                     is_pure=True, pack=1)


@triton.jit
def _round_pair(a, b, FLOAT: tl.constexpr, HW: tl.constexpr, PAIRED: tl.constexpr):
    """_round of two same-shaped tensors (a 16-lane tile's halves). PAIRED (bf16): both rounded into one word per
    pair (HW: one cvt.rn.bf16x2; else the integer RNE), then widened back as the word loads widen (even: << 16,
    odd: the upper half): the same bits as _round's. Used where sm_90 SASS showed a gain (codec_isa): the fused
    norm where its tile read x as words (0.5 fewer per element; on the int16 view ptxas does worse). The 16-lane
    SiLU&Mul backward pairs only where AGOQ_CUDA_BACKWARD_PAIRED asks (launch.backward_pairs: fewer instructions,
    but slower on the H100); not the SiLU&Mul forward (0.25-1.4 fewer, but 56-64 -> 72-80 registers)."""
    if PAIRED and FLOAT == 1:
        if HW:
            d = _cvt_bf16x2(a, b)
        else:
            d = (f32_to_bf16_bits(b) << 16) | f32_to_bf16_bits(a)
        return (d << 16).to(tl.float32, bitcast=True), (d & -65536).to(tl.float32, bitcast=True)
    else:
        return _round(a, FLOAT, HW), _round(b, FLOAT, HW)


@triton.jit
def _exp(x, EXP: tl.constexpr):
    if EXP == 1:  # libdevice __nv_expf (correctly reduced, what nvcc's expf compiles to)
        return tl.extra.cuda.libdevice.exp(x)
    else:
        return tl.exp(x)


@triton.jit
def _bits16(g, FLOAT: tl.constexpr):
    """The 16 bits of a bf16/fp16 value held exactly in fp32, as a table index in [0, 65536). bf16: the upper half
    of its fp32 bits (the widening is exact, NaN payloads included)."""
    if FLOAT == 1:
        return (g.to(tl.int32, bitcast=True) >> 16) & 0xFFFF
    else:
        return g.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF


@triton.jit
def _silu16(g, mask, tab_ptr, SILU: tl.constexpr, FLOAT: tl.constexpr, HW: tl.constexpr = False):
    """silu(g) rounded to the activation dtype (in fp32). SILU 0/1: torch's SiLU formula in fp32,
    x / (1 + exp(-x)) with a correctly rounded division (nvcc's default), tl.exp / libdevice exp;
    SILU 2: torch's own F.silu of this 16-bit value, from the table."""
    if SILU == 2:
        return tl.load(tab_ptr + _bits16(g, FLOAT), mask=mask, other=0.0)
    else:
        return _round(tl.math.div_rn(g, 1.0 + _exp(-g, SILU)), FLOAT, HW)


@triton.jit
def _quantize16_store(xa, xb, c_ptr, s_ptr, elut_ptr, rows, ok, ROWS: tl.constexpr, KIND: tl.constexpr,
                      BITS: tl.constexpr, QMAX: tl.constexpr, BLOCK: tl.constexpr, NF4_LUT: tl.constexpr,
                      HW: tl.constexpr, SCALE: tl.constexpr, rowmax=None):
    """Codes and scales of the 16-lane tile's two halves (the codec kernels' own _quantize16 / _store_codes16;
    rowmax: quantize_tile's)."""
    ca, cb, sc = _quantize16(xa, xb, elut_ptr, ROWS, KIND, BITS, QMAX, BLOCK, NF4_LUT, HW, SCALE, None,
                             rowmax=rowmax)
    _store_codes16(c_ptr, ca, cb, rows, ok, ~(sc > 0.0), ROWS, KIND, BITS, BLOCK)
    tl.store(s_ptr + rows, sc, mask=ok)


@triton.jit(do_not_specialize=["n", "n_blocks", "n_tiles"])
def _silu_mul_quant_kernel(g_ptr, u_ptr, h_ptr, gc_ptr, gs_ptr, uc_ptr, us_ptr, n, n_blocks, n_tiles,
                           KIND: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_P: tl.constexpr,
                           QMAX: tl.constexpr, ROWS: tl.constexpr, FLOAT: tl.constexpr, HW: tl.constexpr,
                           SILU: tl.constexpr, SCALE: tl.constexpr = 0, elut_ptr=None, NF4_LUT: tl.constexpr = False,
                           tab_ptr=None, VEC16: tl.constexpr = False, WORDS: tl.constexpr = False,
                           MAX16: tl.constexpr = False):
    t = tl.program_id(0)
    while t < n_tiles:
        if VEC16:  # the codec kernels' 16-lane tile: a thread owns 16 consecutive elements of a block
            rows, ok, off, m = _tile16(t, n_blocks, ROWS, BLOCK)
            gmax = None  # quantize_tile's own, unless MAX16 reads them from the words
            umax = None
            if MAX16 and WORDS and FLOAT == 1:  # bf16 words, and each block's absmax from them (quantize's MAX16)
                gwa, gwb = _load16_words(g_ptr, t, n_blocks, ROWS, BLOCK)
                uwa, uwb = _load16_words(u_ptr, t, n_blocks, ROWS, BLOCK)
                ga = _words_f32(gwa, ROWS, BLOCK)
                gb = _words_f32(gwb, ROWS, BLOCK)
                ua = _words_f32(uwa, ROWS, BLOCK)
                ub = _words_f32(uwb, ROWS, BLOCK)
                gmax = _words_rowmax(gwa, gwb, ROWS, BLOCK, HW)
                umax = _words_rowmax(uwa, uwb, ROWS, BLOCK, HW)
            else:
                ga, gb = _load16_f32(g_ptr, t, n_blocks, ROWS, BLOCK, FLOAT, WORDS)  # WORDS: bf16 as int32 words
                ua, ub = _load16_f32(u_ptr, t, n_blocks, ROWS, BLOCK, FLOAT, WORDS)
            _quantize16_store(ga, gb, gc_ptr, gs_ptr, elut_ptr, rows, ok, ROWS, KIND, BITS, QMAX, BLOCK, NF4_LUT, HW,
                              SCALE, gmax)
            _quantize16_store(ua, ub, uc_ptr, us_ptr, elut_ptr, rows, ok, ROWS, KIND, BITS, QMAX, BLOCK, NF4_LUT, HW,
                              SCALE, umax)
            _store_f32(h_ptr, off, _silu16(ga, m, tab_ptr, SILU, FLOAT, HW) * ua, m, FLOAT, HW)
            _store_f32(h_ptr, off + 8, _silu16(gb, m, tab_ptr, SILU, FLOAT, HW) * ub, m, FLOAT, HW)
        else:
            rows, ok, elem, emask = _tile(t, n, n_blocks, ROWS, BLOCK, BLOCK_P, False)
            g = _load_f32(g_ptr, elem, emask, FLOAT)
            u = _load_f32(u_ptr, elem, emask, FLOAT)
            c, s = quantize_tile(g, elut_ptr, KIND, BITS, QMAX, HW, NF4_LUT, HW, SCALE)
            store_codes(gc_ptr, c, rows, ok, elem, emask, n, ROWS, BITS, BLOCK, BLOCK_P, False)
            tl.store(gs_ptr + rows, s, mask=ok)
            c, s = quantize_tile(u, elut_ptr, KIND, BITS, QMAX, HW, NF4_LUT, HW, SCALE)
            store_codes(uc_ptr, c, rows, ok, elem, emask, n, ROWS, BITS, BLOCK, BLOCK_P, False)
            tl.store(us_ptr + rows, s, mask=ok)
            a = _silu16(g, emask, tab_ptr, SILU, FLOAT, HW)
            _store_f32(h_ptr, elem, a * u, emask, FLOAT, HW)  # 16-bit x 16-bit is exact in fp32: one rounding
        t += tl.num_programs(0)


@triton.jit
def _backward_elems(dh_ptr, h_ptr, dg_ptr, du_ptr, offs, mask, g, u, tab_ptr, sig_ptr, FLOAT: tl.constexpr,
                    HW: tl.constexpr, SILU: tl.constexpr, SIG: tl.constexpr, FMA: tl.constexpr):
    """h, dup and dgate at ``offs`` from the decoded g and u (already rounded to the activation dtype)."""
    dh = _load_f32(dh_ptr, offs, mask, FLOAT)
    a = _silu16(g, mask, tab_ptr, SILU, FLOAT, HW)
    _store_f32(h_ptr, offs, a * u, mask, FLOAT, HW)
    _store_f32(du_ptr, offs, dh * a, mask, FLOAT, HW)
    dy = _round(dh * u, FLOAT, HW)
    if SIG == 1:  # torch.sigmoid of this 16-bit value, from the table (index: its 16 bits)
        s = tl.load(sig_ptr + _bits16(g, FLOAT), mask=mask, other=0.0)
    else:
        s = tl.math.div_rn(1.0, 1.0 + _exp(-g, SILU))
    if FMA == 2:  # a single rounding in fp64 (x: 16-bit, 1 - s: fp32 -> the product is exact in fp64)
        t1 = (g.to(tl.float64) * (1.0 - s).to(tl.float64) + 1.0).to(tl.float32)
    elif FMA == 1:
        t1 = tl.fma(g, 1.0 - s, 1.0)
    else:
        t1 = 1.0 + g * (1.0 - s)
    _store_f32(dg_ptr, offs, (dy * s) * t1, mask, FLOAT, HW)


@triton.jit(do_not_specialize=["n", "n_blocks", "n_tiles"])
def _silu_mul_backward_kernel(dh_ptr, gc_ptr, gs_ptr, uc_ptr, us_ptr, lut_ptr, tab_ptr, sig_ptr, h_ptr, dg_ptr, du_ptr,
                              n, n_blocks, n_tiles, KIND: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr,
                              BLOCK_P: tl.constexpr, ROWS: tl.constexpr, FLOAT: tl.constexpr, HW: tl.constexpr,
                              NF4_LUT: tl.constexpr, SILU: tl.constexpr, SIG: tl.constexpr, FMA: tl.constexpr,
                              VEC16: tl.constexpr = False, PAIRED: tl.constexpr = False):
    t = tl.program_id(0)
    while t < n_tiles:
        if VEC16:  # codes read as words and unpacked in registers (kernels._dequantize16)
            rows, ok, off, m = _tile16(t, n_blocks, ROWS, BLOCK)
            ga, gb = _dequantize16(gc_ptr, gs_ptr, lut_ptr, rows, ok, off, ROWS, KIND, BITS, BLOCK, NF4_LUT, HW)
            ua, ub = _dequantize16(uc_ptr, us_ptr, lut_ptr, rows, ok, off, ROWS, KIND, BITS, BLOCK, NF4_LUT, HW)
            ga, gb = _round_pair(ga, gb, FLOAT, HW, PAIRED)  # the decoded values in the activation dtype
            ua, ub = _round_pair(ua, ub, FLOAT, HW, PAIRED)
            _backward_elems(dh_ptr, h_ptr, dg_ptr, du_ptr, off, m, ga, ua, tab_ptr, sig_ptr, FLOAT, HW, SILU, SIG, FMA)
            _backward_elems(dh_ptr, h_ptr, dg_ptr, du_ptr, off + 8, m, gb, ub, tab_ptr, sig_ptr, FLOAT, HW, SILU, SIG,
                            FMA)
        else:
            rows, ok, elem, emask = _tile(t, n, n_blocks, ROWS, BLOCK, BLOCK_P, False)
            g = _round(dequantize_tile(gc_ptr, gs_ptr, lut_ptr, rows, ok, elem, emask, n, ROWS, KIND, BITS, BLOCK,
                                       BLOCK_P, NF4_LUT, False, HW), FLOAT, HW)
            u = _round(dequantize_tile(uc_ptr, us_ptr, lut_ptr, rows, ok, elem, emask, n, ROWS, KIND, BITS, BLOCK,
                                       BLOCK_P, NF4_LUT, False, HW), FLOAT, HW)
            _backward_elems(dh_ptr, h_ptr, dg_ptr, du_ptr, elem, emask, g, u, tab_ptr, sig_ptr, FLOAT, HW, SILU, SIG,
                            FMA)
        t += tl.num_programs(0)


def _common_unsupported(t: torch.Tensor, spec, what: str) -> str | None:
    if t.dtype not in (torch.bfloat16, torch.float16):
        return f"{what} is {t.dtype}; the fused SiLU&Mul takes bfloat16 or float16"
    if getattr(spec, "tensor_scaled", False):
        return f"{spec.name} has a per-tensor scale (one pass over the whole tensor first); not fused"
    if t.numel() % spec.block:
        return f"{t.numel()} elements are not whole blocks of {spec.block}"
    if t.numel() >= 1 << 31:
        return f"{t.numel()} elements >= 2**31 (int32 offsets)"
    return None


def silu_mul_quant_unsupported(gate: torch.Tensor, up: torch.Tensor, spec) -> str | None:
    """Why the fused SiLU&Mul + quantize cannot run here (None: it can). Launches nothing."""
    if gate.shape != up.shape or gate.dtype != up.dtype or gate.device != up.device:
        return f"gate {tuple(gate.shape)} {gate.dtype} and up {tuple(up.shape)} {up.dtype} differ"
    if not (gate.is_contiguous() and up.is_contiguous()):
        return "gate and up must be contiguous (a fused gate_up projection's halves are not)"
    return _common_unsupported(gate, spec, "gate")


def silu_mul_backward_unsupported(dh: torch.Tensor, spec) -> str | None:
    """Why the fused SiLU&Mul backward cannot run here (None: it can). Launches nothing."""
    if not dh.is_contiguous():
        return "dh must be contiguous"
    return _common_unsupported(dh, spec, "dh")


def _launch_consts(spec, n: int, dtype: torch.dtype, device: torch.device, programs: int | None, hw: bool | None):
    c = spec_constexprs(spec)
    # from the launcher's plan cache (CudaGeometry's plans are pure): ~4 us of host time per call otherwise
    la = LAUNCHER.plan("quantize", spec, n, dtype, device, programs=programs)
    return c, la, LAUNCHER.geometry.hw(device, hw), LAUNCHER


def silu_mul_quant_into(gate: torch.Tensor, up: torch.Tensor, spec, h: torch.Tensor, gate_codes: torch.Tensor,
                        gate_scales: torch.Tensor, up_codes: torch.Tensor, up_scales: torch.Tensor, *,
                        variant: str | None = None, programs: int | None = None, hw: bool | None = None,
                        vec16: bool | None = None) -> None:
    """h = silu(gate) * up (gate's dtype) and the codes/scales of gate and up (flattened), in one pass. ``vec16``:
    the 16-lane tile (None: the launcher's rules for ``silu_mul_quant``; same bits either way)."""
    why = silu_mul_quant_unsupported(gate, up, spec)
    if why:
        raise ValueError(f"silu_mul_quant: {why}")
    variant = variant or silu_mul_quant_variants(gate.device)[0]
    if variant not in FORWARD_VARIANTS:
        raise ValueError(f"silu_mul_quant: unknown variant {variant!r}; known: {sorted(FORWARD_VARIANTS)}")
    silu = FORWARD_VARIANTS[variant]
    if gate.device.type == "cpu" and silu == 1:
        raise ValueError(f"silu_mul_quant: variant {variant!r} needs a GPU (libdevice exp)")
    n = gate.numel()
    for c_, s_, what in ((gate_codes, gate_scales, "gate"), (up_codes, up_scales, "up")):
        check_codec_buffers(spec, n, c_, s_, gate.device, f"silu_mul_quant ({what})")
    if h.shape != gate.shape or h.dtype != gate.dtype or not h.is_contiguous():
        raise ValueError(f"silu_mul_quant: h must be contiguous {tuple(gate.shape)} {gate.dtype}")
    if n == 0:
        return
    c, la, hw_, launcher = _launch_consts(spec, n, gate.dtype, gate.device, programs, hw)
    gv, fk = float_view(gate.reshape(-1), "silu_mul_quant")
    uv, _ = float_view(up.reshape(-1), "silu_mul_quant")
    hv, _ = float_view(h.reshape(-1), "silu_mul_quant")
    elut = launcher.encode_table(spec, gate.device)
    tile = fused_vec16("silu_mul_quant", spec, (gate_codes, up_codes), writes=True, vec16=vec16)
    launcher.launch(_silu_mul_quant_kernel, la.grid, (
        gv, uv, hv, gate_codes.view(torch.int8), gate_scales, up_codes.view(torch.int8), up_scales,
        n, spec.num_blocks(n), la.n_tiles), dict(
        KIND=c["KIND"], BITS=c["BITS"], BLOCK=c["BLOCK"], BLOCK_P=la.block_p,
        QMAX=c["QMAX"], ROWS=la.rows, FLOAT=fk, HW=hw_, SILU=silu, SCALE=c.get("SCALE", 0),
        elut_ptr=elut, NF4_LUT=elut is not None, tab_ptr=silu_table(gate.dtype, gate.device) if silu == 2 else None,
        enable_fp_fusion=False, **tile, **la.options,
        **({"WORDS": True, "MAX16": la.max16} if la.words and tile.get("VEC16") else {}),
        **fused_maxnreg("silu_mul_quant", spec, tile, gate.device)))


@functools.cache
def silu_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch's F.silu of every 16-bit pattern of ``dtype`` (index = the bits as uint16), as fp32, computed
    by torch on ``device``: bit for bit what the unfused forward's activation returns."""
    bits = torch.arange(0, 1 << 16, dtype=torch.int32, device=device).to(torch.int16)
    return torch.nn.functional.silu(bits.view(dtype)).to(torch.float32).contiguous()


@functools.cache
def sigmoid_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """fp32 torch.sigmoid of every 16-bit pattern of ``dtype`` (index = the bits as uint16), built by
    torch on ``device``: the ``s`` torch's silu_backward computes internally (same exp, same division)."""
    bits = torch.arange(0, 1 << 16, dtype=torch.int32, device=device).to(torch.int16)
    return torch.sigmoid(bits.view(dtype).to(torch.float32)).contiguous()


def silu_mul_backward_into(dh: torch.Tensor, gate_codes: torch.Tensor, gate_scales: torch.Tensor,
                           up_codes: torch.Tensor, up_scales: torch.Tensor, spec, h: torch.Tensor,
                           dgate: torch.Tensor, dup: torch.Tensor, *, variant: str | None = None,
                           programs: int | None = None, hw: bool | None = None, vec16: bool | None = None) -> None:
    """From the kept codes of gate and up and dh = dL/dh: h = silu(g) * u, dup = dh * silu(g),
    dgate = silu_backward(dh * u, g), all in dh's dtype (g, u = the decoded gate and up). ``vec16``: the 16-lane
    tile (None: the launcher's rules for ``silu_mul_backward``; same bits either way)."""
    from agoq_triton_kernels.launch import nf4_lut

    why = silu_mul_backward_unsupported(dh, spec)
    if why:
        raise ValueError(f"silu_mul_backward: {why}")
    variant = variant or silu_mul_backward_variants(dh.device)[0]
    if variant not in BACKWARD_VARIANTS:
        raise ValueError(f"silu_mul_backward: unknown variant {variant!r}; known: {sorted(BACKWARD_VARIANTS)}")
    silu, sig, fma = BACKWARD_VARIANTS[variant]
    if dh.device.type == "cpu" and (silu == 1 or fma == 1):
        raise ValueError(f"silu_mul_backward: variant {variant!r} needs a GPU (libdevice exp / a true FMA)")
    n = dh.numel()
    for c_, s_, what in ((gate_codes, gate_scales, "gate"), (up_codes, up_scales, "up")):
        check_codec_buffers(spec, n, c_, s_, dh.device, f"silu_mul_backward ({what})")
    for t, what in ((h, "h"), (dgate, "dgate"), (dup, "dup")):
        if t.shape != dh.shape or t.dtype != dh.dtype or not t.is_contiguous():
            raise ValueError(f"silu_mul_backward: {what} must be contiguous {tuple(dh.shape)} {dh.dtype}")
    if n == 0:
        return
    c, la, hw_, launcher = _launch_consts(spec, n, dh.dtype, dh.device, programs, hw)
    dv, fk = float_view(dh.reshape(-1), "silu_mul_backward")
    outs = [float_view(t.reshape(-1), "silu_mul_backward")[0] for t in (h, dgate, dup)]
    sig_t = sigmoid_table(dh.dtype, dh.device) if sig else None
    tile = fused_vec16("silu_mul_backward", spec, (gate_codes, up_codes), writes=False, vec16=vec16)
    launcher.launch(_silu_mul_backward_kernel, la.grid, (
        dv, gate_codes.view(torch.int8), gate_scales, up_codes.view(torch.int8), up_scales, nf4_lut(dh.device),
        silu_table(dh.dtype, dh.device) if silu == 2 else None, sig_t, *outs, n, spec.num_blocks(n), la.n_tiles), dict(
        KIND=c["KIND"], BITS=c["BITS"], BLOCK=c["BLOCK"],
        BLOCK_P=la.block_p, ROWS=la.rows, FLOAT=fk, HW=hw_, NF4_LUT=launcher.geometry.nf4_lut, SILU=silu, SIG=sig,
        FMA=fma, enable_fp_fusion=False, PAIRED=bool(tile) and backward_pairs(spec.name), **tile, **la.options,
        **fused_maxnreg("silu_mul_backward", spec, tile, dh.device)))
