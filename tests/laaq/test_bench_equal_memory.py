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
    assert [r["seq"] for r in rows] == [64, 128]  # stops at the first OOM
    ok, oom = rows
    assert not ok["oom"] and ok["tokens_per_s"] > 0 and ok["loss_kind"] == "chunked"
    assert len(ok["choices"]) == 2 and set(ok["mix"]) - {"bf16"}  # the smoke budget forces a mix
    assert oom["oom"] and "simulated OOM" in oom["error"]


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
    assert s["longest_seq"] == {"plain@0": 16384, "sac-c@0": 32768, "policy@0": 32768}
    assert {round(p["error"], 4) for p in s["policy_peak_prediction"]} == {round(98 / 100 - 1, 4), round(130 / 128 - 1, 4)}
    t = bench.table(rows, smoke=False)
    assert "OOM" in t and "7,700" in t


def test_quick_cells_and_cap_flag(bench):
    cells = bench._cells(bench.parse(["--quick"]))
    assert [(c["config"], c["cap_bytes"] // (1 << 30)) for c in cells] == [cc for cc, _ in bench.QUICK_CELLS]
    assert cells[0]["seqs"] == [32768] and cells[2]["seqs"] == [32768, 65536] and cells[0]["batch"] == 1
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
    assert r64["costs"].startswith("measured") and r128["costs"] == "analytic"
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
    rep = lp.run(["--smoke", "--methods", "bf16,sac-c,laaq:nf4", "--reps", "1", "--warmup", "1",
                  "--json", str(tmp_path / "lp.json")])
    assert [r["method"] for r in rep["rows"]] == ["bf16", "sac-c", "laaq:nf4"]
    for r in rep["rows"]:
        assert not r.get("failed"), r.get("traceback")
        assert r["ms"] > 0 and sum(r["fwd_groups_ms"].values()) > 0 and r["bwd_gemm_kernels"] > 0
    laaq = next(r for r in rep["rows"] if r["method"] == "laaq:nf4")
    assert laaq["bwd_groups_ms"]["codec"] > 0  # the dequantize calls are labelled and counted
    assert {e["method"] for e in rep["explain"]} == {"bf16", "laaq:nf4"}
    assert (tmp_path / "lp.json").exists()
