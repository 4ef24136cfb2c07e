"""benchmarks/profile_train.py on CPU (tiny model, one step per phase, in its own process: the script wraps library
functions in profiler ranges): every arm is built as agoq train builds it, its phases are timed, its ATen ops grouped,
and the host ranges it passed through are reported (QuanGrad's hook and step for the AGoQ arm, the master-weight
copies are absent on fp32 CPU runs)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("mode", [["--cprofile", "1"], ["--sequential"]])
def test_profile_train_smoke(tmp_path, mode):
    out = tmp_path / "p.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(_ROOT / d) for d in ("", "backends/triton_common",
                                                                                "backends/cuda")))
    proc = subprocess.run([sys.executable, str(_ROOT / "benchmarks" / "profile_train.py"), "--smoke",
                           "--arms", "baseline,agoq", "--json", str(out), *mode],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = json.loads(out.read_text())
    assert list(rep["arms"]) == ["baseline", "agoq"]
    for name, arm in rep["arms"].items():
        assert "error" not in arm, arm
        p = arm["phases_ms"]
        assert p["fwd_bwd"] > 0 and p["step"] > 0 and p["total"] == pytest.approx(p["fwd_bwd"] + p["step"])
        assert arm["tokens_per_s"] == pytest.approx(rep["config"]["micro_batch"] * rep["config"]["seq_len"]
                                                    / (p["total"] / 1e3))
        k = arm["kernels"]
        assert k["ms"]["gemm"] > 0 and k["launches_per_step"] > 0 and k["top"]
        assert k["host_ranges"]["backward"]["calls_per_step"] == 1
    hr = rep["arms"]["agoq"]["kernels"]["host_ranges"]
    assert hr["qg.hook"]["calls_per_step"] == hr["qg.fold"]["calls_per_step"] > 0
    assert "qg.step_replicated" in hr and "qg.hook" not in rep["arms"]["baseline"]["kernels"]["host_ranges"]
    assert (tmp_path / "p.md").read_text().startswith("# agoq train step profile")
    if "--cprofile" in mode:  # host time by Python function, the backward's own functions included
        for arm in rep["arms"].values():
            assert arm["cprofile"]["wall_ms"] > 0 and arm["cprofile"]["own"]
        fns = [t["fn"] for t in rep["arms"]["agoq"]["cprofile"]["agoq_cum"]]
        assert any("forward_backward" in f for f in fns), fns
        assert "Python own host time" in (tmp_path / "p.md").read_text()
