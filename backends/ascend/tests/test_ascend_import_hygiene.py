"""Importing the plugin (discovery, probing, listing backends, the launch geometry) pulls in neither torch_npu
nor triton; only selecting and loading the backend does."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def _run(code: str, **env) -> str:
    full = {k: v for k, v in os.environ.items() if not k.startswith("AGOQ_")}
    full.update(env)
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().splitlines()[-1]


_HEAVY = "[m for m in sys.modules if m.split('.')[0] in ('torch_npu', 'triton', 'triton_ascend')]"


def test_discovery_and_probe_import_neither_torch_npu_nor_triton():
    out = _run(f"""
        import sys
        import agoq_ascend, agoq_ascend.plugin, agoq_ascend.geometry, agoq_ascend.environment, agoq_ascend.soc
        from agoq_core.backend import list_backends
        rows = {{r["name"]: r for r in list_backends()["backends"]}}
        assert "ascend" in rows and not rows["ascend"]["available"], rows.get("ascend")
        agoq_ascend.plugin.probe()
        print({_HEAVY})
    """)
    assert out == "[]"


def test_interpreter_mode_probe_imports_nothing_heavy_either():
    out = _run(f"""
        import sys, agoq_ascend.plugin
        assert agoq_ascend.plugin.probe().ok
        print({_HEAVY})
    """, AGOQ_ASCEND_INTERPRET="1", TRITON_INTERPRET="1")
    assert out == "[]"


def test_loading_the_backend_imports_triton_but_not_torch_npu_in_interpreter_mode():
    out = _run("""
        import sys, torch, agoq_core
        q = agoq_core.quantize(torch.randn(300), "int4")
        assert agoq_core.dequantize(q).shape == (300,)
        from agoq_core.backend import get_backend
        print(type(get_backend()).__name__, "triton" in sys.modules, "torch_npu" in sys.modules)
    """, AGOQ_BACKEND="ascend", AGOQ_ASCEND_INTERPRET="1", TRITON_INTERPRET="1")
    assert out == "AscendBackend True False"
