"""agoq-ascend: AGoQ's Ascend NPU backend (Triton-Ascend codec kernels, HCCL byte collectives).

Users never import this package: install it and agoq_core discovers it through the ``agoq.backends``
entry point (``agoq backends`` shows whether it can run here, and if not, exactly what is missing).
Importing it is cheap and imports neither torch_npu nor triton: those are imported only when the
backend is selected and loaded (agoq_ascend.backend).

Nothing in this package has run on an Ascend NPU yet: see docs/backends/ascend.md for what was tested
on CPU and how an Ascend owner produces the first conformance report.
"""
__version__ = "0.1.0"
