"""QuantizedTensor: packed codes + fp32 block scales + what is needed to rebuild the tensor."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from agoq_core.errors import FormatError
from agoq_core.formats.spec import FormatSpec

__all__ = ["QuantizedTensor"]


@dataclass(frozen=True, slots=True)
class QuantizedTensor:
    """A tensor stored in a block-scaled format.

    ``codes`` is a flat uint8 tensor of ``spec.code_bytes(numel)`` packed codes, ``scales`` a flat
    fp32 tensor of ``spec.num_blocks(numel)`` scales (NaN marks a block that held NaN/Inf).
    ``nbytes`` is the real storage: codes plus scales, nothing else.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    shape: torch.Size
    dtype: torch.dtype
    spec: FormatSpec

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", torch.Size(self.shape))
        self.validate()

    @property
    def numel(self) -> int:
        return self.shape.numel()

    @property
    def device(self) -> torch.device:
        return self.codes.device

    @property
    def nbytes(self) -> int:
        return self.codes.numel() * self.codes.element_size() + self.scales.numel() * self.scales.element_size()

    @property
    def fmt(self) -> str:
        return self.spec.name

    def validate(self) -> None:
        """Raise FormatError if codes/scales do not fit shape and spec (e.g. a corrupt payload)."""
        n = self.numel
        want_c, want_s = self.spec.code_bytes(n), self.spec.num_blocks(n)
        if self.codes.dtype != torch.uint8 or self.codes.dim() != 1 or self.codes.numel() != want_c:
            raise FormatError(
                f"QuantizedTensor({self.spec.name}, shape={tuple(self.shape)}): codes must be a flat uint8 "
                f"tensor of {want_c} bytes, got {self.codes.dtype} with shape {tuple(self.codes.shape)}"
            )
        if self.scales.dtype != torch.float32 or self.scales.dim() != 1 or self.scales.numel() != want_s:
            raise FormatError(
                f"QuantizedTensor({self.spec.name}, shape={tuple(self.shape)}): scales must be a flat float32 "
                f"tensor of {want_s} blocks, got {self.scales.dtype} with shape {tuple(self.scales.shape)}"
            )
        if self.codes.device != self.scales.device:
            raise FormatError(f"codes on {self.codes.device} but scales on {self.scales.device}")

    def has_nonfinite(self) -> bool:
        """True if any block held NaN/Inf when it was quantized (its scale is NaN)."""
        return bool(torch.isnan(self.scales).any())

    def to(self, device: torch.device | str) -> "QuantizedTensor":
        return QuantizedTensor(self.codes.to(device), self.scales.to(device), self.shape, self.dtype, self.spec)

    def __repr__(self) -> str:
        return (f"QuantizedTensor(fmt={self.spec.name}, block={self.spec.block}, shape={tuple(self.shape)}, "
                f"dtype={self.dtype}, device={self.device}, nbytes={self.nbytes})")
