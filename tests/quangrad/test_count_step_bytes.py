"""benchmarks/count_step_bytes.py: the per-parameter traffic that QuanGrad's FP8 gradient buffers add, counted op by
op on a tiny Llama, matches the design (docs/benchmarks.md §5.9): the step's dequantize (1 + 4 B + scales), the
reported norm's read of the fp32 gradient (4), the cast to bf16 (4 + 2), the zeroing (1); the backward's quantize of
each bf16 gradient (2 + 1)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "count_step_bytes.py"


def test_count_step_bytes_tiny(tmp_path, monkeypatch):
    monkeypatch.setenv("AGOQ_BACKEND", "reference")
    spec = importlib.util.spec_from_file_location("count_step_bytes", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rep = mod.main(["--tiny", "--tokens", "32", "--json", str(tmp_path / "c.json")])
    step, plain = rep["quangrad_step"]["ops"], rep["plain_step"]["ops"]
    assert step["codec dequantize_into"]["bytes_per_param"] == pytest.approx(5.0, abs=0.1)  # fp8 in, fp32 out
    assert step["aten.linalg_vector_norm.default"]["bytes_per_param"] == pytest.approx(4.0, abs=0.01)
    assert step["aten._to_copy.default"]["bytes_per_param"] == pytest.approx(6.0, abs=0.01)  # fp32 -> bf16
    assert rep["quangrad_backward"]["ops"]["codec quantize_into"]["bytes_per_param"] == pytest.approx(3.0, abs=0.1)
    assert "codec dequantize_into" not in plain
    assert 15.0 < rep["step_extra_bytes_per_param"] < 20.0, rep["step_extra_bytes_per_param"]
    assert (tmp_path / "c.json").exists()
