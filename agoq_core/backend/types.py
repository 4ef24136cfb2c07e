"""What plugin authors return from the ``agoq_backends`` hook: light, validated records."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from agoq_core.errors import PluginError

if TYPE_CHECKING:
    import torch

    from agoq_core.backend.protocol import Backend

__all__ = ["Availability", "BackendInfo", "Capabilities", "OPS", "COLLECTIVES"]

#: Operations a backend may claim. Codecs are required; the rest are optional capabilities, each declared
#: by a small protocol in agoq_core.backend.protocol (OPTIONAL_OPS) and documented in docs/writing-a-backend.md.
OPS = frozenset({
    "quantize", "dequantize",            # required: every format the backend lists
    "accumulate",                        # QuanGrad: q <- Q(D(q) + g) in place, fused
    "reduce_requantize",                 # QuanGrad all-reduce: sum W chunks in fp32, requantize
    "gemm_quant_epilogue",               # kernel fusion: GEMM that also writes a quantized copy of its output
    "gemm_dequant_prologue",             # kernel fusion: GEMM that reads a QuantizedTensor operand
    "rmsnorm_quant",                     # fusion into a neighbour: RMSNorm that also writes its input's codes
    "silu_mul_quant",                    # fusion into a neighbour: SiLU&Mul that also writes its inputs' codes
    "silu_mul_backward",                 # fusion into a neighbour: SiLU&Mul backward decoding its kept inputs
})
COLLECTIVES = frozenset({"all_to_all", "all_gather"})

_NAME_RE = re.compile(r"^[a-z][a-z0-9_-]*$")


@dataclass(frozen=True, slots=True)
class Availability:
    """Result of a probe: can this backend run here, and why (not)."""

    ok: bool
    reason: str

    def __bool__(self) -> bool:  # pragma: no cover - convenience
        return self.ok


@dataclass(frozen=True, kw_only=True, slots=True)
class BackendInfo:
    """Registration record for one backend. Cheap to build: importing it must not import kernels.

    ``probe`` must not import torch_npu, triton or initialise a device context; use
    ``importlib.util.find_spec``, environment variables, or files on disk. ``load`` is called only
    when the backend is selected and may import anything.
    """

    name: str
    """Lower-case unique name; the value users put in AGOQ_BACKEND."""
    device_type: str
    """torch device type the backend's kernels run on ("cuda", "npu", "cpu" ...). The one place a plugin
    states it: the manager sets it on the Backend object that ``load`` returns."""
    probe: Callable[[], Availability]
    load: Callable[[], "Backend"]
    accelerator: bool = True
    """Accelerator backends take part in auto-selection; non-accelerator ones only when named."""
    install_hint: str = ""
    """What to install or set when the probe fails (shown in errors and `agoq backends`)."""
    distribution: str = ""
    """Filled in by the manager from the entry point's distribution if left empty."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise PluginError(
                f"backend name {self.name!r} is invalid: use lower-case letters, digits, '-' or '_', "
                "starting with a letter"
            )
        if not callable(self.probe) or not callable(self.load):
            raise PluginError(f"backend {self.name!r}: probe and load must be callables")
        if not isinstance(self.device_type, str) or not self.device_type:
            raise PluginError(f"backend {self.name!r}: device_type must be a non-empty string")


@dataclass(frozen=True, kw_only=True, slots=True)
class Capabilities:
    """What a backend claims. The core checks these before dispatch; claiming is a promise that the
    conformance suite verifies (a claimed op that fails conformance is a failing backend)."""

    formats: frozenset[str]
    device_types: frozenset[str]
    ops: frozenset[str] = frozenset({"quantize", "dequantize"})
    collectives: frozenset[str] = frozenset()
    input_dtypes: frozenset["torch.dtype"] = field(default_factory=frozenset)
    max_block: int = 1 << 20
    """Largest block size the kernels take (spec allows up to 2**20)."""
    notes: tuple[str, ...] = ()
    """Free-text facts worth showing users (e.g. "FP8 stored as bytes: no FP8 units on 910B")."""
    native_float_formats: frozenset[str] | None = None
    """Low-precision float codes (of fp4_e2m1, fp8_e4m3, fp8_e5m2) the device has arithmetic units for;
    None = not restricted (CPU, GPUs). Ascend A2/A3 declare none: every format still works (codes are made
    with integer logic), but defaults avoid them there (agoq_core.formats.policy): QuanGrad stores int8,
    the planner's default candidates drop fp4_e2m1, each with the reason logged."""

    def __post_init__(self) -> None:
        unknown = set(self.ops) - OPS
        if unknown:
            raise PluginError(f"unknown ops in capabilities: {sorted(unknown)}; known: {sorted(OPS)}")
        unknown = set(self.collectives) - COLLECTIVES
        if unknown:
            raise PluginError(f"unknown collectives in capabilities: {sorted(unknown)}")

    def to_dict(self) -> dict:
        return {
            "formats": sorted(self.formats),
            "device_types": sorted(self.device_types),
            "ops": sorted(self.ops),
            "collectives": sorted(self.collectives),
            "input_dtypes": sorted(str(d) for d in self.input_dtypes),
            "max_block": self.max_block,
            "notes": list(self.notes),
            "native_float_formats": None if self.native_float_formats is None else sorted(self.native_float_formats),
        }
