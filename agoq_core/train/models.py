"""The model a training arm trains: a registry shape (agoq_core.models) built as Hugging Face
``LlamaForCausalLM``, random init.

``agoq train`` trains every shape with the shipped tokenizer's vocabulary (4096 tokens): the
``vocab_size`` argument of :func:`build_model` overrides the registry's, so ``llama-1b`` and
``llama2-7b`` here have the bodies of LLaMA-3.2-1B and LLaMA-2-7B but far smaller embedding tables
than the real models (128,256 and 32,000 tokens): see docs/training.md.
"""
from __future__ import annotations

import torch

from agoq_core.models import MODELS, get_model_shape

__all__ = ["build_model", "count_parameters", "MODEL_SIZES"]

#: The names ``--model`` accepts: the registry's (kept under its old name for existing callers).
MODEL_SIZES = MODELS


def build_model(size: str, *, vocab_size: int, seq_len: int, seed: int,
                device: torch.device | str = "cpu") -> torch.nn.Module:
    """A freshly initialised fp32 ``LlamaForCausalLM`` of the named shape with ``vocab_size`` tokens
    on ``device``, from ``seed``.

    Each arm of a run builds its model with this call and the same seed: the init is deterministic on
    a given device, so every arm starts from the same weights (tests/train check it) without keeping
    a second copy of a 7B model around.
    """
    from transformers import LlamaForCausalLM

    cfg = get_model_shape(size).to_hf_config(vocab_size=vocab_size, max_position_embeddings=max(seq_len, 128))
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
