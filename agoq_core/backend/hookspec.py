"""Hooks a backend plugin implements (project ``agoq``, entry-point group ``agoq.backends``).

A complete plugin is two files::

    # my_agoq_backend/plugin.py
    from agoq_core.backend import Availability, BackendInfo, hookimpl

    def _probe():
        import importlib.util
        if importlib.util.find_spec("my_runtime") is None:
            return Availability(False, "my_runtime is not installed")
        return Availability(True, "my_runtime found")

    def _load():
        from my_agoq_backend.backend import MyBackend   # heavy imports happen only here
        return MyBackend()

    @hookimpl
    def agoq_backends():
        return [BackendInfo(name="mine", device_type="cpu", probe=_probe, load=_load,
                            install_hint="pip install my_runtime")]

    # pyproject.toml
    [project.entry-points."agoq.backends"]
    mine = "my_agoq_backend.plugin"

``device_type`` is stated only here: the manager sets it on the Backend object ``_load`` returns.
docs/writing-a-backend.md walks through that object, and every optional operation it may claim (each
declared by a small protocol in agoq_core.backend.protocol) with its signature and semantics.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from agoq_core.backend.types import BackendInfo

PROJECT = "agoq"
ENTRY_POINT_GROUP = "agoq.backends"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class AgoqSpecs:
    @hookspec
    def agoq_backends(self) -> "list[BackendInfo]":
        """Return the backends this plugin provides (a list of :class:`BackendInfo`).

        Must be cheap: no kernel imports, no device initialisation. See the module docstring for a
        complete example plugin.
        """
        raise NotImplementedError
