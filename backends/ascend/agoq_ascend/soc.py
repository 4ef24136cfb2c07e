"""Which Ascend part is this, and what does that change? Plain data (no torch_npu import).

torch_npu reports the part as an integer SoC version (``torch_npu.npu.get_soc_version()``; the enum is
``c10_npu::SocVersion`` / ``torch_npu.npu._backends``) and a name (``get_device_name``). CUDA-style
capability tuples are not available (``get_device_capability()`` returns None on NPUs), so this table
is how the backend tells parts apart.
"""
from __future__ import annotations

from dataclasses import dataclass

from agoq_ascend.geometry import UB_BYTES_950, UB_BYTES_A2

__all__ = ["SocInfo", "classify", "UnsupportedSocError", "INTERPRETER_SOC"]

# c10_npu::SocVersion ranges (Ascend/pytorch torch_npu/csrc/core/npu/NpuVariables.h and the Python
# mirror in torch_npu): 220-225 Ascend910B1..B4_1 (Atlas A2), 250-255 Ascend910_9391..9362 (Atlas A3),
# 260 Ascend950. 100-104 (910A/ProA/...) and 200-243 (310P/310B) are parts Triton-Ascend does not target.
_A2 = range(220, 230)
_A3 = range(250, 260)
_A5_FIRST = 260


class UnsupportedSocError(RuntimeError):
    """A part the Triton-Ascend kernels do not target (910A, 310P, 310B ...)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SocInfo:
    family: str
    """'A2' (Atlas A2, 910B), 'A3' (Atlas A3, 910_93xx), '950' (Ascend 950PR/DT), 'interpreter'."""
    soc_version: int | None
    device_name: str
    fp8_native: bool
    """FP8 arithmetic units: only the 950 class. On A2/A3 FP8 tensors exist only as bytes."""
    ub_bytes: int

    def describe(self) -> str:
        if self.family == "interpreter":
            return self.device_name
        ver = f", soc_version {self.soc_version}" if self.soc_version is not None else ""
        return f"{self.device_name} ({self.family}{ver})"


INTERPRETER_SOC = SocInfo(family="interpreter", soc_version=None, device_name="Triton interpreter (CPU) emulating "
                          "an Atlas A2 launch geometry", fp8_native=False, ub_bytes=UB_BYTES_A2)


def classify(soc_version: int | None, device_name: str) -> SocInfo:
    """SocInfo from what torch_npu reports. A known SoC number decides alone: the name is consulted only
    when the number is missing (None or negative), because names overlap across generations (SoC 100-104
    are the old Ascend 910/910A family, which Triton-Ascend does not target, whatever the name says)."""
    name = device_name or ""
    family = None
    known = soc_version is not None and soc_version >= 0
    if known:
        if soc_version in _A2:
            family = "A2"
        elif soc_version in _A3:
            family = "A3"
        elif soc_version >= _A5_FIRST:
            family = "950"
    else:
        if name.startswith("Ascend950"):
            family = "950"
        elif name.startswith("Ascend910_93"):
            family = "A3"
        elif name.startswith("Ascend910B"):
            family = "A2"
    if family is None:
        raise UnsupportedSocError(
            f"NPU {name!r} (soc_version {soc_version}) is not a part the agoq Triton-Ascend kernels target: they "
            "need Atlas A2 (Ascend910B*, soc 220-225), Atlas A3 (Ascend910_93*, soc 250-255) or Ascend 950 "
            "(soc >= 260), Triton-Ascend's targets. Use AGOQ_BACKEND=reference on this machine")
    return SocInfo(family=family, soc_version=soc_version, device_name=name or f"soc {soc_version}",
                   fp8_native=family == "950", ub_bytes=UB_BYTES_950 if family == "950" else UB_BYTES_A2)
