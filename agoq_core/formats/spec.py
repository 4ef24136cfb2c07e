"""Format specs: pure data describing how a tensor is cut into blocks, scaled, coded and packed.

The numerics contract every backend must reproduce bit for bit is written out in docs/formats.md;
this module holds the constants that contract refers to. Nothing here touches a tensor.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from agoq_core.errors import FormatError

__all__ = [
    "FormatSpec",
    "CodeKind",
    "ScaleKind",
    "SPEC_VERSION",
    "MIN_NORMAL_F32",
    "NF4_LEVELS",
    "FP4_E2M1_LEVELS",
    "get_format",
    "list_formats",
    "microscaling_formats",
    "activation_formats",
    "gradient_formats",
]

#: Version of the numerics contract in docs/formats.md. Bump it when any code or scale changes.
SPEC_VERSION = 3

#: Smallest positive normal fp32 (2**-126). Inputs and scales below it are flushed to zero so that
#: flush-to-zero hardware (and Triton's FTZ defaults) cannot change a code (docs/formats.md §3).
MIN_NORMAL_F32 = 2.0**-126

CodeKind = Literal["int", "fp4_e2m1", "nf4", "fp8_e4m3", "fp8_e5m2"]

#: How a block's scale is chosen (docs/formats.md §3 and §9). "absmax": fp32 absmax / qmax (every format
#: of spec version 1); "e8m0": OCP MX power-of-two scale 2**(floor(log2 absmax) - emax_elem);
#: "e4m3_tensor": NVFP4's E4M3 block scale times one fp32 per-tensor scale.
ScaleKind = Literal["absmax", "e8m0", "e4m3_tensor"]

# NF4 levels as published by QLoRA / bitsandbytes (normal-quantile code, 0 exactly representable).
# Stored as the exact fp32 values bitsandbytes uses, so our NF4 and theirs decode identically.
NF4_LEVELS: tuple[float, ...] = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
)

# Magnitudes of OCP FP4 E2M1 (1 sign, 2 exponent, 1 mantissa bit, no inf/nan), index = 3-bit code.
FP4_E2M1_LEVELS: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


@dataclass(frozen=True, kw_only=True, slots=True)
class FormatSpec:
    """A named block-scaled format.

    One FP32 scale per ``block`` consecutive elements of the flattened (row-major) tensor;
    ``code = encode(x * RN(1/scale))`` (spec version 3), ``x_hat = decode(code) * scale``. Codes of ``bits`` bits are
    packed little-endian into a bit stream (docs/formats.md §5).
    """

    name: str
    """Registry name, e.g. ``"int4"`` or ``"fp8_e4m3"``."""
    kind: CodeKind
    """Which code maps scaled values to integers."""
    bits: int
    """Bits per stored code (4, 5, 6 or 8)."""
    block: int
    """Elements per scale. A multiple of 8 so that every block starts on a byte boundary."""
    qmax: float
    """Largest code magnitude; ``scale = absmax / qmax`` (fp32, correctly rounded)."""
    role: Literal["activation", "gradient", "both"]
    """What the format is meant for (documentation; any format can store any tensor)."""
    version: int = SPEC_VERSION
    scale_kind: ScaleKind = "absmax"
    """How block scales are chosen. Whatever the kind, ``QuantizedTensor.scales`` holds each block's
    *effective* fp32 scale (decode(code) * scale is the value), so every codec path is shared; the
    compact encodings (E8M0 bytes; E4M3 bytes + fp32 tensor scale) are exact re-encodings of it
    (agoq_core.formats.mx)."""
    fixed_block: bool = False
    """The format fixes its block (OCP MX: 32, NVFP4: 16); :func:`get_format` refuses another one."""

    def __post_init__(self) -> None:
        if self.bits not in (4, 5, 6, 8):
            raise FormatError(f"{self.name}: bits must be 4, 5, 6 or 8, got {self.bits}")
        _check_block(self.name, self.block)

    # ---- derived sizes -------------------------------------------------------------------------
    @property
    def pack_group(self) -> int:
        """Codes per whole number of bytes: 4-bit 2→1 B, 5-bit 8→5 B, 6-bit 4→3 B, 8-bit 1→1 B."""
        return {4: 2, 5: 8, 6: 4, 8: 1}[self.bits]

    @property
    def pack_bytes(self) -> int:
        return self.pack_group * self.bits // 8

    @property
    def zero_code(self) -> int:
        """The code of 0.0 (used for padding, all-zero and non-finite blocks)."""
        if self.kind == "int":
            return 1 << (self.bits - 1)
        if self.kind == "nf4":
            return NF4_LEVELS.index(0.0)
        return 0  # fp4 and fp8: +0 is the all-zero bit pattern

    def num_blocks(self, numel: int) -> int:
        return -(-numel // self.block)

    def code_bytes(self, numel: int) -> int:
        """Bytes of packed codes for ``numel`` elements (the tail is padded to a pack group)."""
        return -(-numel // self.pack_group) * self.pack_bytes

    def storage_bytes(self, numel: int) -> int:
        """Exact bytes a QuantizedTensor of ``numel`` elements holds: codes + fp32 scales."""
        return self.code_bytes(numel) + 4 * self.num_blocks(numel)

    @property
    def bits_per_element(self) -> float:
        """Average bits per element including the scale overhead (32 bits per block)."""
        return self.bits + 32.0 / self.block

    @property
    def tensor_scaled(self) -> bool:
        """True if a block's scale depends on the whole tensor (NVFP4's per-tensor scale): such a format
        can be quantized but not accumulated or reduced block by block."""
        return self.scale_kind == "e4m3_tensor"

    def compact_bytes(self, numel: int) -> int:
        """Bytes of the format's own compact layout (what Blackwell-class tensor cores read): codes plus a
        1-byte scale per block (E8M0 / E4M3), plus the 4-byte tensor scale for NVFP4; fp32 scales otherwise."""
        if self.scale_kind == "absmax":
            return self.storage_bytes(numel)
        return self.code_bytes(numel) + self.num_blocks(numel) + (4 if self.tensor_scaled else 0)

    def with_block(self, block: int) -> "FormatSpec":
        if self.fixed_block and block != self.block:
            raise FormatError(f"{self.name} has a fixed block of {self.block} elements (its spec defines it); "
                              f"got block={block}. Leave block unset for {self.name}.")
        return dataclasses.replace(self, block=block)

    def describe(self) -> str:
        return f"{self.name}(block={self.block}, {self.bits_per_element:.3f} bits/element)"


def _check_block(name: str, block: object) -> None:
    if isinstance(block, bool) or not isinstance(block, int):
        raise FormatError(f"{name}: block must be an int, got {type(block).__name__} {block!r}")
    if block <= 0 or block % 8:
        near = sorted({b for b in ((block // 8) * 8, (block // 8 + 1) * 8) if b >= 8}) if block > 0 else [8]
        raise FormatError(
            f"{name}: block={block} is not a positive multiple of 8; blocks must start on a byte "
            f"boundary for every packing (4/5/6/8-bit). Try block={' or '.join(map(str, near))} "
            f"(defaults: 128 for activations, 256 for gradients)."
        )
    if block > 1 << 20:
        raise FormatError(f"{name}: block={block} is larger than the supported maximum {1 << 20}")


# Default block sizes.
# Activations: 128, as the paper (§4.1) — 0.25 bit/element of scale overhead at 4 bits (6%), small
#   enough that one outlier only coarsens 128 neighbours; it also equals the head/hidden tiling of
#   every LLaMA shape, so blocks never straddle rows.
# Gradients: 256, as the authors' code (blocksize=256) — at 8 bits the scale costs 0.125 bit/element
#   (1.6%), and gradients are less heavy-tailed within a block than activations.
_ACT_BLOCK = 128
_GRAD_BLOCK = 256

_REGISTRY: dict[str, FormatSpec] = {
    s.name: s
    for s in (
        FormatSpec(name="int4", kind="int", bits=4, block=_ACT_BLOCK, qmax=7.0, role="activation"),
        FormatSpec(name="int5", kind="int", bits=5, block=_ACT_BLOCK, qmax=15.0, role="activation"),
        FormatSpec(name="int6", kind="int", bits=6, block=_ACT_BLOCK, qmax=31.0, role="activation"),
        FormatSpec(name="int8", kind="int", bits=8, block=_ACT_BLOCK, qmax=127.0, role="both"),
        FormatSpec(name="fp4_e2m1", kind="fp4_e2m1", bits=4, block=_ACT_BLOCK, qmax=6.0, role="activation"),
        FormatSpec(name="nf4", kind="nf4", bits=4, block=_ACT_BLOCK, qmax=1.0, role="activation"),
        FormatSpec(name="fp8_e4m3", kind="fp8_e4m3", bits=8, block=_GRAD_BLOCK, qmax=448.0, role="gradient"),
        FormatSpec(name="fp8_e5m2", kind="fp8_e5m2", bits=8, block=_GRAD_BLOCK, qmax=57344.0, role="gradient"),
        # OCP Microscaling v1.0 (block 32, E8M0 power-of-two scales) and NVIDIA's NVFP4 (block 16, E4M3 block
        # scale x fp32 tensor scale): the layouts Blackwell-class tensor cores read. docs/formats.md §9.
        FormatSpec(name="mxfp4", kind="fp4_e2m1", bits=4, block=32, qmax=6.0, role="activation",
                   scale_kind="e8m0", fixed_block=True),
        FormatSpec(name="mxfp8", kind="fp8_e4m3", bits=8, block=32, qmax=448.0, role="both",
                   scale_kind="e8m0", fixed_block=True),
        FormatSpec(name="nvfp4", kind="fp4_e2m1", bits=4, block=16, qmax=6.0, role="activation",
                   scale_kind="e4m3_tensor", fixed_block=True),
    )
}


def list_formats(*, microscaling: bool = False) -> list[FormatSpec]:
    """Registered formats with their default block sizes, in a stable order.

    ``microscaling=True`` adds the OCP MX and NVFP4 formats (mxfp4, mxfp8, nvfp4: fixed blocks, E8M0 / E4M3
    scales, docs/formats.md §9); the default lists the block-absmax formats of spec version 1, whose blocks
    are free (what the conformance golden set and the block-size sweeps iterate)."""
    return [s for s in _REGISTRY.values() if microscaling or s.scale_kind == "absmax"]


def activation_formats(*, microscaling: bool = False) -> list[str]:
    return [s.name for s in list_formats(microscaling=microscaling) if s.role in ("activation", "both")]


def gradient_formats(*, microscaling: bool = False) -> list[str]:
    return [s.name for s in list_formats(microscaling=microscaling) if s.role in ("gradient", "both")]


def microscaling_formats() -> list[str]:
    """mxfp4, mxfp8, nvfp4."""
    return [s.name for s in _REGISTRY.values() if s.scale_kind != "absmax"]


def get_format(fmt: str | FormatSpec, block: int | None = None, *, default_block: int | None = None) -> FormatSpec:
    """Look a format up by name (or pass a spec through), optionally with another block size.

    ``int8`` used for gradients keeps the activation default block (128) unless ``block`` is given.
    ``default_block`` is a caller's general block setting (e.g. ``LAAQConfig.block``): it applies to
    formats whose block is free and is ignored by formats that fix their own (mxfp4, mxfp8, nvfp4), whereas
    an explicit ``block`` that such a format cannot take is an error.
    """
    if isinstance(fmt, FormatSpec):
        spec = fmt
    elif isinstance(fmt, str):
        try:
            spec = _REGISTRY[fmt.strip().lower()]
        except KeyError:
            raise FormatError(
                f"unknown format {fmt!r}; known formats: {', '.join(_REGISTRY)}"
            ) from None
    else:
        raise FormatError(f"format must be a name or a FormatSpec, got {type(fmt).__name__}")
    if block is None and default_block is not None and not spec.fixed_block:
        block = default_block
    if block is not None and block != spec.block:
        if spec.fixed_block:
            spec.with_block(block)  # raises: the format fixes its block
        _check_block(spec.name, block)
        spec = spec.with_block(block)
    return spec
