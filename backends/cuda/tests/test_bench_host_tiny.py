"""benchmarks/bench_host.py runs end to end (``--tiny``: interpreter, 2^10 elements) and writes its JSON: both
paths, the fast path taken (fast hits), the same bits, and the module launcher's settings left as they were."""
from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[3] / "benchmarks" / "bench_host.py"


def test_bench_host_tiny(tmp_path, device):
    if device.type != "cpu":
        pytest.skip("--tiny is the CPU smoke test; on a GPU run the real benchmark (gpu_session.sh host)")
    from agoq_cuda import launch

    before = launch.LAUNCHER.fast, launch.LAUNCHER.fast_interpreted
    spec = importlib.util.spec_from_file_location("bench_host", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "h.json"
    report = mod.main(["--tiny", "--formats", "fp8_e4m3", "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert (launch.LAUNCHER.fast, launch.LAUNCHER.fast_interpreted) == before
    rows = report["rows"]
    ops = ("quantize_into", "accumulate_", "reduce_requantize_into")
    assert {(r["op"], r["path"]) for r in rows} == {(o, p) for o in ops for p in ("old", "fast")}
    assert report["all_same_bits"] is True
    assert all((r["fast_hits"] > 0) == (r["path"] == "fast") for r in rows)
    assert all(r["host_us"] > 0 for r in rows)
