"""agoq-cuda tests: on a GPU when one is usable, else the same kernels in Triton's interpreter (CPU).

TRITON_INTERPRET must be set before any @triton.jit decorator runs, so it is set here, before the
test modules import agoq_cuda. Oracle: agoq_core.formats.reference on CPU, always.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def backend():
    from agoq_cuda.backend import CudaBackend

    return CudaBackend.create()


@pytest.fixture(scope="session")
def device(backend) -> torch.device:
    return torch.device(backend.device_type)


@pytest.fixture(autouse=True)
def _fresh_selection(monkeypatch):
    from agoq_core.backend import manager

    monkeypatch.delenv("AGOQ_BACKEND", raising=False)
    manager.reset()
    yield
    manager.reset()
