"""agoq-cpu tests. Oracle: agoq_core.formats.reference, always; the full bit-exactness proof of the
compiled codecs is the conformance suite (scripts/test.sh runs it with --agoq-backend cpu)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def eager():
    from agoq_cpu.backend import CpuBackend

    return CpuBackend(compile=False, quiet=True)


@pytest.fixture(scope="session")
def compiled():
    from agoq_cpu.backend import CpuBackend

    return CpuBackend(compile=True, quiet=True)


@pytest.fixture(autouse=True)
def _fresh_selection(monkeypatch):
    from agoq_core.backend import manager

    monkeypatch.delenv("AGOQ_BACKEND", raising=False)
    manager.reset()
    yield
    manager.reset()
