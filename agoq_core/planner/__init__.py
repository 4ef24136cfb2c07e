"""DBCA-PP planner: activation formats per pipeline stage (and per layer) from the schedule.

Quick start::

    from agoq_core.planner import plan_for_pipeline
    plan = plan_for_pipeline("llama2-7b", stages=4, microbatches=8, schedule="interleaved-1f1b")
    print(plan.explain())                      # per-stage table: in flight, formats, peak vs budget
    laaq_cfg = plan.laaq_config_for_stage(0)   # what stage 0 trains with

``agoq plan --stages 4 --microbatches 8 --schedule interleaved-1f1b`` prints the same table.
Model shapes come from agoq_core.models (``TransformerShape``/``MODEL_PRESETS`` here are its
``ModelShape``/``MODELS`` under their old names).
"""
from agoq_core.planner.errors import BudgetError, PlannerError, ScheduleError, TorchScheduleUnavailable
from agoq_core.planner.fidelity import FidelityTable, measure_fidelity
from agoq_core.planner.memory import ActivationCostTable, StaticMemoryConfig
from agoq_core.planner.model import MODEL_PRESETS, TransformerShape, model_shape, split_layers  # noqa: F401
from agoq_core.planner.plan import Plan, PlanConfig, StagePlan, plan_for_pipeline
from agoq_core.planner.schedules import PipelineSpec, inflight, schedule_actions, simulate

__all__ = [
    # the verb and its config
    "plan_for_pipeline",
    "PlanConfig",
    "Plan",
    "StagePlan",
    # inputs
    "ActivationCostTable",
    "FidelityTable",
    "measure_fidelity",
    "StaticMemoryConfig",
    # schedules
    "PipelineSpec",
    "inflight",
    "schedule_actions",
    "simulate",
    # errors
    "PlannerError",
    "ScheduleError",
    "BudgetError",
    "TorchScheduleUnavailable",
]
