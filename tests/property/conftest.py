"""Hypothesis profiles of the property tests.

``ci`` (default): few examples, derandomized (the same examples on every run: no flaky CI, no
database files), sized so that the whole property layer stays around 30 s on 2 CPU cores. ``dev``:
many random examples for a local hunt: ``AGOQ_HYPOTHESIS_PROFILE=dev pytest tests/property``.
"""
from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=30, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=500, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PROFILE = settings.get_profile(os.environ.get("AGOQ_HYPOTHESIS_PROFILE", "ci"))
