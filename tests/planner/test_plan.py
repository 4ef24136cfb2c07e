"""Plans: budget respected, optimal against exhaustive search, the paper's closed form compared."""
from __future__ import annotations

import itertools
import json
import re

import pytest

from agoq_core.formats.spec import get_format
from agoq_core.planner import (ActivationCostTable, BudgetError, PipelineSpec, PlannerError, TransformerShape,
                               inflight, measure_fidelity, plan_for_pipeline, split_layers)
from agoq_core.planner.fidelity import FidelityTable

FORMATS = ("int4", "int5", "int6", "int8", "fp4_e2m1", "nf4")


@pytest.fixture(scope="module")
def fid():
    return measure_fidelity(FORMATS)


def test_fidelity_orders_formats_by_bits(fid):
    # more bits, less error; every 4-bit code is worse than int5 on these samples
    assert fid["int4"] > fid["int5"] > fid["int6"] > fid["int8"] > 0
    assert min(fid["fp4_e2m1"], fid["nf4"], fid["int4"]) > fid["int5"]
    # int: each extra bit roughly quarters the noise (6 dB/bit) — within 1 dB
    for lo, hi in (("int4", "int5"), ("int5", "int6")):
        assert abs(fid.sqnr_db(hi) - fid.sqnr_db(lo) - 6.02) < 1.0


def test_paper_closed_form_overshoots_stage_2_and_the_solver_does_not(fid):
    # Paper accounting: a stage's activation memory = bits x in-flight micro-batches.
    plan = plan_for_pipeline("llama2-7b", 4, 8, "interleaved-1f1b", activations="bits", granularity="stage",
                             fidelity=fid)
    cf = plan.closed_form
    assert [c.bits for c in cf] == [4, 5, 6, 8]                 # the paper's 4/5/6/8
    assert [c.units for c in cf] == [44, 45, 42, 40]            # B_i * N_i
    assert all(c.unit_budget == 44 for c in cf)                 # 4 * N_1
    assert [c.fits for c in cf] == [True, False, True, True]    # stage 2 (index 1): 45 > 44
    widths = [sorted({get_format(f).bits for f in s.formats.values()}) for s in plan.stages]
    assert widths == [[4], [4], [6], [8]]                       # per stage, the exact optimum is 4/4/6/8
    for s in plan.stages:
        assert s.activation_peak <= s.activation_cap == plan.budget


def test_per_layer_plan_beats_the_closed_form_where_it_fits(fid):
    plan = plan_for_pipeline("llama2-7b", 4, 8, "interleaved-1f1b", activations="bits", fidelity=fid)
    for s, c in zip(plan.stages, plan.closed_form):
        assert s.activation_peak <= plan.budget
        if c.fits:  # the closed form's choice is one the solver could have made
            assert s.cost <= c.cost * (1 + 1e-12)
    # stage 2: some layers above 4 bits without overshooting (the closed form's 5 bits everywhere does)
    s1 = plan.stages[1]
    assert any(f in ("int5", "int6", "int8") for f in s1.formats.values())
    assert s1.activation_peak <= plan.budget < plan.closed_form[1].peak
    # stage 3: strictly better than the closed form's int6 everywhere
    assert plan.stages[2].cost < plan.closed_form[2].cost


def _small_costs():
    # distinct bytes per format so that the search is not trivial
    return ActivationCostTable(layer_bytes={"int4": 40, "int5": 49, "int6": 58, "int8": 77},
                               layer_fixed_bytes=10, quantized_numel=100, first_stage_bytes=7,
                               last_stage_bytes=23, tokens=1, source="test table")


def _exhaustive(plan, costs, fid, cap):
    """Independent optimum: every per-layer assignment, peaks from the full in-flight trace."""
    spec = plan.spec
    prof = inflight(spec)
    best_total = 0.0
    for r, s in enumerate(plan.stages):
        layers = [layer for ch in s.layers for layer in ch]
        best = None
        for combo in itertools.product(plan.config.candidates, repeat=len(layers)):
            fm = dict(zip(layers, combo))
            per_mb = []
            for c, vs in enumerate(s.vstages):
                b = sum(costs.bytes_for(fm[layer]) for layer in s.layers[c])
                b += costs.first_stage_bytes if vs == 0 else 0
                b += costs.last_stage_bytes if vs == spec.virtual_stages - 1 else 0
                per_mb.append(b)
            peak = max(sum(n * b for n, b in zip(vec, per_mb)) for vec in prof.ranks[r].trace)
            if peak <= cap:
                err = sum(costs.quantized_numel * fid[f] for f in combo)
                best = err if best is None else min(best, err)
        assert best is not None
        assert s.cost == pytest.approx(best, rel=1e-9), (r, s.formats)
        best_total += best
    return best_total


@pytest.mark.parametrize("schedule,S,m,layers", [("1f1b", 2, 4, 6), ("gpipe", 2, 3, 4),
                                                 ("interleaved-1f1b", 2, 4, 4), ("interleaved-1f1b", 2, 2, 6),
                                                 ("1f1b", 3, 5, 6)])
@pytest.mark.parametrize("cap", [400, 650, 900])
def test_plan_equals_exhaustive_search(fid, schedule, S, m, layers, cap):
    shape = TransformerShape(name="t", hidden=64, layers=layers, heads=4, kv_heads=4, intermediate=128, vocab=100)
    costs = _small_costs()
    try:
        plan = plan_for_pipeline(shape, S, m, schedule, costs=costs, fidelity=fid, activation_budget_bytes=cap,
                                 candidates=("int4", "int5", "int6", "int8"), pipeline_buffers=False,
                                 baseline_format="int4")
    except BudgetError:
        # then even int4 everywhere must fail somewhere, checked independently
        plan_spec = PipelineSpec(schedule=schedule, stages=S, microbatches=m)
        prof = inflight(plan_spec)
        lay = split_layers(layers, plan_spec)
        worst = 0
        for r in range(S):
            vss = plan_spec.vstages_of(r)
            per_mb = [40 * len(lay[vs]) + (7 if vs == 0 else 0) + (23 if vs == plan_spec.virtual_stages - 1 else 0)
                      for vs in vss]
            worst = max(worst, max(sum(n * b for n, b in zip(v, per_mb)) for v in prof.ranks[r].trace))
        assert worst > cap
        return
    _exhaustive(plan, costs, fid, cap)
    for s in plan.stages:
        assert s.activation_peak <= cap


@pytest.mark.parametrize("schedule,S,m", [("gpipe", 2, 4), ("1f1b", 4, 8), ("1f1b", 3, 12),
                                          ("interleaved-1f1b", 4, 8), ("interleaved-1f1b", 2, 6),
                                          ("interleaved-1f1b", 4, 12)])
@pytest.mark.parametrize("activations", ["bits", "formula"])
def test_budget_is_never_exceeded_and_granularity_is_nested(fid, schedule, S, m, activations):
    kw = dict(activations=activations, fidelity=fid, seq_len=1024)
    plans = {g: plan_for_pipeline("llama2-7b", S, m, schedule, granularity=g, **kw)
             for g in ("stage", "chunk", "layer")}
    for g, plan in plans.items():
        for s in plan.stages:
            assert s.activation_peak <= s.activation_cap == plan.budget
            # peak recomputed from the formats, the layer split and the whole in-flight trace
            per_mb = []
            for c, vs in enumerate(s.vstages):
                b = sum(plan.costs.bytes_for(s.formats[layer]) for layer in s.layers[c]) + plan.costs.chunk_bytes
                b += s.chunk_io_bytes[c]
                b += plan.costs.first_stage_bytes if vs == 0 else 0
                b += plan.costs.last_stage_bytes if vs == plan.spec.virtual_stages - 1 else 0
                per_mb.append(b)
            assert per_mb == list(s.chunk_bytes)
            rk = plan.profile.ranks[s.stage]
            # every moment of the schedule: in-flight micro-batches + outputs held by pending sends
            # (+ one stale output in Schedule1F1B once a backward ran on the rank)
            peak, backward_seen = 0, False
            for v, fw, kind in zip(rk.trace, rk.forwarded, rk.kinds):
                backward_seen |= kind == "B"
                held = sum(f * h for f, h in zip(fw, s.chunk_held_bytes))
                peak = max(peak, sum(n * b for n, b in zip(v, per_mb)) + held
                           + (s.stale_output_bytes if backward_seen else 0))
            assert peak == s.activation_peak
    # finer choices can only help: layer <= chunk <= stage, stage by stage
    for r in range(S):
        c_stage, c_chunk, c_layer = (plans[g].stages[r].cost for g in ("stage", "chunk", "layer"))
        assert c_layer <= c_chunk * (1 + 1e-12) and c_chunk <= c_stage * (1 + 1e-12)


def test_device_budget_counts_static_memory_and_suggests_what_fits(fid):
    kw = dict(activations="formula", fidelity=fid, seq_len=2048)
    with pytest.raises(BudgetError) as ei:
        plan_for_pipeline("llama2-7b", 4, 8, "interleaved-1f1b", budget_bytes=10 * 2**30, **kw)
    msg = str(ei.value)
    assert "Smallest budget that fits every stage" in msg and "weights, gradients and optimizer" in msg
    fit = int(re.search(r"fits every stage: ([\d,]+)", msg).group(1).replace(",", ""))
    plan = plan_for_pipeline("llama2-7b", 4, 8, "interleaved-1f1b", budget_bytes=fit, **kw)  # the advice works
    assert max(s.device_peak for s in plan.stages) <= fit
    with pytest.raises(BudgetError):
        plan_for_pipeline("llama2-7b", 4, 8, "interleaved-1f1b", budget_bytes=fit - 1, **kw)
    big = plan_for_pipeline("llama2-7b", 4, 8, "interleaved-1f1b", budget_bytes=200 * 2**30, **kw)
    assert all(set(s.formats.values()) == {"int8"} for s in big.stages)
    assert all(s.binding.startswith("not binding") for s in big.stages)


def test_activation_budget_too_small_says_what_would_fit(fid):
    with pytest.raises(BudgetError, match=r"needs [\d,]+ B of activations even with int4 everywhere \(11 chunk"):
        plan_for_pipeline("llama2-7b", 4, 8, activations="formula", activation_budget_bytes=2**30, fidelity=fid)


@pytest.mark.parametrize("kw,msg", [
    (dict(candidates=("int4", "int7")), "unknown format 'int7'; activation formats: int4"),
    (dict(candidates=("int4", "fp8_e4m3")), "fp8_e4m3 is a gradient format"),
    (dict(baseline_format="bogus"), "unknown format 'bogus'"),
    (dict(granularity="row"), "granularity must be layer, chunk or stage"),
    (dict(budget_bytes=10, activation_budget_bytes=10), "not both"),
    (dict(budget_bytes=-1), "must be an int >= 0"),
    (dict(seq_len=0), "seq_len must be an int >= 1"),
    (dict(flavour=1), r"unknown plan options \['flavour'\]"),
])
def test_bad_plan_input(fid, kw, msg):
    with pytest.raises(PlannerError, match=msg):
        plan_for_pipeline("llama2-7b", 4, 8, activations="bits", fidelity=fid, **kw)


def test_bad_model_input(fid):
    with pytest.raises(PlannerError, match="unknown model 'gpt5'; presets: tiny"):
        plan_for_pipeline("gpt5", 4, 8, activations="bits", fidelity=fid)
    with pytest.raises(PlannerError, match="8 virtual stages"):
        plan_for_pipeline(TransformerShape(hidden=64, layers=6, heads=4, kv_heads=4, intermediate=128, vocab=10),
                          4, 8, activations="bits", fidelity=fid)
    with pytest.raises(PlannerError, match="no entry for 'fp4_e2m1'"):
        plan_for_pipeline("llama2-7b", 4, 8, costs=_small_costs(), fidelity=fid)
    with pytest.raises(PlannerError, match="no fidelity measured for format 'int5'; measured: \\['int4'\\]"):
        plan_for_pipeline("llama2-7b", 4, 8, activations="bits", fidelity=FidelityTable(nsr={"int4": 0.1}, source="x"))


def test_hf_config_and_json(fid):
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=352, num_hidden_layers=8,
                      num_attention_heads=4, num_key_value_heads=2)
    plan = plan_for_pipeline(cfg, 2, 4, "1f1b", activations="formula", seq_len=64, fidelity=fid)
    assert plan.shape.kv_heads == 2 and plan.shape.layers == 8
    d = json.loads(json.dumps(plan.to_dict()))
    assert [s["inflight_peak"] for s in d["stages_plan"]] == [2, 1]
    assert sorted(int(k) for s in d["stages_plan"] for k in s["formats"]) == list(range(8))
