"""Launchers of the fused GEMMs: eligibility, argument checks, tile configs (autotuned on GPU), chunking.

Two entry points per kernel, flat-buffer style like the codec launchers (the caller allocates):
:func:`gemm_quant_epilogue_into` and :func:`gemm_dequant_prologue_into`; and a ``*_unsupported`` function
each that says, before any launch, why a call cannot be fused (``None`` = it can). LAAQ asks that first and
runs the unfused composition when there is a reason, logging it once; it never catches a failed launch.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from agoq_core.formats.spec import FormatSpec
from agoq_cuda.fusion import kernels as K
from agoq_cuda.launch import sm_count
from agoq_triton_kernels import launch as shared
from agoq_triton_kernels.buffers import check_codec_buffers
from agoq_triton_kernels.launch import nf4_lut
from agoq_triton_kernels.layout import KIND_IDS

__all__ = [
    "TileConfig", "is_interpreted", "epilogue_unsupported", "prologue_unsupported",
    "gemm_quant_epilogue_into", "gemm_dequant_prologue_into", "MAX_FUSED_BLOCK", "KERNELS",
]

_FLOAT = {torch.bfloat16: 1, torch.float16: 2}

#: Largest block the fused kernels take: a tile must hold whole blocks and the widest tile is 256
#: columns (a 128x256 fp32 accumulator is already 128 registers/thread at 8 warps).
MAX_FUSED_BLOCK = 256

#: Offsets inside the kernels are int32; every tensor a launch indexes must span fewer elements.
_MAX_INDEX = 2**31 - 1


@functools.cache
def is_interpreted() -> bool:
    """Whether the fused kernels were decorated under TRITON_INTERPRET (fixed at import time)."""
    return shared.is_interpreted(K.gemm_quant_epilogue_kernel)


@dataclass(frozen=True, kw_only=True, slots=True)
class TileConfig:
    """One tile shape. Epilogue GEMM: block_m x block_n output tile, block_k reduction step.
    Prologue GEMM (dW[N, K]): block_m x block_n is the dW tile (N rows x K columns), block_k the
    token step of the reduction."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 16 or v & (v - 1):
                raise ValueError(f"TileConfig.{name} must be a power of two >= 16 (tl.dot needs >= 16), got {v!r}")
        if self.group_m < 1:
            raise ValueError(f"TileConfig.group_m must be >= 1, got {self.group_m}")


# Interpreter: each program instance costs ~8 ms of Python plus numpy time proportional to its tile;
# big tiles and few programs are fastest (tests override with small tiles to cover edges).
_INTERP_EPILOGUE = TileConfig(block_m=64, block_n=256, block_k=64, num_warps=4, num_stages=1)
_INTERP_PROLOGUE = TileConfig(block_m=128, block_n=256, block_k=64, num_warps=4, num_stages=1)

# H200 (Hopper, 228 KiB shared memory/SM): the tile shapes Triton's own Hopper matmul benchmarks favour for
# bf16, restricted to block_n >= 128 so a tile holds whole 128-element blocks. 128x256x64 at 3 stages is
# (128*64 + 64*256) * 2 B * 3 = 144 KiB of shared memory; 4 stages of 128x128x64 is 128 KiB.
_GPU_CONFIGS = (
    TileConfig(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3),
    TileConfig(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=4),
    TileConfig(block_m=256, block_n=128, block_k=64, num_warps=8, num_stages=3),
    TileConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4),
    TileConfig(block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=4),
)
# The prologue GEMM decodes its B tile in registers and stores it to shared memory every step, so its
# wgmma waits for the decode (sm_90 SASS: decode, STS, barrier, HGMMA, wait). Two resident CTAs per SM let
# one decode while the other multiplies: a 4-warp tile with a short token step (~90 KiB of shared memory,
# <= 255 registers x 128 threads) fits twice.
_GPU_PROLOGUE_CONFIGS = _GPU_CONFIGS + (
    TileConfig(block_m=128, block_n=128, block_k=32, num_warps=4, num_stages=4),
)


# Below ~1 GFLOP per launch a GEMM takes microseconds whatever the tile, while autotuning compiles and times
# every config for every new shape/format (seconds each): small launches (tests, conformance) use one config.
_TUNE_MIN_MNK = 1 << 30
_GPU_SMALL = _GPU_CONFIGS[4]  # 128x128x64, 4 warps: compiles fastest, holds a 128-block


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _format_args(spec: FormatSpec) -> dict:
    return {"KIND": KIND_IDS[spec.kind], "BITS": spec.bits, "BLOCK": spec.block}


def _kernel_view(t: torch.Tensor | None) -> torch.Tensor | None:
    """bf16 crosses into the interpreter as int16 bits (its bf16 loads flush subnormals, its cast truncates)."""
    if t is not None and t.dtype == torch.bfloat16 and is_interpreted():
        return t.view(torch.int16)
    return t


def _expected_device() -> str:
    return "cpu" if is_interpreted() else "cuda"


def _block_reason(spec: FormatSpec, dim: int, dim_name: str) -> str | None:
    b = spec.block
    if b & (b - 1) or b > MAX_FUSED_BLOCK:
        return (f"block {b} of {spec.name} is not a power of two <= {MAX_FUSED_BLOCK} (a fused tile must hold whole "
                f"blocks in registers)")
    if dim % b:
        return (f"{dim_name}={dim} is not a multiple of the block {b}, so blocks would straddle rows of the "
                f"flattened tensor")
    return None


def _span(t: torch.Tensor) -> int:
    """Elements between the first and last addressed element, +1 (what int32 offsets must cover)."""
    return 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if s > 0)


def epilogue_unsupported(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         spec: FormatSpec) -> str | None:
    """Why ``y = x Wᵀ + b`` with y quantized in ``spec`` cannot run fused here (None: it can)."""
    if getattr(spec, "scale_kind", "absmax") != "absmax":
        return f"{spec.name}: the GEMM epilogue computes fp32 absmax scales only (E8M0/E4M3 scales: unfused codec)"
    dev = _expected_device()
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if t is None:
            continue
        if t.device.type != dev:
            return f"{name} is on {t.device}, the fused kernels run on {dev} tensors"
        if t.dtype not in _FLOAT:
            return (f"{name} is {t.dtype}; the fused GEMMs take bfloat16 or float16 (an fp32 Triton dot would run in "
                    f"tf32, which is not torch's fp32 GEMM)")
        if t.dtype != x.dtype:
            return f"{name} is {t.dtype} but x is {x.dtype}"
    if x.dim() < 1 or weight.dim() != 2 or x.shape[-1] != weight.shape[1]:
        return f"shapes do not form a linear: x {tuple(x.shape)}, weight {tuple(weight.shape)}"
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0]):
        return f"bias has shape {tuple(bias.shape)}, want ({weight.shape[0]},)"
    if x.shape[-1] == 0 or weight.shape[0] == 0:
        return "empty K or N"
    if _span(weight) > _MAX_INDEX:
        return f"weight spans {_span(weight)} elements, more than the kernels' int32 offsets address"
    return _block_reason(spec, weight.shape[0], "N (output features)")


def prologue_unsupported(grad: torch.Tensor, spec: FormatSpec, k: int, mul: torch.Tensor | None = None) -> str | None:
    """Why ``dW = gradᵀ · (mul ⊙ D(X))`` (X: M x k kept in ``spec``; ``mul`` optional, [M, k]) cannot run
    fused here (None: it can)."""
    dev = _expected_device()
    if grad.device.type != dev:
        return f"grad is on {grad.device}, the fused kernels run on {dev} tensors"
    if grad.dtype not in _FLOAT:
        return f"grad is {grad.dtype}; the fused GEMMs take bfloat16 or float16"
    if grad.dim() < 1 or grad.shape[-1] == 0 or k <= 0:
        return "empty N or K"
    m = grad.numel() // grad.shape[-1]
    if mul is not None:
        if mul.device != grad.device or mul.dtype != grad.dtype:
            return f"mul is {mul.dtype} on {mul.device}, grad is {grad.dtype} on {grad.device}"
        if mul.numel() != m * k or mul.shape[-1] != k:
            return f"mul has shape {tuple(mul.shape)}, want {m} rows of {k}"
        if _span(mul.reshape(-1, k)) > _MAX_INDEX:
            return "mul spans more than 2**31 elements"
    if m * k > _MAX_INDEX or _span(grad) > _MAX_INDEX or grad.shape[-1] * k > _MAX_INDEX:
        return (f"M={m}, N={grad.shape[-1]}, K={k} need offsets beyond int32 (M*K, M*N and N*K must stay "
                f"below 2**31)")
    return _block_reason(spec, k, "K (input features)")


# ---- autotuned wrappers (GPU only: the interpreter has no benchmarker for multi-config autotune) ------------
def _triton_configs(kind: str):
    import triton

    out = []
    for c in (_GPU_CONFIGS if kind == "epilogue" else _GPU_PROLOGUE_CONFIGS):
        if kind == "epilogue":
            kw = {"BLOCK_M": c.block_m, "BLOCK_N": c.block_n, "BLOCK_K": c.block_k, "GROUP_M": c.group_m}
        else:
            kw = {"BLOCK_N": c.block_m, "BLOCK_K": c.block_n, "BLOCK_R": c.block_k, "GROUP_M": c.group_m}
        out.append(triton.Config(kw, num_warps=c.num_warps, num_stages=c.num_stages))
    return out


def _prune(tile_key: str):
    def prune(configs, nargs, **kwargs):
        block = kwargs.get("BLOCK", nargs.get("BLOCK"))
        kept = [c for c in configs if c.kwargs[tile_key] % block == 0]
        if not kept:  # cannot happen for block <= MAX_FUSED_BLOCK; keep the error explicit if it does
            raise ValueError(f"no fused tile config holds whole blocks of {block}")
        return kept
    return prune


@functools.cache
def _tuned(kind: str):
    import triton

    if kind == "epilogue":
        fn = triton.heuristics({"EVEN_K": lambda a: a["K"] % a["BLOCK_K"] == 0})(K.gemm_quant_epilogue_kernel)
        return triton.autotune(configs=_triton_configs(kind), key=["M_KEY", "N", "K", "KIND", "BITS", "BLOCK",
                                                                    "HAS_BIAS"],
                               prune_configs_by={"early_config_prune": _prune("BLOCK_N")})(fn)
    return triton.autotune(configs=_triton_configs(kind), key=["M_KEY", "N", "K", "KIND", "BITS", "BLOCK", "HAS_MUL"],
                           prune_configs_by={"early_config_prune": _prune("BLOCK_K")})(K.gemm_dequant_prologue_kernel)


# ---- forward -------------------------------------------------------------------------------------------
#: Forward kernel families: "ptr" (gemm_quant_epilogue_kernel: one program per tile, cp.async loads; any
#: strides) and "tma" (gemm_quant_epilogue_tma_kernel: persistent, TMA loads; contiguous 16-byte aligned rows).
KERNELS = ("ptr", "tma")
_KERNEL_ENV = "AGOQ_FUSION_KERNEL"
_chosen: dict[tuple, str] = {}


def _kernel_request(kernel: str | None) -> str:
    """"ptr", "tma" or "auto", from the argument or AGOQ_FUSION_KERNEL (default auto)."""
    import os

    k = (kernel or os.environ.get(_KERNEL_ENV, "auto")).strip().lower()
    if k not in KERNELS + ("auto",):
        raise ValueError(f"fused forward kernel {k!r} is not one of {KERNELS + ('auto',)} (argument or {_KERNEL_ENV})")
    return k


def _tma_eligible(*ts: torch.Tensor) -> bool:
    """TMA needs unit inner stride, 16-byte aligned base and 16-byte multiple row pitch."""
    return all(t.dim() == 2 and t.stride(1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0
               and t.data_ptr() % 16 == 0 for t in ts)


@functools.cache
def _num_programs(device: torch.device) -> int:
    if device.type == "cpu":
        return 2  # the interpreter: two programs exercise the persistent loop's stride
    return sm_count(device)


def _tma_hook(nargs):
    nargs["x_desc"].block_shape = [nargs["BLOCK_M"], nargs["BLOCK_K"]]
    nargs["w_desc"].block_shape = [nargs["BLOCK_N"], nargs["BLOCK_K"]]


@functools.cache
def _tuned_tma():
    import triton

    cfgs = [triton.Config({"BLOCK_M": c.block_m, "BLOCK_N": c.block_n, "BLOCK_K": c.block_k, "GROUP_M": c.group_m},
                          num_warps=c.num_warps, num_stages=c.num_stages, pre_hook=_tma_hook) for c in _GPU_CONFIGS]
    return triton.autotune(configs=cfgs, key=["M_KEY", "N", "K", "KIND", "BITS", "BLOCK", "HAS_BIAS", "NUM_PROGRAMS"],
                           prune_configs_by={"early_config_prune": _prune("BLOCK_N")})(K.gemm_quant_epilogue_tma_kernel)


def _launch_ptr(xv, wv, bv, yv, cv, sv, mm, n, k, x_strides, w_strides, common, cfg, block):
    args = (xv, wv, bv if bv is not None else yv, yv, cv, sv, mm, n, k, *x_strides, *w_strides, _pow2_at_least(mm))
    if cfg is None:
        _tuned("epilogue")[lambda meta: (triton_cdiv(mm, meta["BLOCK_M"]) * triton_cdiv(n, meta["BLOCK_N"]),)](
            *args, **common)
        return
    bn = max(cfg.block_n, block)  # both powers of two: the tile holds whole blocks
    grid = (triton_cdiv(mm, cfg.block_m) * triton_cdiv(n, bn),)
    K.gemm_quant_epilogue_kernel[grid](*args, **common, BLOCK_M=cfg.block_m, BLOCK_N=bn, BLOCK_K=cfg.block_k,
                                       GROUP_M=cfg.group_m, EVEN_K=k % cfg.block_k == 0, num_warps=cfg.num_warps,
                                       num_stages=cfg.num_stages)


def _launch_tma(xv, wv, bv, yv, cv, sv, mm, n, k, common, cfg, block, device):
    from triton.tools.tensor_descriptor import TensorDescriptor

    p = _num_programs(device)
    bm, bn, bk = (cfg.block_m, max(cfg.block_n, block), cfg.block_k) if cfg is not None else (64, 64, 64)
    xd = TensorDescriptor.from_tensor(xv, [bm, bk])  # autotuned: the config's pre_hook sets the block shapes
    wd = TensorDescriptor.from_tensor(wv, [bn, bk])
    args = (xd, wd, bv if bv is not None else yv, yv, cv, sv, mm, n, k, _pow2_at_least(mm))
    if cfg is None:
        _tuned_tma()[(p,)](*args, **common, NUM_PROGRAMS=p)
        return
    K.gemm_quant_epilogue_tma_kernel[(p,)](*args, **common, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.group_m,
                                           NUM_PROGRAMS=p, num_warps=cfg.num_warps, num_stages=cfg.num_stages)


#: Rows of the output the first-launch agreement check compares (enough to catch a broken kernel; bounded
#: so the check costs little memory even at the longest sequences).
_CHECK_ROWS = 1024


def _pick_kernel(key, run_ptr, run_tma, y, codes, scales, spec) -> str:
    """First tuned launch of a shape on GPU: run both families, check they agree, keep the faster.

    Agreement, on the first _CHECK_ROWS rows: the tma kernel's codes/scales equal the backend's stand-alone
    quantize kernel applied to the y it wrote, and its y is within the bf16 floor of the ptr kernel's y.
    A disagreement raises."""
    import logging

    import triton.testing

    from agoq_cuda import launch as codec
    from agoq_core.testing.tolerances import sqnr_db, sqnr_floor

    rows = min(_CHECK_ROWS, y.shape[0])
    n_bytes, n_blocks = spec.code_bytes(rows * y.shape[1]), spec.num_blocks(rows * y.shape[1])
    run_tma()
    y_t, c_t, s_t = y[:rows].clone(), codes[:n_bytes].clone(), scales[:n_blocks].clone()
    run_ptr()
    c2, s2 = torch.empty_like(c_t), torch.empty_like(s_t)
    codec.quantize(y_t.view(-1), spec, c2, s2)
    same_s = (s2.view(torch.int32) == s_t.view(torch.int32)) | (torch.isnan(s2) & torch.isnan(s_t))
    q = sqnr_db(y_t, y[:rows])
    if not torch.equal(c2, c_t) or not bool(same_s.all()) or q < sqnr_floor(y.dtype):
        raise RuntimeError(f"fused forward kernels disagree on {key}: tma codes bit-exact {torch.equal(c2, c_t)}, "
                           f"scales {bool(same_s.all())}, y SQNR tma vs ptr {q:.1f} dB; set {_KERNEL_ENV}=ptr to "
                           "use the other kernel and report this")
    del y_t, c_t, s_t, c2, s2
    t_ptr = triton.testing.do_bench(run_ptr, warmup=10, rep=50, return_mode="median")
    t_tma = triton.testing.do_bench(run_tma, warmup=10, rep=50, return_mode="median")
    pick = "tma" if t_tma < t_ptr else "ptr"
    logging.getLogger(__name__).info("fused GEMM+quantize %s: ptr %.3f ms, tma %.3f ms -> %s", key, t_ptr, t_tma, pick)
    run_tma() if pick == "tma" else run_ptr()  # leave the chosen kernel's outputs (they may differ in rounding)
    return pick


def gemm_quant_epilogue_into(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, spec: FormatSpec,
                             out: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, *,
                             config: TileConfig | None = None, kernel: str | None = None) -> None:
    """out[M, N] = round(x[M, K] @ weight[N, K]ᵀ + bias) and (codes, scales) = Q_spec(out flattened).

    ``x`` and ``weight`` may have any strides; ``out`` must be contiguous. ``config`` pins a tile shape
    (tests; on GPU it replaces autotuning). ``kernel`` ("ptr", "tma", "auto"; default AGOQ_FUSION_KERNEL or
    auto) picks the kernel family; auto measures both once per shape on GPU (large launches, TMA-able
    operands) and keeps the faster, otherwise uses ptr."""
    if x.dim() != 2:
        raise ValueError(f"gemm_quant_epilogue_into: x must be 2-D [M, K], got shape {tuple(x.shape)}")
    reason = epilogue_unsupported(x, weight, bias, spec)
    if reason:
        raise ValueError(f"gemm_quant_epilogue_into: cannot fuse: {reason}")
    m, k = x.shape
    n = weight.shape[0]
    if out.shape != (m, n) or out.dtype != x.dtype or not out.is_contiguous() or out.device != x.device:
        raise ValueError(f"gemm_quant_epilogue_into: out must be a contiguous {x.dtype} tensor of shape ({m}, {n}) "
                         f"on {x.device}, got {out.dtype} {tuple(out.shape)} on {out.device}")
    check_codec_buffers(spec, m * n, codes, scales, x.device, "gemm_quant_epilogue_into", data="the operands")
    want = _kernel_request(kernel)
    if want == "tma" and not _tma_eligible(x, weight):
        raise ValueError("gemm_quant_epilogue_into: kernel='tma' needs x and weight with unit inner stride, 16-byte "
                         "aligned storage and 16-byte multiple row pitch; use kernel='ptr' or 'auto'")
    if m == 0:
        return
    interp = is_interpreted()
    # Split the rows so that every launch's x, out and codes stay below int32 offsets.
    per_row = max(n, x.stride(0), 1)
    rows = max(1, (_MAX_INDEX - _span(x[:1])) // per_row)
    fmt = _format_args(spec)
    fmt["QMAX"] = float(spec.qmax)
    xv, wv, bv, ov = (_kernel_view(t) for t in (x, weight, bias, out))
    cv = codes.view(torch.int8)
    row_bytes, row_blocks = spec.code_bytes(n), n // spec.block
    common = dict(HAS_BIAS=bias is not None, FLOAT=_FLOAT[x.dtype], INTERP=interp, **fmt)
    for r0 in range(0, m, rows):
        mm = min(rows, m - r0)
        xc, yc = xv[r0:r0 + mm], ov[r0:r0 + mm]
        cc, sc = cv[r0 * row_bytes:(r0 + mm) * row_bytes], scales[r0 * row_blocks:(r0 + mm) * row_blocks]
        small = mm * n * k < _TUNE_MIN_MNK
        cfg = config or (_INTERP_EPILOGUE if interp else _GPU_SMALL if small else None)

        def run_ptr():
            _launch_ptr(xc, wv, bv, yc, cc, sc, mm, n, k, (x.stride(0), x.stride(1)),
                        (weight.stride(0), weight.stride(1)), common, cfg, spec.block)

        def run_tma():
            _launch_tma(xc, wv, bv, yc, cc, sc, mm, n, k, common, cfg, spec.block, x.device)

        family = want
        if family == "auto":
            family = "ptr"
            if not interp and cfg is None and _tma_eligible(x, weight):
                key = (_pow2_at_least(mm), n, k, spec.name, spec.block, bias is not None, x.dtype, x.stride(0))
                if key not in _chosen:
                    _chosen[key] = _pick_kernel(key, run_ptr, run_tma, out[r0:r0 + mm],
                                                codes[r0 * row_bytes:(r0 + mm) * row_bytes], sc, spec)
                    continue  # _pick_kernel left the chosen kernel's outputs
                family = _chosen[key]
        (run_tma if family == "tma" else run_ptr)()


# ---- backward ------------------------------------------------------------------------------------------
def gemm_dequant_prologue_into(grad: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, spec: FormatSpec,
                               k: int, out: torch.Tensor, mul: torch.Tensor | None = None, *,
                               config: TileConfig | None = None) -> None:
    """out[N, K] = round(grad[M, N]ᵀ @ B) with B = D(codes, scales)[M, K] rounded to grad's dtype (as the
    unfused path materialises it), or B = round(mul ⊙ that) when ``mul`` [M, K] is given (as torch's
    16-bit ``mul * x`` rounds it). ``grad`` and ``mul`` may have any strides; ``out`` must be contiguous."""
    if grad.dim() != 2 or (mul is not None and mul.dim() != 2):
        raise ValueError(f"gemm_dequant_prologue_into: grad [M, N] and mul [M, K] must be 2-D, got "
                         f"{tuple(grad.shape)} and {None if mul is None else tuple(mul.shape)}")
    reason = prologue_unsupported(grad, spec, k, mul)
    if reason:
        raise ValueError(f"gemm_dequant_prologue_into: cannot fuse: {reason}")
    m, n = grad.shape
    if out.shape != (n, k) or out.dtype != grad.dtype or not out.is_contiguous() or out.device != grad.device:
        raise ValueError(f"gemm_dequant_prologue_into: out must be a contiguous {grad.dtype} tensor of shape "
                         f"({n}, {k}) on {grad.device}, got {out.dtype} {tuple(out.shape)} on {out.device}")
    check_codec_buffers(spec, m * k, codes, scales, grad.device, "gemm_dequant_prologue_into", data="the operands")
    if m == 0:
        out.zero_()  # an empty sum
        return
    interp = is_interpreted()
    mv = _kernel_view(mul) if mul is not None else _kernel_view(grad)
    args = (_kernel_view(grad), codes.view(torch.int8), scales, nf4_lut(grad.device), mv, _kernel_view(out),
            m, n, k, grad.stride(0), grad.stride(1), mul.stride(0) if mul is not None else 0,
            mul.stride(1) if mul is not None else 0, _pow2_at_least(m))
    # NF4 decodes by a select tree, not the 16-entry table: inside the GEMM's K loop Triton's pipeliner
    # turned the table gather into per-element cp.async copies (42 LDGSTS per iteration, sm_90 SASS) and
    # the prologue ran at ~47 TFLOP/s on the H200 (docs/bench/fusion.md); the select tree touches no memory.
    common = dict(HAS_MUL=mul is not None, FLOAT=_FLOAT[grad.dtype], INTERP=interp, NF4_LUT=False,
                  **_format_args(spec))
    cfg = config or (_INTERP_PROLOGUE if interp else _GPU_SMALL if m * n * k < _TUNE_MIN_MNK else None)
    if cfg is None:
        _tuned("prologue")[lambda meta: (triton_cdiv(n, meta["BLOCK_N"]) * triton_cdiv(k, meta["BLOCK_K"]),)](
            *args, **common)
    else:
        bk = max(cfg.block_n, spec.block)
        grid = (triton_cdiv(n, cfg.block_m) * triton_cdiv(k, bk),)
        K.gemm_dequant_prologue_kernel[grid](*args, **common, BLOCK_N=cfg.block_m, BLOCK_K=bk, BLOCK_R=cfg.block_k,
                                             GROUP_M=cfg.group_m, num_warps=cfg.num_warps,
                                             num_stages=cfg.num_stages)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
