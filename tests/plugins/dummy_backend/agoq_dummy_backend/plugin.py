"""Two "accelerator" backends for selection tests. Availability: AGOQ_DUMMY_AVAILABLE /
AGOQ_DUMMY2_AVAILABLE = 1. Their codecs delegate to the reference math (they are test doubles for
selection, not numerics)."""
from __future__ import annotations

import os

from agoq_core.backend import Availability, BackendInfo, hookimpl


def _probe(var: str):
    def probe() -> Availability:
        if os.environ.get(var) == "1":
            return Availability(True, f"{var}=1")
        return Availability(False, f"{var} is not 1")
    return probe


def _load():
    from agoq_dummy_backend.backend import DummyBackend

    return DummyBackend()


@hookimpl
def agoq_backends():
    return [
        BackendInfo(name="dummy", device_type="cpu", probe=_probe("AGOQ_DUMMY_AVAILABLE"), load=_load,
                    install_hint="export AGOQ_DUMMY_AVAILABLE=1"),
        BackendInfo(name="dummy2", device_type="cpu", probe=_probe("AGOQ_DUMMY2_AVAILABLE"), load=_load,
                    install_hint="export AGOQ_DUMMY2_AVAILABLE=1"),
    ]
