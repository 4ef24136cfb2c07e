"""Model sizes by name: LLaMA-family shapes built as Hugging Face ``LlamaForCausalLM``, random init.

The shapes give the transformer body (width, depth, heads, MLP width, RoPE base). The vocabulary is
the shipped tokenizer's (4096 tokens) for every size, so ``llama-1b`` and ``llama2-7b`` here have the
bodies of LLaMA-3.2-1B and LLaMA-2-7B but far smaller embedding tables than the real models
(128,256 and 32,000 tokens): see docs/training.md.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ModelShape", "MODEL_SIZES", "build_model", "count_parameters"]


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    rope_theta: float = 10000.0
    tie_embeddings: bool = False
    note: str = ""


MODEL_SIZES: dict[str, ModelShape] = {
    # ~5.3M parameters with the 4096-token vocabulary; one 8 x 128-token fwd+bwd takes ~0.4 s on 2 CPU cores.
    # intermediate = 8/3 * hidden rounded to a multiple of 16, as LLaMA does.
    "tiny": ModelShape(hidden=256, layers=4, heads=4, kv_heads=4, intermediate=688, note="CPU default"),
    # ~29M parameters: a longer CPU run or a quick GPU check.
    "small": ModelShape(hidden=512, layers=8, heads=8, kv_heads=4, intermediate=1376, note="GQA 2:1"),
    # LLaMA-3.2-1B body: 16 layers, width 2048, GQA 32/8, MLP 8192, RoPE base 500000, tied embeddings.
    "llama-1b": ModelShape(hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192,
                           rope_theta=500000.0, tie_embeddings=True, note="LLaMA-3.2-1B body"),
    # LLaMA-2-7B body: 32 layers, width 4096, 32 heads (no GQA), MLP 11008.
    "llama2-7b": ModelShape(hidden=4096, layers=32, heads=32, kv_heads=32, intermediate=11008,
                            note="LLaMA-2-7B body"),
}


def build_model(size: str, *, vocab_size: int, seq_len: int, seed: int,
                device: torch.device | str = "cpu") -> torch.nn.Module:
    """A freshly initialised fp32 ``LlamaForCausalLM`` of the named shape on ``device``, from ``seed``.

    Each arm of a run builds its model with this call and the same seed: the init is deterministic on
    a given device, so every arm starts from the same weights (tests/train check it) without keeping
    a second copy of a 7B model around.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = MODEL_SIZES[size]
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=max(seq_len, 128),
        rope_theta=shape.rope_theta,
        tie_word_embeddings=shape.tie_embeddings,
        rms_norm_eps=1e-5,
        attention_dropout=0.0,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        use_cache=False,
    )
    cfg._attn_implementation = "sdpa"
    # fork_rng keeps the caller's global RNG untouched; the init depends on `seed` alone.
    device = torch.device(device)
    fork_devices = [] if device.type in ("cpu", "meta") else [device]
    with torch.random.fork_rng(devices=fork_devices, device_type=device.type if fork_devices else "cuda"):
        torch.manual_seed(seed)
        with device:  # initialise in place: a 7B model is never materialised on the host
            model = LlamaForCausalLM(cfg)
    return model


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
