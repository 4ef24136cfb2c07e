"""torch_npu's own quantization operators: which ones could stand in for our kernels, and the one
that may, opt-in.

Checked against docs/formats.md (spec version 1; version 2's changes, FP8's −0 code and the scale
step-down near FLT_MAX, do not touch int8 from bf16/fp16 inputs); all need an NPU, none has run here:

* ``npu_dynamic_block_quant`` (A2/A3: int8, 1x128 blocks, ``round_mode="rint"``, fp16/bf16 inputs,
  2-D/3-D, non-empty): documented as ``scale = min(absmax / 127, 1 / min_scale)``, ``y = rint(x / scale)``
  — the same formula as our int8/block-128, with codes in two's complement instead of offset binary
  (we convert: ``code = y + 128``). What the documentation does not fix, and our spec does: whether the
  divisions are correctly rounded, flushing of bf16 subnormals (ours: to 0 before absmax), the
  all-zero block (ours: scale 0, codes 128), NaN/Inf blocks (ours: scale NaN, codes 128), and whether
  -128 can be produced (ours never). Huawei's own tests of the sibling ``npu_dynamic_quant`` accept ±1
  code and 1e-4 relative scale differences. So it is **off by default**; ``AGOQ_ASCEND_VENDOR_OPS=
  npu_dynamic_block_quant`` routes int8/block-128 bf16/fp16 quantization to it and declares the affected
  conformance cases as a tolerance-level deviation (strict xfail: a case that turns out bit-exact shows
  up as xpass, which is the evidence needed to make it the default).
* ``npu_quantize`` (static, per-tensor/per-axis scales): would still need our absmax/scale pass, and its
  rounding and saturation are not documented — kept out.
* ``npu_anti_quant`` (dequantize): one scale per last-dim channel, not per block, fp16/bf16 output
  only — cannot express per-block scales; kept out.
* ``npu_dynamic_quant`` (per-token/per-channel): rows, not 1-D blocks; kept out.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from agoq_core.errors import BackendUnavailableError

__all__ = ["VENDOR_OPS", "VendorOptions", "dynamic_block_quant_applies", "dynamic_block_quant_int8",
           "DYNAMIC_BLOCK_QUANT_DEVIATIONS"]

VENDOR_OPS = {
    "npu_dynamic_block_quant": "int8 quantize with block 128 from bf16/fp16 inputs (tolerance level, opt-in)",
}
_VENDOR_BLOCK = 128
_INT8 = 1  # dst_type: the ScalarType code of torch.int8, as in the op's documentation example

DYNAMIC_BLOCK_QUANT_DEVIATIONS = {
    pat: ("torch_npu.npu_dynamic_block_quant (AGOQ_ASCEND_VENDOR_OPS): its division rounding, bf16-subnormal "
          "flushing, all-zero and NaN/Inf blocks are not specified; Huawei's tests of the sibling "
          "npu_dynamic_quant accept +-1 code and 1e-4 relative scale error (tolerance level, not bit-exact)")
    for pat in ("quantize/int8/b128/*/bf16", "quantize/int8/b128/*/f16")
}


@dataclass(frozen=True, kw_only=True, slots=True)
class VendorOptions:
    """Which torch_npu operators replace our kernels (none by default)."""

    ops: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        unknown = sorted(set(self.ops) - set(VENDOR_OPS))
        if unknown:
            raise BackendUnavailableError(
                f"AGOQ_ASCEND_VENDOR_OPS names unknown operator(s) {unknown}; known: "
                + "; ".join(f"{k} ({v})" for k, v in VENDOR_OPS.items()))

    @classmethod
    def from_env(cls) -> "VendorOptions":
        raw = os.environ.get("AGOQ_ASCEND_VENDOR_OPS", "")
        return cls(ops=frozenset(p.strip() for p in raw.split(",") if p.strip()))

    def known_deviations(self) -> dict[str, str]:
        return dict(DYNAMIC_BLOCK_QUANT_DEVIATIONS) if "npu_dynamic_block_quant" in self.ops else {}


def check_available(torch_npu: Any, options: "VendorOptions") -> None:
    """Every opted-in operator must exist in this torch_npu (older releases lack npu_dynamic_block_quant):
    refuse with the release and the fix, rather than fail at the first quantize."""
    from agoq_core.errors import BackendUnavailableError

    missing = sorted(op for op in options.ops if not hasattr(torch_npu, op))
    if missing:
        ver = getattr(torch_npu, "__version__", "unknown")
        raise BackendUnavailableError(
            f"AGOQ_ASCEND_VENDOR_OPS names {', '.join(missing)}, which torch_npu {ver} does not have: upgrade torch_npu "
            "(and CANN) to a release that provides it, or unset AGOQ_ASCEND_VENDOR_OPS (the default kernels need no "
            "vendor operator)")


def dynamic_block_quant_applies(spec, x: torch.Tensor) -> bool:
    """The documented A2/A3 envelope: int8, 1x128 blocks, fp16/bf16 input."""
    return (spec.name == "int8" and spec.block == _VENDOR_BLOCK and x.dtype in (torch.bfloat16, torch.float16)
            and x.numel() > 0)


def dynamic_block_quant_int8(torch_npu: Any, x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> None:
    """x flat [N] (bf16/fp16) -> our int8 codes (offset binary) and fp32 scales via npu_dynamic_block_quant.

    Blocks run along the last axis in 128-element pieces, so a flat tensor viewed as [N/128, 128] (or
    [1, N] when N is not a multiple) has exactly our blocks, ragged tail included, in the same order."""
    n = x.numel()
    x2 = x.view(n // _VENDOR_BLOCK, _VENDOR_BLOCK) if n % _VENDOR_BLOCK == 0 else x.view(1, n)
    y, s = torch_npu.npu_dynamic_block_quant(x2, min_scale=0.0, round_mode="rint", dst_type=_INT8,
                                             row_block_size=1, col_block_size=_VENDOR_BLOCK)
    nb = -(-n // _VENDOR_BLOCK)
    if y.dtype != torch.int8 or y.numel() != n or s.dtype != torch.float32 or s.numel() != nb:
        raise RuntimeError(f"npu_dynamic_block_quant returned y {y.dtype}[{y.numel()}], scale {s.dtype}[{s.numel()}]; "
                           f"expected int8[{n}] and float32[{nb}]")
    # two's complement q in [-127, 127] -> offset binary q + 128 (int16 add: no uint8 arithmetic on NPU)
    codes.copy_((y.reshape(-1).to(torch.int16) + 128).to(torch.uint8))
    scales.copy_(s.reshape(-1))
