"""Errors of the planner. Each message says what was asked, what was found, and what would fit."""
from __future__ import annotations

from agoq_core.errors import AgoqError

__all__ = ["PlannerError", "ScheduleError", "BudgetError", "TorchScheduleUnavailable"]


class PlannerError(AgoqError, ValueError):
    """Bad planner input: unknown schedule, model or format, inconsistent sizes."""


class ScheduleError(PlannerError):
    """The schedule does not allow this stage / chunk / micro-batch combination."""


class BudgetError(PlannerError):
    """Even the smallest formats do not fit the memory budget on some stage."""


class TorchScheduleUnavailable(PlannerError):
    """torch.distributed.pipelining cannot give the action list asked for (version or schedule)."""
