"""Memory of the cost model: the planner's accounting (same numbers), a real HF model (same bytes)."""
from __future__ import annotations

import pytest

from agoq_core.planner import StaticMemoryConfig, plan_for_pipeline
from agoq_core.planner.memory import static_bytes
from agoq_core.planner.model import model_shape
from agoq_core.planner.schedules import PipelineSpec
from agoq_core.scale import ScaleError
from agoq_core.scale.memory import (AGOQ_CANDIDATES, agoq_memory, baseline_memory, hf_plain_layer_bytes,
                                    paper_cost_table, stage_params, stage_static)

BIG = 1 << 50


@pytest.mark.parametrize("schedule,stages,mb", [("interleaved-1f1b", 4, 8), ("1f1b", 4, 8), ("gpipe", 2, 3)])
def test_agoq_memory_is_the_planners(schedule, stages, mb):
    shape = model_shape("llama2-7b")
    spec = PipelineSpec(schedule=schedule, stages=stages, microbatches=mb)
    static = StaticMemoryConfig(grads="quangrad", optimizer="adam8bit")
    m = agoq_memory(shape, spec, tokens=4096, seq=4096, microbatch_size=1, tp=1, dp=1, usable_bytes=BIG)
    plan = plan_for_pipeline("llama2-7b", stages, mb, schedule, seq_len=4096, candidates=AGOQ_CANDIDATES,
                             activations="formula", pipeline_buffers=False, static=static)
    for s, ps in zip(m.stages, plan.stages):
        assert s.activation_peak == ps.activation_peak
        assert s.formats == dict(ps.formats)
        assert sum(s.static.values()) == ps.static_bytes  # the plan adds pipeline_buffers = 0 here


def test_tensor_parallel_splits_the_planners_bytes():
    shape = model_shape("llama2-13b")
    spec = PipelineSpec(schedule="1f1b", stages=4, microbatches=8)
    one = agoq_memory(shape, spec, tokens=8192, seq=8192, microbatch_size=1, tp=1, dp=1, usable_bytes=BIG)
    eight = agoq_memory(shape, spec, tokens=8192, seq=8192, microbatch_size=1, tp=8, dp=1, usable_bytes=BIG)
    for a, b in zip(one.stages, eight.stages):
        assert b.activation_peak == pytest.approx(a.activation_peak / 8, rel=1e-6)
        assert sum(b.static.values()) == pytest.approx(sum(a.static.values()) / 8, rel=1e-6)


def test_static_is_the_planners_with_zero_sharding():
    shape = model_shape("llama2-7b")
    spec = PipelineSpec(schedule="1f1b", stages=2, microbatches=4)
    cfg = StaticMemoryConfig(grads="fp32", optimizer="adam")
    p = stage_params(shape, spec, 0)
    assert p == 16 * shape.layer_params + shape.embed_params
    assert stage_static(p, cfg, tp=1, dp=4, zero=0) == static_bytes(p, cfg)
    z1 = stage_static(p, cfg, tp=2, dp=4, zero=1)
    full = static_bytes(p // 2, cfg)
    assert z1["optimizer"] == -(-full["optimizer"] // 4) and z1["grads"] == full["grads"]
    z3 = stage_static(p, cfg, tp=2, dp=4, zero=3)
    assert z3["params"] == -(-full["params"] // 4) and z3["grads"] == -(-full["grads"] // 4)
    with pytest.raises(ScaleError, match="zero must be 0, 1, 2 or 3"):
        stage_static(p, cfg, tp=1, dp=1, zero=4)


def test_baseline_1f1b_closed_form_and_recompute():
    # 1F1B: rank r holds S - r micro-batches; checked against that closed form, independent of the walk
    shape = model_shape("llama2-7b")
    spec = PipelineSpec(schedule="1f1b", stages=4, microbatches=8)
    T = 4096
    m = baseline_memory(shape, spec, tokens=T, tp=1, dp=1, usable_bytes=BIG, recompute=0)
    full = hf_plain_layer_bytes(shape, T)
    for r, s in enumerate(m.stages):
        extra = (8 * T if r == 0 else 0) + (4 * 2 * T * shape.hidden + 4 * T * shape.vocab if r == 3 else 0)
        assert s.activation_peak == (4 - r) * (8 * full + extra)
    # each recomputed layer keeps only its input; memory falls strictly with R
    peaks = [baseline_memory(shape, spec, tokens=T, tp=1, dp=1, usable_bytes=BIG, recompute=R).peak for R in range(9)]
    assert all(a > b for a, b in zip(peaks, peaks[1:]))
    # the automatic choice is the smallest R that fits
    budget = peaks[3] + 1
    auto = baseline_memory(shape, spec, tokens=T, tp=1, dp=1, usable_bytes=budget)
    assert auto.fits and auto.recompute_layers == 3


def test_paper_units():
    shape = model_shape("llama2-13b")
    U = 2 * 1024 * shape.hidden
    t = paper_cost_table(shape, 1024, ("nf4", "int8"))
    # 5U + 11U x 4.25/16 (nf4 with its fp32 scale per 128) = 7.921875U; int8 block 128: 8.25 bits
    assert t.bytes_for("nf4") == 5 * U + round(11 * U * 4.25 / 16)
    assert t.bytes_for("int8") == 5 * U + round(11 * U * 8.25 / 16)
    spec = PipelineSpec(schedule="1f1b", stages=1, microbatches=1)
    m = baseline_memory(shape, spec, tokens=1024, tp=1, dp=1, usable_bytes=BIG, accounting="paper", recompute=0)
    assert m.stages[0].activation_peak == 40 * 28 * U + 8 * 1024 + U + 4 * 1024 * shape.vocab


def test_hf_plain_formula_equals_a_real_measurement():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from agoq_core.laaq import measure_saved_bytes

    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=352, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, use_cache=False)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    for seq in (32, 72):
        sb = measure_saved_bytes(model, None, seq=seq)
        assert sb.layer_total(1) == hf_plain_layer_bytes(model_shape(cfg), seq)
