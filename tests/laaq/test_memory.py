"""Memory accounting: measured from live tensors, checked against independent expectations."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from agoq_core.formats.spec import get_format
from agoq_core.laaq import PARTS, LAAQConfig, SavedBytesMeter, apply, measure_saved_bytes, remove
from tests.laaq.conftest import tiny_model

B, S, H, I = 1, 256, 128, 344  # noqa: E741  (LLaMA's 2.69 MLP ratio; 4 heads of 32)


def _model(family="llama", dtype=torch.bfloat16, **kw):
    return tiny_model(family, dtype=dtype, hidden=H, intermediate=I, heads=4, kv_heads=4, **kw)


def test_plain_model_bytes_match_what_pytorch_saves():
    # Expected from what each op of HF's LLaMA layer saves (bf16): RMSNorm keeps its fp32 input copy,
    # the normalized bf16 tensor and the fp32 rsqrt per token; SiLU keeps g, the product keeps
    # silu(g) and u; the GEMMs keep their inputs (one tensor read by q/k/v counts once).
    got = measure_saved_bytes(_model(), None, batch=B, seq=S)
    t = B * S
    want = {"norm": 2 * (t * H * 4 + t * H * 2 + t * 4), "qkv_in": t * H * 2, "mlp_in": t * H * 2,
            "act": 3 * t * I * 2, "down_in": t * I * 2, "o_in": 0, "other": 0}
    for layer in (0, 1):
        d = got.per_layer[layer]
        assert {k: d[k] for k in want} == want, layer
        # attention core: Q, K, V, output (bf16) + logsumexp (fp32) [+ RoPE cos/sin, shared: layer 0]
        core = 4 * t * H * 2 + 4 * S * 4 + (2 * S * 32 * 2 if layer == 0 else 0)
        assert d["attn_core"] == core, (layer, d["attn_core"], core)


@pytest.mark.parametrize("fmt", ["nf4", "int5", "int8"])
def test_laaq_bytes_are_the_kept_quantized_inputs(fmt):
    model = _model()
    got = measure_saved_bytes(model, LAAQConfig.uniform(fmt), batch=B, seq=S)
    spec, t = get_format(fmt), B * S
    for layer in (0, 1):
        d = got.per_layer[layer]
        assert d["norm"] == 2 * spec.storage_bytes(t * H)
        assert d["act"] == 2 * spec.storage_bytes(t * I)
        assert d["qkv_in"] == d["mlp_in"] == d["down_in"] == d["o_in"] == d["other"] == 0
    assert got.outside["norm"] == spec.storage_bytes(t * H) and "head" not in got.outside
    assert not any(is_conv for is_conv in [hasattr(m, "_agoq_laaq") for m in model.modules()])  # undone


def test_default_policy_keeps_under_30_percent_of_plain_layers():
    model = _model()
    plain = measure_saved_bytes(model, None, batch=B, seq=S)
    laaq = measure_saved_bytes(model, LAAQConfig(), batch=B, seq=S)
    assert laaq.layers_total <= 0.30 * plain.layers_total, plain.table(laaq)
    naive = measure_saved_bytes(model, LAAQConfig.uniform("int4", include_attention=True), batch=B, seq=S)
    assert naive.per_layer[1]["attn_core"] < 0.3 * laaq.per_layer[1]["attn_core"]
    text = plain.table(laaq)
    assert "decoder layers: LAAQ keeps" in text and all(p in text for p in PARTS)


class _Births(TorchDispatchMode):
    """Every storage an op creates, weakly (to see what is still alive after forward)."""

    def __init__(self):
        super().__init__()
        self.refs = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                self.refs.setdefault(st._cdata, (StorageWeakRef(st), st.nbytes()))
        return out


@pytest.mark.parametrize("policy", [None, LAAQConfig(), LAAQConfig.uniform("int4", include_attention=True)],
                         ids=["plain", "paper", "naive"])
def test_nothing_else_stays_alive_after_forward(policy):
    """Every storage created in forward and alive afterwards is accounted as kept for backward:
    no hidden copies in ctx, closures or caches (and the accounting misses nothing)."""
    model = _model(layers=2)
    ids = torch.randint(0, 160, (B, S))
    rep = apply(model, policy) if policy is not None else None
    # warm-up: a backend's one-time per-format constants (agoq-cpu's decode tables) are not activations
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    model.zero_grad(set_to_none=True)
    births = _Births()
    meter = SavedBytesMeter(model)
    with meter, births:
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    params = {p.untyped_storage()._cdata for p in model.parameters()}  # e.g. born again as W.t() views
    alive = {k: n for k, (ref, n) in births.refs.items() if not ref.expired() and k not in params}
    alive.pop(loss.untyped_storage()._cdata, None)
    accounted = {k for k, (ref, _, _) in meter._ledger.entries.items() if not ref.expired()}
    assert set(alive) - accounted == set(), f"alive but not accounted: {sorted(alive[k] for k in set(alive) - accounted)}"
    born_before = sum(n for k, (ref, n, _) in meter._ledger.entries.items() if not ref.expired() and k not in births.refs)
    assert born_before == ids.numel() * 8  # the embedding keeps input_ids, made before forward
    assert sum(alive.values()) == meter.result().total - born_before
    loss.backward()
    if rep is not None:
        rep.undo()


def test_meta_device_gives_the_same_bytes_as_cpu():
    cpu = measure_saved_bytes(_model(), LAAQConfig(), batch=B, seq=S)
    meta_model = _model().to("meta")
    meta = measure_saved_bytes(meta_model, LAAQConfig(), batch=B, seq=S)
    for layer in (0, 1):
        assert meta.per_layer[layer] == cpu.per_layer[layer], layer
    # (SDPA on meta keeps what the flash kernels keep, like the CPU-flash kernel: flash_layout_sdpa)
    plain_meta = measure_saved_bytes(meta_model, None, batch=B, seq=S)
    plain_cpu = measure_saved_bytes(_model(), None, batch=B, seq=S)
    assert plain_meta.per_layer == plain_cpu.per_layer and plain_meta.outside == plain_cpu.outside


def test_measure_from_a_config_and_a_role_mapping():
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=128, hidden_size=H, intermediate_size=I, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=4, max_position_embeddings=S, use_cache=False)
    got = measure_saved_bytes(cfg, {"norm_input": "int8", "mlp_act_input": "int6"}, batch=2, seq=S)
    assert got.per_layer[0]["norm"] == 2 * get_format("int8").storage_bytes(2 * S * H)
    assert got.per_layer[0]["act"] == 2 * get_format("int6").storage_bytes(2 * S * I)
    assert got.mean_layer()["norm"] == got.per_layer[0]["norm"]
    with pytest.raises(TypeError, match="nn.Module or a transformers config"):
        measure_saved_bytes(42)
    with pytest.raises(ValueError, match="batch and seq"):
        measure_saved_bytes(_model(), None, seq=0)


def test_meter_on_a_model_that_already_has_laaq():
    model = _model()
    apply(model)
    got = measure_saved_bytes(model, batch=B, seq=S)
    assert got.label == "LAAQ" and got.per_layer[0]["qkv_in"] == 0
    remove(model)


def test_cli_memory_table_and_json(capsys):
    from agoq_core.cli.main import main

    base = ["memory", "--hidden", "64", "--intermediate", "176", "--seq", "64", "--vocab", "128"]
    assert main(base) == 0
    out = capsys.readouterr().out
    assert "decoder layers: LAAQ keeps" in out and "policy: LAAQConfig(norm_input=nf4" in out
    assert main(base + ["--json", "--policy", "int8", "--model", "qwen2"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["laaq"]["per_layer"]["0"]["norm"] == 2 * get_format("int8").storage_bytes(64 * 64)
    assert 0 < data["layers_ratio"] < 1
    assert main(base + ["--policy", "int3"]) == 2
    assert "not an activation format" in capsys.readouterr().err


def test_cli_entry_point_lists_memory():
    out = subprocess.run([sys.executable, "-m", "agoq_core.cli.main", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "memory" in out.stdout
