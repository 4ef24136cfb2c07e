"""Turning LAAQ on and off in a model: ``apply(model, config) -> LAAQReport``, ``remove(model)``.

Nothing is replaced: the converted modules keep their class, parameters and state_dict keys; LAAQ
sets an instance ``forward`` (a bound method, so ``copy.deepcopy`` of a converted model stays
correct) and a ``_agoq_laaq`` record on each, and ``undo`` deletes both. Checkpoints load and save
unchanged. With autograd disabled (inference) every converted module runs its original forward.

Composes with what users stack on a model (docs/integrations.md): autocast (the autograd functions
re-enter forward's autocast state), PEFT LoRA in either order (wrappers are converted as one linear,
also when they appear after ``apply``), HF gradient checkpointing (checkpointed layers run plain),
FSDP2/DDP/torch.compile wrappers (families match by class hierarchy; paths go through wrappers).
"""
from __future__ import annotations

import functools
import logging
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
import torch.nn as nn

from agoq_core.errors import AgoqError
from agoq_core.formats.spec import FormatSpec
from agoq_core.laaq.attention import attention_core_hooks
from agoq_core.laaq.config import NATIVE, LAAQConfig, RolePlan
from agoq_core.laaq.families import FAMILIES, LayerFamily, match_family, unwrap_model
from agoq_core.laaq.functions import (_VIEW_NODES, NormSource, RecomputedInputLinear, SavedInputLinear,
                                      SwiGLUFunction, find_source, kept_by_producer, norm_apply)
from agoq_core.laaq import ops, traced
from agoq_core.laaq.float8 import Float8Gemms, is_float8_linear
from agoq_core.laaq.linears import is_lora_wrapper, linear_problem, resolve
from agoq_core.laaq.moe import MoEExpertsFunction, experts_problem

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
    group: Any = None          # the _Group of its decoder layer (None for single-module conversions)
    path: str = ""             # relative to the group's root
    expect: str = ""           # the norm (path in the group) whose output this consumer must read
    alias_hint: bool | None = None  # the model's attention kernel keeps its output (SDPA/flash)
    laaq: Any = None           # the LAAQ path of this kind (torch.compiler.disable'd), set by _patch
    validated: bool = False    # swiglu: checked once against the module's own forward
    fmts: dict = field(default_factory=dict)  # plan's role -> spec as a plain dict (Dynamo reads it)
    float8: Any = None         # linear: its Float8Gemms; swiglu: (gate, up, down) Float8Gemms or None each

    def __post_init__(self) -> None:
        self.fmts = dict(self.plan.specs)

    def aside(self) -> bool:
        return self.group is not None and self.group.checkpointed()


@dataclass
class LAAQReport:
    """What ``apply`` converted and skipped (with reasons). ``undo()`` restores the model exactly."""

    model_class: str
    config: LAAQConfig
    converted: list[Conversion] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    _modules: list[nn.Module] = field(default_factory=list, repr=False)
    _owner: Any = field(default=None, repr=False)
    _gc_logged: bool = field(default=False, repr=False)

    @property
    def layers(self) -> list[int]:
        return sorted({c.layer for c in self.converted if c.layer is not None})

    def undo(self) -> None:
        for m in reversed(self._modules):
            _unpatch(m)
        self._modules.clear()
        for owner in (self._owner or ()):
            if owner.__dict__.get(_REPORT_ATTR) is self:
                del owner.__dict__[_REPORT_ATTR]
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
# Each converted module's forward is a plain function that torch.compile can trace: with autograd off,
# in a gradient-checkpointed layer, or for calls LAAQ does not handle it runs the module's own forward
# (so inference compiles fullgraph and LAAQ is invisible). In training it runs LAAQ: while compiling,
# the traceable path of agoq_core.laaq.traced (custom-op codecs, state through module state: no graph
# break) where the layer allows it (:func:`_traceable`), otherwise the eager path
# (torch.compiler.disable: its autograd functions hold Python state for backward).
def _state(m: nn.Module) -> "_State":
    return m.__dict__[_STATE_ATTR]


def _float8_eager(st: "_State") -> None:
    raise AgoqError(
        f"LAAQ converted {st.path or 'this module'} with float8 GEMMs (LAAQConfig(float8_gemms=True)); they run in "
        "torch.compile'd decoder layers only (layer.compile(), or apply_policy's -c options), with the attention core "
        "native and no LoRA adapters. This call ran eagerly: compile the layer, or convert without float8_gemms")


def _traceable(st: "_State") -> bool:
    """Whether this module's LAAQ path can be traced (else it runs eagerly: one graph break)."""
    return (torch.compiler.is_compiling() and st.group is not None and not st.group.lora
            and st.fmts["attention_core"] is None)


def _norm_forward(self: nn.Module, x: Any, *args: Any, **kwargs: Any) -> Any:
    st = _state(self)
    if args or kwargs or not torch.is_grad_enabled() or not isinstance(x, torch.Tensor) or st.aside():
        return st.orig(x, *args, **kwargs)
    if _traceable(st):
        return traced.norm(self, st, x)
    return st.laaq(self, st, x)


def _linear_forward(self: nn.Module, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    st = _state(self)
    if args or kwargs or not torch.is_grad_enabled() or st.aside():
        return st.orig(x, *args, **kwargs)
    if _traceable(st):
        alias = st.fmts["attention_core"] is None and x.requires_grad and bool(st.alias_hint)
        return traced.linear(self, st, x, alias)
    if st.float8 is not None:
        _float8_eager(st)
    return st.laaq(self, st, x)


def _swiglu_forward(self: nn.Module, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    st = _state(self)
    if args or kwargs or not torch.is_grad_enabled() or st.aside():
        return st.orig(x, *args, **kwargs)
    if _traceable(st):
        gate, up, down, act_name = st.names
        mods = [_get(self, n) for n in ((gate, down) if not up else (gate, up, down))]
        return traced.swiglu(self, st, x, mods, _activation(self, act_name))
    if st.float8 is not None:
        _float8_eager(st)
    return st.laaq(self, st, x)


def _experts_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    st = _state(self)
    if kwargs or len(args) != 3 or not torch.is_grad_enabled() or st.aside():
        return st.orig(*args, **kwargs)
    return st.laaq(self, st, *args)


def _attention_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    st = _state(self)
    if not torch.is_grad_enabled() or st.aside():
        return st.orig(*args, **kwargs)
    return st.laaq(self, st, *args, **kwargs)


def _norm_laaq(self: nn.Module, st: "_State", x: torch.Tensor) -> torch.Tensor:
    if st.group is not None:
        st.group.sync()
    src = NormSource(st.orig, st.plan["norm_input"], st.layer, st.backend, module=self)
    y = norm_apply(x, src, tuple(p for p in self.parameters()))
    if st.group is not None:
        st.group.sources[st.path] = weakref.ref(src)
    return y


def _from_compiled(x: torch.Tensor) -> bool:
    fn = x.grad_fn
    while fn is not None and type(fn).__name__ in _VIEW_NODES:
        fn = fn.next_functions[0][0] if fn.next_functions else None
    return fn is not None and "Compiled" in type(fn).__name__


def _linear_laaq(self: nn.Module, st: "_State", x: torch.Tensor) -> torch.Tensor:
    meta, tensors = resolve(self)
    src, view = find_source(x)
    if st.group is not None and st.expect:
        st.group.check(st, src)
    if src is not None:
        return RecomputedInputLinear.apply(x, src, view, meta, *tensors)
    # Keep by reference what the producer keeps anyway -- unless the attention core is being
    # quantized (then the producer's copy is 4-bit and a reference would pin the 16-bit one). A
    # compiled producer hides its saved tensors: there the model's attention kernel decides (SDPA and
    # flash keep their output), so eager and compiled LAAQ keep the same thing and agree.
    alias = False
    if st.plan["attention_core"] is None and x.requires_grad:
        alias = bool(st.alias_hint) if _from_compiled(x) else kept_by_producer(x)
    return SavedInputLinear.apply(x, st.plan[st.role], st.role, st.layer, st.backend, alias, meta, *tensors)


def _fork_rng(x: torch.Tensor) -> Any:
    if x.device.type == "cpu":
        return torch.random.fork_rng(devices=[])
    return torch.random.fork_rng(devices=[x.device], device_type=x.device.type)


def _swiglu_laaq(self: nn.Module, st: "_State", x: torch.Tensor) -> torch.Tensor:
    gate, up, down, act_name = st.names
    mods = [_get(self, n) for n in ((gate, down) if not up else (gate, up, down))]  # up "" = fused gate_up
    act = _activation(self, act_name)
    parts = [resolve(m) for m in mods]
    src, view = find_source(x)
    if st.group is not None and st.expect:
        st.group.check(st, src)
    metas = tuple(p[0] for p in parts)
    tensors = [t for p in parts for t in p[1]]
    args = (x, src, view, act, st.plan["mlp_act_input"], st.plan["linear_input"], st.layer, st.backend, metas, *tensors)
    if st.validated or x.device.type == "meta":  # meta: sizes only (memory measurements), nothing to compare
        return SwiGLUFunction.apply(*args)
    # First training forward: check the family row's claim mlp(x) == down(act(gate(x)) * up(x)) against
    # the module's own forward (same RNG draws, e.g. LoRA dropout), once per module.
    with torch.no_grad(), _fork_rng(x):
        ref = st.orig(x)
    row = st.group.row.name if st.group is not None and st.group.row is not None else "convert_swiglu"
    names = f"gate={gate!r}" + (f", up={up!r}" if up else " (fused gate_up)") + f", down={down!r}, act={act_name!r}"
    try:
        out = SwiGLUFunction.apply(*args)
    except RuntimeError as e:
        raise AgoqError(f"LAAQ family row {row!r} does not match {st.path} ({type(self).__name__}): computing "
                        f"down(act(gate(x)) * up(x)) with {names} fails: {e}. Fix the row (fused projections: "
                        "LayerFamily(gate_up_proj=...); fused q/k/v: qkv=(...))") from e
    if out.shape == ref.shape and not bool(torch.isfinite(ref).all()):
        # Nothing to compare on non-finite values (e.g. torch.distributed.pipelining's shape inference
        # runs a stage on uninitialised buffers): check at the next forward instead.
        return out
    err = ((out.detach().double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item() \
        if out.shape == ref.shape else float("inf")
    if not err <= 1e-2:
        raise AgoqError(f"LAAQ family row {row!r} does not match {st.path} ({type(self).__name__}): its forward is not "
                        f"down(act(gate(x)) * up(x)) with {names} (output {tuple(out.shape)} vs {tuple(ref.shape)}, "
                        f"relative difference {err:.3g}). Fix the row, or leave this MLP unconverted (mlp='')")
    st.validated = True
    return out


def _experts_laaq(self: nn.Module, st: "_State", x: torch.Tensor, top_k_index: torch.Tensor,
                  top_k_weights: torch.Tensor) -> torch.Tensor:
    return MoEExpertsFunction.apply(x, top_k_index, top_k_weights, self.gate_up_proj, self.down_proj, self,
                                    st.plan["mlp_act_input"], st.layer, st.backend)


def _attention_laaq(self: nn.Module, st: "_State", *args: Any, **kwargs: Any) -> Any:
    with attention_core_hooks(st.plan["attention_core"], st.layer, st.backend):
        return st.orig(*args, **kwargs)


_LAAQ_FORWARDS = {"norm": _norm_laaq, "linear": _linear_laaq, "swiglu": _swiglu_laaq,
                  "attention_core": _attention_laaq, "moe_experts": _experts_laaq}
_FORWARDS = {"norm": _norm_forward, "linear": _linear_forward, "swiglu": _swiglu_forward,
             "attention_core": _attention_forward, "moe_experts": _experts_forward}


@functools.lru_cache(maxsize=1)
def _eager() -> dict[str, Callable]:
    """The LAAQ paths, run eagerly under torch.compile.

    Dynamo cannot trace them: their autograd functions keep Python objects for backward (NormSource,
    the backend's codecs, the live-output table). Disabled, they run eagerly and the code between them
    (attention, RoPE, residuals) is still compiled (tests/laaq/test_compile.py); with autograd off they
    are never reached. Built on first use, not at import: torch.compiler.disable imports
    torch._dynamo, which imports triton where it is installed.
    """
    return {k: torch.compiler.disable(f, recursive=True) for k, f in _LAAQ_FORWARDS.items()}


def _patch(m: nn.Module, st: _State) -> None:
    st.had_forward = "forward" in m.__dict__
    st.old_forward = m.__dict__.get("forward")
    st.laaq = _eager()[st.kind]  # resolved here, outside any trace
    if st.kind != "attention_core":
        ops.ensure_registered()  # the custom ops the traced paths call
    m.__dict__[_STATE_ATTR] = st
    m.forward = types.MethodType(_FORWARDS[st.kind], m)


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
    problem = linear_problem(m)
    if problem is None and is_converted(m):
        return "already converted"
    return problem


class _Group:
    """The converted pieces of one decoder layer (or of the final norm + LM head), as module state.

    * ``sources``: each converted norm's NormSource of the current forward (weakly), so consumers can
      check that their input really is the norm output the family row says (roles validated on every
      training forward: a wrong row is an error, not a silent 4-bit copy).
    * ``sync()``: re-resolves the linear paths at forward time, so wrapping after ``apply`` (PEFT's
      get_peft_model puts a LoRA wrapper where the converted nn.Linear was) converts the wrapper and
      releases its base layer: the input is then kept once for the base GEMM and the adapters.
    * ``aside()``: a layer HF runs under gradient checkpointing runs plain (checkpointing already keeps
      only the layer input; LAAQ inside it would quantize twice for nothing). Policy: checkpoint some
      layers, LAAQ the others.
    """

    def __init__(self, report: "LAAQReport", converter: "_Converter", root: nn.Module, prefix: str,
                 row: LayerFamily | None, layer_module: nn.Module | None) -> None:
        self.report, self.converter = report, converter
        self.root, self.prefix, self.row, self.layer_module = root, prefix, row, layer_module
        self.linears: list[tuple[str, str, int | None, RolePlan, str]] = []   # (rel path, role, layer, plan, expect)
        self.sources: dict[str, weakref.ref] = {}
        self._failed: set[str] = set()
        # under torch.compile (agoq_core.laaq.traced): converted readers per norm, and each norm's output
        # and kept input of the current forward (removed by its last reader)
        self.expects: dict[str, int] = {}
        self.traced: dict[str, tuple] = {}
        self.left: dict[str, int] = {}
        self.lora = False          # a PEFT wrapper is converted here: the layer runs the eager paths

    def add_reader(self, expect: str, m: Any) -> None:
        if expect:
            self.expects[expect] = self.expects.get(expect, 0) + 1
        if is_lora_wrapper(m):
            self.lora = True

    def checkpointed(self) -> bool:
        m = self.layer_module
        if m is None or getattr(m, "gradient_checkpointing", False) is not True or not m.training:
            return False
        if not self.report._gc_logged:
            self.report._gc_logged = True
            log.warning("agoq LAAQ: gradient checkpointing is on for decoder layer(s) of %s; LAAQ steps aside in "
                        "every checkpointed layer (checkpointing keeps only the layer input) and runs in the others. "
                        "To use LAAQ there, disable checkpointing on those layers (layer.gradient_checkpointing = False "
                        "or model.gradient_checkpointing_disable()).", self.report.model_class)
        return True

    def sync(self) -> None:
        for rel, role, layer, plan, expect in self.linears:
            m = _get(self.root, rel)
            if m is None or is_converted(m):
                continue
            problem = linear_problem(m)
            if problem:
                if rel not in self._failed:
                    self._failed.add(rel)
                    log.warning("agoq LAAQ: %s changed after apply and cannot be converted (%s); it keeps its input "
                                "as PyTorch does", self.prefix + rel, problem)
                continue
            base = getattr(m, "base_layer", None)
            if is_lora_wrapper(m) and base is not None and is_converted(base):
                _unpatch(base)
                self.report._modules = [x for x in self.report._modules if x is not base]
            self.converter.linear(m, self.prefix + rel, layer, plan, role, group=self, rel=rel, expect=expect)
            log.info("agoq LAAQ: converted %s (%s) found at forward time", self.prefix + rel, type(m).__name__)

    def check(self, st: "_State", src: Any) -> None:
        ref = self.sources.get(st.expect)
        expected = ref() if ref is not None else None
        if expected is None or src is not expected:
            row = self.row.name if self.row is not None else "?"
            raise AgoqError(
                f"LAAQ family row {row!r}: {st.path} should read the output of {self.prefix}{st.expect}, but its "
                "input comes from elsewhere (another norm, or the norm output was changed on the way). The row maps "
                "the wrong module; fix input_norm/post_norm (e.g. Gemma2/3: post_norm='pre_feedforward_layernorm') "
                "or pass families=[...] with the right LayerFamily")


class _Converter:
    def __init__(self, report: LAAQReport, config: LAAQConfig) -> None:
        self.report, self.config = report, config

    def _done(self, m: nn.Module, path: str, st: _State, formats: dict[str, str]) -> None:
        _patch(m, st)
        self.report._modules.append(m)
        self.report.converted.append(Conversion(path, st.kind, st.layer, formats))

    def skip(self, path: str, reason: str) -> None:
        self.report.skipped.append(Skip(path, reason))

    def _linear_problem(self, m: Any, plain: Callable[[Any], str | None] = linear_problem) -> str | None:
        """``plain(m)``, but a torchao Float8Linear is convertible with LAAQConfig(float8_gemms=True) (and the
        reason it is not says so)."""
        if self.config.float8_gemms and is_float8_linear(m):
            return "already converted" if is_converted(m) else None
        problem = plain(m)
        if problem and is_float8_linear(m):
            problem += "; LAAQConfig(float8_gemms=True) converts it with float8 GEMMs"
        return problem

    def norm(self, m: Any, path: str, layer: int | None, plan: RolePlan, *, group: _Group | None = None,
             rel: str = "") -> bool:
        if not isinstance(m, nn.Module):
            self.skip(path, "not found")
            return False
        if is_converted(m):
            self.skip(path, "already converted")
            return False
        self._done(m, path, _State("norm", m.forward, layer, plan, self.config.backend, group=group, path=rel),
                   {"norm_input": _fmt_name(plan["norm_input"])})
        return True

    def linear(self, m: Any, path: str, layer: int | None, plan: RolePlan, role: str, *,
               group: _Group | None = None, rel: str = "", expect: str = "", alias_hint: bool | None = None) -> bool:
        if group is not None and not any(e[0] == rel for e in group.linears):
            group.linears.append((rel, role, layer, plan, expect))
        problem = self._linear_problem(m, _plain_linear_problem) if m is not None else "not found"
        if problem:
            self.skip(path, problem)
            return False
        self._done(m, path, _State("linear", m.forward, layer, plan, self.config.backend, role=role, group=group,
                                   path=path, expect=expect, alias_hint=alias_hint,
                                   float8=Float8Gemms.of(m) if is_float8_linear(m) else None),
                   {role: _fmt_name(plan[role])} | ({"gemm": "float8"} if is_float8_linear(m) else {}))
        if group is not None:
            group.add_reader(expect, m)
        return True

    def swiglu(self, m: Any, path: str, layer: int | None, plan: RolePlan, names: tuple[str, str, str, str], *,
               group: _Group | None = None, expect: str = "") -> bool:
        if not isinstance(m, nn.Module):
            self.skip(path, "not found")
            return False
        if is_converted(m):
            self.skip(path, "already converted")
            return False
        for n in (x for x in names[:3] if x):  # up "" = one fused gate_up projection
            problem = self._linear_problem(_get(m, n)) if _get(m, n) is not None else "not found"
            if problem:
                self.skip(path, f"{n} {problem}")
                return False
        if not callable(_activation(m, names[3])):
            self.skip(path, f"activation {names[3]!r} not found or not callable")
            return False
        f8 = tuple(Float8Gemms.of(_get(m, n)) if n and is_float8_linear(_get(m, n)) else None for n in names[:3])
        if any(f8) and not names[1]:
            self.skip(path, "float8 GEMMs with one fused gate_up projection are not supported")
            return False
        self._done(m, path, _State("swiglu", m.forward, layer, plan, self.config.backend, names=names, group=group,
                                   path=path, expect=expect, float8=f8 if any(f8) else None),
                   {"mlp_act_input": _fmt_name(plan["mlp_act_input"])} | ({"gemm": "float8"} if any(f8) else {}))
        if group is not None:
            group.add_reader(expect, m)
            for n in (x for x in names[:3] if x):
                if is_lora_wrapper(_get(m, n)):
                    group.lora = True
        return True

    def experts(self, m: Any, path: str, layer: int | None, plan: RolePlan, group: _Group | None = None) -> bool:
        problem = experts_problem(m) if isinstance(m, nn.Module) else "not found"
        if problem is None and is_converted(m):
            problem = "already converted"
        if problem:
            self.skip(path, f"MoE experts not converted: {problem}")
            return False
        self._done(m, path, _State("moe_experts", m.forward, layer, plan, self.config.backend, group=group, path=path),
                   {"mlp_act_input": _fmt_name(plan["mlp_act_input"])})
        return True

    def attention(self, m: Any, path: str, layer: int | None, plan: RolePlan, group: _Group | None = None) -> None:
        if plan["attention_core"] is None:
            return
        if not isinstance(m, nn.Module) or is_converted(m):
            self.skip(path, "attention module not found or already converted")
            return
        self._done(m, path, _State("attention_core", m.forward, layer, plan, self.config.backend, group=group),
                   {"attention_core": _fmt_name(plan["attention_core"])})


def _chain(model: nn.Module) -> list[nn.Module]:
    out = [model]
    while True:
        inner = unwrap_model(out[-1])
        if inner is out[-1]:
            return out
        out.append(inner)


def _check_model(model: nn.Module) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"LAAQ converts torch.nn.Module objects, got {type(model).__name__}")
    if any(_REPORT_ATTR in m.__dict__ for m in _chain(model)):
        raise AgoqError(f"{type(model).__name__} already has LAAQ applied; call agoq_core.laaq.remove(model) first")


def _layer_index(layer: nn.Module, row: LayerFamily, order: int) -> int:
    idx = getattr(_get(layer, row.attention), row.layer_index_attr, None) if row.layer_index_attr else None
    return idx if isinstance(idx, int) and not isinstance(idx, bool) and idx >= 0 else order


#: Attention kernels that keep their own output for backward (so the out-projection may keep its
#: input by reference): HF's `_attn_implementation` values for SDPA and the flash kernels.
_KEEPS_OUTPUT = ("sdpa", "flash_attention_2", "flash_attention_3", "flash_attention")


def _alias_hint(core: nn.Module) -> bool | None:
    impl = getattr(getattr(core, "config", None), "_attn_implementation", None)
    return None if impl is None else any(str(impl).startswith(k) for k in _KEEPS_OUTPUT)


def apply(model: nn.Module, config: LAAQConfig | None = None, *,
          families: Iterable[LayerFamily] | None = None) -> LAAQReport:
    """Turn LAAQ on for every decoder layer of a known family in ``model``; returns the report.

    ``model`` may be wrapped (PEFT, DDP, torch.compile's OptimizedModule) or sharded with FSDP2:
    decoder layers are matched by class hierarchy. ``families`` replaces the registered table
    (agoq_core.laaq.families) for this call. Raises AgoqError if no decoder layer of any family is
    found (nothing would change).
    """
    config = config if config is not None else LAAQConfig()
    if not isinstance(config, LAAQConfig):
        raise TypeError(f"config must be an LAAQConfig, got {type(config).__name__}")
    _check_model(model)
    rows = list(families) if families is not None else list(FAMILIES.values())
    layers = [(name, m, row) for name, m in model.named_modules() if (row := match_family(m, rows)) is not None]
    if not layers:
        known = sorted({c for r in rows for c in r.layer_classes})
        found = sorted({type(m).__name__ for m in model.modules() if "Layer" in type(m).__name__ or "Block"
                        in type(m).__name__})
        raise AgoqError(
            f"LAAQ found no decoder layer of a known family in {type(model).__name__} (known layer classes: "
            f"{known}; layer-like classes in this model: {found or 'none'}). Describe your layer with "
            "agoq_core.laaq.LayerFamily and pass families=[...] or register_family(...)")
    unsupported = [(n, r) for n, _, r in layers if r.unsupported]
    if unsupported:
        n, r = unsupported[0]
        raise AgoqError(f"LAAQ does not support the {r.name!r} family ({n}): {r.unsupported}")
    core = _chain(model)[-1]
    alias_hint = _alias_hint(core)
    indices = [_layer_index(layer, row, order) for order, (_, layer, row) in enumerate(layers)]
    unknown = sorted(set(config.layer_overrides) - set(indices))
    report = LAAQReport(type(model).__name__, config)
    conv = _Converter(report, config)
    if unknown:  # never silent: a pipeline stage legitimately holds a subset of the layers, so it is reported
        conv.skip("layer_overrides", f"overrides for layer(s) {unknown} match no decoder layer of this "
                                     f"{type(model).__name__} (its layers: {_ranges(indices)}; 0-based, HF "
                                     "self_attn.layer_idx)")
        log.warning("agoq LAAQ: %s", report.skipped[-1].reason)
    mlp_left: list[tuple[str, LayerFamily]] = []
    try:
        last_row = None
        for order, (name, layer, row) in enumerate(layers):
            last_row = row
            idx = _layer_index(layer, row, order)
            plan = config.plan(idx)
            p = f"{name}." if name else ""
            g = _Group(report, conv, layer, p, row, layer)
            attn = _get(layer, row.attention)
            if conv.norm(_get(layer, row.input_norm), p + row.input_norm, idx, plan, group=g, rel=row.input_norm):
                for proj in row.attn_in:
                    rel = f"{row.attention}.{proj}"
                    conv.linear(_get(layer, rel), p + rel, idx, plan, "linear_input", group=g, rel=rel,
                                expect=row.input_norm)
            rel = f"{row.attention}.{row.o_proj}"
            conv.linear(_get(layer, rel), p + rel, idx, plan, "attn_out_input", group=g, rel=rel,
                        alias_hint=alias_hint)
            conv.attention(attn, p + row.attention, idx, plan, g)
            for extra in row.extra_norms:  # norms whose output feeds no GEMM (Gemma2/3 post-norms)
                conv.norm(_get(layer, extra), p + extra, idx, plan, group=g, rel=extra)
            if row.mlp and conv.norm(_get(layer, row.post_norm), p + row.post_norm, idx, plan, group=g,
                                     rel=row.post_norm):
                names = ((row.gate_up_proj, "", row.down_proj, row.act_fn) if row.gate_up_proj else
                         (row.gate_proj, row.up_proj, row.down_proj, row.act_fn))
                conv.swiglu(_get(layer, row.mlp), p + row.mlp, idx, plan, names, group=g, expect=row.post_norm)
            elif not row.mlp:
                conv.skip(p + (row.post_norm or "mlp"), f"family {row.name!r}: {row.mlp_note or 'MLP not converted'}")
                if not (row.experts and conv.experts(_get(layer, row.experts), p + row.experts, idx, plan, g)):
                    mlp_left.append((p + (row.experts or row.post_norm or "mlp"), row))
        if config.convert_final_norm and last_row is not None:
            _convert_final(conv, report, model, core, last_row, config.plan(None))
    except BaseException:
        report.undo()
        raise
    if mlp_left:  # never silent: say which MLPs keep their activations in 16 bits
        fams = sorted({r.name for _, r in mlp_left})
        why = next((s.reason for s in report.skipped if s.path == mlp_left[0][0]), mlp_left[0][1].mlp_note)
        log.warning("agoq LAAQ: the MLP of %d decoder layer(s) of %s (family %s: %s .. %s) is NOT converted and keeps "
                    "its activations as PyTorch does: %s. See report.skipped.", len(mlp_left),
                    type(model).__name__, "/".join(fams), mlp_left[0][0], mlp_left[-1][0], why or "no MLP row")
    report._owner = [model] if core is model else [model, core]  # remove() works from either (PEFT's
    for owner in report._owner:                                     # merge_and_unload returns the core)
        owner.__dict__[_REPORT_ATTR] = report
    log.info("%s", report)
    return report


def _ranges(xs: list[int]) -> str:
    xs = sorted(set(xs))
    return f"{xs[0]}..{xs[-1]}" if xs == list(range(xs[0], xs[-1] + 1)) and len(xs) > 2 else str(xs)


def _convert_final(conv: _Converter, report: LAAQReport, model: nn.Module, core: nn.Module, row: LayerFamily,
                   plan: RolePlan) -> None:
    if not row.final_norm:  # the row says the model has none
        return
    names = {id(m): n for n, m in model.named_modules()}
    prefix = names.get(id(core), "")
    prefix = f"{prefix}." if prefix else ""
    norm_path = next((p for p in row.final_norm if isinstance(_get(core, p), nn.Module)), None)
    if norm_path is None:
        conv.skip("/".join(row.final_norm), "final norm not found")
        return
    g = _Group(report, conv, core, prefix, row, None)
    if conv.norm(_get(core, norm_path), prefix + norm_path, None, plan, group=g, rel=norm_path):
        head_path = next((p for p in row.lm_head if _get(core, p) is not None), None)
        if head_path is not None:
            conv.linear(_get(core, head_path), prefix + head_path, None, plan, "linear_input", group=g, rel=head_path,
                        expect=norm_path)


def remove(model: nn.Module) -> None:
    """Undo ``apply`` on ``model`` (or on a wrapper of it / the model inside a wrapper)."""
    holder = next((m for m in _chain(model) if _REPORT_ATTR in m.__dict__), None)
    if holder is None:
        owners = [m for m in model.modules() if _REPORT_ATTR in m.__dict__] if isinstance(model, nn.Module) else []
        holder = owners[0] if owners else None
    if holder is None:
        raise AgoqError(f"LAAQ is not applied to this {type(model).__name__}")
    holder.__dict__[_REPORT_ATTR].undo()


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
