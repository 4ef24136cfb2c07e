from __future__ import annotations

import torch

from agoq_core.backend.reference import ReferenceBackend
from agoq_core.backend.types import Capabilities


class DummyBackend(ReferenceBackend):
    """Claims only int8 quantize/dequantize on cpu, so capability checks can be tested."""

    name = "dummy"

    def capabilities(self) -> Capabilities:
        return Capabilities(formats=frozenset({"int8"}), device_types=frozenset({"cpu"}),
                            input_dtypes=frozenset({torch.float32}))
