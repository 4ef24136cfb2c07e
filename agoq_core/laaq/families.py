"""Model families LAAQ converts: one table row per family, naming classes and submodules.

A row says which decoder-layer classes belong to the family and where the pieces sit inside a layer.
Classes are matched by name anywhere in the layer's class hierarchy (MRO), so importing this module
imports no transformers, and wrapped layers still match: FSDP2's ``fully_shard`` turns a
``LlamaDecoderLayer`` into an ``FSDPLlamaDecoderLayer`` subclass. Families whose
layers look like LLaMA's — pre-norm, q/k/v/o projections, a gated MLP ``down(act(gate(x)) * up(x))``
— need only a row. Add your own with :func:`register_family` or ``apply(..., families=[...])``.
"""
from __future__ import annotations

from dataclasses import dataclass

from typing import Any, Iterable

__all__ = ["LayerFamily", "register_family", "families", "FAMILIES", "match_family", "unwrap_model"]


@dataclass(frozen=True, kw_only=True)
class LayerFamily:
    """Where the LAAQ pieces of one decoder layer live (attribute names, dotted paths allowed)."""

    name: str
    layer_classes: tuple[str, ...]
    """Class names of the decoder layer (e.g. ``("LlamaDecoderLayer",)``)."""
    input_norm: str = "input_layernorm"
    """Norm before attention; its output feeds q/k/v and nothing else."""
    post_norm: str = "post_attention_layernorm"
    """Norm before the MLP; its output feeds the MLP and nothing else."""
    attention: str = "self_attn"
    q_proj: str = "q_proj"
    k_proj: str = "k_proj"
    v_proj: str = "v_proj"
    o_proj: str = "o_proj"
    """Relative to ``attention``."""
    qkv: tuple[str, ...] | None = None
    """The linears reading ``input_norm``'s output, relative to ``attention`` (default: q, k, v;
    Phi3: ``("qkv_proj",)``)."""
    extra_norms: tuple[str, ...] = ()
    """Norms whose output feeds no GEMM (Gemma2/3's post-attention and post-feedforward norms, applied
    to a sublayer's output before the residual add): converted to keep only their input."""
    mlp: str = "mlp"
    gate_proj: str = "gate_proj"
    up_proj: str = "up_proj"
    down_proj: str = "down_proj"
    act_fn: str = "act_fn"
    """Relative to ``mlp``: ``mlp(x) == down(act(gate(x)) * up(x))``. ``act_fn="silu"`` with no such
    attribute means the MLP calls torch.nn.functional.silu inline (torchtitan's FeedForward). A fused
    q/k/v projection is named by giving q_proj, k_proj and v_proj the same path (or ``qkv``). ``mlp=""``: the MLP is not
    converted (``mlp_note`` says why, e.g. mixture-of-experts blocks) and ``post_norm`` stays plain."""
    gate_up_proj: str = ""
    """Relative to ``mlp``: one projection whose output halves are gate and up (Phi3:
    ``gate, up = gate_up_proj(x).chunk(2, dim=-1)``); then ``gate_proj``/``up_proj`` are unused."""
    mlp_note: str = ""
    experts: str = ""
    """Relative to the layer: a transformers 5 experts module (fused 3-D ``gate_up_proj``/``down_proj``) whose
    SiLU&Mul inputs LAAQ keeps at 4 bits (agoq_core.laaq.moe); with ``mlp=""`` (the router, a shared expert
    and ``post_norm`` stay plain)."""
    unsupported: str = ""
    """Non-empty: the family is known and refused, with this reason (``apply`` raises)."""
    layer_index_attr: str = "layer_idx"
    """Attribute of ``attention`` holding the global layer index (else: order in the model)."""
    final_norm: tuple[str, ...] = ("model.norm", "norm")
    """Candidate paths (from the model passed to apply) of the norm after the last layer."""
    lm_head: tuple[str, ...] = ("lm_head",)
    """Candidate paths of the output projection that reads the final norm."""

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.layer_classes, tuple) or not self.layer_classes:
            raise ValueError(f"LayerFamily {self.name!r}: layer_classes must be a non-empty tuple of class names")
        if self.qkv is not None and (not isinstance(self.qkv, tuple) or not self.qkv):
            raise ValueError(f"LayerFamily {self.name!r}: qkv must be a non-empty tuple of names, got {self.qkv!r}")

    @property
    def attn_in(self) -> tuple[str, ...]:
        return self.qkv if self.qkv is not None else tuple(dict.fromkeys((self.q_proj, self.k_proj, self.v_proj)))


_MOE = ("mixture-of-experts block: post_norm, the router and any shared expert stay plain (the router keeps the "
        "norm output anyway); the routed experts (transformers 5 fused 3-D weights) are converted separately")

# HF transformers 5.x (checked on 5.17 and 5.24). Llama, Mistral, Qwen2, Qwen3 and Gemma share LLaMA's
# layer layout: Qwen2 adds q/k/v biases; Qwen3 (and Gemma3) q_norm/k_norm on the heads (part of the
# attention core here); Mistral differs only in its attention mask; Gemma in its norm (1 + w) and GELU.
# Gemma2/3 normalise each sublayer's output too: the MLP reads pre_feedforward_layernorm, and
# post_attention_layernorm / post_feedforward_layernorm feed only the residual add (a row mapping
# post_norm to post_attention_layernorm is caught at the first forward). Phi3 fuses q/k/v and gate/up.
FAMILIES: dict[str, LayerFamily] = {
    f.name: f for f in (
        LayerFamily(name="llama", layer_classes=("LlamaDecoderLayer",)),
        LayerFamily(name="mistral", layer_classes=("MistralDecoderLayer",)),
        LayerFamily(name="qwen2", layer_classes=("Qwen2DecoderLayer",)),
        LayerFamily(name="qwen3", layer_classes=("Qwen3DecoderLayer",)),
        LayerFamily(name="gemma", layer_classes=("GemmaDecoderLayer",)),
        LayerFamily(name="gemma2", layer_classes=("Gemma2DecoderLayer", "Gemma3DecoderLayer"),
                    post_norm="pre_feedforward_layernorm",
                    extra_norms=("post_attention_layernorm", "post_feedforward_layernorm")),
        LayerFamily(name="phi3", layer_classes=("Phi3DecoderLayer",), qkv=("qkv_proj",), gate_up_proj="gate_up_proj",
                    act_fn="activation_fn"),
        LayerFamily(name="mixtral", layer_classes=("MixtralDecoderLayer",), mlp="", mlp_note=_MOE,
                    experts="mlp.experts"),
        LayerFamily(name="qwen_moe", layer_classes=("Qwen2MoeDecoderLayer", "Qwen3MoeDecoderLayer"), mlp="",
                    mlp_note=_MOE, experts="mlp.experts"),
        LayerFamily(name="gpt2", layer_classes=("GPT2Block",), unsupported=(
            "GPT-2 blocks use Conv1D projections (transposed weights), a fused c_attn and a non-gated GELU MLP; LAAQ's "
            "roles (nn.Linear projections, gated MLP down(act(gate(x)) * up(x))) do not apply")),
    )
}


def register_family(family: LayerFamily, *, replace: bool = False) -> None:
    """Add a row to the table (e.g. for your own decoder-layer class)."""
    if not isinstance(family, LayerFamily):
        raise TypeError(f"register_family expects a LayerFamily, got {type(family).__name__}")
    if family.name in FAMILIES and not replace:
        raise ValueError(f"a family named {family.name!r} is already registered; pass replace=True to override")
    for other in FAMILIES.values():
        clash = set(other.layer_classes) & set(family.layer_classes)
        if clash and other.name != family.name:
            raise ValueError(f"layer classes {sorted(clash)} already belong to family {other.name!r}")
    FAMILIES[family.name] = family


def families() -> list[LayerFamily]:
    return list(FAMILIES.values())


def match_family(module: Any, rows: Iterable[LayerFamily] | None = None) -> LayerFamily | None:
    """The row whose layer class is ``type(module)`` or one of its bases (nearest first)."""
    rows = list(FAMILIES.values()) if rows is None else list(rows)
    by_class = {c: r for r in rows for c in r.layer_classes}
    for cls in type(module).__mro__:
        row = by_class.get(cls.__name__)
        if row is not None:
            return row
    return None


def unwrap_model(m: Any) -> Any:
    """One wrapper level down: DDP/FSDP1 ``.module``, torch.compile's ``._orig_mod``, PEFT's
    ``get_base_model()``; ``m`` itself when it wraps nothing (FSDP2 wraps in place)."""
    inner = getattr(m, "_orig_mod", None)
    if inner is not None:
        return inner
    get_base = getattr(type(m), "get_base_model", None)
    if callable(get_base):
        inner = m.get_base_model()
        if inner is not None and inner is not m:
            return inner
    names = {c.__name__ for c in type(m).__mro__}
    if names & {"DistributedDataParallel", "FullyShardedDataParallel", "DataParallel"}:
        return m.module
    return m
