"""Core test configuration (CPU)."""
from __future__ import annotations

import os

import pytest

# Core tests use the auto-selected backend: agoq-cpu where it is installed. Its codecs run eagerly here
# (same functions, same bits, no Inductor compile per format and dtype in every test process); the
# compiled path is tested by backends/cpu/tests and by the conformance run on the cpu backend.
os.environ.setdefault("AGOQ_CPU_COMPILE", "0")


@pytest.fixture(autouse=True)
def _fresh_backend_selection(monkeypatch):
    """Each test starts from a clean AGOQ_BACKEND and an empty selection cache."""
    from agoq_core.backend import manager

    monkeypatch.delenv("AGOQ_BACKEND", raising=False)
    manager.reset()
    yield
    manager.reset()
