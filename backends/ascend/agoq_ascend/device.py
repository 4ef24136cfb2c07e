"""The torch_npu boundary: every call this backend makes into torch_npu is in this file.

Kept small and explicit so that CPU tests can put a fake ``torch_npu`` module in ``sys.modules`` and
assert each call's arguments (tests/test_torch_npu_boundary.py). Device services go to
``torch_npu.npu`` directly rather than through ``torch.get_device_module("npu")``: same functions,
but one visible boundary.
"""
from __future__ import annotations

import os
from typing import Any

from agoq_core.errors import BackendUnavailableError
from agoq_ascend.geometry import DeviceProps
from agoq_ascend.soc import SocInfo, classify

__all__ = ["import_torch_npu", "query_device", "ub_override"]


def import_torch_npu() -> Any:
    """Import torch_npu (the one place it is imported), turning its failure into the probe's language."""
    try:
        import torch_npu  # noqa: F401  (registers the 'npu' device and the 'hccl' process-group backend)
    except Exception as exc:  # ImportError for libhccl.so, RuntimeError for the two-accelerators check ...
        raise BackendUnavailableError(
            f"import torch_npu failed: {type(exc).__name__}: {exc}. Source CANN's set_env.sh in this shell and "
            "check that torch_npu matches torch (agoq backends shows what is missing)") from exc
    return torch_npu


def ub_override(default: int) -> int:
    """AGOQ_ASCEND_UB_BYTES, if set, replaces the UB size the planner budgets with."""
    raw = os.environ.get("AGOQ_ASCEND_UB_BYTES", "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BackendUnavailableError(f"AGOQ_ASCEND_UB_BYTES={raw!r} is not an integer number of bytes") from None
    if value < 16 * 1024:
        raise BackendUnavailableError(f"AGOQ_ASCEND_UB_BYTES={value} is below 16384; Ascend UBs are 192 KB or more")
    return value


def query_device(torch_npu: Any, index: int) -> tuple[SocInfo, DeviceProps]:
    """SoC family and launch-relevant properties of NPU ``index`` (vector cores from torch_npu's
    device properties, UB size from the SoC family)."""
    npu = torch_npu.npu
    if not npu.is_available():
        raise BackendUnavailableError(
            "torch_npu imported but torch.npu.is_available() is False (driver not loaded, no device visible, or "
            "ASCEND_RT_VISIBLE_DEVICES hides them); npu-smi info shows what the driver sees")
    count = int(npu.device_count())
    if not 0 <= index < count:
        raise BackendUnavailableError(f"NPU index {index} requested but {count} NPU(s) are visible")
    props = npu.get_device_properties(index)
    soc = classify(int(npu.get_soc_version()), str(npu.get_device_name(index)))
    cores = int(getattr(props, "vector_core_num", 0) or 0)
    if cores < 1:
        raise BackendUnavailableError(f"{soc.describe()}: torch_npu reports vector_core_num={cores}; cannot size the "
                                      "launch grid")
    return soc, DeviceProps(vector_cores=cores, ub_bytes=ub_override(soc.ub_bytes), name=soc.describe())
