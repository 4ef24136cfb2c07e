"""AGoQ: activation and gradient quantization for memory-efficient LLM training.

Quick start::

    import torch, agoq_core
    q = agoq_core.quantize(torch.randn(4096, 4096), "int4")      # 4-bit codes + fp32 block scales
    x_hat = agoq_core.dequantize(q)                               # back to a float tensor

The core is device-neutral: it imports no triton, torch_npu or CUDA module. Kernels come from the
backend selected by ``AGOQ_BACKEND`` (``agoq backends`` shows what is installed and chosen).
"""
from agoq_core.api import dequantize, quantize
from agoq_core.backend import get_backend, list_backends
from agoq_core.errors import AgoqError, BackendError, CapabilityError, FormatError
from agoq_core.formats import FormatSpec, QuantizedTensor, get_format, list_formats

__version__ = "0.1.0"

__all__ = [
    # codecs
    "quantize",
    "dequantize",
    "QuantizedTensor",
    # formats
    "FormatSpec",
    "get_format",
    "list_formats",
    # backends
    "get_backend",
    "list_backends",
    # errors
    "AgoqError",
    "BackendError",
    "CapabilityError",
    "FormatError",
]
