"""Backend plugins: discovery (pluggy entry points ``agoq.backends``), selection and the protocol.

Public verbs: :func:`get_backend` (the selected or a named backend), :func:`list_backends`
(what is installed, available, and selected, for ``agoq backends``).
"""
from __future__ import annotations

from typing import Any

from agoq_core.backend.hookspec import ENTRY_POINT_GROUP, hookimpl
from agoq_core.backend.protocol import Backend, BackendBase
from agoq_core.backend.types import Availability, BackendInfo, Capabilities

__all__ = [
    # using backends
    "get_backend",
    "list_backends",
    "selected_backend_name",
    "check_same_backend_across_ranks",
    # writing backends
    "hookimpl",
    "Backend",
    "BackendBase",
    "BackendInfo",
    "Availability",
    "Capabilities",
    "ENTRY_POINT_GROUP",
]


def get_backend(name: "str | Backend | None" = None) -> Backend:
    """The backend to use: ``None`` -> the selected one (AGOQ_BACKEND or auto), a name -> that one,
    a Backend object -> itself."""
    from agoq_core.backend import manager

    if name is None:
        return manager.load(manager.selection().name)
    if isinstance(name, str):
        return manager.load(name.strip().lower())
    if isinstance(name, Backend):
        return name
    raise TypeError(f"backend must be None, a name or a Backend, got {type(name).__name__}")


def selected_backend_name() -> str:
    from agoq_core.backend import manager

    return manager.selection().name


def list_backends() -> dict[str, Any]:
    """Every installed backend with its distribution, availability, reason, and the selection.

    Never raises for a broken plugin or an invalid AGOQ_BACKEND: those are reported in the result.
    """
    from agoq_core.backend import manager

    reg = manager.registry()
    rows = []
    for name, info in sorted(reg.infos.items()):
        av = manager.probe(info)
        rows.append({
            "name": name, "distribution": info.distribution, "device_type": info.device_type,
            "accelerator": info.accelerator, "available": av.ok, "reason": av.reason,
            "install_hint": info.install_hint,
        })
    for b in reg.broken:
        rows.append({"name": b.name, "distribution": b.distribution, "device_type": "?", "accelerator": None,
                     "available": False, "reason": f"failed to load: {b.error}", "install_hint": ""})
    try:
        sel = manager.selection()
        selected = {"name": sel.name, "how": sel.how, "reason": sel.reason, "error": None}
    except Exception as exc:
        selected = {"name": None, "how": None, "reason": None, "error": f"{type(exc).__name__}: {exc}"}
    return {"backends": rows, "selected": selected}


def check_same_backend_across_ranks(group: Any = None) -> str:
    """Collective: verify every rank of ``group`` selected the same backend; returns its name."""
    import torch.distributed as dist

    mine = selected_backend_name()
    names: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(names, mine, group=group)
    if len(set(names)) != 1:
        detail = ", ".join(f"rank {r}: {n}" for r, n in enumerate(names))
        raise RuntimeError(f"ranks selected different agoq backends ({detail}); set AGOQ_BACKEND on every rank")
    return mine
