"""Tiny torchtitan Llama 3 models for CPU tests: torchtitan's own debugmodel config (dim 256, 16 heads,
fused wqkv, SwiGLU 768), cut to a few layers, with SDPA as the inner attention (torchtitan 0.3.0's
language-model default, FlexAttention, always runs through torch.compile; SDPA is its eager module)."""
from __future__ import annotations

import torch

from agoq_core.integrations.torchtitan import torch_compat

torch_compat()  # torchtitan 0.3.0 imports on torch < 2.13 only with it (a no-op on 2.13); spawned ranks too


def tiny_spec(converters=None, layers: int = 2):
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import model_registry

    spec = model_registry("debugmodel", converters=converters)
    spec.model.layers = spec.model.layers[:layers]
    for layer in spec.model.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    return spec


def build(spec, seed: int = 0):
    torch.manual_seed(seed)
    model = spec.model.build()
    model.init_weights()
    with torch.no_grad():  # norm weights start at exactly 1: perturb them so their gradients are not degenerate
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
    return model


def tokens(seed: int, batch: int = 2, seq: int = 64, vocab: int = 2048):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq + 1), generator=g)


def loss_of(model, tok):
    logits = model(tok[:, :-1])
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tok[:, 1:].flatten())
