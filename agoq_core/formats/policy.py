"""Hardware-aware format defaults: what the defaults pick on a device without low-precision float units.

Every backend produces every registered format bit-exactly (FP8 and FP4 codes are made with integer
logic), so this is not about correctness: on a part without FP8/FP4 arithmetic (Ascend A2/A3, declared by
``Capabilities.native_float_formats``) a float-coded format buys nothing over an integer one of the same
width, and any consumer of the codes outside AGoQ (a vendor kernel, a cast) cannot use them natively. So
the *defaults* -- never an explicit choice -- switch to the integer formats there, and say why.
"""
from __future__ import annotations

from typing import Iterable

__all__ = ["FLOAT_CODE_FORMATS", "DEFAULT_GRADIENT_FORMAT", "INTEGER_GRADIENT_FORMAT", "default_gradient_format",
           "fp8_cast_unavailable", "hardware_candidates"]

FLOAT_CODE_FORMATS = frozenset({"fp4_e2m1", "fp8_e4m3", "fp8_e5m2"})
DEFAULT_GRADIENT_FORMAT = "fp8_e4m3"
INTEGER_GRADIENT_FORMAT = "int8"


def _missing(caps, names: Iterable[str]) -> list[str]:
    native = getattr(caps, "native_float_formats", None)
    if native is None:
        return []
    return [n for n in names if n in FLOAT_CODE_FORMATS and n not in native]


def _device(caps) -> str:
    notes = getattr(caps, "notes", ()) or ()
    dev = next((n for n in notes if n.startswith("device:")), "")
    return dev.split(";")[0].removeprefix("device:").strip() or "this device"


def default_gradient_format(caps) -> tuple[str, str | None]:
    """(format QuanGrad's default resolves to, reason or None): fp8_e4m3, or int8 where the device has no
    FP8 units."""
    if _missing(caps, [DEFAULT_GRADIENT_FORMAT]):
        return INTEGER_GRADIENT_FORMAT, (
            f"{_device(caps)} has no FP8 units (Capabilities.native_float_formats="
            f"{sorted(caps.native_float_formats)}): QuanGrad's default gradient format is {INTEGER_GRADIENT_FORMAT} "
            f"there instead of {DEFAULT_GRADIENT_FORMAT} (same 8 bits and block; pass fmt='{DEFAULT_GRADIENT_FORMAT}' "
            "to keep FP8 codes, which are still produced bit-exactly with integer logic)")
    return DEFAULT_GRADIENT_FORMAT, None


def fp8_cast_unavailable(caps, fmt: str) -> str | None:
    """Why torch's own FP8 casts (the naive FP8 all-reduce baseline uses them) cannot run on this device, or None."""
    if _missing(caps, [fmt]):
        return (f"{_device(caps)} has no FP8 units: torch's casts to {fmt} are not supported there (on Ascend A2/A3 "
                "aclnnCast rejects FP8 dtypes), so the naive FP8 all-reduce baseline cannot run; QuanGrad itself "
                "works (its FP8 codes are made with integer logic)")
    return None


def hardware_candidates(caps, candidates: Iterable[str]) -> tuple[tuple[str, ...], str | None]:
    """(candidates without the float codes the device has no units for, reason or None)."""
    cands = tuple(candidates)
    drop = _missing(caps, cands)
    if not drop:
        return cands, None
    kept = tuple(c for c in cands if c not in drop)
    return kept, (f"{_device(caps)} has no units for {', '.join(drop)}: default candidates are "
                  f"{', '.join(kept)} (name them with --candidates to plan with them anyway)")
