"""benchmarks/profile_layer_host.py on CPU (tiny LLaMA layers, in its own process): both models are timed, the
LAAQ model really is converted (agoq's own functions show up in its cProfile), and the report is written."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]


def test_profile_layer_host_smoke(tmp_path):
    out = tmp_path / "h.json"
    env = dict(os.environ, PYTHONPATH=str(_ROOT))
    proc = subprocess.run([sys.executable, str(_ROOT / "benchmarks" / "profile_layer_host.py"), "--smoke",
                           "--json", str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = json.loads(out.read_text())
    for arm in ("plain", "laaq"):
        assert rep[arm]["host_ms"] > 0 and rep[arm]["synced_ms"] > 0
    cp = rep["cprofile"]
    fns = [r["fn"] for r in cp["agoq_cum"]]
    assert any("laaq/functions.py" in f for f in fns), fns  # the converted layers ran LAAQ's functions
    assert cp["agoq_own_ms"] > 0 and cp["own"]
    md = (tmp_path / "h.md").read_text()
    assert md.startswith("# LAAQ host time per step") and "| LAAQ - plain |" in md
