"""The model shapes agoq knows by name: one table, used by the planner, ``agoq train``, ``agoq memory``
and the benchmarks.

A :class:`ModelShape` holds the sizes of a LLaMA-family decoder-only model that memory and compute
depend on. :func:`get_model_shape` reads one from a name in :data:`MODELS`, from a Hugging Face config
(or model) of the LLaMA family, or passes a ModelShape through. :meth:`ModelShape.to_hf_config` turns
a shape into the ``transformers.LlamaConfig`` every part of agoq builds its models from (random init,
no download)::

    from agoq_core.models import get_model_shape
    cfg = get_model_shape("llama2-7b").to_hf_config(num_hidden_layers=2)

Each name means one model. ``agoq train`` replaces the vocabulary by its shipped tokenizer's (4096
tokens) for every shape, an explicit override (``vocab_size=``), so that its ``llama-1b`` is the
LLaMA-3.2-1B body with a far smaller embedding table (docs/training.md).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from agoq_core.errors import AgoqError

__all__ = ["ModelShape", "MODELS", "get_model_shape", "ModelShapeError"]

#: RMSNorm epsilon of LLaMA-2 and LLaMA-3 (both 1e-5; transformers' LlamaConfig defaults to 1e-6).
_RMS_NORM_EPS = 1e-5


class ModelShapeError(AgoqError, ValueError):
    """An unknown model name, a config without a LLaMA-family shape, or inconsistent sizes."""


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """The sizes of a LLaMA-family decoder-only model (no biases, SwiGLU MLP, RMSNorm, RoPE)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    rope_theta: float = 10000.0
    tie_embeddings: bool = False
    name: str = "custom"
    note: str = ""

    def __post_init__(self) -> None:
        for f in ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ModelShapeError(f"ModelShape.{f} must be an int >= 1, got {v!r}")
        if self.hidden % self.heads:
            raise ModelShapeError(f"ModelShape: hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if (self.hidden // self.heads) % 2:
            raise ModelShapeError(f"ModelShape: head_dim = hidden ({self.hidden}) / heads ({self.heads}) = "
                                  f"{self.hidden // self.heads} is odd; rotary embeddings need an even head_dim")
        if self.heads % self.kv_heads:
            raise ModelShapeError(f"ModelShape: heads ({self.heads}) must be a multiple of kv_heads "
                                  f"({self.kv_heads})")
        if isinstance(self.rope_theta, bool) or not isinstance(self.rope_theta, (int, float)) or self.rope_theta <= 0:
            raise ModelShapeError(f"ModelShape.rope_theta must be a positive number, got {self.rope_theta!r}")
        if not isinstance(self.tie_embeddings, bool):
            raise ModelShapeError(f"ModelShape.tie_embeddings must be true or false, got {self.tie_embeddings!r}")

    # ---- derived sizes ----------------------------------------------------------------------------
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

    def replace(self, **changes: Any) -> "ModelShape":
        return dataclasses.replace(self, **changes)

    # ---- Hugging Face ---------------------------------------------------------------------------
    def to_hf_config(self, family: str = "llama", **overrides: Any) -> Any:
        """A transformers config of this shape (``LlamaConfig``; ``family`` "mistral", "qwen2", ...
        gives that model type's config with the same sizes): SDPA attention, no KV cache, no dropout,
        no special tokens, RMSNorm eps 1e-5. ``overrides`` are config keywords that win over the shape
        (``vocab_size=4096``, ``num_hidden_layers=2``, ``max_position_embeddings=...``)."""
        try:
            from transformers import AutoConfig
        except ModuleNotFoundError as exc:
            raise ModelShapeError("building an HF config needs transformers (pip install 'agoq[train]' or "
                                  "pip install transformers)") from exc
        kw: dict[str, Any] = dict(
            vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.intermediate,
            num_hidden_layers=self.layers, num_attention_heads=self.heads, num_key_value_heads=self.kv_heads,
            rope_theta=float(self.rope_theta), tie_word_embeddings=self.tie_embeddings,
            rms_norm_eps=_RMS_NORM_EPS, attention_dropout=0.0, bos_token_id=None, eos_token_id=None,
            pad_token_id=None, use_cache=False)
        kw.update(overrides)
        try:
            cfg = AutoConfig.for_model(family, **kw)
        except ValueError as exc:  # transformers names the model types it knows
            raise ModelShapeError(f"unknown model family {family!r}: {exc}") from None
        cfg._attn_implementation = "sdpa"
        return cfg


MODELS: dict[str, ModelShape] = {
    s.name: s
    for s in (
        # ~5.3M parameters with a 4096-token vocabulary; one 8 x 128-token fwd+bwd takes ~0.4 s on 2 CPU
        # cores. intermediate = 8/3 * hidden rounded to a multiple of 16, as LLaMA does.
        ModelShape(name="tiny", hidden=256, layers=4, heads=4, kv_heads=4, intermediate=688, vocab=4096,
                   note="CPU default of agoq train"),
        # tiny with 8 layers, so that 4 pipeline stages x 2 chunks get one layer each (the planner's
        # CPU pipeline tests).
        ModelShape(name="tiny-8l", hidden=256, layers=8, heads=4, kv_heads=4, intermediate=688, vocab=4096,
                   note="tiny, 8 layers: CPU pipeline tests"),
        # Seconds-long CPU smoke runs of the GPU benchmarks (intermediate: whole 128-element blocks).
        ModelShape(name="micro", hidden=128, layers=2, heads=4, kv_heads=4, intermediate=384, vocab=512,
                   note="benchmarks' CPU smoke shape"),
        # ~29M parameters: a longer CPU run or a quick GPU check.
        ModelShape(name="small", hidden=512, layers=8, heads=8, kv_heads=4, intermediate=1376, vocab=4096,
                   note="GQA 2:1"),
        ModelShape(name="llama-1b", hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192, vocab=128256,
                   rope_theta=500000.0, tie_embeddings=True, note="LLaMA-3.2-1B"),
        ModelShape(name="llama2-7b", hidden=4096, layers=32, heads=32, kv_heads=32, intermediate=11008, vocab=32000,
                   note="LLaMA-2-7B"),
        ModelShape(name="llama3-8b", hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336, vocab=128256,
                   rope_theta=500000.0, note="LLaMA-3-8B"),
        ModelShape(name="llama2-13b", hidden=5120, layers=40, heads=40, kv_heads=40, intermediate=13824,
                   vocab=32000, note="LLaMA-2-13B"),
    )
}

_HF_NEEDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")


def get_model_shape(model: object) -> ModelShape:
    """A ModelShape from a name in :data:`MODELS`, a ModelShape, or an HF LLaMA-family config / model."""
    if isinstance(model, ModelShape):
        return model
    if isinstance(model, str):
        key = model.strip().lower()
        if key not in MODELS:
            raise ModelShapeError(f"unknown model {model!r}; presets: {', '.join(MODELS)} (or pass an HF config)")
        return MODELS[key]
    cfg = getattr(model, "config", model)  # an HF model carries its config
    missing = [a for a in _HF_NEEDS if not hasattr(cfg, a)]
    if missing:
        raise ModelShapeError(f"cannot read a model shape from {type(model).__name__}: it lacks {missing}; pass a "
                              f"preset name ({', '.join(MODELS)}), a ModelShape or an HF LLaMA-family config")
    rope = getattr(cfg, "rope_parameters", None)  # transformers >= 5 keeps rope_theta there
    theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    theta = theta if theta is not None else getattr(cfg, "rope_theta", None)
    return ModelShape(
        name=str(getattr(cfg, "name_or_path", "") or getattr(cfg, "model_type", "hf")),
        hidden=int(cfg.hidden_size), layers=int(cfg.num_hidden_layers), heads=int(cfg.num_attention_heads),
        kv_heads=int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads),
        intermediate=int(cfg.intermediate_size), vocab=int(cfg.vocab_size),
        rope_theta=float(theta) if theta is not None else 10000.0,
        tie_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)))
