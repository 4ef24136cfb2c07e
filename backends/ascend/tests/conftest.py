"""agoq-ascend tests (CPU only: no Ascend NPU exists here).

The kernels run in upstream Triton's interpreter, which must be switched on before any @triton.jit
decorator runs: TRITON_INTERPRET is set here, before a test module imports the kernels. The torch_npu
boundary is faked per test (ascend_fakes.FakeTorchNpu in sys.modules, restored afterwards).
"""
from __future__ import annotations

import os

import torch

# On a GPU machine other areas' tests may run the same kernels on the GPU: do not force the interpreter
# there (the kernel tests below then skip); on CPU machines (CI) switch it on.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_selection(monkeypatch):
    """No test sees another's AGOQ_* variables or cached backend selection."""
    from agoq_core.backend import manager

    for var in ("AGOQ_BACKEND", "AGOQ_ASCEND_INTERPRET", "AGOQ_ASCEND_VENDOR_OPS", "AGOQ_ASCEND_UB_BYTES",
                "AGOQ_ASCEND_INTERPRET_CORES", "AGOQ_ASCEND_MAX_ROWS", "AGOQ_ASCEND_SELF_TEST"):
        monkeypatch.delenv(var, raising=False)
    manager.reset()
    yield
    manager.reset()


@pytest.fixture
def interp_backend():
    """The ascend backend in interpreter mode (A2 geometry, 3 fake vector cores), built directly."""
    from agoq_ascend.backend import AscendBackend
    from agoq_triton_kernels.launch import is_interpreted
    from agoq_ascend.geometry import DeviceProps
    from agoq_ascend.soc import INTERPRETER_SOC

    if not is_interpreted():
        pytest.skip("the shared kernels were imported without TRITON_INTERPRET=1 (GPU machine); these tests need "
                    "Triton's CPU interpreter")
    return AscendBackend(soc=INTERPRETER_SOC, props=DeviceProps(vector_cores=3), interpreted=True)
