"""Kernel-helper tests run on a GPU when one is usable, else in Triton's interpreter on CPU.

TRITON_INTERPRET must be set before any @triton.jit decorator runs (Triton fixes the mode at
decoration), so it is set here, before the test modules import the kernels.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def device() -> torch.device:
    """cpu under the interpreter, else the GPU."""
    from triton.runtime.interpreter import InterpretedFunction

    from agoq_triton_kernels import kernels

    return torch.device("cpu" if isinstance(kernels.quantize_kernel, InterpretedFunction) else "cuda")
