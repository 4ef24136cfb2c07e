"""Fused GEMM kernels for LAAQ: codec in the epilogue of the producing GEMM, in the prologue of the consuming one.

* :func:`gemm_quant_epilogue_kernel` — ``y = x @ Wᵀ (+ b)`` (16-bit in, fp32 accumulate). The epilogue
  rounds the accumulator to y's dtype, stores y, then block-quantizes *the rounded values* in registers
  and stores the codes and scales: exactly what the unfused codec would make of the y this kernel wrote.
  Blocks run along the flattened row-major output; with N a multiple of the block, a BLOCK_N tile that is
  a multiple of the block holds whole blocks, so no block crosses a program.
* :func:`gemm_dequant_prologue_kernel` — ``dW = dYᵀ · D(X)`` where X [M, K] is kept quantized: the
  B-operand tile is decoded and scaled in registers (fp32 ``decode(code) * scale``, one RNE rounding to
  dY's dtype — the same operand values the unfused ``dequantize`` would materialise), never written out.
  Optionally ``dW = dYᵀ · (m ⊙ D(X))`` with a dense m: LAAQ's down-projection weight gradient, whose input
  ``h = act(gate) * up`` is rebuilt from the kept ``up`` and ``m = act(gate)`` (the product rounded once to
  16 bits, as torch's ``m * x`` rounds it), so ``h`` is never written out either.

The codec works on tiles of whole blocks, each row carrying its *global* block index (agoq_cuda.fusion.codec,
built on the shared element-wise contract helpers of agoq_triton_kernels.codes).

Two paths, chosen by the ``INTERP`` constexpr:
* GPU: 16-bit ``tl.dot`` with fp32 accumulation, a ``for`` K-loop (Triton pipelines ``for`` loops, not
  ``while``), hardware RNE casts.
* Triton interpreter (CPU CI): its bf16 ``tl.dot`` multiplies raw bit patterns and its fp32->bf16 cast
  truncates, it flushes bf16 subnormals on load, and it cannot take a runtime ``range`` bound under
  numpy >= 2.4 (triton-lang/triton#9171). So bf16 travels as int16 bits widened/rounded with integer
  logic, tiles are widened to fp32 before ``tl.dot`` (exact products, fp32 sums), and loops are ``while``.

Offsets are int32: the launcher keeps every tensor a kernel indexes below 2**31 elements (it splits the
rows of the epilogue GEMM; the prologue GEMM is declined above that size).
"""
from __future__ import annotations

import triton
import triton.language as tl

from agoq_cuda.fusion.codec import dequantize_rows, quantize_rows, store_packed
from agoq_triton_kernels.codes import bf16_bits_to_f32, f32_to_bf16_bits

__all__ = ["gemm_quant_epilogue_kernel", "gemm_dequant_prologue_kernel"]

# Float kinds of 16-bit operands (the FLOAT constexpr); the same numbering as agoq_triton_kernels.layout.
_BF16 = tl.constexpr(1)
_F16 = tl.constexpr(2)


@triton.jit
def _load16(ptr, mask, FLOAT: tl.constexpr, INTERP: tl.constexpr, MASKED: tl.constexpr):
    """A 16-bit tile as a dot operand: itself on GPU, exact fp32 in the interpreter (bf16 from int16 bits).
    Masked-off lanes read 0. (tl.load refuses ``other`` without a mask, hence MASKED.)"""
    if MASKED:
        v = tl.load(ptr, mask=mask, other=0)
    else:
        v = tl.load(ptr)
    if INTERP:
        if FLOAT == 1:
            return bf16_bits_to_f32(v)
        else:
            return v.to(tl.float32)
    else:
        return v


@triton.jit
def _round16(x, FLOAT: tl.constexpr, INTERP: tl.constexpr):
    """fp32 -> (value to store, its fp32 value): one round-half-even to bf16/fp16.

    GPU: the hardware cast (cvt.rn). Interpreter: bf16 with integer logic (its cast truncates) stored as
    int16 bits; fp16's cast is exact RNE there too."""
    if FLOAT == 1:
        if INTERP:
            b = f32_to_bf16_bits(x)
            return b.to(tl.int16), bf16_bits_to_f32(b)
        else:
            h = x.to(tl.bfloat16)
            return h, h.to(tl.float32)
    else:
        h = x.to(tl.float16)
        return h, h.to(tl.float32)


@triton.jit
def _grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Program id -> (tile row, tile column), GROUP_M tile rows at a time so that consecutive programs
    share operand tiles in L2 (the standard Triton matmul ordering)."""
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % size_m, (pid % per_group) // size_m


# ---- forward: y = x Wᵀ (+ b), and Q(y) ------------------------------------------------------------------
@triton.jit
def _epi_step(x_ptr, w_ptr, acc, kt, K, rm, rn, stride_xm, stride_xk, stride_wn, stride_wk,
              BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, FLOAT: tl.constexpr, INTERP: tl.constexpr):
    rk = kt * BLOCK_K + tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + rm[:, None] * stride_xm + rk[None, :] * stride_xk
    b_ptrs = w_ptr + rk[:, None] * stride_wk + rn[None, :] * stride_wn
    a = _load16(a_ptrs, rk[None, :] < K, FLOAT, INTERP, not EVEN_K)
    b = _load16(b_ptrs, rk[:, None] < K, FLOAT, INTERP, not EVEN_K)
    return tl.dot(a, b, acc)


@triton.jit
def gemm_quant_epilogue_kernel(
        x_ptr, w_ptr, b_ptr, y_ptr, codes_ptr, scales_ptr,
        M, N, K, stride_xm, stride_xk, stride_wn, stride_wk, M_KEY,
        HAS_BIAS: tl.constexpr, FLOAT: tl.constexpr, INTERP: tl.constexpr,
        KIND: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr, QMAX: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        EVEN_K: tl.constexpr):
    """x [M, K], W [N, K] (any strides), b [N] -> y [M, N] contiguous in x's dtype, codes/scales of y.

    Preconditions (launcher): BLOCK is a power of two dividing both N and BLOCK_N; M * N < 2**31.
    ``M_KEY`` only buckets M for the autotuner's cache."""
    pid_m, pid_n = _grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Out-of-range rows/columns read valid memory (modulo) and are never stored: no masks in the K loop.
    rm = offs_m % M
    rn = offs_n % N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_tiles = tl.cdiv(K, BLOCK_K)
    if INTERP:
        kt = 0
        while kt < k_tiles:
            acc = _epi_step(x_ptr, w_ptr, acc, kt, K, rm, rn, stride_xm, stride_xk, stride_wn, stride_wk,
                            BLOCK_K, EVEN_K, FLOAT, INTERP)
            kt += 1
    else:
        for kt in range(0, k_tiles):
            acc = _epi_step(x_ptr, w_ptr, acc, kt, K, rm, rn, stride_xm, stride_xk, stride_wn, stride_wk,
                            BLOCK_K, EVEN_K, FLOAT, INTERP)
    _bias_round_store_quantize(acc, pid_m, pid_n, M, N, b_ptr, y_ptr, codes_ptr, scales_ptr, HAS_BIAS, FLOAT, INTERP,
                               KIND, BITS, BLOCK, QMAX, BLOCK_M, BLOCK_N)


@triton.jit
def _bias_round_store_quantize(acc, pid_m, pid_n, M, N, b_ptr, y_ptr, codes_ptr, scales_ptr,
                               HAS_BIAS: tl.constexpr, FLOAT: tl.constexpr, INTERP: tl.constexpr,
                               KIND: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr, QMAX: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The epilogue of both forward kernels: + bias, round to y's dtype, store y, quantize the stored values,
    store codes and scales (tile rows/columns outside [M, N] hold garbage and are not stored)."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if HAS_BIAS:
        rn = offs_n % N
        if INTERP and FLOAT == 1:
            bias = bf16_bits_to_f32(tl.load(b_ptr + rn))
        else:
            bias = tl.load(b_ptr + rn).to(tl.float32)
        acc = acc + bias[None, :]

    # y in its 16-bit dtype (one RNE rounding), and the exact fp32 value of what was stored.
    y_st, y32 = _round16(acc, FLOAT, INTERP)
    ok_m = offs_m < M
    ok_n = offs_n < N
    tl.store(y_ptr + offs_m[:, None] * N + offs_n[None, :], y_st, mask=ok_m[:, None] & ok_n[None, :])

    # Quantize the stored values. Tile row r, block j is global block g = row * (N / BLOCK) + col0 / BLOCK + j;
    # blocks of out-of-range rows or columns are not stored.
    NBT: tl.constexpr = BLOCK_N // BLOCK
    jb = pid_n * NBT + tl.arange(0, NBT)
    g = offs_m[:, None] * (N // BLOCK) + jb[None, :]
    ok = ok_m[:, None] & (jb[None, :] < N // BLOCK)
    rows = tl.reshape(g, (BLOCK_M * NBT,))
    ok = tl.reshape(ok, (BLOCK_M * NBT,))
    codes, scale = quantize_rows(tl.reshape(y32, (BLOCK_M * NBT, BLOCK)), KIND, BITS, QMAX, not INTERP)
    store_packed(codes_ptr, codes, rows, ok, BLOCK_M * NBT, BITS, BLOCK)
    tl.store(scales_ptr + rows, scale, mask=ok)


# ---- forward, persistent and TMA-fed (Hopper): the same epilogue ----------------------------------------
@triton.jit
def _tma_tile(x_desc, w_desc, b_ptr, y_ptr, codes_ptr, scales_ptr, tile, M, N, K,
              HAS_BIAS: tl.constexpr, FLOAT: tl.constexpr, INTERP: tl.constexpr,
              KIND: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr, QMAX: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid_m, pid_n = _grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_tiles = tl.cdiv(K, BLOCK_K)
    # TMA zero-fills reads outside [M, K] / [N, K]: ragged edges need no masks and add exact zeros.
    if INTERP:
        kt = 0
        while kt < k_tiles:
            a = x_desc.load([pid_m * BLOCK_M, kt * BLOCK_K])
            b = w_desc.load([pid_n * BLOCK_N, kt * BLOCK_K])
            if FLOAT == 1:
                a = bf16_bits_to_f32(a)
                b = bf16_bits_to_f32(b)
            acc = tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), acc)
            kt += 1
    else:
        for kt in range(0, k_tiles):
            a = x_desc.load([pid_m * BLOCK_M, kt * BLOCK_K])
            b = w_desc.load([pid_n * BLOCK_N, kt * BLOCK_K])
            acc = tl.dot(a, tl.trans(b), acc)
    _bias_round_store_quantize(acc, pid_m, pid_n, M, N, b_ptr, y_ptr, codes_ptr, scales_ptr, HAS_BIAS, FLOAT, INTERP,
                               KIND, BITS, BLOCK, QMAX, BLOCK_M, BLOCK_N)


@triton.jit
def gemm_quant_epilogue_tma_kernel(
        x_desc, w_desc, b_ptr, y_ptr, codes_ptr, scales_ptr, M, N, K, M_KEY,
        HAS_BIAS: tl.constexpr, FLOAT: tl.constexpr, INTERP: tl.constexpr,
        KIND: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr, QMAX: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        NUM_PROGRAMS: tl.constexpr):
    """The forward kernel as a persistent loop over output tiles with TMA operand loads: x_desc [M, K] and
    w_desc [N, K] are tensor descriptors (contiguous rows, 16-byte aligned) with block shapes
    [BLOCK_M, BLOCK_K] and [BLOCK_N, BLOCK_K]. NUM_PROGRAMS programs (one per SM) take tiles
    p, p + NUM_PROGRAMS, ...; on GPU the tile and K loops are flattened into one software pipeline, so the
    next tile's loads are in flight while this tile's epilogue (rounding, quantization, stores) runs."""
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    if INTERP:
        tile = tl.program_id(0)
        while tile < num_tiles:
            _tma_tile(x_desc, w_desc, b_ptr, y_ptr, codes_ptr, scales_ptr, tile, M, N, K, HAS_BIAS, FLOAT, INTERP,
                      KIND, BITS, BLOCK, QMAX, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
            tile += NUM_PROGRAMS
    else:
        for tile in tl.range(tl.program_id(0), num_tiles, NUM_PROGRAMS, flatten=True):
            _tma_tile(x_desc, w_desc, b_ptr, y_ptr, codes_ptr, scales_ptr, tile, M, N, K, HAS_BIAS, FLOAT, INTERP,
                      KIND, BITS, BLOCK, QMAX, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)


# ---- backward: dW = dYᵀ · (m ⊙ D(X)) ------------------------------------------------------------------
@triton.jit
def _pro_step(g_ptr, codes_ptr, scales_ptr, lut_ptr, m_ptr, acc, mt, M, K, rn, rk, jb, stride_gm, stride_gn,
              stride_mm, stride_mk, HAS_MUL: tl.constexpr,
              FLOAT: tl.constexpr, INTERP: tl.constexpr, KIND: tl.constexpr, BITS: tl.constexpr,
              BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
              NF4_LUT: tl.constexpr):
    rr = mt * BLOCK_R + tl.arange(0, BLOCK_R)
    ok_r = rr < M
    # A = dYᵀ tile [BLOCK_N, BLOCK_R]; rows past M read as 0 (they must add exactly nothing).
    a = _load16(g_ptr + rn[:, None] * stride_gn + rr[None, :] * stride_gm, ok_r[None, :], FLOAT, INTERP, True)
    # B = D(X) tile [BLOCK_R, BLOCK_K], decoded block by block (BLOCK_K // BLOCK blocks per row); blocks of
    # rows past M read as exact zeros, blocks of columns past K are never stored.
    NBT: tl.constexpr = BLOCK_K // BLOCK
    g = rr[:, None] * (K // BLOCK) + jb[None, :]
    ok = ok_r[:, None] & (jb[None, :] < K // BLOCK)
    d = dequantize_rows(codes_ptr, scales_ptr, lut_ptr, tl.reshape(g, (BLOCK_R * NBT,)),
                        tl.reshape(ok, (BLOCK_R * NBT,)), BLOCK_R * NBT, KIND, BITS, BLOCK, NF4_LUT)
    # The unfused path dequantizes to dY's dtype (one RNE rounding) before the GEMM: same operand here.
    b16, b = _round16(tl.reshape(d, (BLOCK_R, BLOCK_K)), FLOAT, INTERP)
    if HAS_MUL:
        # m ⊙ D(X) as torch multiplies two 16-bit tensors: fp32 product, one RNE rounding.
        m = _load16(m_ptr + rr[:, None] * stride_mm + rk[None, :] * stride_mk, ok_r[:, None], FLOAT, INTERP, True)
        b16, b = _round16(m.to(tl.float32) * b, FLOAT, INTERP)
    if INTERP:
        return tl.dot(a, b, acc)  # exact fp32 values of the 16-bit operands (its bf16 dot is broken)
    else:
        return tl.dot(a, b16, acc)


@triton.jit
def gemm_dequant_prologue_kernel(
        g_ptr, codes_ptr, scales_ptr, lut_ptr, m_ptr, out_ptr,
        M, N, K, stride_gm, stride_gn, stride_mm, stride_mk, M_KEY,
        HAS_MUL: tl.constexpr, FLOAT: tl.constexpr, INTERP: tl.constexpr,
        KIND: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr, NF4_LUT: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr, GROUP_M: tl.constexpr):
    """dY [M, N] (any strides), X = D(codes, scales) [M, K] row-major, optional m [M, K] (any strides, dY's
    dtype) -> out [N, K] contiguous in dY's dtype: dYᵀ · X, or dYᵀ · (m ⊙ X) with HAS_MUL.

    The reduction runs over the M rows (tokens). Preconditions (launcher): BLOCK is a power of two that
    divides K and BLOCK_K; M * K and M * N < 2**31."""
    pid_n, pid_k = _grouped_tile(tl.program_id(0), N, K, BLOCK_N, BLOCK_K, GROUP_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    rn = offs_n % N
    rk = offs_k % K
    jb = pid_k * (BLOCK_K // BLOCK) + tl.arange(0, BLOCK_K // BLOCK)  # the tile's block columns of X
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    m_tiles = tl.cdiv(M, BLOCK_R)
    if INTERP:
        mt = 0
        while mt < m_tiles:
            acc = _pro_step(g_ptr, codes_ptr, scales_ptr, lut_ptr, m_ptr, acc, mt, M, K, rn, rk, jb, stride_gm,
                            stride_gn, stride_mm, stride_mk, HAS_MUL, FLOAT, INTERP, KIND, BITS, BLOCK, BLOCK_N,
                            BLOCK_K, BLOCK_R, NF4_LUT)
            mt += 1
    else:
        for mt in range(0, m_tiles):
            acc = _pro_step(g_ptr, codes_ptr, scales_ptr, lut_ptr, m_ptr, acc, mt, M, K, rn, rk, jb, stride_gm,
                            stride_gn, stride_mm, stride_mk, HAS_MUL, FLOAT, INTERP, KIND, BITS, BLOCK, BLOCK_N,
                            BLOCK_K, BLOCK_R, NF4_LUT)
    out_st, _ = _round16(acc, FLOAT, INTERP)
    tl.store(out_ptr + offs_n[:, None] * K + offs_k[None, :], out_st,
             mask=(offs_n[:, None] < N) & (offs_k[None, :] < K))
