"""benchmarks/train_step_stats.py: medians and ratios from a metrics.jsonl written here, and clear errors."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import train_step_stats as tss  # noqa: E402


def _run(tmp_path, arms):
    lines = [json.dumps({"kind": "eval", "arm": "baseline", "step": 1, "val_loss": 1.0})]
    for arm, secs in arms.items():
        lines += [json.dumps({"kind": "step", "arm": arm, "step": i + 1, "seconds": s}) for i, s in enumerate(secs)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_median_and_ratio(tmp_path, capsys):
    run = _run(tmp_path, {"baseline": [9.0, 9.0, 1.0, 1.0, 1.2], "agoq": [9.0, 9.0, 1.25, 5.0, 1.25]})
    st = tss.step_stats(run)
    assert st["baseline"]["median_s"] == 1.0 and st["baseline"]["steps"] == 3
    assert st["agoq"]["median_s"] == 1.25 and st["agoq"]["ratio"] == pytest.approx(0.8)
    assert st["agoq"]["mean_s"] == pytest.approx(7.5 / 3)
    assert tss.step_stats(run, skip=0)["baseline"]["median_s"] == 1.2
    out = tmp_path / "s.json"
    assert tss.main([str(run), "--json", str(out)]) == 0
    assert "agoq 1.2500 s (0.800)" in capsys.readouterr().out
    assert json.loads(out.read_text())[str(run)]["agoq"]["ratio"] == pytest.approx(0.8)


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        tss.step_stats(tmp_path)
    run = _run(tmp_path, {"agoq": [1.0, 1.0]})
    with pytest.raises(ValueError, match="no step records"):
        tss.step_stats(run)
    assert tss.step_stats(run, skip=0)["agoq"]["ratio"] is None


def test_step_costs_are_averaged(tmp_path, capsys):
    lines = [json.dumps({"kind": "step", "arm": "agoq", "step": i + 1, "seconds": 1.0, "gc_ms": g, "device_allocs": a})
             for i, (g, a) in enumerate([(50.0, 9), (50.0, 9), (1.0, 0), (3.0, 2)])]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    st = tss.step_stats(tmp_path)["agoq"]
    assert st["gc_ms_mean"] == 2.0 and st["device_allocs_mean"] == 1.0 and st["seconds"] == [1.0, 1.0]
    assert "device_frees_mean" not in st
    tss.main([str(tmp_path)])
    assert "[gc 2.0 ms, 1.0 device allocs per step]" in capsys.readouterr().out
