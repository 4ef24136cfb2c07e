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
