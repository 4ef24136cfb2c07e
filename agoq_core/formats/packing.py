"""Canonical bit packing (docs/formats.md §5), pure torch.

Codes of ``b`` bits form a little-endian bit stream: code ``k`` occupies stream bits
``[k*b, (k+1)*b)``, and stream bit ``p`` is bit ``p % 8`` of byte ``p // 8``. For 4-bit codes this
is "element 2i in the low nibble of byte i"; 5-bit packs 8 codes into 5 bytes, 6-bit 4 codes into 3.
"""
from __future__ import annotations

import torch

from agoq_core.formats.spec import FormatSpec

__all__ = ["pack_codes", "unpack_codes"]


def pack_codes(codes: torch.Tensor, spec: FormatSpec) -> torch.Tensor:
    """Pack integer codes (any int dtype, values in [0, 2**bits)) into a uint8 tensor.

    ``codes.numel()`` must be a multiple of ``spec.pack_group``.
    """
    b, g, nb = spec.bits, spec.pack_group, spec.pack_bytes
    c = codes.reshape(-1).to(torch.int64)
    if c.numel() % g:
        raise ValueError(f"pack_codes: {c.numel()} codes is not a multiple of the pack group {g}")
    if b == 8:
        return c.to(torch.uint8)
    c = c.reshape(-1, g)
    shifts = torch.arange(g, device=c.device, dtype=torch.int64) * b
    word = (c << shifts).sum(dim=1, keepdim=True)  # at most 40 bits: fits int64
    byte_shifts = torch.arange(nb, device=c.device, dtype=torch.int64) * 8
    return ((word >> byte_shifts) & 0xFF).to(torch.uint8).reshape(-1)


def unpack_codes(packed: torch.Tensor, spec: FormatSpec, count: int | None = None) -> torch.Tensor:
    """Inverse of :func:`pack_codes`; returns int64 codes, truncated to ``count`` if given."""
    b, g, nb = spec.bits, spec.pack_group, spec.pack_bytes
    p = packed.reshape(-1).to(torch.int64)
    if b == 8:
        out = p
    else:
        p = p.reshape(-1, nb)
        byte_shifts = torch.arange(nb, device=p.device, dtype=torch.int64) * 8
        word = (p << byte_shifts).sum(dim=1, keepdim=True)
        shifts = torch.arange(g, device=p.device, dtype=torch.int64) * b
        out = ((word >> shifts) & ((1 << b) - 1)).reshape(-1)
    return out if count is None else out[:count]
