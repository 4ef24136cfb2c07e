"""LAAQ with the wrappers models live in: FSDP2 (``fully_shard``, before or after ``apply``), DDP and
torch.compile's OptimizedModule. Families are matched by class hierarchy (FSDP2 makes an
``FSDPLlamaDecoderLayer`` subclass) and paths go through wrappers (``module.``, ``_orig_mod.``).

A real 1-process gloo group (CPU): FSDP2's all-gather/reduce-scatter run, trivially. Oracle: the same
model with LAAQ and no wrapper (same gradients up to the reduce's fp32 rounding)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from agoq_core.laaq import LAAQConfig, apply, remove
from agoq_core.laaq.families import match_family
from tests.laaq.conftest import grads, rel_err, small_batch, small_model


@pytest.fixture
def gloo(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _full(g):
    return g.full_tensor() if hasattr(g, "full_tensor") else g


def _shard(model):
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


@pytest.mark.parametrize("order", ["shard_then_apply", "apply_then_shard"])
def test_fsdp2_either_order(gloo, order):
    ids = small_batch()
    ref = small_model("llama")
    apply(ref)
    l0, g0 = grads(ref, ids)
    model = small_model("llama")
    if order == "shard_then_apply":
        _shard(model)
        assert type(model.model.layers[0]).__name__ == "FSDPLlamaDecoderLayer"
        rep = apply(model)
    else:
        rep = apply(model)
        _shard(model)
    assert rep.layers == [0, 1] and rep.skipped == []
    l1, g1 = grads(model, ids)
    assert torch.equal(l0, l1)
    errs = {n: rel_err(g0[n], _full(g1[n])) for n in g0}
    assert max(errs.values()) < 1e-6, errs
    remove(model)


def test_ddp_and_compile_wrappers(gloo):
    ids = small_batch()
    ref = small_model("llama")
    apply(ref)
    l0, g0 = grads(ref, ids)
    ddp = torch.nn.parallel.DistributedDataParallel(small_model("llama"))
    rep = apply(ddp)
    assert rep.layers == [0, 1] and any(c.path == "module.model.norm" for c in rep.converted)
    l1, g1 = grads(ddp, ids)
    assert torch.equal(l0, l1)
    assert max(rel_err(g0[n.removeprefix("module.")], g1[n]) for n in g1) < 1e-6
    remove(ddp)
    compiled = torch.compile(small_model("llama"))  # not run here (tests/laaq/test_compile.py runs it)
    rep = apply(compiled, LAAQConfig())
    assert rep.layers == [0, 1] and any(c.path == "_orig_mod.lm_head" for c in rep.converted)
    remove(compiled._orig_mod)  # from the inner model too


def test_family_match_follows_the_class_hierarchy():
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    layer = small_model("llama").model.layers[0]
    sub = type("WrappedLayer", (type(layer),), {})
    layer.__class__ = sub
    assert isinstance(layer, LlamaDecoderLayer) and match_family(layer).name == "llama"
