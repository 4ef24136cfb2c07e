"""Backend plugins: discovery (pluggy entry points ``agoq.backends``), selection and the protocol.

Public verbs: :func:`get_backend` (the selected or a named backend), :func:`list_backends`
(what is installed, available, and selected, for ``agoq backends``).
"""
from __future__ import annotations

import weakref
from typing import Any

from agoq_core.backend.hookspec import ENTRY_POINT_GROUP, hookimpl
from agoq_core.backend.protocol import Backend, BackendBase
from agoq_core.backend.protocol import (
    OPTIONAL_OPS, SupportsAccumulate, SupportsGemmDequantPrologue, SupportsGemmQuantEpilogue, SupportsReduceRequantize,
)
from agoq_core.backend.types import Availability, BackendInfo, Capabilities
from agoq_core.errors import BackendError, BackendMismatchError

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
    # optional operations a backend may claim (one protocol each)
    "OPTIONAL_OPS",
    "SupportsAccumulate",
    "SupportsReduceRequantize",
    "SupportsGemmQuantEpilogue",
    "SupportsGemmDequantPrologue",
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

    Never raises for a broken plugin, an invalid AGOQ_BACKEND or two plugins claiming one name: those
    are reported in the result ("selected"."error", "conflicts").
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
    conflicts = [{"name": n, "providers": list(p), "error": manager.conflict_message(reg, n)}
                 for n, p in sorted(reg.duplicates.items())]
    return {"backends": rows, "selected": selected, "conflicts": conflicts}


# Groups already checked (per backend name): entry points called per tensor check once per group.
_checked: "weakref.WeakKeyDictionary[Any, set[str]]" = weakref.WeakKeyDictionary()


def check_same_backend_across_ranks(group: Any = None, backend: "str | Backend | None" = None, *,
                                    once: bool = False) -> str:
    """Collective: verify that every rank of ``group`` uses the same agoq backend (the one ``backend``
    names, or the selected one) on the same device type; returns its name.

    On a mismatch, or when selection failed on some rank, every rank raises the same
    :class:`~agoq_core.errors.BackendMismatchError` listing each rank's backend (a rank that failed alone
    would otherwise leave the others waiting in the next collective). ``once=True`` skips groups already
    checked for this backend in this process (for entry points called per tensor; every rank must then
    call with the same sequence of backends, as QuanGrad's collectives require anyway). Without an
    initialised process group it only resolves the backend.
    """
    import torch.distributed as dist

    try:
        be = get_backend(backend)
        mine, failure = f"{be.name} ({be.device_type})", None
    except BackendError as exc:
        mine, failure = f"failed: {type(exc).__name__}: {exc}", exc
    if not (dist.is_available() and dist.is_initialized()):
        if failure is not None:
            raise failure
        return be.name
    key = group if group is not None else dist.group.WORLD
    if once and failure is None and be.name in _checked.get(key, ()):
        return be.name
    names: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(names, mine, group=group)
    if len(set(names)) != 1:
        detail = "; ".join(f"rank {r}: {n}" for r, n in enumerate(names))
        raise BackendMismatchError(
            f"the ranks of this process group use different agoq backends ({detail}). Every rank must run the "
            f"same backend on the same device type: set AGOQ_BACKEND=<name> identically on every rank (and the "
            "variables that pick its mode, such as TRITON_INTERPRET)")
    if failure is not None:
        raise failure
    _checked.setdefault(key, set()).add(be.name)
    return be.name
