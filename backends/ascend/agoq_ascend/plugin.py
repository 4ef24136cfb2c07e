"""Registration of the ``ascend`` backend (entry point ``agoq.backends: ascend = agoq_ascend.plugin``).

Importing this module is cheap: no torch_npu, no triton, no device. The probe answers from files and
environment variables (agoq_ascend.environment):

* ``AGOQ_ASCEND_INTERPRET=1`` with ``TRITON_INTERPRET=1`` and any ``triton`` installed: available in
  *interpreter mode* (the shared kernels with Ascend launch geometry on CPU tensors; CPU CI);
* otherwise every piece of the Ascend runtime must be there (torch_npu matching torch, triton-ascend
  instead of triton, CANN's set_env.sh sourced, libascendcl/libhccl loadable, npu-smi and device
  nodes). The unavailable reason lists every missing piece with its fix.
"""
from __future__ import annotations

import importlib.machinery
import os
import sys

from agoq_core.backend import Availability, BackendInfo, hookimpl

__all__ = ["agoq_backends", "device_type", "interpreter_requested", "probe", "INSTALL_HINT"]

INSTALL_HINT = ("on an Ascend machine (Atlas A2/A3 or Ascend 950): a venv with the CPU build of torch, the "
                "torch-npu release matching it, triton-ascend (not triton) and CANN's set_env.sh sourced: "
                "pip install 'agoq-ascend[npu]' (docs/backends/ascend.md). Without an NPU: "
                "AGOQ_ASCEND_INTERPRET=1 TRITON_INTERPRET=1 runs the kernels on CPU in Triton's interpreter")

_TRUE = ("1", "true", "on", "yes")


def interpreter_requested() -> bool:
    """AGOQ_ASCEND_INTERPRET set to 1/true/on/yes."""
    return os.environ.get("AGOQ_ASCEND_INTERPRET", "").strip().lower() in _TRUE


def device_type(interpreted: bool) -> str:
    """The backend's device type, stated once: CPU tensors in interpreter mode, else NPU. BackendInfo
    declares it; AscendBackend objects built outside the manager (tests) take it from here."""
    return "cpu" if interpreted else "npu"


def _triton_interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on")


def probe() -> Availability:
    if interpreter_requested():
        if not _triton_interpret():
            return Availability(False, "AGOQ_ASCEND_INTERPRET=1 needs TRITON_INTERPRET=1 as well (set both before "
                                       "Python starts: Triton fixes interpreter mode when the kernels are imported)")
        if importlib.machinery.PathFinder.find_spec("triton", sys.path) is None:
            return Availability(False, "AGOQ_ASCEND_INTERPRET=1 needs a 'triton' package for its interpreter: "
                                       "pip install triton")
        return Availability(True, "interpreter mode (AGOQ_ASCEND_INTERPRET=1, TRITON_INTERPRET=1): the shared kernels "
                                  "with Ascend launch geometry on CPU tensors")
    from agoq_ascend.environment import check_environment, summarize

    findings = check_environment()
    return Availability(all(f.ok for f in findings), summarize(findings))


def _load():
    if not interpreter_requested():
        from agoq_ascend.device import import_torch_npu

        import_torch_npu()  # registers the 'npu' device and 'hccl' before triton-ascend's driver looks for them
    from agoq_ascend.backend import AscendBackend  # heavy: imports the kernels (triton)

    return AscendBackend.create()


@hookimpl
def agoq_backends() -> list[BackendInfo]:
    # Interpreter mode is not an accelerator: it serves CPU tensors and is only used when named
    # (AGOQ_BACKEND=ascend), so it never competes with a real device in auto-selection.
    interp = interpreter_requested()
    return [BackendInfo(name="ascend", device_type=device_type(interp), probe=probe, load=_load,
                        accelerator=not interp, install_hint=INSTALL_HINT)]
