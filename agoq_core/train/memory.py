"""Measured memory of a training arm: saved activations, gradient storage and optimizer state.

All three are measured from live tensors, never computed from a formula:
- activations: the distinct storages saved for backward during one micro-batch's forward, caught with
  ``torch.autograd.graph.saved_tensors_hooks`` (parameters excluded: they are not activations);
- gradients: the distinct storages that hold gradients between backward and the optimizer step
  (the ``.grad`` tensors, or whatever extra buffers an arm reports, e.g. QuanGrad's 8-bit buffers);
- optimizer state: the distinct tensor storages inside ``optimizer.state``.
"Distinct storage" means a view and its base are counted once, and a storage is counted whole (a slice
of a big buffer keeps the whole buffer alive).
"""
from __future__ import annotations

from collections.abc import Iterable
from contextlib import contextmanager
from typing import Any, Iterator

import torch

__all__ = ["SavedTensorCounter", "storage_bytes", "grad_bytes", "optimizer_state_bytes", "format_bytes"]


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


class SavedTensorCounter:
    """Counts the bytes autograd keeps for backward while the ``measure()`` context is open.

    Use around one micro-batch's forward; ``bytes`` is then the activation memory of that micro-batch
    as the graph holds it at the end of the forward (the point where it peaks before backward).
    Tensors saved by custom autograd Functions through ``ctx.save_for_backward`` are caught too, so an
    arm whose saved tensors are 4-bit codes reports their real (packed) size.

    Tensors saved while a module of ``regions`` runs its forward are attributed to that region's name,
    the rest to ``"other"`` (for a causal LM: embeddings, final norm, logits and loss).
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = (),
                 regions: dict[str, Iterable[torch.nn.Module]] | None = None) -> None:
        self._exclude = {_storage_key(t) for t in exclude}
        self._seen: dict[tuple[str, int], tuple[str, int]] = {}
        self._regions = {name: list(mods) for name, mods in (regions or {}).items()}
        self._current = "other"
        self.count = 0

    @property
    def bytes(self) -> int:
        return sum(n for _, n in self._seen.values())

    def bytes_by_region(self) -> dict[str, int]:
        out = {name: 0 for name in [*self._regions, "other"]}
        for region, n in self._seen.values():
            out[region] += n
        return out

    def _pack(self, t: torch.Tensor) -> Any:
        if t.device.type != "meta":
            key = _storage_key(t)
            if key not in self._exclude and key[1] != 0 and key not in self._seen:
                self._seen[key] = (self._current, t.untyped_storage().nbytes())
                self.count += 1
        return t

    @staticmethod
    def _unpack(t: Any) -> Any:
        return t

    @contextmanager
    def measure(self) -> Iterator["SavedTensorCounter"]:
        handles = []
        for name, mods in self._regions.items():
            for m in mods:
                handles.append(m.register_forward_pre_hook(lambda *_, n=name: self._enter(n)))
                handles.append(m.register_forward_hook(lambda *_: self._enter("other")))
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                yield self
        finally:
            for h in handles:
                h.remove()
            self._current = "other"

    def _enter(self, name: str) -> None:
        self._current = name


def format_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"
