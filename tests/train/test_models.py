"""Model sizes: real HF LlamaForCausalLM shapes; same seed gives the same weights."""
from __future__ import annotations

import torch

from agoq_core.models import MODELS
from agoq_core.train.models import build_model, count_parameters


def _expected_params(s, vocab: int) -> int:
    # written from the LLaMA architecture, not from the model object
    head_dim = s.hidden // s.heads
    attn = s.hidden * s.heads * head_dim + 2 * s.hidden * s.kv_heads * head_dim + s.heads * head_dim * s.hidden
    mlp = 3 * s.hidden * s.intermediate
    norms = 2 * s.hidden
    emb = vocab * s.hidden * (1 if s.tie_embeddings else 2)
    return s.layers * (attn + mlp + norms) + s.hidden + emb


def test_every_size_builds_with_the_documented_shape():
    for name, shape in MODELS.items():
        dev = "cpu" if name in ("tiny", "micro") else "meta"  # the big ones: shapes only, no memory
        m = build_model(name, vocab_size=4096, seq_len=64, seed=0, device=dev)
        assert type(m).__name__ == "LlamaForCausalLM"
        assert m.config.num_hidden_layers == shape.layers and m.config.hidden_size == shape.hidden
        assert count_parameters(m) == _expected_params(shape, 4096), name
    assert 4e6 < count_parameters(build_model("tiny", vocab_size=4096, seq_len=64, seed=0)) < 8e6


def test_same_seed_same_weights_other_seed_other_weights():
    a = build_model("tiny", vocab_size=4096, seq_len=64, seed=1)
    b = build_model("tiny", vocab_size=4096, seq_len=64, seed=1)
    c = build_model("tiny", vocab_size=4096, seq_len=64, seed=2)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)
    # building a model leaves the caller's RNG alone
    torch.manual_seed(5)
    r1 = torch.rand(3)
    torch.manual_seed(5)
    build_model("tiny", vocab_size=4096, seq_len=64, seed=9)
    assert torch.equal(torch.rand(3), r1)
