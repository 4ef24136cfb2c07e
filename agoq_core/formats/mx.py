"""Reference codecs of the microscaling formats: OCP MX (mxfp4, mxfp8) and NVFP4 (docs/formats.md §9).

Pure torch, written from the OCP Microscaling Formats (MX) v1.0 specification and NVIDIA's NVFP4 recipe;
checked in tests against torchao's reference implementations (torchao.prototype.mx_formats).

Representation: ``QuantizedTensor.scales`` holds each block's *effective* fp32 scale, so dequantize,
packing and every backend's decode path are the ones of the other formats (``decode(code) * scale``).
The compact encodings are exact re-encodings of it: an MX scale is a power of two whose fp32 exponent
field is the E8M0 byte (:func:`mx_scales_to_e8m0`); NVFP4's effective scale is
``RN(tensor_scale * e4m3_block_scale)`` and :func:`nvfp4_quantize_compact` returns the two factors.

Shape legend: N = numel, NB = number of blocks, B = block size.
"""
from __future__ import annotations

import torch

from agoq_core.formats.spec import FormatSpec

__all__ = ["quantize_scaled", "nvfp4_tensor_scale", "nvfp4_tensor_scale_from_absmax", "nvfp4_quantize_compact", "mx_scales_to_e8m0",
           "e8m0_to_mx_scales", "EMAX_ELEM", "MX_MIN_EXP", "NVFP4_MIN_TENSOR_SCALE", "NVFP4_SCALE_DIVISOR",
           "E4M3_MIN_SUBNORMAL"]

_EXP = 0x7F800000
#: emax of the element format: largest power of two below its max normal (OCP MX v1.0 §6.3): E2M1 6 = 1.5 * 2**2,
#: E4M3 448 = 1.75 * 2**8.
EMAX_ELEM = {"fp4_e2m1": 2, "fp8_e4m3": 8}
#: Smallest shared exponent. OCP allows -127 (E8M0 byte 0), but 2**-127 is an fp32 subnormal, which
#: flush-to-zero hardware would read as 0; clamping at -126 keeps every scale a normal fp32 and changes a
#: code only for blocks whose absmax is below 2**-124 (OCP would pick 2**-127 or 2**-128 there).
MX_MIN_EXP = -126
#: NVFP4: a tensor scale below this flushes the whole tensor to zero (scales 0, codes 0). It keeps
#: RN(1/S)/s_b finite (< 2**109) and every effective scale a normal fp32; it means a tensor whose absmax is
#: below 2688 * 2**-100 (~2e-27), which carries nothing in a bf16 network. torchao gives NaN/Inf at S = 0.
NVFP4_MIN_TENSOR_SCALE = 2.0**-100
E4M3_MIN_SUBNORMAL = 2.0**-9
#: NVFP4: S = RN(absmax / this): F8E4M3_MAX * F4_E2M1_MAX (torchao per_tensor_amax_to_scale).
NVFP4_SCALE_DIVISOR = 448.0 * 6.0


def _f32(v: float, like: torch.Tensor) -> torch.Tensor:
    """``v`` as a 0-d fp32 tensor on ``like``'s device: a tensor operand, so every backend divides in fp32 with
    correct rounding (a Python scalar divisor may become a multiply by its reciprocal on CUDA). Filled on the
    device: ``torch.tensor`` would copy from pageable host memory, a host-device sync per call on a GPU."""
    return torch.full((), v, dtype=torch.float32, device=like.device)


def _clean_blocks(xb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(xb with subnormals and non-finite values set to +0, per-block non-finite flag) (§3 steps 2-3)."""
    expo = xb.view(torch.int32) & _EXP
    nonfinite = (expo == _EXP).any(dim=1)
    return torch.where((expo == 0) | (expo == _EXP), torch.zeros_like(xb), xb), nonfinite


def nvfp4_tensor_scale(x: torch.Tensor) -> torch.Tensor:
    """NVFP4's fp32 per-tensor scale S = RN(absmax / 2688) over the finite, normal elements of ``x``
    (0-d fp32 tensor on x's device). Below :data:`NVFP4_MIN_TENSOR_SCALE` it is 0 (the tensor flushes)."""
    xf = x.reshape(-1).to(torch.float32)
    if xf.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)
    expo = xf.view(torch.int32) & _EXP
    a = torch.where((expo == 0) | (expo == _EXP), torch.zeros_like(xf), xf.abs()).amax()
    return nvfp4_tensor_scale_from_absmax(a)


def nvfp4_tensor_scale_from_absmax(a: torch.Tensor) -> torch.Tensor:
    """S from the absmax ``a`` (0-d fp32) of the finite, normal elements; the one copy of the step after the
    max: the Triton launchers compute ``a`` with a kernel (a max is exact: any order gives the same bits) and
    call this, so S is bit-identical on every backend (torch's fp32 division is correctly rounded on CPU,
    CUDA and NPU)."""
    a = a.to(torch.float32)
    s = a / _f32(NVFP4_SCALE_DIVISOR, a)
    return torch.where(s < NVFP4_MIN_TENSOR_SCALE, torch.zeros_like(s), s)


def _e4m3_round(v: torch.Tensor) -> torch.Tensor:
    """fp32 values in [2**-9, 448] rounded to the nearest E4M3 value, ties to even (exact fp32 result)."""
    return v.to(torch.float8_e4m3fn).to(torch.float32)


def _block_scales(xb: torch.Tensor, spec: FormatSpec, tensor_scale: torch.Tensor | None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(effective fp32 scale [NB], what to multiply x by [NB], the NVFP4 E4M3 block scale [NB] or None)."""
    amax = xb.abs().amax(dim=1)
    if spec.scale_kind == "e8m0":
        # floor(log2(amax)) is amax's unbiased exponent (amax is 0 or a normal fp32 after the flush)
        e = ((amax.view(torch.int32) >> 23) & 0xFF) - 127 - EMAX_ELEM[spec.kind]
        e = e.clamp(min=MX_MIN_EXP)  # <= 127 - 2 always: no upper clamp needed
        scale = ((e + 127) << 23).view(torch.float32)
        inv = ((127 - e) << 23).view(torch.float32)  # 2**-e, exact and normal (-e in [-125, 126])
        zero = amax == 0
        return torch.where(zero, 0.0, scale), torch.where(zero, 0.0, inv), None
    if spec.scale_kind == "e4m3_tensor":
        s = tensor_scale
        if float(s) == 0.0:  # the whole tensor flushes
            z = torch.zeros_like(amax)
            return z, z, z
        # torchao nvfp4_quantize (two-level): s_b = e4m3(clamp(RN(RN(amax / 6) / S), 2**-9, 448));
        # x is multiplied by RN(RN(1 / S) / s_b); dequantize multiplies by RN(S * s_b).
        sb = _e4m3_round(((amax / _f32(6.0, amax)) / s).clamp(E4M3_MIN_SUBNORMAL, 448.0))
        inv = (_f32(1.0, amax) / s) / sb
        return s * sb, inv, sb
    raise ValueError(f"{spec.name}: scale kind {spec.scale_kind!r} is not a microscaling kind")


def quantize_scaled(xf: torch.Tensor, spec: FormatSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat fp32 ``xf`` (N > 0) -> (packed uint8 codes, effective fp32 scales [NB]) for an MX/NVFP4 spec.

    Steps (docs/formats.md §9): flush subnormals, non-finite flag; block scale; v = x * inv (exact for MX:
    a power of two; NVFP4: one rounding, as torchao); element encode with saturation to ±qmax and ties to
    even; no negative-zero code; a non-finite block gets scale NaN and zero codes."""
    from agoq_core.formats.packing import pack_codes
    from agoq_core.formats.reference import encode

    n = xf.numel()
    nb = spec.num_blocks(n)
    tensor_scale = nvfp4_tensor_scale(xf) if spec.tensor_scaled else None
    pad = nb * spec.block - n
    if pad:
        xf = torch.cat([xf, xf.new_zeros(pad)])
    xb, nonfinite = _clean_blocks(xf.view(nb, spec.block))
    scale, inv, _ = _block_scales(xb, spec, tensor_scale)
    v = xb * inv[:, None]
    codes = encode(v.clamp(-spec.qmax, spec.qmax), spec)
    codes = torch.where((codes & 0x7F) == 0, 0, codes) if spec.bits == 8 else codes  # no -0 code (fp4 has none)
    codes[nonfinite] = 0
    scale = torch.where(nonfinite, torch.full_like(scale, float("nan")), scale)
    n_codes = -(-n // spec.pack_group) * spec.pack_group
    return pack_codes(codes.reshape(-1)[:n_codes], spec), scale


def nvfp4_quantize_compact(x: torch.Tensor, spec: FormatSpec | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """NVFP4 in its compact layout: (packed E2M1 codes, E4M3 block scales as uint8 [NB], fp32 tensor scale).

    The codes equal ``quantize_scaled``'s; ``S * fp32(block scale)`` rounded once is its effective scale.
    A non-finite block's scale byte is 0x7F (E4M3 NaN)."""
    from agoq_core.formats.spec import get_format

    spec = spec or get_format("nvfp4")
    xf = x.reshape(-1).to(torch.float32)
    codes, _ = quantize_scaled(xf, spec)
    nb = spec.num_blocks(xf.numel())
    s = nvfp4_tensor_scale(xf)
    pad = nb * spec.block - xf.numel()
    xb, nonfinite = _clean_blocks(torch.cat([xf, xf.new_zeros(pad)]).view(nb, spec.block))
    _, _, sb = _block_scales(xb, spec, s)
    sb8 = sb.to(torch.float8_e4m3fn).view(torch.uint8).clone()
    sb8[nonfinite] = 0x7F
    return codes, sb8, s


def mx_scales_to_e8m0(scales: torch.Tensor) -> torch.Tensor:
    """Effective MX scales (fp32 powers of two, 0 for an all-zero block, NaN for a non-finite one) -> the
    E8M0 bytes (uint8): the fp32 exponent field; 0 -> 0x00 (2**-127, which this contract never uses for a
    non-zero block, so the map is a bijection); NaN -> 0xFF."""
    b = ((scales.view(torch.int32) >> 23) & 0xFF).to(torch.uint8)
    return torch.where(torch.isnan(scales), torch.full_like(b, 0xFF), b)


def e8m0_to_mx_scales(e8m0: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`mx_scales_to_e8m0`."""
    e = e8m0.to(torch.int32)
    s = (e << 23).view(torch.float32)
    return torch.where(e == 0xFF, float("nan"), torch.where(e == 0, 0.0, s))
