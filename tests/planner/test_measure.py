"""Activation costs from LAAQ's measurement: against the shape formula, extrapolation, LAAQ configs."""
from __future__ import annotations

import pytest

pytest.importorskip("transformers")
laaq = pytest.importorskip("agoq_core.laaq", reason="LAAQ (agoq_core.laaq) is not in this checkout")

from agoq_core.planner import ActivationCostTable, PlannerError, TransformerShape, plan_for_pipeline  # noqa: E402
from agoq_core.planner.measure import measure_activation_costs  # noqa: E402

FORMATS = ("int4", "int5", "int6", "int8", "nf4")
# odd sizes on purpose: GQA 6 heads / 2 kv heads, intermediate not a power of two
SHAPE = TransformerShape(name="odd", hidden=384, layers=4, heads=6, kv_heads=2, intermediate=1040, vocab=1000)


@pytest.mark.parametrize("dtype,act_bytes", [("float32", 4), ("bfloat16", 2)])
def test_measured_costs_equal_the_shape_formula(dtype, act_bytes):
    m = measure_activation_costs(SHAPE, microbatch_size=2, seq_len=48, formats=FORMATS, dtype=dtype,
                                 extrapolate=False)
    f = ActivationCostTable.from_formula(SHAPE, tokens=96, formats=FORMATS, act_bytes=act_bytes, seq_len=48)
    assert dict(m.layer_bytes) == dict(f.layer_bytes)
    assert m.layer_fixed_bytes == f.layer_fixed_bytes
    assert (m.first_stage_bytes, m.last_stage_bytes, m.chunk_bytes) == \
        (f.first_stage_bytes, f.last_stage_bytes, f.chunk_bytes)
    # more bits, more bytes; 4-bit codes cost the same
    b = m.layer_bytes
    assert b["int4"] == b["nf4"] < b["int5"] < b["int6"] < b["int8"]


def test_extrapolated_measurement_equals_full_length():
    kw = dict(microbatch_size=1, seq_len=160, formats=("int4", "int6"), dtype="float32")
    full = measure_activation_costs(SHAPE, extrapolate=False, **kw)
    line = measure_activation_costs(SHAPE, extrapolate=True, **kw)
    assert dict(full.layer_bytes) == dict(line.layer_bytes)
    assert (full.first_stage_bytes, full.last_stage_bytes, full.chunk_bytes, full.layer_fixed_bytes) == \
        (line.first_stage_bytes, line.last_stage_bytes, line.chunk_bytes, line.layer_fixed_bytes)
    assert "extrapolated" in line.source


def test_laaq_config_for_stage_carries_the_planned_formats():
    plan = plan_for_pipeline("tiny", 2, 4, "1f1b", activations="formula", seq_len=64, dtype="float32",
                             activation_budget_bytes=None)
    for s in plan.stages:
        cfg = plan.laaq_config_for_stage(s.stage)
        assert isinstance(cfg, laaq.LAAQConfig)
        for layer, fmt in s.formats.items():
            names = cfg.plan(layer).names()
            assert names["norm_input"] == names["mlp_act_input"] == names["attn_out_input"] == fmt
            assert names["attention_core"] == "native"
    # a base config's other settings survive
    cfg = plan.laaq_config_for_stage(0, base=laaq.LAAQConfig(block=64))
    assert cfg.block == 64
    with pytest.raises(PlannerError, match="stage must be an int in \\[0, 1\\]"):
        plan.laaq_config_for_stage(2)
    with pytest.raises(PlannerError, match="base must be an LAAQConfig"):
        plan.laaq_config_for_stage(0, base={"norm_input": "int4"})


def test_measurement_errors_are_planner_errors():
    with pytest.raises(PlannerError, match="dtype must be one of"):
        measure_activation_costs(SHAPE, microbatch_size=1, seq_len=8, formats=FORMATS, dtype="int8")
    with pytest.raises(PlannerError, match="cannot build a 2-layer odd"):
        measure_activation_costs(SHAPE, microbatch_size=1, seq_len=8, formats=FORMATS, device="nodevice")
