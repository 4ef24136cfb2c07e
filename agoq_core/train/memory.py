"""Measured memory of a training arm: gradient storage and optimizer state (the saved activations
are measured by LAAQ's meter, agoq_core.laaq.SavedBytesMeter, for every arm).

Both are measured from live tensors, never computed from a formula:
- gradients: the distinct storages that hold gradients between backward and the optimizer step
  (the ``.grad`` tensors, or whatever extra buffers an arm reports, e.g. QuanGrad's 8-bit buffers);
- optimizer state: the distinct tensor storages inside ``optimizer.state``.
"Distinct storage" means a view and its base are counted once, and a storage is counted whole (a slice
of a big buffer keeps the whole buffer alive).
"""
from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["storage_bytes", "grad_bytes", "optimizer_state_bytes", "format_bytes"]


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    s = t.untyped_storage()
    return (str(t.device), s.data_ptr())


def storage_bytes(tensors: Iterable[torch.Tensor], *, exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the distinct storages behind ``tensors``, leaving out the storages of ``exclude``."""
    skip = {_storage_key(t) for t in exclude}
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        if t is None or t.device.type == "meta":
            continue
        key = _storage_key(t)
        if key in skip or key[1] == 0:
            continue
        seen[key] = t.untyped_storage().nbytes()
    return sum(seen.values())


def grad_bytes(params: Iterable[torch.nn.Parameter], extra: Iterable[torch.Tensor] = ()) -> int:
    """Gradient storage now alive: ``.grad`` of ``params`` plus ``extra`` buffers, distinct storages."""
    tensors = [p.grad for p in params if p.grad is not None]
    return storage_bytes([*tensors, *extra])


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of every tensor in ``optimizer.state`` (fp32 moments, or 8-bit codes + scales + maps)."""
    tensors: list[torch.Tensor] = []
    for state in optimizer.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                tensors.append(v)
    return storage_bytes(tensors)


def format_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"
