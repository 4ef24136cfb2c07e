"""Registration of the ``cuda`` backend (entry point ``agoq.backends: cuda = agoq_cuda.plugin``).

Importing this module is cheap and side-effect free: it imports neither triton nor the kernels and
does not touch CUDA. The probe decides availability from files and environment variables only:

* ``triton`` importable (``importlib.util.find_spec``, which does not import it);
* ``TRITON_INTERPRET=1``: available in *interpreter mode* (the real kernels run on CPU tensors
  through Triton's interpreter; what CPU CI uses). In that mode the backend is registered as a
  non-accelerator: it runs when named (``AGOQ_BACKEND=cuda``), never by auto-selection;
* otherwise a CUDA build of torch (``torch.version.cuda``), a GPU visible by CUDA_VISIBLE_DEVICES and
  an NVIDIA device node (``/dev/nvidia0``, ``/dev/nvidia1`` ...). We do not call
  ``torch.cuda.is_available()`` here: it runs ``cuInit`` in this process (no torch context, but the
  driver is initialised, which a later ``fork`` inherits) and can take seconds. ``load()`` performs
  the real CUDA check and fails with the reason if the driver cannot be used.
"""
from __future__ import annotations

import glob
import importlib.util
import os

from agoq_core.backend import Availability, BackendInfo, hookimpl

__all__ = ["agoq_backends", "device_type", "interpreter_requested", "probe"]

INSTALL_HINT = ("pip install agoq-cuda (brings triton) on a machine with an NVIDIA GPU and a CUDA build of "
                "torch; on a CPU-only machine set TRITON_INTERPRET=1 to run the kernels in Triton's interpreter")


def interpreter_requested() -> bool:
    """TRITON_INTERPRET as Triton parses it (``1``/``true``/``on``, any case)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on")


def device_type(interpreted: bool) -> str:
    """The backend's device type, stated once: CPU tensors in interpreter mode, else CUDA. BackendInfo
    declares it; CudaBackend objects built outside the manager (tests, benchmarks) take it from here."""
    return "cpu" if interpreted else "cuda"


def _visible_devices_hidden() -> bool:
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    return vis is not None and vis.strip() in ("", "-1", "none", "NoDevFiles")


def probe() -> Availability:
    if importlib.util.find_spec("triton") is None:
        return Availability(False, "the 'triton' package is not installed")
    if interpreter_requested():
        return Availability(True, "Triton interpreter (TRITON_INTERPRET=1): the kernels run on CPU tensors")
    import torch  # already imported by agoq_core; reading torch.version does not initialise CUDA

    if getattr(torch.version, "cuda", None) is None:
        return Availability(False, f"torch {torch.__version__} is not a CUDA build")
    if _visible_devices_hidden():
        return Availability(False, f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r} hides every GPU")
    nodes = sorted(glob.glob("/dev/nvidia[0-9]*"))
    if not nodes:
        return Availability(False, "no NVIDIA device node (/dev/nvidia0 ...) on this machine")
    return Availability(True, f"triton installed, CUDA torch {torch.version.cuda}, {len(nodes)} NVIDIA device node(s)")


def _load():
    from agoq_cuda.backend import CudaBackend  # heavy: imports triton and compiles nothing yet

    return CudaBackend.create()


@hookimpl
def agoq_backends() -> list[BackendInfo]:
    # Interpreter mode is a CPU test mode: the backend is used when named (AGOQ_BACKEND=cuda) but takes
    # no part in auto-selection (accelerator=False), so exporting TRITON_INTERPRET=1 for a test run does
    # not silently move every auto-selecting caller from the reference onto the (slow) interpreter.
    interp = interpreter_requested()
    return [BackendInfo(name="cuda", device_type=device_type(interp), probe=probe, load=_load,
                        accelerator=not interp, install_hint=INSTALL_HINT)]
