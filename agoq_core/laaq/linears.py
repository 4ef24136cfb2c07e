"""What LAAQ calls "a linear": a plain ``nn.Linear`` or a PEFT LoRA wrapper around one.

LAAQ's autograd functions treat both the same way: one input ``x`` (kept once, 4-bit, or rebuilt
from a converted norm), the base GEMM ``x Wᵀ + b`` handled by LAAQ's own seams (agoq_core.laaq.fusion),
and zero or more LoRA adapters ``(B(A(dropout(x))) * scaling)`` added on top, exactly in PEFT's order.
The adapters are rank-r GEMMs: in backward they are re-run under autograd from the rebuilt ``x``
(cost r/out of the base GEMM) so their derivatives are PyTorch's own. A dropout mask is kept as
bits (1/32 of an fp32 copy of ``x``); everything else of the adapter path is recomputed.

PEFT is recognised by structure (``base_layer`` + ``lora_A``/``lora_B`` ModuleDicts + ``scaling``), so
importing this module imports no peft. What LAAQ cannot reproduce exactly (DoRA and other LoRA
variants, ``fan_in_fan_out`` Conv1D bases, quantized base layers, per-batch ``adapter_names``) is
refused or left unconverted with a reason, never approximated.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["LinearMeta", "AdapterMeta", "is_lora_wrapper", "linear_problem", "resolve", "adapter_forward",
           "adapter_backward", "amp_state", "amp_context", "pack_mask", "unpack_mask"]


# ---- autocast: record it in forward, re-enter it in backward --------------------------------------
def amp_state(device_type: str) -> tuple[str, bool, torch.dtype | None]:
    """The autocast state forward ran under (what torch.amp.custom_fwd records, for any device)."""
    try:
        on = torch.is_autocast_enabled(device_type)
    except (TypeError, RuntimeError):  # a device type autocast does not know (e.g. meta)
        return device_type, False, None
    return device_type, on, (torch.get_autocast_dtype(device_type) if on else None)


def amp_context(state: tuple[str, bool, torch.dtype | None]) -> Any:
    """Re-enter ``state`` in backward so recomputations and GEMMs see forward's dtypes (custom_bwd)."""
    device_type, on, dtype = state
    if not on:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=dtype, enabled=True)


# ---- what a linear is ----------------------------------------------------------------------------
def _plain(m: Any) -> bool:
    return isinstance(m, nn.Linear) and type(m).forward is nn.Linear.forward


def is_lora_wrapper(m: Any) -> bool:
    """A PEFT ``lora.Linear`` (or anything shaped like it): base_layer + lora_A/lora_B ModuleDicts."""
    return (isinstance(m, nn.Module) and isinstance(getattr(m, "base_layer", None), nn.Module)
            and isinstance(getattr(m, "lora_A", None), nn.ModuleDict)
            and isinstance(getattr(m, "lora_B", None), nn.ModuleDict)
            and isinstance(getattr(m, "scaling", None), dict))


def linear_problem(m: Any) -> str | None:
    """Why LAAQ cannot convert ``m`` as a linear (None: it can)."""
    if is_lora_wrapper(m):
        base = m.base_layer
        if not _plain(base):
            return (f"PEFT LoRA over {type(base).__name__}, not a plain nn.Linear (QLoRA/quantized base layers "
                    "keep their own input format)")
        if getattr(m, "fan_in_fan_out", False):
            return "PEFT LoRA with fan_in_fan_out=True (Conv1D-style transposed weight)"
        for name in m.lora_A:
            if not (_plain(m.lora_A[name]) and _plain(m.lora_B[name])):
                return f"PEFT adapter {name!r} is not a pair of plain nn.Linear"
        return None
    if not isinstance(m, nn.Linear):
        return f"is {type(m).__name__}, not nn.Linear"
    if type(m).forward is not nn.Linear.forward:
        return f"{type(m).__name__} overrides nn.Linear.forward (quantized or adapter layer?)"
    return None


@dataclass(frozen=True)
class AdapterMeta:
    """One active LoRA adapter as forward ran it."""

    name: str
    scaling: float
    dropout: Callable | None      # the adapter's dropout module when it drops (training, p > 0)
    has_bias: bool                # lora_B bias (PEFT lora_bias=True)
    cast: torch.dtype | None      # PEFT casts x to lora_A.weight.dtype first


@dataclass(frozen=True)
class LinearMeta:
    """Static layout of a resolved linear; the tensors travel separately (autograd inputs)."""

    has_bias: bool
    adapters: tuple[AdapterMeta, ...] = ()
    peft: bool = False

    @property
    def n_tensors(self) -> int:
        return 2 + sum(3 if a.has_bias else 2 for a in self.adapters)


def _dropout_active(d: Any) -> bool:
    if d is None or isinstance(d, nn.Identity):
        return False
    if isinstance(d, nn.Dropout):
        return d.training and d.p > 0
    return True  # unknown module: treat as stochastic, take its mask from a call on ones


def resolve(m: nn.Module) -> tuple[LinearMeta, list[torch.Tensor | None]]:
    """The layout and tensors of ``m`` as its forward would run it now (adapters on/off, merged)."""
    if not is_lora_wrapper(m):
        return LinearMeta(has_bias=m.bias is not None), [m.weight, m.bias]
    base = m.base_layer
    tensors: list[torch.Tensor | None] = [base.weight, base.bias]
    adapters: list[AdapterMeta] = []
    if not getattr(m, "disable_adapters", False) and not getattr(m, "merged", False):
        variants = getattr(m, "lora_variant", {}) or {}
        for name in m.active_adapters:
            if name not in m.lora_A:
                continue
            if name in variants:
                from agoq_core.errors import AgoqError
                raise AgoqError(f"LAAQ cannot reproduce the LoRA variant {type(variants[name]).__name__} of adapter "
                                f"{name!r} (DoRA and others); use plain LoRA or agoq_core.laaq.remove(model)")
            a, b = m.lora_A[name], m.lora_B[name]
            drop = m.lora_dropout[name] if name in m.lora_dropout else None
            cast = a.weight.dtype if getattr(m, "cast_input_dtype_enabled", True) else None
            adapters.append(AdapterMeta(name, float(m.scaling[name]), drop if _dropout_active(drop) else None,
                                        b.bias is not None, cast))
            tensors += [a.weight, b.weight] + ([b.bias] if b.bias is not None else [])
    return LinearMeta(has_bias=base.bias is not None, adapters=tuple(adapters), peft=True), tensors


# ---- dropout masks, kept as bits --------------------------------------------------------------
_BITS = (1 << torch.arange(8, dtype=torch.int32))


def pack_mask(keep: torch.Tensor) -> tuple[torch.Tensor, torch.Size]:
    flat = keep.reshape(-1).to(torch.int32)
    pad = (-flat.numel()) % 8
    if pad:
        flat = F.pad(flat, (0, pad))
    return (flat.view(-1, 8) * _BITS.to(flat.device)).sum(1).to(torch.uint8), keep.shape


def unpack_mask(packed: tuple[torch.Tensor, torch.Size]) -> torch.Tensor:
    bits, shape = packed
    n = 1
    for s in shape:
        n *= s
    keep = (bits.to(torch.int32)[:, None] & _BITS.to(bits.device)) != 0
    return keep.reshape(-1)[:n].view(shape)


def _dropout_scale(drop: Callable, x: torch.Tensor) -> tuple[torch.Tensor, tuple]:
    """The multiplier dropout applies to ``x`` (mask / (1 - p)) from one call on ones: the same RNG
    draws as ``drop(x)``, and ``x * m`` is the product torch's CPU dropout computes. The kept bits are
    announced to the memory meters like every other kept tensor."""
    from agoq_core.laaq import storage

    with torch.no_grad():
        m = drop(torch.ones_like(x))
    packed = pack_mask(m != 0)
    storage.record(packed[0], role="lora_dropout_mask", layer=None)
    return m, packed


def _mask_from(packed: tuple, drop: Callable, dtype: torch.dtype) -> torch.Tensor:
    p = float(getattr(drop, "p", 0.0))
    keep = unpack_mask(packed)
    return keep.to(dtype) * (1.0 / (1.0 - p)) if p < 1 else torch.zeros(keep.shape, dtype=dtype, device=keep.device)


# ---- adapter path ---------------------------------------------------------------------------------
def _adapter_tensors(meta: LinearMeta, tensors: Sequence[torch.Tensor | None]):
    i = 2
    for a in meta.adapters:
        n = 3 if a.has_bias else 2
        yield a, tensors[i], tensors[i + 1], (tensors[i + 2] if a.has_bias else None), i
        i += n


def adapter_forward(x: torch.Tensor, result: torch.Tensor, meta: LinearMeta,
                    tensors: Sequence[torch.Tensor | None]) -> tuple[torch.Tensor, list]:
    """PEFT's ``result + lora_B(lora_A(dropout(x))) * scaling`` per adapter, then ``.to(result dtype)``;
    also returns the dropout masks (packed, or None) to keep for backward."""
    if not meta.adapters:
        return result, []
    dtype = result.dtype
    masks = []
    for a, wa, wb, bb, _ in _adapter_tensors(meta, tensors):
        xa = x.to(a.cast) if a.cast is not None and x.dtype != a.cast else x
        if a.dropout is not None:
            m, packed = _dropout_scale(a.dropout, xa)
            xa = xa * m
            masks.append(packed)
        else:
            masks.append(None)
        result = result + F.linear(F.linear(xa, wa), wb, bb) * a.scaling
    return result.to(dtype), masks


def adapter_backward(grad_out: torch.Tensor, x: torch.Tensor, meta: LinearMeta,
                     tensors: Sequence[torch.Tensor | None], masks: list, needs: Sequence[bool],
                     need_x: bool) -> tuple[torch.Tensor | None, list[torch.Tensor | None]]:
    """Gradients of the adapter path given the rebuilt input ``x``: (dx contribution, grads aligned with
    ``tensors``, ``needs`` saying which are wanted; None for the base weight/bias). Re-runs the rank-r
    GEMMs under autograd."""
    grads: list[torch.Tensor | None] = [None] * len(tensors)
    if not meta.adapters:
        return None, grads
    dx = None
    for (a, wa, wb, bb, i), packed in zip(_adapter_tensors(meta, tensors), masks):
        want = [needs[i], needs[i + 1]] + ([needs[i + 2]] if a.has_bias else [])
        if not any(want) and not need_x:
            continue
        with torch.enable_grad():
            xr = x.detach().requires_grad_(need_x)
            leaves = [t.detach().requires_grad_(w) for t, w in zip((wa, wb, bb)[:len(want)], want)]
            xa = xr.to(a.cast) if a.cast is not None and xr.dtype != a.cast else xr
            if packed is not None:
                xa = xa * _mask_from(packed, a.dropout, xa.dtype).reshape(xa.shape)
            out = F.linear(F.linear(xa, leaves[0]), leaves[1], leaves[2] if a.has_bias else None) * a.scaling
            inputs = ([xr] if need_x else []) + [t for t, w in zip(leaves, want) if w]
            got = list(torch.autograd.grad(out, inputs, grad_out.to(out.dtype)))
        if need_x:
            g = got.pop(0)
            dx = g if dx is None else dx + g
        for k, w in enumerate(want):
            if w:
                grads[i + k] = got.pop(0)
    return dx, grads
