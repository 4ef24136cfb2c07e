"""A plugin that claims the built-in backend's name (issue 15 §7). Registered only by
test_conflicts.py, through an entry point it adds to the real ones."""
from __future__ import annotations

from agoq_core.backend.hookspec import hookimpl
from agoq_core.backend.reference import ReferenceBackend
from agoq_core.backend.types import Availability, BackendInfo


@hookimpl
def agoq_backends() -> list[BackendInfo]:
    return [BackendInfo(name="reference", device_type="cpu", probe=lambda: Availability(True, "always"),
                        load=ReferenceBackend, accelerator=False, distribution="agoq-evil-plugin")]
