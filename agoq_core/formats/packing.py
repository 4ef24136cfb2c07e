"""Canonical bit packing (docs/formats.md §5), pure torch.

Codes of ``b`` bits form a little-endian bit stream: code ``k`` occupies stream bits
``[k*b, (k+1)*b)``, and stream bit ``p`` is bit ``p % 8`` of byte ``p // 8``. For 4-bit codes this
is "element 2i in the low nibble of byte i"; 5-bit packs 8 codes into 5 bytes, 6-bit 4 codes into 3.

Written as unrolled shifts and ORs on column slices of a ``[groups, G]`` view and broadcast shifts
(no reductions, no stack; int32 where a group's bits fit): the reference runs it eagerly, and the
``cpu`` backend compiles the same function into its codec loops, where Inductor vectorises this form
(a ``sum`` over shifted int64 columns, or a ``stack``, stayed a scalar loop: 4x slower at 64 MiB).
"""
from __future__ import annotations

import sys

import torch

from agoq_core.formats.spec import FormatSpec

__all__ = ["pack_codes", "unpack_codes"]


_LITTLE_ENDIAN = sys.byteorder == "little"


def _word_dtype(spec: FormatSpec) -> torch.dtype:
    return torch.int64 if spec.bits * spec.pack_group > 31 else torch.int32  # 5-bit groups hold 40 bits


def _groups(t: torch.Tensor, g: int) -> torch.Tensor:
    """``t`` as ``[..., groups, g]``, keeping leading dims when the last one splits evenly (a compiled
    caller passes ``[blocks, B]``: Inductor vectorises the 2-D loop, not a flattened one)."""
    if t.dim() == 0 or t.shape[-1] % g:
        t = t.reshape(-1)
    return t.reshape(*t.shape[:-1], -1, g)


def pack_codes(codes: torch.Tensor, spec: FormatSpec) -> torch.Tensor:
    """Pack integer codes (any int dtype, or floats holding exact integers; values in [0, 2**bits)) into
    a uint8 tensor.

    ``codes.numel()`` must be a multiple of ``spec.pack_group``.
    """
    b, g, nb = spec.bits, spec.pack_group, spec.pack_bytes
    if codes.numel() % g:
        raise ValueError(f"pack_codes: {codes.numel()} codes is not a multiple of the pack group {g}")
    if b == 8:
        return codes.to(torch.uint8).reshape(-1)  # convert before flattening: Inductor keeps the 2-D loop
    if b == 4 and _LITTLE_ENDIAN and codes.dim() and codes.shape[-1] % 8 == 0:
        # 8 codes read as one int64 word (code k in byte k) and their nibbles gathered into one int32:
        # contiguous loads, which Inductor vectorises, where the column slices below (stride 2) stay a
        # scalar loop (the cpu backend's nf4 quantize 10% faster).
        w = codes.to(torch.uint8).contiguous().view(torch.int64)
        out = w & 0xF
        for k in range(1, 8):
            out = out | ((w >> (4 * k)) & (0xF << (4 * k)))
        return out.to(torch.int32).view(torch.uint8).reshape(-1)
    if b in (5, 6) and _LITTLE_ENDIAN and codes.dim() and codes.shape[-1] % g == 0:
        # One group (8 five-bit or 4 six-bit codes) read as one int64/int32 word (code k in byte k), its
        # bits gathered into the low 40/24 bits, whose first 5/3 bytes are the packed group: contiguous
        # word arithmetic that Inductor vectorises (cpu backend int5/int6 quantize 2.4-2.7x faster).
        w = codes.to(torch.uint8).contiguous().view(_word_dtype(spec))
        m = (1 << b) - 1
        out = w & m
        for k in range(1, g):
            out = out | (((w >> (8 * k)) & m) << (b * k))
        return out.view(torch.uint8).reshape(*out.shape, g)[..., :nb].reshape(-1)
    c = _groups(codes, g).to(_word_dtype(spec))
    word = c[..., 0]
    for k in range(1, g):
        word = word | (c[..., k] << (k * b))
    if nb == 1:
        return word.to(torch.uint8).reshape(-1)  # to(uint8) keeps the low 8 bits
    byte_shifts = torch.arange(nb, device=word.device, dtype=word.dtype) * 8
    return ((word.unsqueeze(-1) >> byte_shifts) & 0xFF).to(torch.uint8).reshape(-1)


def unpack_codes(packed: torch.Tensor, spec: FormatSpec, count: int | None = None,
                 dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """Inverse of :func:`pack_codes`; returns integer codes (``dtype``, default int64), truncated to
    ``count`` if given."""
    b, g, nb = spec.bits, spec.pack_group, spec.pack_bytes
    if b == 8:
        out = packed.reshape(-1).to(torch.int64)
    elif b == 4 and _LITTLE_ENDIAN and packed.dim() and packed.shape[-1] % 4 == 0 and dtype != torch.int64:
        # The inverse of pack_codes' word path: 4 bytes (8 codes) as one int32 word, each nibble moved
        # to its own byte of an int64: contiguous and vectorised under Inductor (only for callers that
        # take narrow codes: the int64 conversion of 8x more elements would cost more than it saves).
        w = packed.contiguous().view(torch.int32).to(torch.int64)
        word = w & 0xF
        for k in range(1, 8):
            word = word | (((w >> (4 * k)) & 0xF) << (8 * k))
        out = word.view(torch.uint8).reshape(-1)
    elif b in (5, 6) and _LITTLE_ENDIAN and packed.dim() and packed.shape[-1] % nb == 0 and dtype != torch.int64:
        # The inverse of pack_codes' group-word path: each group's 5/3 bytes padded to a whole word,
        # its codes moved to one byte each (int5/int6 dequantize 8-9x the reference's speed).
        p = packed.reshape(*packed.shape[:-1], -1, nb)
        p = torch.cat([p, p.new_zeros(*p.shape[:-1], g - nb)], dim=-1)
        w = p.reshape(*packed.shape[:-1], -1).view(_word_dtype(spec))
        m = (1 << b) - 1
        word = w & m
        for k in range(1, g):
            word = word | (((w >> (b * k)) & m) << (8 * k))
        out = word.view(torch.uint8).reshape(-1)
    else:
        p = _groups(packed, nb).to(_word_dtype(spec))
        word = p[..., 0]
        for j in range(1, nb):
            word = word | (p[..., j] << (8 * j))
        mask = (1 << b) - 1
        shifts = torch.arange(g, device=word.device, dtype=word.dtype) * b
        out = ((word.unsqueeze(-1) >> shifts) & mask).reshape(-1).to(torch.int64)
    out = out.to(dtype)
    return out if count is None else out[:count]
