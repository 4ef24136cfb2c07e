"""benchmarks/bench_laaq.py --tiny: the H200 script's logic on CPU (methods, OOM ladder, JSON)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_laaq_tiny_runs_end_to_end(tmp_path):
    out = tmp_path / "b.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_laaq.py"), "--tiny", "--steps", "1", "--seqs", "32",
           "--ladder", "64,128,256", "--fake-oom-above", "64", "--methods", "plain,ckpt,laaq",
           "--ladder-methods", "laaq,ckpt", "--json", str(out)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    rep = json.loads(out.read_text())
    assert "max sequence laaq" in res.stdout and "goals:" in res.stdout
    assert rep["max_seq"]["laaq"] == {"max_fit": 64, "first_oom": 128, "stopped": "OOM at 128"}
    assert rep["max_seq"]["ckpt"]["max_fit"] == 64
    runs = {(r["method"], r["seq"]): r for r in rep["runs"]}
    assert runs[("laaq", 32)]["loss_kind"] == "chunked" and runs[("plain", 32)]["loss_kind"] == "hf"
    assert runs[("laaq", 128)]["oom"] is True and "simulated OOM" in runs[("laaq", 128)]["error"]
    # measured, not assumed: LAAQ's decoder layers keep under 30% of the plain model's bytes
    assert 0 < rep["goals"]["saved_layers_ratio_32"] < 0.30
    assert runs[("laaq", 32)]["parts"]["logits_loss"] < runs[("plain", 32)]["parts"]["logits_loss"]
    assert abs(runs[("laaq", 32)]["loss"] - runs[("plain", 32)]["loss"]) < 1e-2  # same model, same data
    assert rep["meta"]["agoq_backend"] in ("cpu", "reference") and "LAAQ on LlamaForCausalLM" in rep["laaq_report"]


def test_bench_grad_error_plots_a_saved_report(tmp_path):
    """--plot-from draws the committed H200 report; a report with no measured phase is refused by name."""
    src = ROOT / "docs" / "bench" / "h200-2026-12-01-s2" / "bench_grad_error.json"
    png = tmp_path / "g.png"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_grad_error.py"), "--plot-from", str(src), "--png", str(png)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert res.returncode == 0, res.stderr[-3000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    rep = json.loads(src.read_text())
    last = list(rep["phases"])[-1]
    rep["phases"][last] = {k: {} for k in rep["phases"][last]}
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps(rep))
    res = subprocess.run(cmd[:3] + [str(empty), "--png", str(tmp_path / "e.png")], capture_output=True, text=True,
                         timeout=120, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert res.returncode != 0 and "no measurement to draw" in res.stderr
