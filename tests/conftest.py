"""Core test configuration (CPU)."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _fresh_backend_selection(monkeypatch):
    """Each test starts from a clean AGOQ_BACKEND and an empty selection cache."""
    from agoq_core.backend import manager

    monkeypatch.delenv("AGOQ_BACKEND", raising=False)
    manager.reset()
    yield
    manager.reset()
