"""Model shapes the planner knows, and how a model's layers are split over virtual stages.

A shape is read from a Hugging Face config (``LlamaConfig`` and friends: any config with
``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``intermediate_size``,
``vocab_size``), from a preset name, or given as a :class:`TransformerShape`.

Layer split: ``layers`` decoder layers over ``V = stages * chunks`` virtual stages, ``layers // V``
each, and the last ``layers % V`` virtual stages one more (virtual stage 0 also holds the
embedding, the last one the final norm and LM head; torchtitan splits the same way). Virtual stage
``k`` runs on rank ``k % stages`` (torch's interleaved mapping).
"""
from __future__ import annotations

from dataclasses import dataclass

from agoq_core.planner.errors import PlannerError
from agoq_core.planner.schedules import PipelineSpec

__all__ = ["TransformerShape", "MODEL_PRESETS", "model_shape", "split_layers"]


@dataclass(frozen=True, kw_only=True)
class TransformerShape:
    """The sizes of a LLaMA-family decoder-only model that memory depends on."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tie_embeddings: bool = False
    name: str = "custom"

    def __post_init__(self) -> None:
        for f in ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise PlannerError(f"TransformerShape.{f} must be an int >= 1, got {v!r}")
        if self.hidden % self.heads:
            raise PlannerError(f"TransformerShape: hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise PlannerError(f"TransformerShape: heads ({self.heads}) must be a multiple of kv_heads "
                               f"({self.kv_heads})")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        h = self.hidden
        attn = h * h + 2 * h * self.kv_dim + h * h  # q, k, v, o (LLaMA: no biases)
        mlp = 3 * h * self.intermediate             # gate, up, down
        return attn + mlp + 2 * h                   # + two RMSNorm weights

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        # Under pipelining a tied LM head still needs its own copy on the last stage (Megatron keeps
        # one and all-reduces its gradient with the embedding's), so it is counted either way.
        return self.vocab * self.hidden + self.hidden  # + final norm


MODEL_PRESETS: dict[str, TransformerShape] = {
    s.name: s
    for s in (
        # The CPU pipeline tests' model: 8 layers so that 4 stages x 2 chunks get one each.
        TransformerShape(name="tiny", hidden=256, layers=8, heads=4, kv_heads=4, intermediate=688, vocab=4096),
        TransformerShape(name="llama-1b", hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192,
                         vocab=128256, tie_embeddings=True),
        TransformerShape(name="llama2-7b", hidden=4096, layers=32, heads=32, kv_heads=32, intermediate=11008,
                         vocab=32000),
        TransformerShape(name="llama3-8b", hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336,
                         vocab=128256),
        TransformerShape(name="llama2-13b", hidden=5120, layers=40, heads=40, kv_heads=40, intermediate=13824,
                         vocab=32000),
    )
}


def model_shape(model: object) -> TransformerShape:
    """A TransformerShape from a preset name, a TransformerShape, or an HF config / model."""
    if isinstance(model, TransformerShape):
        return model
    if isinstance(model, str):
        key = model.strip().lower()
        if key not in MODEL_PRESETS:
            raise PlannerError(f"unknown model {model!r}; presets: {', '.join(MODEL_PRESETS)} (or pass an HF config)")
        return MODEL_PRESETS[key]
    cfg = getattr(model, "config", model)  # an HF model carries its config
    need = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
    missing = [a for a in need if not hasattr(cfg, a)]
    if missing:
        raise PlannerError(f"cannot read a model shape from {type(model).__name__}: it lacks {missing}; pass a "
                           f"preset name ({', '.join(MODEL_PRESETS)}), a TransformerShape or an HF LLaMA-family config")
    return TransformerShape(
        name=str(getattr(cfg, "name_or_path", "") or getattr(cfg, "model_type", "hf")),
        hidden=int(cfg.hidden_size), layers=int(cfg.num_hidden_layers), heads=int(cfg.num_attention_heads),
        kv_heads=int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads),
        intermediate=int(cfg.intermediate_size), vocab=int(cfg.vocab_size),
        tie_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)))


def split_layers(num_layers: int, spec: PipelineSpec) -> tuple[tuple[int, ...], ...]:
    """Global decoder-layer indices of each virtual stage (index = virtual stage)."""
    V = spec.virtual_stages
    if num_layers < V:
        raise PlannerError(
            f"{num_layers} decoder layers cannot fill {spec.stages} stages x {spec.chunks} chunks = {V} virtual "
            f"stages; use at most {num_layers} virtual stages (fewer stages or chunks)")
    base, extra = divmod(num_layers, V)
    out, start = [], 0
    for k in range(V):
        n = base + (1 if k >= V - extra else 0)
        out.append(tuple(range(start, start + n)))
        start += n
    return tuple(out)
