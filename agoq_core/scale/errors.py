"""Errors of the cluster cost model. Each message shows what was asked, what was found, and the fix."""
from __future__ import annotations

from agoq_core.planner.errors import PlannerError

__all__ = ["ScaleError"]


class ScaleError(PlannerError):
    """Bad cost-model input: unknown device or network, parallel sizes that do not match the cluster."""
