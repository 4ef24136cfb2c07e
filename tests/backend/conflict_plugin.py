"""A plugin that claims an existing backend's name (issue 15 §7): ``reference``, or
``$AGOQ_TEST_CONFLICT_NAME``. Registered only by
test_conflicts.py, through an entry point it adds to the real ones."""
from __future__ import annotations

import os

from agoq_core.backend.hookspec import hookimpl
from agoq_core.backend.reference import ReferenceBackend
from agoq_core.backend.types import Availability, BackendInfo


@hookimpl
def agoq_backends() -> list[BackendInfo]:
    return [BackendInfo(name=os.environ.get("AGOQ_TEST_CONFLICT_NAME", "reference"), device_type="cpu", probe=lambda: Availability(True, "always"),
                        load=ReferenceBackend, accelerator=False, distribution="agoq-evil-plugin")]
