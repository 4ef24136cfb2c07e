"""Turning LAAQ on and off in a model: ``apply(model, config) -> LAAQReport``, ``remove(model)``.

Nothing is replaced: the converted modules keep their class, parameters and state_dict keys; LAAQ
sets an instance ``forward`` (a bound method, so ``copy.deepcopy`` of a converted model stays
correct) and a ``_agoq_laaq`` record on each, and ``undo`` deletes both. Checkpoints load and save
unchanged. With autograd disabled (inference) every converted module runs its original forward.
"""
from __future__ import annotations

import functools
import logging
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
import torch.nn as nn

from agoq_core.errors import AgoqError
from agoq_core.formats.spec import FormatSpec
from agoq_core.laaq.attention import attention_core_hooks
from agoq_core.laaq.config import NATIVE, LAAQConfig, RolePlan
from agoq_core.laaq.families import FAMILIES, LayerFamily
from agoq_core.laaq.functions import (NormSource, RecomputedInputLinear, SavedInputLinear, SwiGLUFunction,
                                      find_source, kept_by_producer, norm_apply)

__all__ = ["apply", "remove", "convert_norm", "convert_linear", "convert_swiglu", "LAAQReport", "Conversion",
           "Skip", "is_converted"]

log = logging.getLogger("agoq.laaq")
_REPORT_ATTR = "_agoq_laaq_report"
_STATE_ATTR = "_agoq_laaq"


@dataclass(frozen=True)
class Conversion:
    path: str
    kind: str            # norm | linear | swiglu | attention_core
    layer: int | None
    formats: dict[str, str]


@dataclass(frozen=True)
class Skip:
    path: str
    reason: str


@dataclass
class _State:
    kind: str
    orig: Callable
    layer: int | None
    plan: RolePlan
    backend: str | None
    role: str = ""
    names: tuple[str, ...] = ()
    had_forward: bool = False
    old_forward: Any = None


@dataclass
class LAAQReport:
    """What ``apply`` converted and skipped (with reasons). ``undo()`` restores the model exactly."""

    model_class: str
    config: LAAQConfig
    converted: list[Conversion] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    _modules: list[nn.Module] = field(default_factory=list, repr=False)
    _owner: Any = field(default=None, repr=False)

    @property
    def layers(self) -> list[int]:
        return sorted({c.layer for c in self.converted if c.layer is not None})

    def undo(self) -> None:
        for m in reversed(self._modules):
            _unpatch(m)
        self._modules.clear()
        if self._owner is not None and self._owner.__dict__.get(_REPORT_ATTR) is self:
            del self._owner.__dict__[_REPORT_ATTR]
        self._owner = None

    def to_dict(self) -> dict:
        return {
            "model_class": self.model_class,
            "config": self.config.describe(),
            "converted": [c.__dict__ for c in self.converted],
            "skipped": [s.__dict__ for s in self.skipped],
        }

    def __str__(self) -> str:
        kinds: dict[str, int] = {}
        for c in self.converted:
            kinds[c.kind] = kinds.get(c.kind, 0) + 1
        lines = [f"LAAQ on {self.model_class}: {len(self.layers)} decoder layers, "
                 + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) + f"; {len(self.skipped)} skipped",
                 f"  {self.config.describe()}"]
        lines += [f"  skipped {s.path}: {s.reason}" for s in self.skipped]
        return "\n".join(lines)


# ---- the converted forwards (bound to their module; state in module._agoq_laaq) -------------------
def _norm_forward(self: nn.Module, x: Any, *args: Any, **kwargs: Any) -> Any:
    st: _State = self.__dict__[_STATE_ATTR]
    if args or kwargs or not torch.is_grad_enabled() or not isinstance(x, torch.Tensor):
        return st.orig(x, *args, **kwargs)
    src = NormSource(st.orig, st.plan["norm_input"], st.layer, st.backend)
    return norm_apply(x, src, tuple(p for p in self.parameters()))


def _linear_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    st: _State = self.__dict__[_STATE_ATTR]
    if not torch.is_grad_enabled():
        return st.orig(x)
    src, view = find_source(x)
    if src is not None:
        return RecomputedInputLinear.apply(x, self.weight, self.bias, src, view)
    # Keep by reference what the producer keeps anyway -- unless the attention core is being
    # quantized (then the producer's copy is 4-bit and a reference would pin the 16-bit one).
    alias = st.plan["attention_core"] is None and x.requires_grad and kept_by_producer(x)
    return SavedInputLinear.apply(x, self.weight, self.bias, st.plan[st.role], st.role, st.layer, st.backend,
                                  alias)


def _swiglu_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    st: _State = self.__dict__[_STATE_ATTR]
    if not torch.is_grad_enabled():
        return st.orig(x)
    gate, up, down = (_get(self, n) for n in st.names[:3])
    act = _activation(self, st.names[3])
    src, view = find_source(x)
    return SwiGLUFunction.apply(x, gate.weight, up.weight, down.weight, gate.bias, up.bias, down.bias, src, view,
                                act, st.plan["mlp_act_input"], st.plan["linear_input"], st.layer, st.backend)


def _attention_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    st: _State = self.__dict__[_STATE_ATTR]
    if not torch.is_grad_enabled():
        return st.orig(*args, **kwargs)
    with attention_core_hooks(st.plan["attention_core"], st.layer, st.backend):
        return st.orig(*args, **kwargs)


_PLAIN_FORWARDS = {"norm": _norm_forward, "linear": _linear_forward, "swiglu": _swiglu_forward,
                   "attention_core": _attention_forward}


@functools.lru_cache(maxsize=1)
def _forwards() -> dict[str, Callable]:
    """The converted forwards, hidden from torch.compile.

    Dynamo would trace into them and lose the NormSource attached to a norm output (tensor attributes
    do not survive tracing), silently turning "recompute" into "quantize the GEMM input". Disabled,
    they run eagerly and the code between them (attention, RoPE, residuals) is still compiled
    (tests/laaq/test_compile.py). Built on first use, not at import: torch.compiler.disable imports
    torch._dynamo, which imports triton where it is installed.
    """
    return {k: torch.compiler.disable(f, recursive=True) for k, f in _PLAIN_FORWARDS.items()}


def _patch(m: nn.Module, st: _State) -> None:
    st.had_forward = "forward" in m.__dict__
    st.old_forward = m.__dict__.get("forward")
    m.__dict__[_STATE_ATTR] = st
    m.forward = types.MethodType(_forwards()[st.kind], m)


def _unpatch(m: nn.Module) -> None:
    st: _State | None = m.__dict__.pop(_STATE_ATTR, None)
    if st is None:
        return
    if st.had_forward:
        m.__dict__["forward"] = st.old_forward
    else:
        m.__dict__.pop("forward", None)


def is_converted(m: nn.Module) -> bool:
    return _STATE_ATTR in m.__dict__


# ---- helpers ------------------------------------------------------------------------------------
def _get(root: nn.Module, path: str) -> Any:
    obj: Any = root
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


# Activations an MLP may call inline instead of holding a module (torchtitan's FeedForward calls
# F.silu): a family row names them in ``act_fn`` when the MLP has no attribute of that name.
_INLINE_ACTIVATIONS: dict[str, Callable] = {"silu": torch.nn.functional.silu}


def _activation(mlp: nn.Module, name: str) -> Any:
    act = _get(mlp, name)
    return act if act is not None else _INLINE_ACTIVATIONS.get(name)


def _fmt_name(spec: FormatSpec | None) -> str:
    return NATIVE if spec is None else spec.name


def _plain_linear_problem(m: Any) -> str | None:
    if not isinstance(m, nn.Linear):
        return f"is {type(m).__name__}, not nn.Linear"
    if type(m).forward is not nn.Linear.forward:
        return f"{type(m).__name__} overrides nn.Linear.forward (quantized or adapter layer?)"
    if is_converted(m):
        return "already converted"
    return None


class _Converter:
    def __init__(self, report: LAAQReport, config: LAAQConfig) -> None:
        self.report, self.config = report, config

    def _done(self, m: nn.Module, path: str, st: _State, formats: dict[str, str]) -> None:
        _patch(m, st)
        self.report._modules.append(m)
        self.report.converted.append(Conversion(path, st.kind, st.layer, formats))

    def skip(self, path: str, reason: str) -> None:
        self.report.skipped.append(Skip(path, reason))

    def norm(self, m: Any, path: str, layer: int | None, plan: RolePlan) -> bool:
        if not isinstance(m, nn.Module):
            self.skip(path, "not found")
            return False
        if is_converted(m):
            self.skip(path, "already converted")
            return False
        self._done(m, path, _State("norm", m.forward, layer, plan, self.config.backend),
                   {"norm_input": _fmt_name(plan["norm_input"])})
        return True

    def linear(self, m: Any, path: str, layer: int | None, plan: RolePlan, role: str) -> bool:
        problem = _plain_linear_problem(m) if m is not None else "not found"
        if problem:
            self.skip(path, problem)
            return False
        self._done(m, path, _State("linear", m.forward, layer, plan, self.config.backend, role=role),
                   {role: _fmt_name(plan[role])})
        return True

    def swiglu(self, m: Any, path: str, layer: int | None, plan: RolePlan, names: tuple[str, str, str, str]) -> bool:
        if not isinstance(m, nn.Module):
            self.skip(path, "not found")
            return False
        if is_converted(m):
            self.skip(path, "already converted")
            return False
        for n in names[:3]:
            problem = _plain_linear_problem(_get(m, n)) if _get(m, n) is not None else "not found"
            if problem:
                self.skip(path, f"{n} {problem}")
                return False
        if not callable(_activation(m, names[3])):
            self.skip(path, f"activation {names[3]!r} not found or not callable")
            return False
        self._done(m, path, _State("swiglu", m.forward, layer, plan, self.config.backend, names=names),
                   {"mlp_act_input": _fmt_name(plan["mlp_act_input"])})
        return True

    def attention(self, m: Any, path: str, layer: int | None, plan: RolePlan) -> None:
        if plan["attention_core"] is None:
            return
        if not isinstance(m, nn.Module) or is_converted(m):
            self.skip(path, "attention module not found or already converted")
            return
        self._done(m, path, _State("attention_core", m.forward, layer, plan, self.config.backend),
                   {"attention_core": _fmt_name(plan["attention_core"])})


def _check_model(model: nn.Module) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"LAAQ converts torch.nn.Module objects, got {type(model).__name__}")
    if _REPORT_ATTR in model.__dict__:
        raise AgoqError(f"{type(model).__name__} already has LAAQ applied; call agoq_core.laaq.remove(model) first")
    # HF sets `gradient_checkpointing = True` on every checkpointed layer (5.x: GradientCheckpointingLayer).
    if any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules()):
        raise AgoqError(
            "LAAQ replaces activation checkpointing and does not compose with it (checkpointing would re-run "
            "the quantizing forwards in backward for no saving); call model.gradient_checkpointing_disable() first")


def _layer_index(layer: nn.Module, row: LayerFamily, order: int) -> int:
    idx = getattr(_get(layer, row.attention), row.layer_index_attr, None) if row.layer_index_attr else None
    return idx if isinstance(idx, int) and not isinstance(idx, bool) and idx >= 0 else order


def apply(model: nn.Module, config: LAAQConfig | None = None, *,
          families: Iterable[LayerFamily] | None = None) -> LAAQReport:
    """Turn LAAQ on for every decoder layer of a known family in ``model``; returns the report.

    ``families`` replaces the registered table (agoq_core.laaq.families) for this call. Raises
    AgoqError if no decoder layer of any family is found (nothing would change).
    """
    config = config if config is not None else LAAQConfig()
    if not isinstance(config, LAAQConfig):
        raise TypeError(f"config must be an LAAQConfig, got {type(config).__name__}")
    _check_model(model)
    rows = list(families) if families is not None else list(FAMILIES.values())
    by_class = {cls: row for row in rows for cls in row.layer_classes}
    layers = [(name, m, by_class[type(m).__name__]) for name, m in model.named_modules()
              if type(m).__name__ in by_class]
    if not layers:
        found = sorted({type(m).__name__ for m in model.modules() if "Layer" in type(m).__name__ or "Block"
                        in type(m).__name__})
        raise AgoqError(
            f"LAAQ found no decoder layer of a known family in {type(model).__name__} (known layer classes: "
            f"{sorted(by_class)}; layer-like classes in this model: {found or 'none'}). Describe your layer with "
            "agoq_core.laaq.LayerFamily and pass families=[...] or register_family(...)")
    report = LAAQReport(type(model).__name__, config)
    conv = _Converter(report, config)
    try:
        last_row = None
        for order, (name, layer, row) in enumerate(layers):
            last_row = row
            idx = _layer_index(layer, row, order)
            plan = config.plan(idx)
            p = f"{name}." if name else ""
            attn = _get(layer, row.attention)
            if conv.norm(_get(layer, row.input_norm), p + row.input_norm, idx, plan):
                for proj in dict.fromkeys((row.q_proj, row.k_proj, row.v_proj)):  # one path if fused
                    conv.linear(_get(attn, proj) if attn is not None else None,
                                f"{p}{row.attention}.{proj}", idx, plan, "linear_input")
            conv.linear(_get(attn, row.o_proj) if attn is not None else None, f"{p}{row.attention}.{row.o_proj}",
                        idx, plan, "attn_out_input")
            conv.attention(attn, p + row.attention, idx, plan)
            if conv.norm(_get(layer, row.post_norm), p + row.post_norm, idx, plan):
                conv.swiglu(_get(layer, row.mlp), p + row.mlp, idx, plan,
                            (row.gate_proj, row.up_proj, row.down_proj, row.act_fn))
        if config.convert_final_norm and last_row is not None:
            _convert_final(conv, model, last_row, config.plan(None))
    except BaseException:
        report.undo()
        raise
    report._owner = model
    model.__dict__[_REPORT_ATTR] = report
    log.info("%s", report)
    return report


def _convert_final(conv: _Converter, model: nn.Module, row: LayerFamily, plan: RolePlan) -> None:
    if not row.final_norm:  # the row says the model has none
        return
    norm_path = next((p for p in row.final_norm if isinstance(_get(model, p), nn.Module)), None)
    if norm_path is None:
        conv.skip("/".join(row.final_norm), "final norm not found")
        return
    if conv.norm(_get(model, norm_path), norm_path, None, plan):
        head_path = next((p for p in row.lm_head if _get(model, p) is not None), None)
        if head_path is not None:
            conv.linear(_get(model, head_path), head_path, None, plan, "linear_input")


def remove(model: nn.Module) -> None:
    """Undo ``apply`` on ``model`` (no-op error if LAAQ is not applied)."""
    report = model.__dict__.get(_REPORT_ATTR)
    if report is None:
        raise AgoqError(f"LAAQ is not applied to this {type(model).__name__}")
    report.undo()


# ---- single modules, for people with their own model code -------------------------------------------
def _single(module: nn.Module, config: LAAQConfig | None, fn: Callable[[_Converter, RolePlan], bool],
            layer: int | None) -> LAAQReport:
    config = config if config is not None else LAAQConfig()
    report = LAAQReport(type(module).__name__, config)
    if not fn(_Converter(report, config), config.plan(layer)):
        raise AgoqError(f"cannot convert {type(module).__name__}: {report.skipped[-1].reason}")
    return report


def convert_norm(norm: nn.Module, config: LAAQConfig | None = None, *, layer: int | None = None) -> LAAQReport:
    """Make ``norm`` keep only its input (role norm_input). Its output, fed to modules converted with
    :func:`convert_linear` / :func:`convert_swiglu`, is recomputed in their backward instead of kept.
    Any norm whose forward is a deterministic function of its input and parameters works."""
    return _single(norm, config, lambda c, plan: c.norm(norm, type(norm).__name__, layer, plan), layer)


def convert_linear(linear: nn.Linear, config: LAAQConfig | None = None, *, role: str = "linear_input",
                   layer: int | None = None) -> LAAQReport:
    """Make an ``nn.Linear`` keep its input in ``role``'s format, or nothing if the input is the output
    of a converted norm (then it is recomputed)."""
    if role not in ("linear_input", "attn_out_input"):
        raise ValueError(f"convert_linear: role must be 'linear_input' or 'attn_out_input', got {role!r}")
    return _single(linear, config, lambda c, plan: c.linear(linear, type(linear).__name__, layer, plan, role), layer)


def convert_swiglu(mlp: nn.Module, config: LAAQConfig | None = None, *, gate: str = "gate_proj",
                   up: str = "up_proj", down: str = "down_proj", act: str = "act_fn",
                   layer: int | None = None) -> LAAQReport:
    """Make a gated MLP ``down(act(gate(x)) * up(x))`` keep only gate(x) and up(x) (role mlp_act_input).

    The module's own forward must compute exactly that expression; LAAQ replaces it with one
    autograd function built from the named submodules."""
    return _single(mlp, config, lambda c, plan: c.swiglu(mlp, type(mlp).__name__, layer, plan, (gate, up, down, act)),
                   layer)
