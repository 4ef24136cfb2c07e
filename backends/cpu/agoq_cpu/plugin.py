"""Registration of the ``cpu`` backend (entry point ``agoq.backends: cpu = agoq_cpu.plugin``).

The smallest complete plugin in the tree, and the one to copy: a cheap probe, a lazy ``load()``, and a
Backend object (agoq_cpu.backend) whose codecs are plain torch functions (agoq_cpu.codecs) compiled by
``torch.compile``. docs/writing-a-backend.md walks through it.

It is not an accelerator backend, so it never competes with one: with ``AGOQ_BACKEND`` unset and no
accelerator backend available, the core picks ``cpu`` when it is installed and its probe passes
(agoq_core.backend.manager), else ``reference``.
"""
from __future__ import annotations

from agoq_core.backend import Availability, BackendInfo, hookimpl

__all__ = ["agoq_backends", "probe"]


def probe() -> Availability:
    # Imports nothing heavy: torch is already imported by agoq_core; the compiler check is a PATH lookup.
    from agoq_cpu.compiled import compiler_status

    _, why = compiler_status()
    return Availability(True, f"CPU tensors; {why}")


def _load():
    from agoq_cpu.backend import CpuBackend

    return CpuBackend()


@hookimpl
def agoq_backends() -> list[BackendInfo]:
    return [BackendInfo(name="cpu", device_type="cpu", probe=probe, load=_load, accelerator=False,
                        install_hint="pip install agoq-cpu")]
