"""The GPU variants compile for sm_90 (H100/H200) with Triton's real NVIDIA pipeline — no GPU needed.

Runs agoq_cuda.fusion.compile_check in a subprocess without TRITON_INTERPRET (this process's kernels are
interpreter objects). Catches on CPU CI what would otherwise fail only on the lent GPU: kernels that do
not lower, operand loads that are not software-pipelined, a dot that is not wgmma, shared memory above
the 227 KiB an H200 block can use, register spills above 512 bytes (a few are normal with a 128x256 fp32
accumulator at 8 warps).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys


def test_main_variants_compile_for_sm90(tmp_path):
    out = tmp_path / "cc.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-m", "agoq_cuda.fusion.compile_check", "--quick", "--json", str(out)],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    recs = json.loads(out.read_text())
    assert {x["kernel"] for x in recs} == {"epilogue", "epilogue-tma", "prologue", "prologue+mul"}
    for x in recs:
        assert x["wgmma"], x                      # Hopper tensor-core MMA
        assert x["pipelined_loads"] > 0, x        # cp.async / TMA prefetch of the operand tiles
        assert x["shared_bytes"] <= 227 * 1024, x
        assert x["spill_bytes"] is None or x["spill_bytes"] <= 512, x   # None: cuobjdump unavailable
