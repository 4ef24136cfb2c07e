"""Host-side costs of a training step that a tokens/s ratio hides: Python's garbage collector and the device
allocator.

Both differ between arms: LAAQ and QuanGrad create Python objects (kept-tensor records, autograd contexts) and
device buffers (codes, scales) every step, which the baseline does not. A collection of Python's oldest
generation walks every object of the process (hundreds of milliseconds once transformers, Triton and Inductor
are imported); a device allocation that misses the caching allocator's pool calls the driver (``cudaMalloc``;
``cudaFree`` synchronises the device). :class:`StepCosts` counts both over the timed steps of one arm, and
:class:`ManagedGC` is the remedy large training stacks use (torchtitan's ``gc_freq``, Megatron's
``--manual-gc``): automatic collection off during training, a young-generation collection every N steps.
"""
from __future__ import annotations

import gc
import time
from typing import Any

import torch

__all__ = ["StepCosts", "ManagedGC"]

# torch.<device>.memory_stats() counters read around each step (absent keys read as 0: not every device has them)
_ALLOC_KEYS = (("device_allocs", "num_device_alloc"), ("device_frees", "num_device_free"),
               ("alloc_retries", "num_alloc_retries"))


class StepCosts:
    """Counts Python GC collections (per generation, and their time) and device allocator calls during the steps
    passed to :meth:`begin`/:meth:`end` with ``timed=True``. Use as a context manager around the step loop (it
    installs a ``gc.callbacks`` entry and removes it on exit)."""

    def __init__(self, device: torch.device) -> None:
        mod = torch.get_device_module(device.type) if device.type != "cpu" else None
        self._mem = mod if mod is not None and hasattr(mod, "memory_stats") else None
        self._device = device
        self._active = False
        self._started: dict[int, float] = {}
        self.steps = 0
        self.collections = [0, 0, 0]
        self.gc_seconds = 0.0
        self.allocator = {k: 0 for k, _ in _ALLOC_KEYS}
        self._before: dict[str, int] = {}
        self._gc_at_begin = 0.0

    def __enter__(self) -> "StepCosts":
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        self._active = False

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if not self._active:
            return
        gen = info.get("generation", 0)
        if phase == "start":
            self._started[gen] = time.perf_counter()
        elif gen in self._started:
            self.gc_seconds += time.perf_counter() - self._started.pop(gen)
            self.collections[min(gen, 2)] += 1

    def _counters(self) -> dict[str, int]:
        if self._mem is None:
            return {}
        stats = self._mem.memory_stats(self._device)
        return {k: int(stats.get(key, 0)) for k, key in _ALLOC_KEYS}

    def begin(self, timed: bool) -> None:
        """Start counting this step (before its timer starts) if ``timed``."""
        self._active = timed
        if timed:
            self._before = self._counters()
            self._gc_at_begin = self.gc_seconds

    def end(self) -> dict[str, Any]:
        """Stop counting; what this step cost (empty when it was not timed): ``gc_ms`` and the allocator calls."""
        if not self._active:
            return {}
        self._active = False
        self.steps += 1
        out: dict[str, Any] = {}
        for k, v in self._counters().items():
            d = v - self._before.get(k, 0)
            self.allocator[k] += d
            out[k] = d
        out["gc_ms"] = (self.gc_seconds - self._gc_at_begin) * 1e3
        return out

    def summary(self) -> dict[str, Any]:
        """Totals over the timed steps, and per step."""
        n = max(self.steps, 1)
        out: dict[str, Any] = {"timed_steps": self.steps, "gc_collections": list(self.collections),
                               "gc_ms": self.gc_seconds * 1e3, "gc_ms_per_step": self.gc_seconds * 1e3 / n}
        if self._mem is not None:
            out.update(self.allocator)
            out["device_allocs_per_step"] = self.allocator["device_allocs"] / n
        return out


class ManagedGC:
    """``every`` > 0: Python's automatic garbage collection off while training, a collection of the young
    generations (``gc.collect(1)``) every ``every`` steps, the previous state restored on exit. ``every`` == 0:
    nothing changes (automatic collection, Python's default)."""

    def __init__(self, every: int) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise ValueError(f"gc_every must be an integer >= 0, got {every!r}")
        self.every = every
        self._was_enabled = gc.isenabled()

    def __enter__(self) -> "ManagedGC":
        self._was_enabled = gc.isenabled()
        if self.every:
            gc.collect(1)
            gc.disable()
        return self

    def before_step(self, step: int) -> None:
        """At the start of step ``step`` (0-based, inside its timer: the collection is part of training's cost):
        collect the young generations every ``every`` steps."""
        if self.every and step and step % self.every == 0:
            gc.collect(1)

    def __exit__(self, *exc: Any) -> None:
        if self.every and self._was_enabled:
            gc.enable()
