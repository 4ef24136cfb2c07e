"""benchmarks/bench_equal_memory.py: one configuration's ladder in-process on CPU (tiny shapes), OOM ends the
ladder and is recorded, partial checkpointing retries with more layers, the summary compares the right rows."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_equal_memory.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_equal_memory", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cell(config, seqs, **kw):
    return dict(dict(device="cpu", smoke=True, layers=2, steps=1, fake_oom_above=None, compile_backend="eager",
                     config=config, seqs=seqs, cap_bytes=0), **kw)


def test_policy_ladder_and_oom(bench):
    rows = bench.run_cell(_cell("policy", [64, 128, 256], fake_oom_above=64))
    assert [r["seq"] for r in rows] == [64, 128, 128]  # one re-plan with more headroom, then the ladder stops
    ok, oom, oom2 = rows
    assert not ok["oom"] and ok["tokens_per_s"] > 0 and ok["loss_kind"] == "chunked"
    assert len(ok["choices"]) == 2 and set(ok["mix"]) - {"bf16"}  # the smoke budget forces a mix
    assert oom["oom"] and "simulated OOM" in oom["error"] and oom2["oom"]
    assert (oom["headroom"], oom2["headroom"]) == (0.02, 0.07)


def test_partial_adds_layers_after_oom(bench):
    rows = bench.run_cell(_cell("partial", [128], fake_oom_above=64))
    ns = [r["ckpt_layers"] for r in rows]
    assert ns == sorted(ns) and ns[-1] == 2 and all(r["oom"] for r in rows)


def test_summary_and_table(bench):
    rows = [
        {"config": "plain", "seq": 16384, "cap_gib": 0, "oom": False, "tokens_per_s": 9000.0, "peak_bytes": 130 << 30},
        {"config": "sac-c", "seq": 32768, "cap_gib": 0, "oom": False, "tokens_per_s": 7000.0, "peak_bytes": 60 << 30},
        {"config": "plain", "seq": 32768, "cap_gib": 0, "oom": True, "error": "OOM"},
        {"config": "policy", "seq": 32768, "cap_gib": 0, "oom": False, "tokens_per_s": 7700.0, "peak_bytes": 100 << 30,
         "predicted_peak_bytes": 98 << 30, "mix": {"laaq:nf4": 32}},
        {"config": "policy", "seq": 16384, "cap_gib": 0, "oom": False, "tokens_per_s": 8900.0,
         "peak_bytes": 128 << 30, "predicted_peak_bytes": 130 << 30},
    ]
    s = bench.summarize(rows)
    c32 = next(c for c in s["agoq_vs_fastest_alternative"] if c["seq"] == 32768)
    assert c32["fastest_alternative"] == "sac-c" and abs(c32["ratio"] - 1.1) < 1e-9 and not c32["plain_fits"]
    c16 = next(c for c in s["agoq_vs_fastest_alternative"] if c["seq"] == 16384)
    assert c16["plain_fits"] and abs(c16["ratio"] - 8900 / 9000) < 1e-9
    assert c32["ratio_median"] is None  # rows without a median step
    compiled = [dict(r, config="plain-c") if r["config"] == "plain" else r for r in rows]  # compiled plain is plain
    assert next(c for c in bench.summarize(compiled)["agoq_vs_fastest_alternative"] if c["seq"] == 16384)["plain_fits"]
    rows[1]["tokens_per_s_median"], rows[3]["tokens_per_s_median"] = 7000.0, 7350.0  # a slow step in sac-c's mean
    c32 = next(c for c in bench.summarize(rows)["agoq_vs_fastest_alternative"] if c["seq"] == 32768)
    assert abs(c32["ratio"] - 1.1) < 1e-9 and abs(c32["ratio_median"] - 1.05) < 1e-9
    assert s["longest_seq"] == {"plain@0": 16384, "sac-c@0": 32768, "policy@0": 32768}
    assert {round(p["error"], 4) for p in s["policy_peak_prediction"]} == {round(98 / 100 - 1, 4), round(130 / 128 - 1, 4)}
    t = bench.table(rows, smoke=False)
    assert "OOM" in t and "7,700" in t and "ANALYTIC" not in t
    # a policy-m row planned without measured bf16 costs (a float8-only --layer-costs file) says so in the table
    m = dict(rows[3], config="policy-m")
    assert "ANALYTIC COSTS" in bench.table([dict(m, costs="analytic")], smoke=False)
    assert "ANALYTIC" not in bench.table([dict(m, costs="measured (bench_layer_profile) + analytic for the rest")],
                                         smoke=False)


def test_quick_cells_and_cap_flag(bench):
    cells = bench._cells(bench.parse(["--quick"]))
    assert [(c["config"], c["cap_bytes"] // (1 << 30)) for c in cells] == [cc for cc, _ in bench.QUICK_CELLS]
    assert cells[0]["seqs"] == [32768] and cells[3]["seqs"] == [32768, 65536] and cells[0]["batch"] == 1
    assert [c["cap_bytes"] for c in cells[1:]] == [80 << 30] * (len(cells) - 1)
    capped = bench._cells(bench.parse(["--cap-gib", "80", "--configs", "sac-c,policy-m", "--seqs", "8K,16K"]))
    assert [(c["config"], c["cap_bytes"], c["seqs"]) for c in capped] == [
        ("sac-c", 80 << 30, [8192, 16384]), ("policy-m", 80 << 30, [8192, 16384])]
    with pytest.raises(SystemExit, match="not both"):
        bench._cells(bench.parse(["--cap-gib", "80", "--caps", "0"]))


def test_policy_m_plans_with_measured_costs(bench):
    # made-up costs smaller and faster than every analytic option: the plan must take them
    measured = {"64": {"bf16-c": {"saved_bytes": 2_000, "transient_bytes": 1_000, "time_s": 1e-4},
                       "sac": {"saved_bytes": 1_000, "transient_bytes": 1_000, "time_s": 2e-4},
                       "fp8-sac-c": {"saved_bytes": 1, "transient_bytes": 1, "time_s": 1e-6}}}  # not an option
    rows = bench.run_cell(_cell("policy-m", [64, 128], measured=measured))
    r64, r128 = rows
    assert not r64.get("failed"), r64.get("traceback")
    assert r64["costs"].startswith("measured") and "costs_scaled" not in r64
    # a length the profile lacks plans from the nearest profiled one, scaled (not from the eager-only analytic set)
    assert r128["costs"].startswith("measured") and "measured at 64 tokens, scaled to 128" in r128["costs_scaled"]
    assert set(r128["choices"]) == {"bf16-c"}
    assert set(r64["choices"]) <= {"bf16-c", "sac", "bf16", "laaq:nf4", "laaq:int8", "ckpt", "qckpt:nf4", "qckpt:int8"}
    assert set(r64["choices"]) == {"bf16-c"} and r64["headroom"] == 0.02


def test_summary_longest_by_cap(bench):
    rows = [
        {"config": "ckpt-c", "seq": 32768, "cap_gib": 80, "oom": False, "tokens_per_s": 5000.0, "peak_bytes": 1},
        {"config": "ckpt-c", "seq": 65536, "cap_gib": 80, "oom": True, "error": "OOM"},
        {"config": "policy-m", "seq": 65536, "cap_gib": 80, "oom": False, "tokens_per_s": 3000.0, "peak_bytes": 1},
    ]
    (c,) = bench.summarize(rows)["longest_by_cap"]
    assert c == {"cap_gib": 80, "alternatives_longest": 32768, "agoq_longest": 65536, "ratio": 2.0}


def test_layer_profile_smoke(tmp_path):
    """benchmarks/bench_layer_profile.py on a tiny layer on CPU: every method measured and profiled, the delta
    table against compiled SAC, kernel-name groups."""
    spec = importlib.util.spec_from_file_location("bench_layer_profile", _PATH.with_name("bench_layer_profile.py"))
    lp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lp)
    assert lp.group_of("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0") == "elementwise"
    assert lp.group_of("nvjet_tst_256x128_64x4_1x2_h_bz_coopA_TNT") == "gemm"
    assert lp.group_of("pytorch_flash::flash_bwd_kernel<Flash_bwd_kernel_traits>") == "attention"
    assert lp.group_of("dequantize_kernel") == lp.group_of("quantize_kernel") == "codec"
    assert lp.group_of("void at::native::unrolled_elementwise_kernel<direct_copy_kernel_cuda>") == "copy"
    # what a CUDA profile lists beside the kernels: record_function spans on the GPU timeline (the 2026-12-02 H200
    # step profile counted Optimizer.step#AdamW8bit.step's 224 ms as elementwise time) and CUPTI's host-stall marker
    from types import SimpleNamespace as E
    assert lp.is_kernel(E(name="triton_poi_fused__to_copy_add_clamp_0", is_user_annotation=False))
    assert lp.is_kernel(E(name="dequantize_kernel"))
    assert not lp.is_kernel(E(name="Optimizer.step#AdamW8bit.step", is_user_annotation=True))
    assert not lp.is_kernel(E(name="Optimizer.step#AdamW8bit.step", is_user_annotation=False))
    assert not lp.is_kernel(E(name="Command Buffer Full", is_user_annotation=False))
    assert not lp.is_kernel(E(name="my_range", is_user_annotation=True))
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:  # the real event types: FunctionEvent, FunctionEventAvg
        with torch.profiler.record_function("Optimizer.step#AdamW8bit.step"):
            torch.ones(4).sum()
    for events in (prof.events(), prof.key_averages()):
        kept = {getattr(e, "name", None) or e.key for e in events if lp.is_kernel(e)}
        assert "aten::sum" in kept and "Optimizer.step#AdamW8bit.step" not in kept, kept
    rep = lp.run(["--smoke", "--methods", "bf16,sac-c,laaq:nf4", "--reps", "1", "--warmup", "1",
                  "--json", str(tmp_path / "lp.json")])
    assert [r["method"] for r in rep["rows"]] == ["bf16", "sac-c", "laaq:nf4"]
    for r in rep["rows"]:
        assert not r.get("failed"), r.get("traceback")
        assert r["ms"] > 0 and sum(r["fwd_groups_ms"].values()) > 0 and r["bwd_gemm_kernels"] > 0
    laaq = next(r for r in rep["rows"] if r["method"] == "laaq:nf4")
    assert laaq["bwd_groups_ms"]["codec"] > 0  # the dequantize calls are labelled and counted
    assert {e["method"] for e in rep["explain"]} == {"bf16", "laaq:nf4"}
    # the planner's costs carry the attention kernels' share, which it scales as length^2 (no bytes on CPU: given)
    got = lp.costs([dict(r, saved_bytes=1, transient_bytes=2) for r in rep["rows"]])
    for r in rep["rows"]:
        c = got[str(r["seq"])][r["method"]]
        att = (r["fwd_groups_ms"]["attention"] + r["bwd_groups_ms"]["attention"]) / 1e3
        assert c["time_s"] == r["ms"] / 1e3 and c["attention_s"] == pytest.approx(att)
    assert (tmp_path / "lp.json").exists()


_RUN = Path(__file__).resolve().parents[2] / "docs" / "bench" / "h200-2026-12-01-s2" / "equal-memory"


def _lp():
    spec = importlib.util.spec_from_file_location("bench_layer_profile", _PATH.with_name("bench_layer_profile.py"))
    lp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lp)
    return lp


def test_apply_cap_sets_the_fraction_on_an_indexed_device(bench, monkeypatch):
    """The 80 GiB cells: set_per_process_memory_fraction gets cuda:N (torch 2.11 refuses a bare "cuda", which is
    how the 2026-12-01 cells failed) and cap / total; the whole device sets nothing."""
    import types

    import torch

    calls = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda d: types.SimpleNamespace(total_memory=int(139.8 * (1 << 30))))

    def setf(frac, device=None):
        if not isinstance(device, int) and getattr(device, "index", None) is None:
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
        calls.append((frac, device))

    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", setf)
    dev, frac = bench._apply_cap({"cap_bytes": 80 << 30}, torch.device("cuda"))
    assert dev == torch.device("cuda", 3) and calls == [(frac, dev)] and abs(frac - 80 / 139.8) < 1e-12
    dev, frac = bench._apply_cap({"cap_bytes": 0}, torch.device("cuda"))
    assert frac is None and len(calls) == 1 and dev.index == 3
    assert bench._apply_cap({"cap_bytes": 80 << 30}, torch.device("cpu")) == (torch.device("cpu"), None)


def test_capped_plan_budgets_the_cap(bench):
    """What the planner budgets against is the cap, not the device (LLaMA-2-7B at 32K under 80 GiB)."""
    from agoq_core.planner.model import model_shape

    class _M:
        config = _shape = None

    m = _M()
    m.config = bench._shape(False, None).to_hf_config(max_position_embeddings=32768)
    cell = dict(smoke=False, cap_bytes=80 << 30, batch=1)
    plan = bench._plan(cell, m, 32768, "bf16,laaq:nf4,ckpt", "chunked", None)
    assert plan.budget_bytes == 80 << 30 and plan.peak_bytes <= int((80 << 30) * 0.98)
    assert model_shape(m.config).layers == 32
    assert plan.device == "H200" and bench._plan_desc(plan)["planner_profile"] == "H200"  # no card: the default
    assert bench._plan(dict(cell, profile="H100"), m, 32768, "bf16,laaq:nf4,ckpt", "chunked", None).device == "H100"


def test_a_card_plans_with_its_own_profile(bench, monkeypatch):
    """On a GPU the planner's profile is the card's by name (an H100 planned with the H200's until 2026-12-06); a
    card without a profile falls back to the H200's."""
    import torch

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H100 80GB HBM3")
    assert bench._profile({}, torch.device("cuda", 0)) == "H100"
    assert bench._profile({"profile": "A100"}, torch.device("cuda", 0)) == "A100"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA GeForce RTX 4090")
    assert bench._profile({}, torch.device("cuda", 0)) == "H200"
    assert bench._profile({}, torch.device("cpu")) == bench._profile({}, None) == "H200"


def test_policy_m_degrades_after_oom(bench):
    """OOM: the next plan has more headroom (5% when the warm-up did not finish), then the analytic eager options
    (checked on the H200 within 1.1%), then the ladder ends -- each attempt a row."""
    measured = {"64": {"bf16-c": {"saved_bytes": 2_000, "transient_bytes": 1_000, "time_s": 1e-4}}}
    rows = bench.run_cell(_cell("policy-m", [64, 128], measured=measured, fake_oom_above=32))
    assert [r["seq"] for r in rows] == [64, 64, 64] and all(r["oom"] for r in rows)
    assert [r["headroom"] for r in rows] == [0.02, 0.07, 0.02]
    assert [r["costs"].split(" ")[0] for r in rows] == ["measured", "measured", "analytic"]
    assert all(r["oom_phase"] == "warm-up" and r["predicted_parts"]["grads"] > 0 for r in rows)


def test_policy_retry_uses_the_warmup_peak(bench):
    """When the warm-up step fit and a timed step did not, the warm-up's excess over the plan's prediction for it
    (the peak without gradients and optimizer state) is the under-count the next plan leaves room for."""
    G = 1 << 30
    state = {"headroom": 0.02}
    res = {"config": "policy-m", "budget_bytes": 100 * G, "predicted_peak_bytes": 90 * G, "warmup_peak_bytes": 80 * G}
    assert bench._policy_retry(state, res, static_late=20 * G)  # predicted warm-up 70 GiB, measured 80: 10 short
    assert abs(state["headroom"] - (0.02 + 0.10 + 0.01)) < 1e-12
    assert bench._policy_retry(state, res, 20 * G) and state["analytic"] and state["headroom"] == 0.02
    assert not bench._policy_retry(state, res, 20 * G)


def test_recorded_h200_policy_m_oom_is_explained():
    """The 2026-12-01 H200 run (docs/bench/h200-2026-12-01-s2/equal-memory): from the profile's measured costs the
    plan was 15 x laaq-c:nf4 + 17 x bf16-c, predicted 135.4 GiB on a 139.8 GiB device, OOM. Dynamo compiled only the
    first 8 layers (recompile_limit; fixed in laaq.traced): the other 7 LAAQ layers and all 17 bf16 layers ran
    eager, and an eager bf16 layer keeps 1.8-2.1 GB more than a compiled one. The same costs, with those layers
    eager, predict more than the device -- the OOM. The same combination for compiled SAC (32 layers, HF loss)
    predicts its measured 104.27 GiB within 0.2%, so static memory, the head and the measured costs add up."""
    import json

    from agoq_core.planner.budget import CE_CHUNK, HEAD_NORM_BACKWARD_B, plan_budget, plan_for_choices

    rep = json.loads((_RUN / "bench_equal_memory.json").read_text())
    costs = rep["layer_profile"]["costs"]["32768"]  # as recorded (the leaf-input correction: the next test)
    pol = [r for r in rep["runs"] if r["config"] == "policy-m" and r["cap_gib"] == 0]
    sac = next(r for r in rep["runs"] if r["config"] == "sac-c")
    opts = ",".join(k for k in costs if not k.startswith("fp8")) + ",bf16,laaq:nf4,laaq:int8,sac,ckpt,qckpt:nf4,qckpt:int8"
    measured = {k: v for k, v in costs.items() if not k.startswith("fp8")}
    G = 1 << 30
    plan = plan_budget("llama2-7b", budget=int(139.8 * G), seq_len=32768, options=opts, measured=measured)
    # the recorded plan, predicted then without the final norm's backward in the head (docs/benchmarks.md §5.14):
    # today's prediction is higher by at most what that moment adds over the loss's
    T, h, V = 32768, 4096, 32000
    head_gain = HEAD_NORM_BACKWARD_B * T * h - (10 * CE_CHUNK * V + 10 * T * h + 4 * V * h)
    assert plan.mix == pol[0]["mix"]
    assert -(1 << 20) < plan.peak_bytes - pol[0]["predicted_peak_bytes"] < head_gain + (1 << 20)
    ran = [c if i < 8 else c.replace("-c", "") for i, c in enumerate(plan.choices)]  # what actually ran
    real = plan_for_choices("llama2-7b", ran, seq_len=32768, measured=measured)
    assert real.peak_bytes > 139.8 * G > plan.peak_bytes
    assert real.peak_bytes - plan.peak_bytes > 17 * 2.0e9  # the missing term: 17 x (bf16 - bf16-c), 6.38 - 4.32 GB
    # with the corrected costs: the warm-up step (no gradients or optimizer state yet) fit, the timed step did not
    fixed, _ = _lp().input_leaf_correction(rep["layer_profile"]["costs"], 4096, meta=rep["layer_profile"]["meta"])
    real = plan_for_choices("llama2-7b", ran, seq_len=32768,
                            measured={k: v for k, v in fixed["32768"].items() if not k.startswith("fp8")})
    late = real.static["grads"] + real.static["optimizer"]
    assert real.peak_bytes - late < 139.8 * G - (1 << 30) < 139.8 * G < real.peak_bytes
    assert pol[0]["oom"] and pol[0]["first_step_s"] > 0  # the recorded warm-up finished
    s = plan_for_choices("llama2-7b", ["sac-c"] * 32, seq_len=32768, loss="hf", measured=measured)
    assert abs(s.peak_bytes / sac["peak_bytes"] - 1) < 0.002


def test_old_profile_leaf_input_correction():
    """A profile measured with a leaf layer input (before 2026-12-02) counted the input for methods that do not
    keep it: corrected, their saved bytes equal the planner's byte-exact counts (LAAQ's formula, HF's plain layer,
    the quantized checkpoint's input) within 1 KiB; ckpt/sac (which keep the input) are left alone; a profile
    marked non-leaf is not touched."""
    import json

    from agoq_core.planner.budget import layer_options
    from agoq_core.planner.model import model_shape

    lp = _lp()
    prof = json.loads((_RUN / "bench_layer_profile.json").read_text())
    shape = model_shape("llama2-7b")
    fixed, notes = lp.input_leaf_correction(prof["costs"], shape.hidden, meta=prof["meta"])
    got, old = fixed["32768"], prof["costs"]["32768"]
    ref = {o.name: o.saved_bytes for o in layer_options(shape, seq_len=32768,
                                                        options=["bf16", "laaq:nf4", "laaq:int8", "qckpt:nf4", "ckpt"])}
    for m in ("bf16", "laaq:nf4", "laaq:int8", "qckpt:nf4"):
        assert abs(got[m]["saved_bytes"] - ref[m]) <= 1024, m
    assert got["laaq-c:nf4"]["saved_bytes"] == got["laaq:nf4"]["saved_bytes"]
    for m in ("ckpt", "sac-c", "bf16-c", "laaq-mlp-c:nf4"):
        assert got[m] == old[m]
    assert got["ckpt"]["saved_bytes"] == ref["ckpt"] and len(notes) == 5
    assert lp.input_leaf_correction(prof["costs"], shape.hidden, meta={"input": lp.INPUT_NON_LEAF}) == (prof["costs"], [])


def test_compile_watch_records_dynamo_falling_back_to_eager(bench):
    """Past recompile_limit Dynamo runs the frame eagerly with a warning only: a row must say so."""
    import torch

    w = bench._CompileWatch()
    try:
        f = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
        with torch._dynamo.config.patch(recompile_limit=1):
            for n in (2, 3, 4):
                f(torch.ones(n))
        seen = w.take()
        assert len(seen) == 1 and "recompile_limit" in seen[0] and w.take() == []
    finally:
        w.close()
        torch._dynamo.reset()


def test_layer_costs_from_several_profiles(bench, tmp_path):
    """--layer-costs A,B: costs merged per (seq, method), each file corrected for its own input."""
    import json

    old = {"meta": {"batch": 1}, "costs": {"100": {"laaq:nf4": {"saved_bytes": 5000, "transient_bytes": 1, "time_s": 1.0},
                                                   "ckpt": {"saved_bytes": 800, "transient_bytes": 1, "time_s": 2.0}}}}
    new = {"meta": {"input": "non-leaf"}, "costs": {"200": {"laaq:nf4": {"saved_bytes": 7000, "transient_bytes": 1,
                                                                         "time_s": 3.0}}}}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(old))
    b.write_text(json.dumps(new))
    rep = bench._read_layer_costs(f"{a},{b}", hidden=4)
    assert rep["costs"]["100"]["laaq:nf4"]["saved_bytes"] == 5000 - 2 * 100 * 4  # old profile: leaf input off
    assert rep["costs"]["100"]["ckpt"]["saved_bytes"] == 800 and rep["costs"]["200"]["laaq:nf4"]["saved_bytes"] == 7000
    assert len(rep["cost_corrections"]) == 1 and rep["merged_from"] == [str(a), str(b)]


def test_longest_pair_primed_single_step(bench):
    """--longest: the furthest-reaching alternative (compiled full checkpointing + chunked loss) and AGoQ's
    longest reach (every layer qckpt-c:nf4), one primed step per length; an OOM ends that ladder."""
    cells = bench._cells(bench.parse(["--longest"]))
    assert [(c["config"], c["seqs"], c["steps"], c["cap_bytes"]) for c in cells] == [
        ("qckpt-c", [327680], 0, 0), ("ckpt-ce-c", [262144], 0, 0)]
    with pytest.raises(SystemExit, match="drop --configs"):
        bench._cells(bench.parse(["--longest", "--configs", "plain"]))
    ok, oom = bench.run_cell(_cell("qckpt-c", [64, 128], steps=0, fake_oom_above=64))
    assert ok["loss_kind"] == "chunked" and "qckpt-c:nf4 x2" in ok["policy"] and ok["tokens_per_s_includes_compile"]
    assert not ok["oom"] and ok["tokens_per_s"] > 0 and oom["oom"]
    (alt,) = bench.run_cell(_cell("ckpt-ce-c", [64], steps=0))
    assert alt["loss_kind"] == "chunked" and not alt["oom"] and alt["tokens_per_s"] > 0


def test_prime_allocates_grads_and_optimizer_state_without_moving_weights(bench):
    import torch

    lin = torch.nn.Linear(8, 4)
    w0 = lin.weight.detach().clone()
    opt = torch.optim.AdamW(lin.parameters(), lr=1e-5, weight_decay=0.0)
    bench._prime(lin, opt)
    assert lin.weight.grad is not None and torch.equal(lin.weight.grad, torch.zeros_like(w0))
    assert "exp_avg" in opt.state[lin.weight] and torch.equal(lin.weight.detach(), w0)


def test_merge_runs_newest_row_wins_and_reach_bounds(bench, tmp_path, capsys):
    import json

    a = {"runs": [{"config": "ckpt-c", "seq": 1024, "cap_gib": 0, "oom": False, "tokens_per_s": 10.0, "peak_bytes": 1},
                  {"config": "policy-m", "seq": 1024, "cap_gib": 80, "oom": False, "tokens_per_s": 11.0, "peak_bytes": 1}]}
    b = {"runs": [{"config": "policy-m", "seq": 1024, "cap_gib": 80, "oom": False, "tokens_per_s": 12.0, "peak_bytes": 1},
                  {"config": "ckpt-c", "seq": 1024, "cap_gib": 0, "oom": True, "error": "OOM"},  # never replaces a row
                  {"config": "ckpt-c", "seq": 2048, "cap_gib": 0, "oom": True, "error": "OOM"},
                  {"config": "qckpt-c", "seq": 4096, "cap_gib": 0, "oom": False, "tokens_per_s": 1.0, "peak_bytes": 1},
                  {"config": "liger", "seq": 1024, "cap_gib": 0, "oom": False, "unavailable": "ImportError"}]}
    pa, pb, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "m.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    assert bench.main(["--merge", f"{pa},{pb}", "--json", str(out)]) == 0
    m = json.loads(out.read_text())
    rows = {(r["config"], r["cap_gib"], r["seq"]): r for r in m["runs"]}
    assert rows[("policy-m", 80, 1024)]["tokens_per_s"] == 12.0 and not rows[("ckpt-c", 0, 1024)]["oom"]
    assert ("liger", 0, 1024) not in rows
    assert m["summary"]["reach"]["ckpt-c@0"] == {"fits": 1024, "oom": 2048}
    assert m["summary"]["reach"]["qckpt-c@0"] == {"fits": 4096, "oom": None}
    with pytest.raises(SystemExit, match="cannot read"):
        bench.main(["--merge", str(tmp_path / "missing.json")])


def test_merge_a_cap_above_the_device_is_the_whole_device(bench, tmp_path):
    """An 80 GiB cap on a 79.2 GiB card limits nothing: its rows merge with the same card's whole-device rows (the
    newer wins), keep the cap they ran under, and a cap below the card's memory stays a cap."""
    import json

    old = {"meta": {"memory_gib": 79.2},
           "runs": [{"config": "fp8-ce-c", "seq": 16384, "cap_gib": 80, "oom": False, "tokens_per_s": 9.0,
                     "peak_bytes": 1},
                    {"config": "ckpt-c", "seq": 16384, "cap_gib": 40, "oom": False, "tokens_per_s": 5.0,
                     "peak_bytes": 1}]}
    new = {"meta": {"memory_gib": 79.2},
           "runs": [{"config": "fp8-ce-c", "seq": 16384, "cap_gib": 0, "oom": False, "tokens_per_s": 10.0,
                     "peak_bytes": 1},
                    {"config": "fp8-ce-c", "seq": 32768, "cap_gib": 80, "oom": False, "tokens_per_s": 7.0,
                     "peak_bytes": 1}]}
    pa, pb, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "m.json"
    pa.write_text(json.dumps(old))
    pb.write_text(json.dumps(new))
    assert bench.main(["--merge", f"{pa},{pb}", "--json", str(out)]) == 0
    rows = {(r["config"], r["cap_gib"], r["seq"]): r for r in json.loads(out.read_text())["runs"]}
    assert set(rows) == {("fp8-ce-c", 0, 16384), ("fp8-ce-c", 0, 32768), ("ckpt-c", 40, 16384)}
    assert rows[("fp8-ce-c", 0, 16384)]["tokens_per_s"] == 10.0 and "cap_as_run" not in rows[("fp8-ce-c", 0, 16384)]
    assert rows[("fp8-ce-c", 0, 32768)]["cap_as_run"] == 80


def test_warmup_steps_are_untimed(bench):
    (row,) = bench.run_cell(_cell("plain", [64], steps=2, warmup=3))
    assert len(row["step_times_s"]) == 2 and not row["oom"]
    assert bench._cells(bench.parse(["--configs", "plain", "--caps", "0", "--warmup", "2"]))[0]["warmup"] == 2
    with pytest.raises(SystemExit, match="--warmup"):
        bench._cells(bench.parse(["--warmup", "0"]))


def test_policy_m_fp8_plans_from_float8_costs(bench):
    """policy-m-fp8: the plan's options are the profile's fp8-* methods (prefix dropped; eager LAAQ is no float8
    option), applied with float8 on every decoder Linear (torchao's emulation on CPU); no fp8 costs: a clear error."""
    measured = {"64": {"fp8-laaq-c:nf4": {"saved_bytes": 1_000, "transient_bytes": 1_000, "time_s": 1e-4},
                       "fp8-ckpt-c": {"saved_bytes": 100, "transient_bytes": 3_000, "time_s": 3e-4},
                       "fp8-laaq:nf4": {"saved_bytes": 1, "transient_bytes": 1, "time_s": 1e-6},  # eager: dropped
                       "bf16-c": {"saved_bytes": 1, "transient_bytes": 1, "time_s": 1e-6}}}       # not float8
    (row,) = bench.run_cell(_cell("policy-m-fp8", [64], measured=measured))
    assert not row.get("failed"), row.get("traceback")
    assert set(row["choices"]) <= {"laaq-c:nf4", "ckpt-c"} and row["costs"].startswith("measured float8")
    assert not row["oom"] and row["tokens_per_s"] > 0
    (bad,) = bench.run_cell(_cell("policy-m-fp8", [64], measured={"64": {"bf16-c": measured["64"]["bf16-c"]}}))
    assert "fp8-laaq-c:nf4" in bad["failed"]


def test_fp8_alternative_tries_every_checkpointing_and_grows_partial(bench):
    """fp8-ce-c (float8 + the chunked loss): none, SAC, partial (more layers after each OOM), then full
    checkpointing -- the fastest checkpointing that fits, partial included, as for Liger."""
    rows = bench.run_cell(_cell("fp8-ce-c", [64], layers=4, fake_oom_above=32))
    modes = [(r["checkpointing"], r.get("ckpt_layers")) for r in rows]
    assert [m for m, _ in modes][:2] == ["none", "sac"] and modes[-1][0] == "ckpt", modes
    partial = [n for m, n in modes if m == "partial"]
    assert partial and partial == sorted(partial) and partial[-1] == 4
    assert all(r["oom"] and r["loss_kind"] == "chunked" for r in rows)
    (ok,) = bench.run_cell(_cell("fp8-c", [64]))  # HF's loss; fits at once (emulated float8 on CPU)
    assert not ok["oom"] and ok["checkpointing"] == "none" and ok["loss_kind"] == "hf", ok.get("traceback")


def test_partial_guess_plans_from_measured_fp8_costs(bench):
    """The first partial guess of the float8 alternative comes from the profile's fp8-bf16-c / fp8-ckpt-c costs: the
    planner checkpoints the fewest layers whose bytes fit the budget."""
    model = bench.build(_cell("plain", [64]), __import__("torch").device("cpu"))
    big = 1 << 40
    measured = {"64": {"fp8-bf16-c": {"saved_bytes": big, "transient_bytes": 1, "time_s": 1e-4},
                       "fp8-ckpt-c": {"saved_bytes": 1, "transient_bytes": 1, "time_s": 2e-4}}}
    cell = _cell("fp8-c", [64], measured=measured, smoke=False, cap_bytes=80 << 30)
    assert bench._partial_guess(cell, model, 64, "chunked", None, "fp8-") == 2  # a bf16 layer never fits
    measured["64"]["fp8-bf16-c"]["saved_bytes"] = 1
    assert bench._partial_guess(cell, model, 64, "chunked", None, "fp8-") == 0  # everything fits bf16


def test_policy_m_fp8_with_quangrad_plans_fp8_gradients(bench):
    """policy-m-fp8-qg: QuanGrad holds the gradients in FP8 (no bf16 .grad after backward) and the plan budgets its
    gradient bytes (about half of bf16's); a primed single step works too."""
    measured = {"64": {"fp8-laaq-c:nf4": {"saved_bytes": 1_000, "transient_bytes": 1_000, "time_s": 1e-4},
                       "fp8-ckpt-c": {"saved_bytes": 100, "transient_bytes": 3_000, "time_s": 3e-4}}}
    (plain,) = bench.run_cell(_cell("policy-m-fp8", [64], measured=measured))
    for steps in (1, 0):
        (row,) = bench.run_cell(_cell("policy-m-fp8-qg", [64], measured=measured, steps=steps))
        assert not row.get("failed"), row.get("traceback")
        assert row["quangrad"] and row["optimizer"].startswith("QuanGrad") and not row["oom"]
        g, g0 = row["predicted_parts"]["grads"], plain["predicted_parts"]["grads"]
        assert 0.45 < g / g0 < 0.6, (g, g0)
    # --qg-nonfinite apply: the same row with QuanGrad's check before the step off, recorded in the row
    (row,) = bench.run_cell(_cell("policy-m-fp8-qg", [64], measured=measured, qg_nonfinite="apply"))
    assert not row.get("failed"), row.get("traceback")
    assert "on_nonfinite=apply" in row["optimizer"] and row["quangrad"], row["optimizer"]
    (row,) = bench.run_cell(_cell("policy-m-fp8-qg", [64], measured=measured))
    assert "on_nonfinite=raise" in row["optimizer"], row["optimizer"]  # the default: checked before every step
    assert bench.parse(["--qg-nonfinite", "apply"]).qg_nonfinite == "apply" and bench.parse([]).qg_nonfinite == "raise"


def test_policy_m_fp8_auto_runs_the_gradient_storage_its_plan_chose(bench, monkeypatch):
    """policy-m-fp8-auto: the planner picks the gradient storage too (plan_budget(grads="auto")); the row runs
    QuanGrad's FP8 buffers exactly when the plan says so, and records the FP8 gradients' predicted step cost."""
    from agoq_core.scale import compute as C

    measured = {"64": {"fp8-laaq-c:nf4": {"saved_bytes": 1_000, "transient_bytes": 1_000, "time_s": 1e-4},
                       "fp8-ckpt-c": {"saved_bytes": 100, "transient_bytes": 3_000, "time_s": 3e-4}}}
    seen = set()
    # FP8 gradients cost nothing (and free memory): always chosen; or cost more than any layer: chosen only where
    # bf16 .grad does not fit (--smoke plans to the smallest budget that fits, where only FP8 gradients may)
    for cost in (0.0, 1e9):
        monkeypatch.setitem(C.GRAD_STORAGE_STEP_BYTES_PER_PARAM, "quangrad", cost)
        (row,) = bench.run_cell(_cell("policy-m-fp8-auto", [64], measured=measured))
        assert not row.get("failed"), row.get("traceback")
        qg = row["quangrad"]
        assert row["optimizer"].startswith("QuanGrad") is qg and not row["oom"]
        assert (row["predicted_time_parts"]["grads"] > 0) is (qg and cost > 0)
        assert qg or cost > 0
        seen.add(qg)
    assert True in seen


def test_laaq_with_hf_loss_keeps_plain_loss(bench):
    """laaq-hf: LAAQ with HF's loss (as plain's), so a plain-vs-LAAQ row changes one variable."""
    (row,) = bench.run_cell(_cell("laaq-hf", [64]))
    assert not row.get("failed"), row.get("traceback")
    assert row["loss_kind"] == "hf" and not row["oom"] and "laaq" in row


def test_matrix_marks_measured_oom_implied_and_missing_cells_and_plans_the_rest(bench, tmp_path, capsys):
    """--merge --matrix: each cell of issue 18's matrix is measured, out of memory, out of memory by implication (a
    shorter length of the same configuration and budget ran out) or missing; the missing ones come back as cells-stage
    commands grouped by their missing lengths, each asking for the time its estimate needs."""
    import json

    K = 1024
    rows = [{"config": "plain-c", "seq": 8 * K, "cap_gib": 0, "oom": False, "tokens_per_s": 9.0, "peak_bytes": 1},
            {"config": "plain-c", "seq": 16 * K, "cap_gib": 0, "oom": True, "error": "OOM"},
            {"config": "policy-m", "seq": 32 * K, "cap_gib": 80, "oom": False, "tokens_per_s": 7.0, "peak_bytes": 1},
            {"config": "qckpt-c", "seq": 320 * K, "cap_gib": 0, "oom": False, "tokens_per_s": 1.0, "peak_bytes": 1}]
    m = bench.matrix(rows, configs=("plain-c", "policy-m"), seqs=(8 * K, 16 * K, 32 * K), caps=(0.0, 80.0))
    assert m["cells"]["plain-c@0@8192"] == "ok" and m["cells"]["plain-c@0@16384"] == "oom"
    assert m["cells"]["plain-c@0@32768"] == "oom-implied" and m["cells"]["policy-m@80@32768"] == "ok"
    assert m["cells"]["policy-m@0@8192"] == "missing" and m["cells"]["plain-c@80@32768"] == "missing"
    assert m["counts"] == {"ok": 2, "oom": 1, "oom-implied": 1, "missing": 8}  # qckpt-c is not in the matrix

    def est(c, qs):  # the documented model: 25 s a process, 10 s + 4 steps a cell, 0.85x + 0.05x^2 s a step at x*8K
        return 25 + sum(10 + 4 * (0.85 * q / (8 * K) + 0.05 * (q / (8 * K)) ** 2) for q in qs)

    def limit(total):
        return int(min(560, max(120, 90 + total)))

    three, two = (8 * K, 16 * K, 32 * K), (8 * K, 16 * K)
    assert m["commands"] == [
        f"CELLS_CONFIGS=policy-m CELLS_SEQS=8K,16K,32K CELLS_CAPS=0 bash benchmarks/gpu_session.sh "
        f"cells:{limit(est('policy-m', three))}",
        f"CELLS_CONFIGS=policy-m CELLS_SEQS=8K,16K CELLS_CAPS=80 bash benchmarks/gpu_session.sh "
        f"cells:{limit(est('policy-m', two))}",
        f"CELLS_CONFIGS=plain-c CELLS_SEQS=8K,16K,32K CELLS_CAPS=80 bash benchmarks/gpu_session.sh "
        f"cells:{limit(est('plain-c', three))}"]
    assert m["estimated_s"] == round(est("policy-m", three) + est("policy-m", two) + est("plain-c", three))
    # one length: configurations share a command while the stage's budget (560 - 60 s) lasts; eager ones cost 1.3x
    many = bench.matrix([], configs=tuple(bench.MATRIX_CONFIGS), seqs=(64 * K,), caps=(0.0,))["commands"]
    sizes = [c.split()[0].count(",") + 1 for c in many]
    assert sum(sizes) == len(bench.MATRIX_CONFIGS) and len(many) > 1
    for cmd in many:
        configs = cmd.split()[0].split("=")[1].split(",")
        total = sum(25 + bench.matrix_cell_seconds(c, 64 * K) for c in configs)
        assert total <= 500 and cmd.endswith(f"cells:{limit(total)}")
    assert bench.matrix_cell_seconds("ckpt", 64 * K) > bench.matrix_cell_seconds("ckpt-c", 64 * K)
    assert bench.matrix_cell_seconds("offload", 8 * K) > bench.matrix_cell_seconds("ckpt", 8 * K)
    # a ladder longer than one process may run (240 s) is split into several commands
    long = bench.matrix([], configs=("ckpt",), seqs=(32 * K, 64 * K, 128 * K), caps=(0.0,))["commands"]
    assert [c.split()[1] for c in long] == ["CELLS_SEQS=32K,64K", "CELLS_SEQS=128K"]
    p, out = tmp_path / "a.json", tmp_path / "m.json"
    p.write_text(json.dumps({"runs": rows}))
    assert bench.main(["--merge", str(p), "--json", str(out), "--matrix", "--matrix-caps", "0"]) == 0
    printed = capsys.readouterr().out
    assert "issue 18's matrix: 16 configurations x 5 lengths x 1 budgets = 80 cells" in printed
    assert json.loads(out.read_text())["summary"]["matrix"]["caps"] == [0.0]
    with pytest.raises(SystemExit, match="--matrix-caps"):
        bench.main(["--merge", str(p), "--matrix", "--matrix-caps", "80GiB"])


def test_budgets_must_be_positive_and_an_empty_run_has_no_plot(bench, tmp_path):
    # 2026-12-07: a `cells` stage given 55 s passed --budget-s -5, skipped every cell and then crashed in plot()
    for flag in ("--budget-s", "--cell-timeout-s"):
        for bad in ("-5", "0"):
            with pytest.raises(SystemExit):
                bench.parse(["--configs", "ckpt", "--seqs", "8K", flag, bad])
    assert bench.parse(["--budget-s", "1"]).budget_s == 1.0
    assert bench.plot([], tmp_path / "empty.png") is None and not (tmp_path / "empty.png").exists()


def test_timed_steps_record_where_the_time_goes_by_phase(bench):
    """Each timed step marks forward / backward / optimizer (a CUDA event and a host clock on a GPU, the host clock
    here): the row keeps the median per phase, each inside a step, and the summary prints them."""
    row = bench.run_cell(_cell("ckpt", [64], steps=3))[0]
    assert not row["oom"] and row["phases_ms"]["gpu"] is None  # no CUDA events on CPU
    host = row["phases_ms"]["host"]
    assert set(host) == set(bench.PHASES) and all(v > 0 for v in host.values())
    # each phase's median is one step's phase, so it is inside the slowest step; the medians of the parts need not
    # add up to any step (CI, 2026-12-07, two busy xdist workers: a 166 ms median step, phase medians adding to 76),
    # but in ms they are of a step's size: seconds or microseconds would be 1,000x off
    steps_ms = [1e3 * t for t in row["step_times_s"]]
    assert max(host.values()) <= max(steps_ms) + 0.1  # (step times are kept to 0.1 ms)
    assert 0.1 * min(steps_ms) < sum(host.values()) < 3 * max(steps_ms)
    line = bench.phase_lines([row])[0]
    assert "ckpt" in line and "host" in line and "gpu" not in line
    assert bench.phase_lines([dict(row, oom=True)]) == []


def test_median_phases_of_gpu_and_host_marks(bench):
    marks = [{"gpu": {"forward": f, "backward": 2 * f, "optimizer": 1.0}, "host": {"forward": 1.0, "backward": 1.0,
                                                                             "optimizer": 0.5}} for f in (10.0, 30.0, 20.0)]
    out = bench._median_phases(marks)
    assert out["gpu"] == {"forward": 20.0, "backward": 40.0, "optimizer": 1.0}
    assert out["host"] == {"forward": 1.0, "backward": 1.0, "optimizer": 0.5}
    assert bench._median_phases([dict(marks[0], gpu=None)])["gpu"] is None


def test_a_cell_killed_from_outside_is_out_of_host_memory_a_timeout_is_not(bench):
    cell = {"config": "offload", "cap_bytes": 0}
    killed = bench.failed_row(cell, 16384, -9, "warning\nlast line")
    assert killed["oom"] and killed["oom_phase"] == "host" and "failed" not in killed and "last line" in killed["killed"]
    timed = bench.failed_row(cell, 16384, -9, "", timed_out_s=240)
    assert not timed["oom"] and timed["failed"] == "timed out after 240 s"
    crashed = bench.failed_row(cell, 16384, 1, "Traceback\nRuntimeError: boom")
    assert not crashed["oom"] and crashed["failed"] == "process exit 1: RuntimeError: boom"


def test_merge_reads_an_old_sigkill_row_as_host_oom_and_an_old_timeout_as_a_failure(bench, tmp_path):
    """Rows written before failed_row: "process exit -9: <stderr>" was a kill from outside (2026-12-07, offload at 16K
    on a 128 GiB host), "process exit -9: " with nothing after it the bench's own timeout."""
    import json

    runs = [{"config": "offload", "seq": 8192, "cap_gib": 0, "oom": False, "tokens_per_s": 2.0, "peak_bytes": 1},
            {"config": "offload", "seq": 16384, "cap_gib": 0.0, "oom": False,
             "failed": 'process exit -9:   """Configuration class for applying'},
            {"config": "sac", "seq": 8192, "cap_gib": 0, "oom": False, "failed": "process exit -9: "}]
    src, out = tmp_path / "a.json", tmp_path / "m.json"
    src.write_text(json.dumps({"runs": runs}))
    assert bench.main(["--merge", str(src), "--json", str(out)]) == 0
    m = json.loads(out.read_text())
    rows = {(r["config"], r["seq"]): r for r in m["runs"]}
    assert rows[("offload", 16384)]["oom"] and rows[("offload", 16384)]["oom_phase"] == "host"
    assert ("sac", 8192) not in rows
    cells = m["summary"]["matrix"]["cells"]
    assert cells["offload@0@16384"] == "oom" and cells["offload@0@32768"] == "oom-implied"
    assert cells["sac@0@8192"] == "missing"


@pytest.mark.parametrize("at, phase", [(0, "warm-up"), (1, "warm-up"), (2, "timed")])
def test_oom_phase_counts_every_warmup_step(bench, at, phase):
    """With two warm-up steps an OOM in the second is a warm-up OOM (it was labelled "timed" until 2026-12-07,
    which hid that 128K plans ran out once optimizer state existed); steps_done says how many steps completed."""
    rows = bench.run_cell(_cell("plain", [64], warmup=2, fake_oom_at_step=at))
    assert len(rows) == 1 and rows[0]["oom"] and "simulated OOM in step" in rows[0]["error"]
    assert rows[0]["oom_phase"] == phase and rows[0]["steps_done"] == at


def test_policy_retry_prefers_the_first_steps_peak(bench):
    """The first step runs before optimizer state exists; a later warm-up step's peak holds it and would count it
    as under-prediction."""
    G = 1 << 30
    state = {"headroom": 0.02}
    res = {"config": "policy-m", "budget_bytes": 100 * G, "predicted_peak_bytes": 90 * G,
           "first_step_peak_bytes": 72 * G, "warmup_peak_bytes": 95 * G}
    assert bench._policy_retry(state, res, static_late=20 * G)  # predicted first step 70 GiB, measured 72: 2 short
    assert abs(state["headroom"] - (0.02 + 0.03)) < 1e-12  # at least 3% more


def test_matrix_goals_say_which_goal_applies_where_it_stands_and_what_could_change_it(bench, capsys):
    """Where plain fits, the budget policy against plain (>= 0.98x), only plain and the policies able to change it;
    elsewhere AGoQ's best (any AGoQ row, in the matrix or not) against the fastest alternative that fits (>= 1.15x),
    every missing cell able to change it."""
    K = 1024

    def row(c, q, tps=None, cap=0):
        return {"config": c, "seq": q, "cap_gib": cap, "oom": tps is None, "tokens_per_s": tps, "peak_bytes": 1}

    rows = [row("plain-c", 8 * K, 100.0), row("policy-m", 8 * K, 99.0), row("laaq-c", 8 * K, 120.0),
            row("plain-c", 16 * K), row("fp8-c", 16 * K, 80.0), row("policy-m-fp8-qg", 16 * K, 96.0),
            row("ckpt-c", 32 * K, 50.0), row("policy-m", 64 * K, 10.0)]
    configs = ("plain-c", "ckpt-c", "fp8-c", "laaq-c", "policy-m")
    m = bench.matrix(rows, configs=configs, seqs=(8 * K, 16 * K, 32 * K, 64 * K), caps=(0.0,))
    g = {x["seq"] // K: x for x in m["goals"]}
    assert g[8]["target"] == 0.98 and (g[8]["agoq"], g[8]["against"]) == ("policy-m", "plain-c")  # not laaq-c
    assert abs(g[8]["ratio"] - 0.99) < 1e-12 and g[8]["state"] == "met"
    assert g[8]["open"] == [] and g[8]["final"]  # ckpt-c, fp8-c missing at 8K cannot change a plain-fits goal
    assert g[16]["target"] == 1.15 and (g[16]["agoq"], g[16]["against"]) == ("policy-m-fp8-qg", "fp8-c")
    assert abs(g[16]["ratio"] - 1.2) < 1e-12 and g[16]["state"] == "met" and g[16]["open"] == ["ckpt-c", "laaq-c", "policy-m"]
    assert g[32]["state"] == "no AGoQ row" and g[32]["ratio"] is None and not g[32]["final"]
    assert g[64]["state"] == "only AGoQ fits" and "plain-c" not in g[64]["open"]  # plain-c ran out at 16K
    bench._print_matrix(m)
    out = capsys.readouterr().out
    assert "policy-m 99 / plain-c 100 = 0.990x (goal 0.98x: met); final" in out
    assert "only AGoQ fits; open: ckpt-c, fp8-c, laaq-c" in out
