"""benchmarks/bench_fusion.py runs end to end (``--tiny``: interpreter, tiny shapes) and writes its JSON."""
from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[4] / "benchmarks" / "bench_fusion.py"


def test_bench_tiny_writes_table_and_json(tmp_path, capsys, device):
    if device.type != "cpu":
        pytest.skip("--tiny is the CPU smoke test; on a GPU run the real benchmark")
    spec = importlib.util.spec_from_file_location("bench_fusion", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "b.json"
    report = mod.main(["--tiny", "--tokens", "64", "--json", str(out)])
    data = json.loads(out.read_text())
    assert data == json.loads(json.dumps(report))
    kinds = {"fc1_epilogue", "down_dw_gated", "oproj_dw_prologue", "fc1_dw_prologue"}
    assert {r["gemm"] for r in data["rows"]} == kinds
    assert data["summary"]["all_codes_bit_exact"] is True
    epi = [r for r in data["rows"] if r["gemm"] == "fc1_epilogue"]
    assert all(r["ptr_codes_bit_exact"] and r["tma_codes_bit_exact"] and r["fused_tma_ms"] > 0 for r in epi)
    for r in data["rows"]:
        assert r["fused_ms"] > 0 and r["unfused_ms"] > 0 and r["plain_ms"] > 0
        assert r["sqnr_fused_vs_unfused_db"] >= 45.0      # same operands, different accumulation order
    assert "fc1_epilogue" in capsys.readouterr().out
