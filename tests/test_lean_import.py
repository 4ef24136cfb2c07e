"""The core is device-neutral: importing it pulls in no triton, torch_npu, or CUDA context."""
from __future__ import annotations

import pathlib
import pkgutil
import re
import subprocess
import sys

import agoq_core

_FORBIDDEN_SOURCE = re.compile(r"^\s*(import|from)\s+(triton|torch_npu)\b|torch\.cuda\.|\.cuda\(\)", re.M)


def test_import_touches_no_device_stack():
    code = (
        "import sys, pkgutil, importlib, agoq_core\n"
        "mods = [m.name for m in pkgutil.walk_packages(agoq_core.__path__, 'agoq_core.')]\n"
        "for m in mods:\n"
        "    importlib.import_module(m)\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('triton', 'torch_npu', 'triton_ascend', 'agoq_cuda', 'agoq_ascend')]\n"
        "import torch\n"
        "assert not bad, bad\n"
        "assert not torch.cuda.is_initialized()\n"
        "print(len(mods))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip()) > 10


def test_core_sources_do_not_reference_device_stacks():
    root = pathlib.Path(agoq_core.__file__).parent
    hits = []
    for path in root.rglob("*.py"):
        for m in _FORBIDDEN_SOURCE.finditer(path.read_text()):
            line = path.read_text()[: m.start()].count("\n") + 1
            hits.append(f"{path.relative_to(root)}:{line}: {m.group(0).strip()}")
    assert not hits, "agoq_core must stay device-neutral:\n" + "\n".join(hits)
