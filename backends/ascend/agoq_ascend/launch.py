"""Ascend launchers: buffers -> kernel arguments, with the launch geometry of agoq_ascend.planner.

The kernel bodies are agoq_triton_kernels' (the same source the CUDA backend launches); what is Ascend
here: one program per vector core, tiles sized to the unified buffer, lanes padded to a 32-byte tail,
NF4 decoded with a select tree instead of a table gather (Ascend's vector unit has no cheap gather),
the portable arithmetic of the bodies (HW=False: no fp8 casts, correctly rounded divisions), and
Triton-Ascend compile options (multibuffer, no fp contraction) passed only from this wrapper.

Tensors cross the boundary as the CUDA launcher does it: codes as int8 views (no uint8 arithmetic in
kernels), bf16 as its int16 bit pattern (widened and rounded with integer logic), fp32 scales.
Tensors above 2**30 elements are cut into pieces of whole blocks so int32 offsets cannot wrap, and a
ragged last block gets a launch of its own (RAGGED=True), as the shared kernels require.
"""
from __future__ import annotations

import functools

import torch

from agoq_core.formats.spec import FormatSpec
from agoq_ascend.planner import DeviceProps, LaunchPlan, compile_options, plan_launch
from agoq_triton_kernels import kernels as K
from agoq_triton_kernels.buffers import check_codec_buffers as _check
from agoq_triton_kernels.buffers import float_view
from agoq_triton_kernels.codes import NF4_LEVELS_KERNEL
from agoq_triton_kernels.layout import MAX_CHUNK_ELEMENTS, format_constexprs

__all__ = ["Launcher", "is_interpreted"]

_DTYPE_NAME = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def is_interpreted() -> bool:
    """Whether the shared kernels were decorated under TRITON_INTERPRET (fixed at their import)."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(K.quantize_kernel, InterpretedFunction)


@functools.cache
def _nf4_lut(device: torch.device) -> torch.Tensor:
    # The kernels take a LUT pointer in every call; with NF4_LUT=False (Ascend) it is never read.
    return torch.tensor(NF4_LEVELS_KERNEL, dtype=torch.float32, device=device)


def _segments(spec: FormatSpec, n: int):
    """One launch per piece: runs of whole blocks (<= 2**30 elements each, int32 offsets) with RAGGED=False
    (row masks only), then the last, partial block, if any, with RAGGED=True (element masks), as the
    shared kernels expect. Yields (element offset, elements, code-byte offset, block offset, ragged)."""
    full = n // spec.block * spec.block
    step = max(spec.block, MAX_CHUNK_ELEMENTS // spec.block * spec.block)
    per_block = spec.block * spec.bits // 8
    for off in range(0, full, step):
        yield off, min(step, full - off), off // spec.block * per_block, off // spec.block, False
    if full < n:
        yield full, n - full, full // spec.block * per_block, full // spec.block, True


class Launcher:
    """Launches the shared kernels with the geometry the planner derives from ``props``.

    ``last_plans`` keeps the plans of the most recent call (one per chunk) so tests and benchmarks can
    see the geometry that actually ran."""

    def __init__(self, props: DeviceProps):
        self.props = props
        self.last_plans: list[LaunchPlan] = []

    def _plan(self, op: str, spec: FormatSpec, m: int, io_dtype: str, rows, programs) -> LaunchPlan:
        return plan_launch(op=op, numel=m, kind=spec.kind, bits=spec.bits, block=spec.block, device=self.props,
                           io_dtype=io_dtype, rows=rows, programs=programs)

    def _consts(self, spec: FormatSpec, plan: LaunchPlan, ragged: bool) -> dict:
        c = format_constexprs(kind=spec.kind, bits=spec.bits, block=spec.block, qmax=spec.qmax)
        c["BLOCK_P"] = plan.lanes  # >= next_pow2(block): padded to a 32-byte tail, extra lanes masked
        c["ROWS"] = plan.rows
        c["RAGGED"] = ragged
        # HW=False: FP8 and bf16 by integer logic, quotients by tl.math.div_rn. HW=True is CUDA sm_89+ only
        # (hardware fp8/bf16 converts, an FMA-based quotient): A2/A3 have no FP8, and the FMA trick's
        # exactness on Ascend's vector unit is unverified.
        c["HW"] = False
        return c

    def _launch(self, kernel, plan: LaunchPlan, args: tuple, consts: dict) -> None:
        self.last_plans.append(plan)
        kernel[(plan.grid,)](*args, **consts, **compile_options(plan))

    def quantize(self, x, spec, codes, scales, *, rows=None, programs=None) -> None:
        """x flat [N] (fp32/bf16/fp16) -> codes uint8[code_bytes(N)], scales fp32[NB]."""
        n = x.numel()
        _check(spec, n, codes, scales, x.device, "quantize")
        xv, xk = float_view(x.reshape(-1), "quantize", "agoq-ascend")
        cv = codes.view(torch.int8)
        self.last_plans = []
        for off, m, boff, soff, ragged in _segments(spec, n):
            plan = self._plan("quantize", spec, m, _DTYPE_NAME[x.dtype], rows, programs)
            nb = plan.n_blocks
            self._launch(K.quantize_kernel, plan,
                         (xv[off:off + m], cv[boff:boff + spec.code_bytes(m)], scales[soff:soff + nb], m, nb,
                          plan.n_tiles), {**self._consts(spec, plan, ragged), "X_FLOAT": xk})

    def dequantize(self, codes, scales, spec, out, *, rows=None, programs=None) -> None:
        """codes + scales -> out flat [N] (fp32, bf16 or fp16)."""
        n = out.numel()
        _check(spec, n, codes, scales, out.device, "dequantize")
        ov, ok = float_view(out.reshape(-1), "dequantize", "agoq-ascend")
        cv = codes.view(torch.int8)
        lut = _nf4_lut(out.device)
        self.last_plans = []
        for off, m, boff, soff, ragged in _segments(spec, n):
            plan = self._plan("dequantize", spec, m, _DTYPE_NAME[out.dtype], rows, programs)
            nb = plan.n_blocks
            self._launch(K.dequantize_kernel, plan,
                         (cv[boff:boff + spec.code_bytes(m)], scales[soff:soff + nb], lut, ov[off:off + m], m, nb,
                          plan.n_tiles), {**self._consts(spec, plan, ragged), "OUT_FLOAT": ok, "NF4_LUT": False})

    def accumulate(self, codes, scales, spec, g, *, rows=None, programs=None) -> None:
        """In place: (codes, scales) <- Q(D(codes, scales) + g), g flat [N] (fp32, bf16, fp16)."""
        n = g.numel()
        _check(spec, n, codes, scales, g.device, "accumulate_")
        gv, gk = float_view(g.reshape(-1), "accumulate_", "agoq-ascend")
        cv = codes.view(torch.int8)
        lut = _nf4_lut(g.device)
        self.last_plans = []
        for off, m, boff, soff, ragged in _segments(spec, n):
            plan = self._plan("accumulate", spec, m, _DTYPE_NAME[g.dtype], rows, programs)
            nb = plan.n_blocks
            self._launch(K.accumulate_kernel, plan,
                         (cv[boff:boff + spec.code_bytes(m)], scales[soff:soff + nb], lut, gv[off:off + m], m, nb,
                          plan.n_tiles), {**self._consts(spec, plan, ragged), "G_FLOAT": gk, "NF4_LUT": False})

    def reduce_requantize(self, codes, scales, spec, numel, codes_out, scales_out, *, rows=None,
                          programs=None) -> None:
        """codes uint8[W, code_bytes], scales fp32[W, NB] -> Q(sum_r D_r) (fp32, rank order)."""
        if codes.dim() != 2 or scales.dim() != 2 or codes.shape[0] != scales.shape[0] or codes.shape[0] < 1:
            raise ValueError(f"reduce_requantize: want codes[W, B] and scales[W, NB] with W >= 1, got "
                             f"{tuple(codes.shape)} and {tuple(scales.shape)}")
        n, w = numel, codes.shape[0]
        _check(spec, n, codes_out, scales_out, codes.device, "reduce_requantize")
        _check(spec, n, codes[0], scales[0], codes.device, "reduce_requantize (input row)")
        if codes.stride(1) != 1 or scales.stride(1) != 1:
            raise ValueError("reduce_requantize: rows of codes and scales must be contiguous")
        cv, cov = codes.view(torch.int8), codes_out.view(torch.int8)
        lut = _nf4_lut(codes.device)
        self.last_plans = []
        for off, m, boff, soff, ragged in _segments(spec, n):
            plan = self._plan("reduce_requantize", spec, m, "float32", rows, programs)
            nb, cb = plan.n_blocks, spec.code_bytes(m)
            self._launch(K.reduce_requantize_kernel, plan,
                         (cv[:, boff:boff + cb], scales[:, soff:soff + nb], lut, cov[boff:boff + cb],
                          scales_out[soff:soff + nb], m, nb, plan.n_tiles, w, codes.stride(0), scales.stride(0)),
                         {**self._consts(spec, plan, ragged), "NF4_LUT": False})
