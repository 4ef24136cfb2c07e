"""agoq-cuda: AGoQ's CUDA backend (Triton codec kernels, NCCL byte collectives).

Users never import this package: install it and agoq_core discovers it through the ``agoq.backends``
entry point (``agoq backends`` shows it). Importing it is cheap: triton is imported only when the
backend is loaded (agoq_cuda.backend).
"""
__version__ = "0.1.0"
