"""Apply a memory-budget plan (agoq_core.planner.budget) to a model in one call.

::

    plan = plan_budget("llama2-7b", budget="80GiB", seq_len=32768)
    report = apply_policy(model, plan)        # or a list of option names, one per decoder layer
    ...train...
    report.undo()

Per decoder layer: ``bf16`` leaves it as is; ``laaq:FMT`` runs ``laaq.apply`` on that layer alone (every
quantized role in FMT, the attention core 16-bit); ``ckpt`` wraps it in torch's ``checkpoint_wrapper``
(non-reentrant torch.utils.checkpoint); ``laaq-mlp:FMT`` converts only the MLP half (post-attention norm and
gated MLP; the attention half stays as it is); ``sac`` wraps it the same way with torchtitan's op-level selective
checkpointing policy (:func:`sac_context_fn`: the outputs of every other GEMM and of the attention kernel are
kept, the rest recomputed); ``qckpt:FMT`` wraps it in :class:`QuantizedCheckpoint`. A kind ending in ``-c`` is
``torch.compile``'d layer by layer; for ``qckpt-c:FMT`` that is the wrapped layer (its forward runs compiled
without grad in forward and compiled with grad when backward recomputes it: two graphs shared by every such
layer), not the wrapper, whose autograd function, RNG bookkeeping and codec calls Dynamo would split into a
dozen graph breaks and run the layer eagerly between them. Wrappers
keep state_dict keys (parameter names seen from the root gain ``_checkpoint_wrapped_module.``, as with
torch's checkpoint_wrapper). With a plan made for the chunked loss, the final norm is
converted too (LAAQ nf4), so ``chunked_linear_cross_entropy(model.model(ids).last_hidden_state, ...)``
keeps only its 4-bit input.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch.nn as nn

from agoq_core.errors import AgoqError

__all__ = ["apply_policy", "PolicyReport", "decoder_layers", "sac_context_fn", "float8_plan_options"]

_ATTR = "_agoq_policy_report"
#: Option kinds apply_policy(float8=...) refuses: LAAQ's float8 GEMMs run in whole compiled decoder layers only.
NOT_FLOAT8 = ("laaq", "laaq-mlp", "laaq-mlp-c")


def float8_plan_options(costs: dict) -> dict:
    """The float8 budget options of a bench_layer_profile ``costs[seq]``: its ``fp8-*`` methods with the prefix
    dropped, less the kinds ``apply_policy(float8=...)`` refuses (NOT_FLOAT8) -- what ``plan_budget(measured=)``
    takes for a plan applied with ``apply_policy(model, plan, float8=True)``."""
    from agoq_core.planner.budget import plan_options

    return {k: c for k, c in plan_options(costs, prefix="fp8-").items() if k.split(":")[0] not in NOT_FLOAT8}


def sac_context_fn():
    """torchtitan's op-level selective-checkpointing policy (torchtitan 0.3,
    ``distributed/activation_checkpoint.py``, ``SelectiveAC``), for ``checkpoint(..., context_fn=...)``: keep
    the outputs of the compute-intensive ops of torch's partitioner (``get_default_op_list()``: mm, bmm,
    addmm, _scaled_mm, the SDPA/flash/efficient attention kernels, ...) plus cuDNN/math attention, aten.max
    (float8 amax), linear, topk and the reduce-scatter / all-to-all collectives -- except every other
    mm/linear, counted per layer -- and recompute everything else. Re-stated so no torchtitan install is
    needed (the CPU flash attention op is added so the policy behaves the same on CPU)."""
    from collections import defaultdict

    import torch
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    ops = torch.ops.aten
    save = set()
    try:
        from torch._functorch.partitioners import get_default_op_list

        save |= {op.default for op in get_default_op_list().compute_intensive_ops}
    except (ImportError, AttributeError):  # an older torch: the ops torchtitan 0.2 listed
        save |= {ops.mm.default, ops._scaled_dot_product_efficient_attention.default,
                 ops._scaled_dot_product_flash_attention.default}
    for name in ("_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math",
                 "_scaled_dot_product_fused_attention_overrideable", "_scaled_dot_product_flash_attention_for_cpu",
                 "max", "linear", "topk"):
        if hasattr(ops, name):
            save.add(getattr(ops, name).default)
    for name in ("reduce_scatter_tensor", "all_to_all_single"):
        if hasattr(torch.ops, "_c10d_functional") and hasattr(torch.ops._c10d_functional, name):
            save.add(getattr(torch.ops._c10d_functional, name).default)
    mm_ops = (ops.mm.default, ops.linear.default)

    def context_fn():
        meta: dict = defaultdict(int)

        def policy(ctx, func, *args, **kwargs):
            key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"
            if func in mm_ops:
                meta[key] += 1
            keep = func in save and not (func in mm_ops and meta[key] % 2 == 0)
            return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    return context_fn


def _laaq_mlp(layer: nn.Module, index: int, fmt: str, backend: str | None, *, float8: bool = False) -> list:
    """LAAQ on the MLP half of a decoder layer only (its post-attention norm keeps its input in ``fmt``, the
    gated MLP its gate/up outputs); the attention half stays as it is."""
    from agoq_core.laaq.config import LAAQConfig
    from agoq_core.laaq.families import match_family
    from agoq_core.laaq.integrate import _get, convert_norm, convert_swiglu

    row = match_family(layer)
    if row is None or not row.mlp or row.gate_up_proj or row.unsupported:
        why = (row.mlp_note or row.unsupported or "fused gate_up projection") if row else "unknown family"
        raise AgoqError(f"laaq-mlp: {type(layer).__name__} has no separate gate/up/down MLP LAAQ converts "
                        f"({why}); use laaq:FMT for this layer")
    cfg = LAAQConfig(norm_input=fmt, mlp_act_input=fmt, attn_out_input=fmt, linear_input=fmt, convert_final_norm=False,
                     backend=backend, float8_gemms=float8)
    reps = [convert_norm(_get(layer, row.post_norm), cfg, layer=index)]
    try:
        reps.append(convert_swiglu(_get(layer, row.mlp), cfg, gate=row.gate_proj, up=row.up_proj, down=row.down_proj,
                                   act=row.act_fn, layer=index))
    except BaseException:
        reps[0].undo()
        raise
    return reps


def decoder_layers(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, attribute name, layer) of every decoder layer of a known LAAQ family, in model order."""
    from agoq_core.laaq.families import FAMILIES

    names = {c for row in FAMILIES.values() for c in row.layer_classes}
    out = []
    for parent in model.modules():
        for attr, child in parent.named_children():
            if any(k.__name__ in names for k in type(child).__mro__):
                out.append((parent, attr, child))
    return out


@dataclass
class PolicyReport:
    choices: tuple[str, ...]
    laaq_reports: list = field(default_factory=list, repr=False)
    _wrapped: list = field(default_factory=list, repr=False)
    _compiled: list = field(default_factory=list, repr=False)
    _model: Any = field(default=None, repr=False)

    def undo(self) -> None:
        for mod in self._compiled:
            mod._compiled_call_impl = None  # what nn.Module.compile set
        self._compiled.clear()
        for rep in reversed(self.laaq_reports):
            rep.undo()
        self.laaq_reports.clear()
        for parent, attr, layer in reversed(self._wrapped):
            parent._modules[attr] = layer
        self._wrapped.clear()
        if self._model is not None:
            self._model.__dict__.pop(_ATTR, None)
            self._model = None

    def __str__(self) -> str:
        mix: dict[str, int] = {}
        for c in self.choices:
            mix[c] = mix.get(c, 0) + 1
        return f"memory-budget policy on {len(self.choices)} layers: " + ", ".join(f"{k} x{v}" for k, v in mix.items())


def device_capacity(model: nn.Module) -> tuple[str, int] | None:
    """(device, total bytes) of the accelerator the model's parameters are on (its torch device module's
    ``get_device_properties(...).total_memory``: CUDA, NPU); None on the CPU or where the module reports none."""
    import torch

    p = next(model.parameters(), None)
    if p is None or p.device.type in ("cpu", "meta"):
        return None
    try:
        props = torch.get_device_module(p.device.type).get_device_properties(p.device)
    except (AttributeError, RuntimeError):
        return None
    total = getattr(props, "total_memory", None)
    return (str(p.device), int(total)) if total else None


def _warn_budget_over_device(model: nn.Module, budget: int | None) -> None:
    """A plan made for more memory than the device has would run out of memory after the model was converted
    (e.g. ``--budget 80GiB`` on an "80 GB" H100, which has 79.2 GiB, part of it the CUDA context's)."""
    cap = device_capacity(model) if budget else None
    if cap and budget > cap[1]:
        warnings.warn(f"apply_policy: the plan was made for a budget of {budget / 2**30:.1f} GiB but {cap[0]} has "
                      f"{cap[1] / 2**30:.1f} GiB in all; it will likely run out of memory. Plan with a budget below "
                      f"the device's memory (plan_budget(..., budget={int(cap[1] * 0.97)}) leaves 3% for the CUDA "
                      "context).", RuntimeWarning, stacklevel=3)


def apply_policy(model: nn.Module, plan: Any, *, convert_final_norm: bool | None = None,
                 backend: str | None = None, compile_backend: str = "inductor", float8: Any = False) -> PolicyReport:
    """Apply ``plan`` (a BudgetPlan, or one option name per decoder layer) to ``model``; returns the report.

    ``convert_final_norm``: default True when the plan is for the chunked loss. Options whose kind ends in
    ``-c`` (``bf16-c``, ``sac-c``, ``laaq-c:nf4``) are also ``torch.compile``'d, layer by layer, with
    ``compile_backend`` (LAAQ's own autograd functions still run eagerly inside a compiled layer).

    ``float8=True`` (or a torchao ``Float8LinearConfig``): every decoder layer's Linears become torchao
    ``Float8Linear`` first (``convert_to_float8_training``; default: tensorwise recipe), and LAAQ layers run their GEMMs in float8 on the inputs they rebuild
    (``LAAQConfig(float8_gemms=True)``, agoq_core.laaq.float8): LAAQ options must then be compiled
    (``laaq-c:FMT``); checkpointed and bf16 layers simply run torchao's float8 layers. Not undone by
    ``report.undo()`` (the float8 conversion stays, as torchao leaves it)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    from agoq_core.laaq.config import LAAQConfig
    from agoq_core.laaq.integrate import apply as laaq_apply
    from agoq_core.laaq.integrate import convert_norm
    from agoq_core.laaq.qcheckpoint import QuantizedCheckpoint
    from agoq_core.planner.budget import parse_option

    choices = tuple(plan.choices) if hasattr(plan, "choices") else tuple(plan)
    if _ATTR in model.__dict__:
        raise AgoqError(f"{type(model).__name__} already has a memory-budget policy; call report.undo() first")
    if any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules()):
        raise AgoqError("the memory-budget policy decides checkpointing per layer; call "
                        "model.gradient_checkpointing_disable() first")
    layers = decoder_layers(model)
    if len(layers) != len(choices):
        raise AgoqError(f"the plan has {len(choices)} layer choices but {type(model).__name__} has {len(layers)} "
                        f"decoder layers; plan for this model (plan_budget(model.config, ...))")
    parsed = [parse_option(c) for c in choices]
    _warn_budget_over_device(model, getattr(plan, "budget_bytes", None))
    if float8:
        bad = sorted({f"{k}:{f}" for k, f in parsed if k in NOT_FLOAT8})
        if bad:
            raise AgoqError(f"apply_policy(float8=True): LAAQ's float8 GEMMs run in whole compiled decoder layers "
                            f"only; use laaq-c:FMT (or a checkpointing / bf16 option) instead of {', '.join(bad)}")
        from torchao.float8 import convert_to_float8_training

        kw = {} if float8 is True else {"config": float8}
        for _, _, layer in layers:
            convert_to_float8_training(layer, module_filter_fn=lambda m, fqn: isinstance(m, nn.Linear), **kw)
        float8 = True
    report = PolicyReport(choices=tuple(k if f is None else f"{k}:{f}" for k, f in parsed))
    try:
        for i, ((parent, attr, layer), (kind, fmt)) in enumerate(zip(layers, parsed)):
            compiled = kind.endswith("-c")
            kind = kind[:-2] if compiled else kind
            if kind == "laaq":
                cfg = LAAQConfig(norm_input=fmt, mlp_act_input=fmt, attn_out_input=fmt, linear_input=fmt,
                                 convert_final_norm=False, backend=backend, float8_gemms=float8)
                report.laaq_reports.append(laaq_apply(layer, cfg))
            elif kind == "laaq-mlp":
                report.laaq_reports.extend(_laaq_mlp(layer, i, fmt, backend, float8=float8))
            elif kind in ("ckpt", "sac"):
                kw = {"context_fn": sac_context_fn()} if kind == "sac" else {}
                parent._modules[attr] = checkpoint_wrapper(layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT, **kw)
                report._wrapped.append((parent, attr, layer))
            elif kind == "qckpt":
                if compiled:  # the wrapped layer, not the wrapper: see compile_target()
                    layer.compile(backend=compile_backend)
                    report._compiled.append(layer)
                parent._modules[attr] = QuantizedCheckpoint(layer, fmt, layer_index=i, backend=backend)
                report._wrapped.append((parent, attr, layer))
            if compiled and kind != "qckpt":
                mod = parent._modules[attr]
                mod.compile(backend=compile_backend)
                report._compiled.append(mod)
        want_final = convert_final_norm if convert_final_norm is not None else getattr(plan, "loss", "") == "chunked"
        if want_final:
            norm = getattr(getattr(model, "model", model), "norm", None)
            if not isinstance(norm, nn.Module):
                raise AgoqError(f"convert_final_norm: {type(model).__name__} has no model.norm; pass "
                                "convert_final_norm=False")
            report.laaq_reports.append(convert_norm(norm, LAAQConfig(backend=backend)))
    except BaseException:
        report.undo()
        raise
    report._model = model
    model.__dict__[_ATTR] = report
    return report
