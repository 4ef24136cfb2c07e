"""Discovery and selection of backends (internal; the public verbs are in agoq_core.backend).

Selection rule (design.md): ``AGOQ_BACKEND`` names one backend and never falls back; unset, the one
available accelerator backend wins, several is an error, none means ``cpu`` (the agoq-cpu plugin's
compiled CPU codecs) when it is installed and its probe passes, else ``reference``.
"""
from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass, field
from importlib.metadata import entry_points

import pluggy

from agoq_core.backend import hookspec
from agoq_core.backend.protocol import Backend, unimplemented_ops
from agoq_core.backend.types import Availability, BackendInfo
from agoq_core.errors import (
    AmbiguousBackendError,
    BackendNotFoundError,
    BackendUnavailableError,
    PluginError,
)

log = logging.getLogger("agoq")

ENV_VAR = "AGOQ_BACKEND"
FALLBACK = "reference"
#: Preferred over the reference when no accelerator backend is available (agoq-cpu: compiled CPU codecs,
#: bit-exact with the reference and 5x+ faster; its probe explains when it cannot run).
CPU_DEFAULT = "cpu"


@dataclass(frozen=True, slots=True)
class BrokenPlugin:
    """An entry point that failed to import or whose hook raised or returned garbage."""

    name: str
    distribution: str
    error: str


@dataclass(slots=True)
class Registry:
    infos: dict[str, BackendInfo] = field(default_factory=dict)
    broken: list[BrokenPlugin] = field(default_factory=list)
    duplicates: dict[str, list[str]] = field(default_factory=dict)
    """Backend name -> every provider claiming it ("distribution (entry point X)"), first one first."""
    providers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Selection:
    name: str
    how: str  # "env" or "auto"
    reason: str


def _collect(plugin: object, plugin_name: str, dist: str, reg: Registry) -> None:
    try:
        infos = plugin.agoq_backends()  # type: ignore[attr-defined]
        infos = list(infos or [])
        for info in infos:
            if not isinstance(info, BackendInfo):
                raise PluginError(f"agoq_backends() returned {type(info).__name__}, expected BackendInfo")
    except Exception as exc:  # a broken plugin is reported by name and does not break the others
        reg.broken.append(BrokenPlugin(plugin_name, dist, f"{type(exc).__name__}: {exc}"))
        return
    for info in infos:
        if not info.distribution:
            object.__setattr__(info, "distribution", dist)
        provider = f"{info.distribution} (entry point {plugin_name!r})"
        if info.name in reg.infos:
            reg.duplicates.setdefault(info.name, [reg.providers[info.name]]).append(provider)
            continue
        reg.infos[info.name] = info
        reg.providers[info.name] = provider


@functools.cache
def registry() -> Registry:
    """Load every ``agoq.backends`` entry point once per process (cached)."""
    pm = pluggy.PluginManager(hookspec.PROJECT)
    pm.add_hookspecs(hookspec.AgoqSpecs)
    reg = Registry()
    from agoq_core.backend import reference

    pm.register(reference, name="reference")
    _collect(reference, "reference", "agoq", reg)
    for ep in sorted(entry_points(group=hookspec.ENTRY_POINT_GROUP), key=lambda e: e.name):
        dist = getattr(getattr(ep, "dist", None), "name", "") or "?"
        if ep.name == "reference":
            reg.broken.append(BrokenPlugin(ep.name, dist, "the name 'reference' is reserved for the built-in backend"))
            continue
        try:
            plugin = ep.load()
            pm.register(plugin, name=ep.name)
        except Exception as exc:
            reg.broken.append(BrokenPlugin(ep.name, dist, f"{type(exc).__name__}: {exc}"))
            continue
        _collect(plugin, ep.name, dist, reg)
    return reg


def _installed_summary(reg: Registry) -> str:
    lines = [f"  {n} (from {i.distribution})" for n, i in sorted(reg.infos.items())]
    lines += [f"  {b.name} (from {b.distribution}) BROKEN: {b.error}" for b in reg.broken]
    return "\n".join(lines)


def probe(info: BackendInfo) -> Availability:
    try:
        res = info.probe()
        if not isinstance(res, Availability):
            return Availability(False, f"probe returned {type(res).__name__}, expected Availability")
        return res
    except Exception as exc:  # a probe must never take the process down
        return Availability(False, f"probe raised {type(exc).__name__}: {exc}")


def conflict_message(reg: Registry, name: str) -> str:
    provs = reg.duplicates[name]
    return (f"backend name {name!r} is registered by several plugins: {' and '.join(provs)}; the name must be "
            f"unique: uninstall or rename all but one (e.g. pip uninstall {provs[-1].split(' ')[0]})")


def _check_duplicates(reg: Registry, name: str) -> None:
    if name in reg.duplicates:
        raise PluginError(conflict_message(reg, name))


@functools.cache
def selection() -> Selection:
    """Which backend this process uses and why (cached; logged once)."""
    reg = registry()
    wanted = os.environ.get(ENV_VAR, "").strip()
    if wanted:
        name = wanted.lower()
        if name not in reg.infos:
            broken = [b for b in reg.broken if b.name == name]
            if broken:
                raise BackendNotFoundError(
                    f"{ENV_VAR}={wanted!r}: the plugin is installed but failed to load: {broken[0].error}"
                )
            raise BackendNotFoundError(
                f"{ENV_VAR}={wanted!r} is not an installed backend. Installed backends:\n"
                f"{_installed_summary(reg)}\nUnset {ENV_VAR} to auto-select, or install the plugin."
            )
        _check_duplicates(reg, name)
        info = reg.infos[name]
        av = probe(info)
        if not av.ok:
            hint = f"\nFix: {info.install_hint}" if info.install_hint else ""
            raise BackendUnavailableError(f"{ENV_VAR}={wanted!r} cannot run here: {av.reason}{hint}")
        sel = Selection(name, "env", f"{ENV_VAR}={wanted} ({av.reason})")
    else:
        available = []
        for name, info in sorted(reg.infos.items()):
            if info.accelerator:
                av = probe(info)
                if av.ok:
                    available.append((info, av))
        if len(available) > 1:
            names = ", ".join(f"{i.name} ({a.reason})" for i, a in available)
            raise AmbiguousBackendError(
                f"several accelerator backends are available: {names}. Set {ENV_VAR} to one of them."
            )
        if available:
            info, av = available[0]
            _check_duplicates(reg, info.name)
            sel = Selection(info.name, "auto", f"the only available accelerator backend ({av.reason})")
        else:
            sel = _no_accelerator(reg)
            _check_duplicates(reg, sel.name)  # a plugin claiming the fallback's name would fail every call later
    log.info("agoq: using backend %r (%s)", sel.name, sel.reason)
    return sel


def _no_accelerator(reg: Registry) -> Selection:
    info = reg.infos.get(CPU_DEFAULT)
    if info is None:
        return Selection(FALLBACK, "auto", "no accelerator backend is available and agoq-cpu is not installed; "
                                           "using the pure-torch reference")
    _check_duplicates(reg, CPU_DEFAULT)
    av = probe(info)
    if not av.ok:
        return Selection(FALLBACK, "auto", f"no accelerator backend is available and the {CPU_DEFAULT} backend "
                                           f"cannot run ({av.reason}); using the pure-torch reference")
    return Selection(CPU_DEFAULT, "auto", f"no accelerator backend is available; {CPU_DEFAULT} backend ({av.reason})")


@functools.cache
def load(name: str) -> Backend:
    """Instantiate backend ``name`` (cached). Explicit: probes it and fails loudly if unavailable."""
    reg = registry()
    if name not in reg.infos:
        raise BackendNotFoundError(f"backend {name!r} is not installed. Installed backends:\n{_installed_summary(reg)}")
    _check_duplicates(reg, name)
    info = reg.infos[name]
    av = probe(info)
    if not av.ok:
        hint = f"\nFix: {info.install_hint}" if info.install_hint else ""
        raise BackendUnavailableError(f"backend {name!r} cannot run here: {av.reason}{hint}")
    try:
        backend = info.load()
    except Exception as exc:
        raise PluginError(f"backend {name!r} (from {info.distribution}) failed to load: {type(exc).__name__}: {exc}") from exc
    _bind_device_type(backend, info)
    if not isinstance(backend, Backend):
        raise PluginError(f"backend {name!r}: load() returned {type(backend).__name__}, which lacks the Backend protocol")
    _check_claims(backend, info)
    return backend


def _bind_device_type(backend: object, info: BackendInfo) -> None:
    """The device type is stated once, in BackendInfo: give it to the loaded object."""
    have = getattr(backend, "device_type", None)
    if have is not None and have != info.device_type:
        raise PluginError(
            f"backend {info.name!r} (from {info.distribution}): its BackendInfo says device_type="
            f"{info.device_type!r} but the loaded {type(backend).__name__} says {have!r}; state the device type "
            "once, in BackendInfo.device_type (the manager sets it on the Backend object)")
    try:
        backend.device_type = info.device_type  # type: ignore[attr-defined]
    except AttributeError as exc:
        raise PluginError(f"backend {info.name!r}: cannot set device_type on {type(backend).__name__} ({exc}); "
                          "subclass agoq_core.backend.BackendBase or leave device_type assignable") from None


def _check_claims(backend: Backend, info: BackendInfo) -> None:
    """A claimed optional op must be backed by its methods (not BackendBase's raising defaults)."""
    try:
        ops = backend.capabilities().ops
    except Exception as exc:
        raise PluginError(f"backend {info.name!r} (from {info.distribution}): capabilities() raised "
                          f"{type(exc).__name__}: {exc}") from exc
    missing = unimplemented_ops(backend, ops)
    if missing:
        detail = "; ".join(f"{op!r} needs {', '.join(ms)}" for op, ms in missing.items())
        raise PluginError(
            f"backend {info.name!r} (from {info.distribution}) claims ops it does not implement: {detail}. "
            "Implement them (signatures: agoq_core.backend.protocol, docs/writing-a-backend.md) or drop the "
            "claim from capabilities().ops")


def reset() -> None:
    """Forget cached discovery/selection (tests, or after changing AGOQ_BACKEND in-process)."""
    registry.cache_clear()
    selection.cache_clear()
    load.cache_clear()
