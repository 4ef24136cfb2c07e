"""Device profiles against the measurements they cite: the codec tables row by row against their JSON, the
H100's memory and copy bandwidth against the 2026-12-06 runs, and which table each consumer uses."""
from __future__ import annotations

import json
import re
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from agoq_core.scale import single_gpu
from agoq_core.scale.devices import (CODEC_COPY_FRACTION, CODEC_COPY_FRACTION_2026_11_29,
                                     CODEC_COPY_FRACTION_2026_12_02, DEVICES, H100_CODEC_COPY_FRACTION,
                                     H100_MEASURED, H200_2026_11_29, device_profile)

BENCH = Path(__file__).resolve().parents[2] / "docs" / "bench"
GiB = 1 << 30
#: The tables hold shares rounded to 3 decimals.
ROUNDING = 5e-4

#: The run each row of CODEC_COPY_FRACTION_2026_12_02 comes from: the newest H200 run of that op and format.
H200_RUNS = {
    "h200-2026-12-02-s7/call1/n0/bench_codecs_norm.json": [  # 19:00 UTC, as shipped
        (op, f) for op in ("quantize", "dequantize") for f in ("int4", "nf4", "fp4_e2m1", "mxfp4")],
    "h200-2026-12-02-s6/tiles/bench_codecs_tiles.json": [("quantize", "nvfp4"), ("dequantize", "nvfp4")],  # 14:52
    "h200-2026-12-02-s5/tiles/bench_codecs.json": [  # 12:20
        *((op, f) for op in ("quantize", "dequantize")
          for f in ("int5", "int6", "int8", "fp8_e4m3", "fp8_e5m2", "mxfp8")),
        *((op, f) for op in ("accumulate", "reduce_requantize") for f in ("int8", "fp8_e4m3", "fp8_e5m2", "mxfp8"))],
}
#: The same for the rows measured on the H100 (2026-12-06).
H100_RUNS = {
    "h100-2026-12-06-s11/norm-caps/auto3.json": [  # 16:21 UTC, as shipped
        (op, f) for op in ("quantize", "dequantize") for f in ("int4", "nf4", "fp4_e2m1", "mxfp4")],
    "h100-2026-12-06-s10/codecs-ab1/codecs_new2.json": [("quantize", "nvfp4"), ("dequantize", "nvfp4")],  # 12:47
}


def _load(rel: str) -> dict:
    return json.loads((BENCH / rel).read_text())


def _shares(rel: str) -> dict[tuple[str, str], float]:
    """(op, format) -> % of copy / 100 of the plain 1 GiB rows of one bench_codecs.py JSON (no tile overrides)."""
    return {(r["op"], r["fmt"]): r["pct_copy"] / 100 for r in _load(rel)["rows"]
            if r["size_mib"] == 1024 and r["exact"]}


def _check_table(table, runs: dict, gpu: str) -> set:
    seen = set()
    for rel, rows in runs.items():
        assert _load(rel)["env"]["gpu"] == gpu, rel
        measured = _shares(rel)
        for op, fmt in rows:
            assert table[op][fmt] == pytest.approx(measured[(op, fmt)], abs=ROUNDING), (rel, op, fmt)
            seen.add((op, fmt))
    return seen


def test_h200_codec_table_is_its_runs():
    seen = _check_table(CODEC_COPY_FRACTION_2026_12_02, H200_RUNS, "NVIDIA H200")
    assert seen == {(op, f) for op, fmts in CODEC_COPY_FRACTION_2026_12_02.items() for f in fmts}  # every row cited


def test_h100_codec_table_is_its_runs_and_the_h200_table_elsewhere():
    seen = _check_table(H100_CODEC_COPY_FRACTION, H100_RUNS, "NVIDIA H100 80GB HBM3")
    for op, fmts in CODEC_COPY_FRACTION_2026_12_02.items():
        assert set(H100_CODEC_COPY_FRACTION[op]) == set(fmts)
        for f, v in fmts.items():
            if (op, f) not in seen:
                assert H100_CODEC_COPY_FRACTION[op][f] == v, (op, f)
    assert device_profile("H100").codec_copy_fraction is H100_CODEC_COPY_FRACTION


def test_default_h200_is_the_newest_table_and_the_check_uses_the_2026_11_29_one():
    assert CODEC_COPY_FRACTION is CODEC_COPY_FRACTION_2026_12_02
    for name in ("H200", "A100", "A6000", "910B"):
        assert device_profile(name).codec_copy_fraction is CODEC_COPY_FRACTION, name
    assert H200_2026_11_29.codec_copy_fraction is CODEC_COPY_FRACTION_2026_11_29
    # the 2026-11-29 table as docs/bench/codecs.md "Previous run (2026-11-29)" has it (1 GiB rows)
    assert CODEC_COPY_FRACTION_2026_11_29["quantize"]["nf4"] == 0.411
    assert CODEC_COPY_FRACTION_2026_11_29["dequantize"]["nf4"] == 0.606
    # apart from the codec table, the check's H200 is the default one
    assert replace(H200_2026_11_29, codec_copy_fraction=CODEC_COPY_FRACTION,
                   measured=DEVICES["H200"].measured) == DEVICES["H200"]
    # h200_check predicts LAAQ with the 2026-11-29 kernels: the step times docs/scale.md §5 shows
    laaq = {r.seq: r.predicted for r in single_gpu.h200_check() if r.method == "laaq" and r.quantity == "step_s"}
    assert laaq[4096] == pytest.approx(0.412, abs=ROUNDING) and laaq[16384] == pytest.approx(1.886, abs=ROUNDING)


def test_check_would_move_with_the_newest_table(monkeypatch):
    """The LAAQ rows depend on the codec table (so the test above can fail)."""
    monkeypatch.setattr(single_gpu, "H200_2026_11_29", DEVICES["H200"])
    laaq = {r.seq: r.predicted for r in single_gpu.h200_check() if r.method == "laaq" and r.quantity == "step_s"}
    assert laaq[4096] != pytest.approx(0.412, abs=ROUNDING)  # 0.408 s: the newer nf4 kernels are faster


def _h100_runs() -> list[dict]:
    runs = []
    for folder in ("h100-2026-12-06-s10", "h100-2026-12-06-s11"):
        for p in sorted((BENCH / folder).rglob("*.json")):
            d = json.loads(p.read_text())
            if isinstance(d, dict) and isinstance(d.get("copy"), dict):
                runs.append(d)
    return runs


def test_h100_copy_bandwidth_is_the_measured_median():
    runs = _h100_runs()
    assert len(runs) == 12
    assert {r["env"]["gpu"] for r in runs} == {"NVIDIA H100 80GB HBM3"}
    assert {r["copy"]["size_mib"] for r in runs} == {1024}
    median = statistics.median(r["copy"]["gb_s"] * 1e9 for r in runs)
    dev = device_profile("H100")
    assert dev.copy_bandwidth == pytest.approx(H100_MEASURED["copy_GBps"] * 1e9)
    assert dev.copy_bandwidth == pytest.approx(median, abs=0.05e9)  # 3,002.6 GB/s, one decimal
    # what was not measured on the H100 stays as before: datasheet peak, the H200's efficiencies
    assert dev.peak_flops == 989.4e12 and dev.hbm_bandwidth == 3.35e12
    assert dev.gemm_efficiency == DEVICES["H200"].gemm_efficiency
    assert dev.attention_efficiency == DEVICES["H200"].attention_efficiency


def test_h100_memory_is_the_measured_capacity():
    dev = device_profile("H100")
    assert dev.memory_bytes == H100_MEASURED["memory_bytes"]
    # env.memory_gib of every 2026-12-06 run: torch's total_memory / 2^30, one decimal
    assert {r["env"]["memory_gib"] for r in _h100_runs()} == {round(dev.memory_bytes / GiB, 1)}
    # torch's "total capacity" (two decimals) in the out-of-memory errors of the same day
    text = (BENCH / "h100-2026-12-06-s10/cells-16k/bench_equal_memory_cells.json").read_text()
    caps = set(re.findall(r"total capacity of ([0-9.]+) GiB", text))
    assert caps == {f"{dev.memory_bytes / GiB:.2f}"} == {"79.18"}


def test_profile_name_for_the_runtime_names():
    """The card's runtime name picks its profile (the equal-memory bench plans an H100 with the H100 profile);
    a card without a profile gives None, not a wrong profile."""
    from agoq_core.scale.devices import profile_name_for

    assert profile_name_for("NVIDIA H100 80GB HBM3") == "H100"
    assert profile_name_for("NVIDIA H200") == "H200"
    assert profile_name_for("NVIDIA A100-SXM4-80GB") == "A100"
    assert profile_name_for("NVIDIA RTX A6000") == "A6000"
    assert profile_name_for("NVIDIA GeForce RTX 4090") is None and profile_name_for(None) is None
