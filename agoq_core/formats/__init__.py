"""Formats: named, versioned block-scaled specs and the pure-torch reference codecs (the oracle)."""
from agoq_core.formats.spec import (
    SPEC_VERSION,
    FormatSpec,
    activation_formats,
    get_format,
    gradient_formats,
    list_formats,
)
from agoq_core.formats.tensor import QuantizedTensor

__all__ = [
    "SPEC_VERSION",
    "FormatSpec",
    "QuantizedTensor",
    "activation_formats",
    "get_format",
    "gradient_formats",
    "list_formats",
]
