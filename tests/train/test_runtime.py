"""Runtime choices: torch threads per process, device resolution."""
from __future__ import annotations

import pytest

from agoq_core.train.config import ConfigError
from agoq_core.train.runtime import resolve_device


def test_auto_threads_leaves_busy_cores_alone(monkeypatch):
    import os

    from agoq_core.train import runtime

    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(runtime, "_busy_cores", lambda: 0.2)
    assert runtime.auto_threads(1)[0] == 8 and runtime.auto_threads(2)[0] == 4
    monkeypatch.setattr(runtime, "_busy_cores", lambda: 3.0)
    n, why = runtime.auto_threads(1)
    assert n == 5 and "3.0 of 8 cores busy" in why
    monkeypatch.setattr(runtime, "_busy_cores", lambda: 7.9)
    assert runtime.auto_threads(1)[0] == 1
    monkeypatch.setattr(runtime, "_busy_cores", lambda: None)   # no /proc/stat: split the cores
    assert runtime.auto_threads(3)[0] == 2


def test_resolve_device():
    assert str(resolve_device("cpu")) == "cpu"
    assert str(resolve_device("auto")) in ("cpu", "cuda:0", "npu:0", "xpu:0", "mps:0")
    with pytest.raises(ConfigError, match="unknown device 'gpu0'"):
        resolve_device("gpu0")
