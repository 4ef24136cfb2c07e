"""Model families LAAQ converts: one table row per family, naming classes and submodules.

A row says which decoder-layer classes belong to the family (matched by class name, so importing
this module imports no transformers) and where the pieces sit inside a layer. Families whose
layers look like LLaMA's — pre-norm, q/k/v/o projections, a gated MLP ``down(act(gate(x)) * up(x))``
— need only a row. Add your own with :func:`register_family` or ``apply(..., families=[...])``.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LayerFamily", "register_family", "families", "FAMILIES"]


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
    mlp: str = "mlp"
    gate_proj: str = "gate_proj"
    up_proj: str = "up_proj"
    down_proj: str = "down_proj"
    act_fn: str = "act_fn"
    """Relative to ``mlp``: ``mlp(x) == down(act(gate(x)) * up(x))``. ``act_fn="silu"`` with no such
    attribute means the MLP calls torch.nn.functional.silu inline (torchtitan's FeedForward). A fused
    q/k/v projection is named by giving q_proj, k_proj and v_proj the same path."""
    layer_index_attr: str = "layer_idx"
    """Attribute of ``attention`` holding the global layer index (else: order in the model)."""
    final_norm: tuple[str, ...] = ("model.norm", "norm")
    """Candidate paths (from the model passed to apply) of the norm after the last layer."""
    lm_head: tuple[str, ...] = ("lm_head",)
    """Candidate paths of the output projection that reads the final norm."""

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.layer_classes, tuple) or not self.layer_classes:
            raise ValueError(f"LayerFamily {self.name!r}: layer_classes must be a non-empty tuple of class names")


# HF transformers 5.x (checked on 5.17 and 5.24): all four share LLaMA's layer layout. Qwen2 adds
# q/k/v biases; Qwen3 adds q_norm/k_norm on the heads (part of the attention core here); Mistral
# differs only in its attention mask (sliding window), which LAAQ does not touch.
FAMILIES: dict[str, LayerFamily] = {
    f.name: f for f in (
        LayerFamily(name="llama", layer_classes=("LlamaDecoderLayer",)),
        LayerFamily(name="mistral", layer_classes=("MistralDecoderLayer",)),
        LayerFamily(name="qwen2", layer_classes=("Qwen2DecoderLayer",)),
        LayerFamily(name="qwen3", layer_classes=("Qwen3DecoderLayer",)),
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
