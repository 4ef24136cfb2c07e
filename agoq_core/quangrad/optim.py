"""Optimizer factories for QuanGradDDP, including an 8-bit AdamW from a maintained library.

``optimizer_factory(name, **kwargs)`` returns ``params -> torch.optim.Optimizer``:

- ``"adamw"``, ``"adam"``, ``"sgd"``: torch.optim.
- ``"adamw8bit"``: bitsandbytes ``AdamW8bit`` (block-wise 8-bit Adam moments). bitsandbytes 0.50.2 runs
  it on CPU tensors as well as CUDA (checked on CPU: bit-identical across runs, fp32 and bf16
  params); tensors smaller than ``min_8bit_size`` (4096) keep 32-bit moments, bitsandbytes' rule.
- ``"adamw8bit_torchao"``: torchao ``AdamW8bit`` (pip install torchao), for devices bitsandbytes does
  not serve.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

import torch

__all__ = ["optimizer_factory", "OPTIMIZERS"]

OPTIMIZERS = ("adamw", "adam", "sgd", "adamw8bit", "adamw8bit_torchao")


def _import(module: str, attr: str, hint: str) -> Any:
    try:
        return getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        raise ImportError(f"{module}.{attr} is not available ({exc}); {hint}") from exc


def optimizer_factory(name: str, **kwargs: Any) -> Callable[[list[torch.Tensor]], torch.optim.Optimizer]:
    """A callable building optimizer ``name`` over the given parameters with ``kwargs`` (lr=...)."""
    key = name.strip().lower() if isinstance(name, str) else name
    if key == "adamw":
        cls = torch.optim.AdamW
    elif key == "adam":
        cls = torch.optim.Adam
    elif key == "sgd":
        cls = torch.optim.SGD
    elif key == "adamw8bit":
        cls = _import("bitsandbytes.optim", "AdamW8bit",
                      "install bitsandbytes (pip install bitsandbytes), or use 'adamw8bit_torchao'")
    elif key == "adamw8bit_torchao":
        cls = _import("torchao.optim", "AdamW8bit", "install torchao (pip install torchao), or use 'adamw8bit'")
    else:
        raise ValueError(f"unknown optimizer {name!r}; known: {', '.join(OPTIMIZERS)}")

    def build(params: list[torch.Tensor]) -> torch.optim.Optimizer:
        return cls(params, **kwargs)

    build.__name__ = build.__qualname__ = f"optimizer_factory({key!r})"
    return build
