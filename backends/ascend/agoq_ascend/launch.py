"""Ascend launch geometry for the shared codec launcher (agoq_triton_kernels.launch).

The kernel bodies and the host launcher are agoq_triton_kernels' (the same source and the same launcher
the CUDA backend uses); what is Ascend here is the geometry agoq_ascend.geometry plans: one program per
vector core, tiles sized to the unified buffer, lanes padded to a 32-byte tail, NF4 decoded with a select
tree instead of a table gather (Ascend's vector unit has no cheap gather), the portable arithmetic of the
bodies (HW=False: no fp8 casts, correctly rounded divisions), and Triton-Ascend's ``multibuffer`` compile
option.
"""
from __future__ import annotations

import logging
import os

import torch

from agoq_ascend.geometry import DeviceProps, compile_options, plan_launch
from agoq_triton_kernels.launch import Launch, Launcher, is_interpreted

__all__ = ["AscendGeometry", "Launcher", "launcher", "is_interpreted", "max_rows_setting"]

log = logging.getLogger("agoq.ascend")

_DTYPE_NAME = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


class AscendGeometry:
    """The LaunchGeometry of agoq-ascend, for one device's ``props`` (vector cores, UB size)."""

    who = "agoq-ascend"
    nf4_lut = False
    # 5/6-bit pack groups by one access contiguous per block (kernels.CONTIG): Triton-Ascend lowers the strided
    # per-byte stores (innermost stride 3/5 bytes) to discrete byte-by-byte transfers (issue 20, risk 5).
    contig_pack = True
    # No float64: 910B's vector units have no fp64 and torch_npu's fp64 -> fp32 cast path is unverified.
    float64_via_float32 = False

    def __init__(self, props: DeviceProps):
        self.props = props
        self.learned_caps: dict[tuple, int] = {}
        """rows caps learned from "ub overflow" compile errors, per (op, kind, bits, block, dtype)."""

    def hw(self, device: torch.device, requested: bool | None) -> bool:
        # HW=True is CUDA sm_89+ only (hardware fp8/bf16 converts, libdevice's rcp.rn / mul.rn): A2/A3 have no FP8,
        # and Triton-Ascend has no libdevice with explicitly rounded, never-contracted fp32 ops.
        if requested:
            raise ValueError("hw=True (hardware fp8/bf16 conversions) is CUDA sm_89+ only; agoq-ascend runs the "
                             "portable integer-logic kernels")
        return False

    def plan(self, op: str, spec, numel: int, io_dtype: torch.dtype, device: torch.device, *,
             rows: int | None, programs: int | None) -> Launch:
        kw = dict(op=op, numel=numel, kind=spec.kind, bits=spec.bits, block=spec.block, device=self.props,
                  io_dtype=_DTYPE_NAME[io_dtype], programs=programs, tensor_scaled=spec.tensor_scaled)
        p = plan_launch(**kw, rows=rows)
        if rows is None:  # caps: AGOQ_ASCEND_MAX_ROWS, and what an "ub overflow" taught us for this kernel
            cap = min(max_rows_setting(), self.learned_caps.get(self._key(op, spec, io_dtype), 1 << 30))
            if p.rows > cap:
                p = plan_launch(**kw, rows=cap)
        # BLOCK_P = the planned lanes: >= next_pow2(block), padded to a 32-byte tail, extra lanes masked.
        return Launch(grid=p.grid, rows=p.rows, block_p=p.lanes, n_tiles=p.n_tiles, options=compile_options(p),
                      plan=p)


    @staticmethod
    def _key(op, spec, io_dtype) -> tuple:
        return (op, spec.kind, spec.bits, spec.block, str(io_dtype))

    def retry_smaller(self, exc: BaseException, launch: Launch, replan) -> Launch | None:
        """After Triton-Ascend's "ub overflow" compile error (the tile's working set exceeds the unified buffer:
        the UB rule underestimated it), the same piece with half the rows, remembered for later launches of
        this kernel; None (re-raise) for any other error or when one row already overflows."""
        if "ub overflow" not in str(exc).lower() or launch.rows <= 1:
            return None
        op, spec, _, io_dtype = replan.args[:4]
        rows = launch.rows // 2
        self.learned_caps[self._key(op, spec, io_dtype)] = rows
        log.warning("agoq-ascend: %s %s/block %d (%s) with %d rows per tile overflowed the unified buffer; retrying "
                    "with %d rows (set AGOQ_ASCEND_MAX_ROWS=%d to start there)", op, spec.name, spec.block,
                    io_dtype, launch.rows, rows, rows)
        return replan(rows=rows)


def max_rows_setting() -> int:
    """AGOQ_ASCEND_MAX_ROWS: upper bound on the planner's tile rows (a power of two >= 1; unset = no bound)."""
    raw = os.environ.get("AGOQ_ASCEND_MAX_ROWS", "").strip()
    if not raw:
        return 1 << 30
    try:
        v = int(raw)
    except ValueError:
        v = 0
    if v < 1 or v & (v - 1):
        raise ValueError(f"AGOQ_ASCEND_MAX_ROWS={raw!r} must be a power of two >= 1 (tile rows per launch)")
    return v


def launcher(props: DeviceProps) -> Launcher:
    """The shared launcher with the Ascend geometry of ``props``."""
    return Launcher(AscendGeometry(props))
