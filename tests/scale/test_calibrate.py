"""benchmarks/calibrate_collectives.py on gloo: it measures, fits and writes a profile the model reads."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from agoq_core.scale.network import load_profile

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_smoke_run_writes_a_loadable_profile(tmp_path):
    out = tmp_path / "gloo.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "calibrate_collectives.py"), "--smoke", "--backend",
                        "gloo", "--world", "2", "--out", str(out)], capture_output=True, text=True, env=env, timeout=240)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    prof = load_profile(out)
    assert prof.fitted["backend"] == "gloo" and prof.fitted["world"] == 2
    rows = prof.fitted["measurements"]["world"]
    assert len(rows["all_reduce"]) == 3 and len(rows["all_to_all"]) == 3, (prof.fitted["skipped"], r.stdout)
    assert all(t > 0 for op in rows.values() for _, _, t in op)
    assert prof.intra.alpha >= 0 and prof.intra.bandwidth > 0
    assert "all_reduce" in r.stdout and "wrote" in r.stdout
