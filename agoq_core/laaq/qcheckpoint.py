"""Quantized-input checkpointing: a layer keeps only its input, in a 4-8 bit activation format, and runs
its forward again in backward from the dequantized input.

Full activation checkpointing keeps a decoder layer's bf16 input (2 bytes x tokens x hidden);
:class:`QuantizedCheckpoint` keeps it at 4-8 bits through LAAQ's codecs (``agoq_core.laaq.storage``: the
selected backend, reported to the memory meters), 0.53 bytes per element at nf4 block 128. Gradients are
those of the layer at the *dequantized* input (as LAAQ's are for the tensors it stores): within
``GRAD_REL_L2`` of the plain layer's (tests/laaq/test_policy.py).

It is a real module wrapper (torch's ``ActivationWrapper``, the base of ``checkpoint_wrapper``): the
state_dict keys are those of the wrapped layer (the ``_checkpoint_wrapped_module.`` prefix is stripped, as for
``checkpoint_wrapper``; parameter names seen from the model's root keep it, as there), attributes resolve to it.
Parameters enter the autograd function as inputs, so their gradients flow through autograd as usual
(``torch.autograd.grad``, DDP/FSDP hooks, PEFT adapters). RNG state (dropout) and autocast are replayed
as in forward.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import ActivationWrapper
from torch.utils.checkpoint import get_device_states, set_device_states

from agoq_core.errors import AgoqError
from agoq_core.formats.spec import FormatSpec, activation_formats, get_format
from agoq_core.laaq import storage

__all__ = ["QuantizedCheckpoint", "GRAD_REL_L2", "grad_tolerance"]

#: Relative L2 error of a quantized-checkpointed layer's gradients (input and weights) against the
#: plain layer's, by stored bits. Measured on a tiny HF Llama layer (hidden 128, fp32, random init,
#: tests/laaq/test_policy.py): worst 0.161 (nf4) / 0.092 (int5) / 0.044 (int6) / 0.011 (int8), always the
#: Q/K weight gradients (the paper's Table 13 sees the same at 4 bits: 0.14-0.15); floors leave ~1.5x.
GRAD_REL_L2: dict[int, float] = {4: 0.25, 5: 0.14, 6: 0.07, 8: 0.018}


def grad_tolerance(fmt: str | FormatSpec) -> float:
    spec = fmt if isinstance(fmt, FormatSpec) else get_format(fmt)
    return GRAD_REL_L2[spec.bits]


def _autocast_state(device_type: str) -> dict:
    return {"device_type": device_type, "enabled": torch.is_autocast_enabled(device_type),
            "dtype": torch.get_autocast_dtype(device_type), "cache_enabled": torch.is_autocast_cache_enabled()}


class _QuantizedCheckpointFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run, spec: FormatSpec, layer: int | None, backend: str | None, preserve_rng: bool,
                x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        ctx.run, ctx.backend, ctx.preserve_rng = run, backend, preserve_rng
        ctx.params = params  # parameters, not activations (as LAAQ's NormFunction)
        ctx.autocast = _autocast_state(x.device.type)
        ctx.cpu_autocast = _autocast_state("cpu") if x.device.type != "cpu" else None
        if preserve_rng:
            ctx.cpu_rng = torch.get_rng_state()
            ctx.devices, ctx.device_states = get_device_states(x) if x.device.type != "cpu" else ([], [])
            ctx.device_type = x.device.type
        ctx.stored = storage.store(x, spec, role="layer_input", layer=layer, backend=backend)
        out = run(x)
        if not isinstance(out, torch.Tensor):
            raise AgoqError(f"QuantizedCheckpoint: the wrapped layer returned {type(out).__name__}; it must return "
                            "one tensor (HF transformers 5.x decoder layers do)")
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        if ctx.stored is None:
            raise RuntimeError("QuantizedCheckpoint: backward ran twice through a freed layer input; call backward "
                               "with retain_graph=True the first time")
        x = storage.load(ctx.stored, None, ctx.backend).detach()
        need_x = ctx.needs_input_grad[5]
        x.requires_grad_(need_x)
        rng_devices = ctx.devices if ctx.preserve_rng else []
        with torch.random.fork_rng(devices=rng_devices, enabled=ctx.preserve_rng,
                                   device_type=getattr(ctx, "device_type", "cpu")):
            if ctx.preserve_rng:
                torch.set_rng_state(ctx.cpu_rng)
                if rng_devices:
                    set_device_states(ctx.devices, ctx.device_states, device_type=ctx.device_type)
            with torch.enable_grad(), torch.autocast(**ctx.autocast):
                if ctx.cpu_autocast is not None:
                    with torch.autocast(**ctx.cpu_autocast):
                        out = ctx.run(x)
                else:
                    out = ctx.run(x)
        pmask = ctx.needs_input_grad[6:]
        wanted = ([x] if need_x else []) + [p for p, need in zip(ctx.params, pmask) if need]
        got = list(torch.autograd.grad(out, wanted, grad_out, allow_unused=True)) if wanted else []
        del out
        from agoq_core.laaq.functions import graph_kept

        if not graph_kept():
            ctx.stored = None
        dx = got.pop(0) if need_x else None
        dparams = [got.pop(0) if need else None for need in pmask]
        return (None, None, None, None, None, dx, *dparams)


def _tensors(obj: Any):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


class QuantizedCheckpoint(ActivationWrapper):
    """Wrap ``layer`` so that it keeps only its first argument (the hidden states) in ``fmt`` and is
    recomputed in backward. Other tensor arguments (RoPE tables, masks) are kept by reference and must not
    need gradients. Without autograd (inference) the layer runs as is."""

    def __init__(self, layer: torch.nn.Module, fmt: str | FormatSpec = "nf4", *, layer_index: int | None = None,
                 backend: str | None = None, preserve_rng_state: bool = True) -> None:
        super().__init__(layer)
        spec = fmt if isinstance(fmt, FormatSpec) else None
        if spec is None:
            if not isinstance(fmt, str) or fmt.strip().lower() not in activation_formats():
                raise AgoqError(f"QuantizedCheckpoint: format {fmt!r} is not an activation format; use one of "
                                f"{activation_formats()}")
            spec = get_format(fmt)
        if spec.name not in activation_formats():
            raise AgoqError(f"QuantizedCheckpoint: {spec.name} is a gradient format; use one of {activation_formats()}")
        # plain attributes, not submodules/buffers: nothing extra in state_dict
        self.__dict__["_agoq_qckpt"] = (spec, layer_index, backend, bool(preserve_rng_state))

    @property
    def spec(self) -> FormatSpec:
        return self.__dict__["_agoq_qckpt"][0]

    def extra_repr(self) -> str:
        spec, idx, _, _ = self.__dict__["_agoq_qckpt"]
        return f"fmt={spec.name}, layer={idx}"

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        layer = self._checkpoint_wrapped_module
        if not torch.is_grad_enabled() or not isinstance(hidden_states, torch.Tensor):
            return layer(hidden_states, *args, **kwargs)
        for t in _tensors((args, kwargs)):
            if t.requires_grad:
                raise AgoqError("QuantizedCheckpoint: only the layer's first argument (the hidden states) may "
                                "require grad; another tensor argument does (its gradient would be lost). Use "
                                "torch.utils.checkpoint for this layer")
        spec, idx, backend, rng = self.__dict__["_agoq_qckpt"]
        params = tuple(p for p in layer.parameters() if p.requires_grad)

        def run(x: torch.Tensor) -> Any:
            return layer(x, *args, **kwargs)

        return _QuantizedCheckpointFunction.apply(run, spec, idx, backend, rng, hidden_states, *params)
