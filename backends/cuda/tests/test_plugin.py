"""Discovery through the real entry point, probe hygiene, and how interpreter mode is selected."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from agoq_core.backend import manager
from agoq_cuda import plugin


def _python(code: str, **env_overrides) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "AGOQ_BACKEND")}
    env.update({k: v for k, v in env_overrides.items() if v is not None})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)


def test_entry_point_registers_cuda_from_its_distribution(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    manager.reset()
    info = manager.registry().infos["cuda"]
    assert info.distribution == "agoq-cuda"
    assert info.device_type == "cuda" and info.accelerator is True
    assert "TRITON_INTERPRET" in info.install_hint


def test_interpreter_mode_is_never_auto_selected(monkeypatch):
    """TRITON_INTERPRET=1 makes cuda usable by name on CPU, but auto-selection stays on the reference."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    manager.reset()
    info = manager.registry().infos["cuda"]
    assert info.accelerator is False and info.device_type == "cpu"
    assert manager.probe(info).ok
    sel = manager.selection()
    assert sel.name != "cuda"


@pytest.mark.parametrize("interpret", [None, "1"])
def test_discovery_and_probe_import_no_triton_and_touch_no_cuda(interpret):
    code = (
        "import sys, torch\n"
        "from agoq_core.backend import list_backends\n"
        "rows = {r['name']: r for r in list_backends()['backends']}\n"
        "assert 'cuda' in rows, rows\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('triton', 'agoq_triton_kernels')]\n"
        "assert not bad, bad\n"
        "assert not torch.cuda.is_initialized()\n"
        "print(rows['cuda']['available'], rows['cuda']['reason'])\n"
    )
    out = _python(code, TRITON_INTERPRET=interpret)
    assert out.returncode == 0, out.stderr
    if interpret:
        assert out.stdout.startswith("True") and "interpreter" in out.stdout


def test_probe_without_triton(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    av = plugin.probe()
    assert not av.ok and "triton" in av.reason


def test_probe_interpreter_mode(monkeypatch):
    for value in ("1", "true", "ON"):
        monkeypatch.setenv("TRITON_INTERPRET", value)
        av = plugin.probe()
        assert av.ok and "interpreter" in av.reason


def test_probe_gpu_checks_use_files_only(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.version, "cuda", None)
    av = plugin.probe()
    assert not av.ok and "not a CUDA build" in av.reason
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(plugin.glob, "glob", lambda pattern: [])
    av = plugin.probe()
    assert not av.ok and "/dev/nvidia0" in av.reason
    monkeypatch.setattr(plugin.glob, "glob", lambda pattern: ["/dev/nvidia0", "/dev/nvidia1"])
    av = plugin.probe()
    assert av.ok and "2 NVIDIA device node" in av.reason
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    av = plugin.probe()
    assert not av.ok and "hides every GPU" in av.reason


def test_agoq_backend_cuda_with_interpreter_runs_on_cpu():
    code = (
        "import torch, agoq_core\n"
        "be = agoq_core.get_backend()\n"
        "q = agoq_core.quantize(torch.arange(10.0), 'int8')\n"
        "print(be.name, be.device_type, be.dist_backend, sorted(be.capabilities().device_types), q.codes.device)\n"
    )
    out = _python(code, TRITON_INTERPRET="1", AGOQ_BACKEND="cuda")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["cuda", "cpu", "gloo", "['cpu']", "cpu"]


def test_agoq_backends_command_shows_the_selection():
    out = _python("import sys; from agoq_core.cli.main import main; sys.exit(main(['backends']))",
                  TRITON_INTERPRET="1", AGOQ_BACKEND="cuda")
    assert out.returncode == 0, out.stderr
    assert "selected: cuda" in out.stdout and "Triton interpreter" in out.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the failure on a machine without a GPU")
def test_agoq_backend_cuda_without_gpu_or_interpreter_fails_loudly():
    out = _python("import agoq_core; agoq_core.get_backend()", AGOQ_BACKEND="cuda")
    assert out.returncode != 0
    assert "BackendUnavailableError" in out.stderr and "TRITON_INTERPRET=1" in out.stderr


def test_interpreter_flag_set_after_kernel_import_is_refused():
    code = (
        "import os\n"
        "from agoq_cuda import launch  # decorates the kernels in compiled mode\n"
        "os.environ['TRITON_INTERPRET'] = '1'\n"
        "from agoq_cuda.backend import CudaBackend\n"
        "from agoq_core.errors import BackendUnavailableError\n"
        "try:\n"
        "    CudaBackend.create()\n"
        "except BackendUnavailableError as e:\n"
        "    print('refused:', e)\n"
    )
    out = _python(code)
    assert out.returncode == 0, out.stderr
    assert "refused:" in out.stdout and "changed after" in out.stdout
