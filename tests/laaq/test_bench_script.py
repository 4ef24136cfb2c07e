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
