"""LAAQ policy: which saved tensor of a decoder layer is stored, and in which format.

A role names a tensor that backward needs. Every role takes an activation format name from the
registry (``int4``, ``fp4_e2m1``, ``nf4``, ``int5``, ``int6``, ``int8``) or ``"native"`` (kept as is,
in the tensor's own dtype). Whatever a role's format, LAAQ still recomputes the RMSNorm outputs, the
norm statistics and the SwiGLU output in backward; only the stored inputs change.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from agoq_core.errors import FormatError
from agoq_core.formats.spec import FormatSpec, activation_formats, get_format

__all__ = ["LAAQConfig", "ROLES", "NATIVE", "RolePlan"]

NATIVE = "native"

#: Saved-tensor roles, in the order tables print them.
ROLES: tuple[str, ...] = (
    "norm_input",        # input of both RMSNorms (the residual stream); the norm outputs are recomputed
    "mlp_act_input",     # gate/up GEMM outputs = SiLU&Mul input; the SwiGLU output is recomputed
    "attn_out_input",    # input of the attention out-projection (the attention output)
    "attention_core",    # Q, K, V, softmax state and output kept by the attention kernel
    "linear_input",      # input of a converted Linear/SwiGLU that no converted norm produced (own models)
)

_ROLE_DOC = {
    "norm_input": "RMSNorm inputs (both norms of a layer)",
    "mlp_act_input": "gate/up outputs (SiLU&Mul input)",
    "attn_out_input": "attention out-projection input",
    "attention_core": "Q/K/V/softmax state/output saved by the attention kernel",
    "linear_input": "input of a converted Linear not fed by a converted norm",
}


def _check_fmt(role: str, value: object, block: int) -> FormatSpec | None:
    if isinstance(value, FormatSpec):
        spec = value
    elif isinstance(value, str):
        if value.strip().lower() == NATIVE:
            return None
        if value.strip().lower() not in activation_formats(microscaling=True):
            raise FormatError(
                f"LAAQConfig.{role}={value!r} is not an activation format; use one of "
                f"{activation_formats(microscaling=True) + [NATIVE]}"
            )
        spec = get_format(value, default_block=block)  # mxfp4/nvfp4 keep their fixed block
    else:
        raise FormatError(f"LAAQConfig.{role} must be a format name, a FormatSpec or {NATIVE!r}, "
                          f"got {type(value).__name__} {value!r}")
    if spec.name not in activation_formats(microscaling=True):
        raise FormatError(f"LAAQConfig.{role}: {spec.name} is a gradient format; use one of "
                          f"{activation_formats(microscaling=True)}")
    return spec


@dataclass(frozen=True, slots=True)
class RolePlan:
    """Resolved formats of one layer: role -> FormatSpec, or None for native storage."""

    specs: Mapping[str, FormatSpec | None]

    def __getitem__(self, role: str) -> FormatSpec | None:
        return self.specs[role]

    def names(self) -> dict[str, str]:
        return {r: (s.name if s is not None else NATIVE) for r, s in self.specs.items()}

    # immutable: copies are the object itself; pickles rebuild the read-only mapping
    def __deepcopy__(self, memo: dict) -> "RolePlan":
        return self

    def __reduce__(self):
        return (_role_plan, (dict(self.specs),))


def _role_plan(specs: dict) -> RolePlan:
    return RolePlan(MappingProxyType(specs))


def _laaq_config(kwargs: dict) -> "LAAQConfig":
    return LAAQConfig(**kwargs)


@dataclass(frozen=True, kw_only=True)
class LAAQConfig:
    """Per-role storage formats (the paper's policy by default) and per-layer overrides.

    Defaults, from the paper (§4.1): RMSNorm inputs, SiLU&Mul input and out-projection input at
    4 bits, block 128; the attention core untouched (16-bit, the kernel's own saved state). The
    4-bit code is ``nf4``: in the gradient-error study of docs/laaq.md it gave the lowest
    gradient error of the three 4-bit codes for every layer type, at init and after training
    (e.g. MLP weight gradients 0.029 vs 0.034 fp4_e2m1 vs 0.036 int4 at init); activations are
    near-Gaussian within a 128-element block, which is what NF4's normal-quantile levels fit.

    ``layer_overrides`` maps a layer index (HF ``self_attn.layer_idx``, else the order of layers in
    the model) to ``{role: format}``; unnamed roles keep the defaults. DBCA-PP uses it to give
    pipeline stages (or single layers) other bit-widths.
    """

    norm_input: str | FormatSpec = "nf4"
    mlp_act_input: str | FormatSpec = "nf4"
    attn_out_input: str | FormatSpec = "nf4"
    attention_core: str | FormatSpec = NATIVE
    linear_input: str | FormatSpec = "nf4"
    block: int = 128
    """Block size used for role formats given by name (FormatSpec values keep their own)."""
    layer_overrides: Mapping[int, Mapping[str, str | FormatSpec]] = field(default_factory=dict)
    convert_final_norm: bool = True
    """Also convert the model's final norm and the LM head that reads it (one more norm per model)."""
    backend: str | None = None
    """Backend for the codecs; None = the selected one (AGOQ_BACKEND or auto)."""
    float8_gemms: bool = False
    """Convert torchao ``Float8Linear`` modules too, running their GEMMs in float8 as torchao's recipe does
    while LAAQ keeps (or rebuilds) their inputs (agoq_core.laaq.float8; compiled layers only). False: they are
    skipped with a reason, each keeping its own bf16 input."""

    def __post_init__(self) -> None:
        if not isinstance(self.float8_gemms, bool):
            raise TypeError(f"LAAQConfig.float8_gemms must be True or False, got {self.float8_gemms!r}")
        if isinstance(self.block, bool) or not isinstance(self.block, int) or self.block <= 0 or self.block % 8:
            raise FormatError(f"LAAQConfig.block must be a positive multiple of 8, got {self.block!r}")
        for role in ROLES:
            _check_fmt(role, getattr(self, role), self.block)
        if not isinstance(self.layer_overrides, Mapping):
            raise TypeError(f"LAAQConfig.layer_overrides must map layer index -> {{role: format}}, "
                            f"got {type(self.layer_overrides).__name__}")
        frozen: dict[int, Mapping[str, str | FormatSpec]] = {}
        for idx, roles in self.layer_overrides.items():
            if isinstance(idx, bool) or not isinstance(idx, int) or idx < 0:
                raise ValueError(f"LAAQConfig.layer_overrides: layer index must be an int >= 0, got {idx!r}")
            if not isinstance(roles, Mapping):
                raise TypeError(f"LAAQConfig.layer_overrides[{idx}] must be a mapping role -> format, "
                                f"got {type(roles).__name__}")
            for role, fmt in roles.items():
                if role not in ROLES:
                    raise ValueError(f"LAAQConfig.layer_overrides[{idx}]: unknown role {role!r}; roles: {list(ROLES)}")
                _check_fmt(f"layer_overrides[{idx}][{role!r}]", fmt, self.block)
            frozen[idx] = MappingProxyType(dict(roles))
        object.__setattr__(self, "layer_overrides", MappingProxyType(frozen))
        if self.backend is not None and not isinstance(self.backend, str):
            raise TypeError(f"LAAQConfig.backend must be a backend name or None, got {type(self.backend).__name__}")

    # ---- presets --------------------------------------------------------------------------------
    @classmethod
    def paper(cls, **kw) -> "LAAQConfig":
        """The paper's policy (the default)."""
        return cls(**kw)

    @classmethod
    def uniform(cls, fmt: str, *, include_attention: bool = False, **kw) -> "LAAQConfig":
        """Every role in ``fmt``. ``include_attention=True`` is the naive all-4-bit policy that the
        paper reports as not converging (Q, K, V and the attention output quantized too)."""
        roles = {r: fmt for r in ROLES if r != "attention_core"}
        roles["attention_core"] = fmt if include_attention else NATIVE
        return cls(**roles, **kw)

    @classmethod
    def native(cls, **kw) -> "LAAQConfig":
        """Nothing quantized, everything recomputed: gradients bit-identical to the plain model."""
        return cls.uniform(NATIVE, **kw)

    # ---- resolution -----------------------------------------------------------------------------
    def plan(self, layer: int | None) -> RolePlan:
        """Formats for ``layer`` (None = a module outside the decoder layers, e.g. the final norm)."""
        over = self.layer_overrides.get(layer, {}) if layer is not None else {}
        return RolePlan(MappingProxyType(
            {r: _check_fmt(r, over.get(r, getattr(self, r)), self.block) for r in ROLES}))

    def __deepcopy__(self, memo: dict) -> "LAAQConfig":
        return self  # frozen and holding only immutable values

    def __reduce__(self):
        kw = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        kw["layer_overrides"] = {k: dict(v) for k, v in self.layer_overrides.items()}
        return (_laaq_config, (kw,))

    def replace(self, **changes) -> "LAAQConfig":
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        base = ", ".join(f"{r}={self.plan(None).names()[r]}" for r in ROLES)
        extra = f"; {len(self.layer_overrides)} layer overrides" if self.layer_overrides else ""
        extra += "; float8 GEMMs" if self.float8_gemms else ""
        return f"LAAQConfig({base}, block={self.block}{extra})"

    @staticmethod
    def role_doc(role: str) -> str:
        return _ROLE_DOC[role]
