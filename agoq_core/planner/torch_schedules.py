"""The per-rank action lists PyTorch itself runs, obtained without a process group.

``torch.distributed.pipelining`` has two kinds of schedules:

- single-chunk ones (``ScheduleGPipe``, ``Schedule1F1B``) run a hand-written loop
  (``_step_microbatches``); their ``pipeline_order`` IR is only used for display and, in torch 2.13,
  labels the last rank's 1F1B forwards 1..m instead of 0..m-1. So we *run* that loop with a recording
  stand-in stage (no communication, no model) and keep the order of ``forward_one_chunk`` /
  ``backward_one_chunk`` calls;
- multi-chunk ones (``ScheduleInterleaved1F1B``) execute their action IR: we read
  ``pipeline_order_with_comms`` (what the runtime walks; compute actions only) or, on versions
  without it, ``pipeline_order``.

Stand-in stages are ``unittest.mock.create_autospec(PipelineStage)``, the same device torch's own
``_schedule_visualizer.get_schedule_ops`` uses. Anything that does not work on the installed torch
raises TorchScheduleUnavailable with the precise reason, so callers (tests) can skip rather than guess.
"""
from __future__ import annotations

from dataclasses import dataclass
from unittest import mock

from agoq_core.planner.errors import TorchScheduleUnavailable
from agoq_core.planner.schedules import SCHEDULES, Action, PipelineSpec, schedule_actions

__all__ = ["TorchActions", "torch_action_lists", "compare_with_torch"]


@dataclass(frozen=True, slots=True)
class TorchActions:
    actions: tuple[tuple[Action, ...], ...]
    source: str
    """``"runtime"`` (recorded _step_microbatches calls) or ``"pipeline_order_with_comms"`` / ``"pipeline_order"``."""
    torch_version: str


def _import():
    try:
        import torch
        from torch.distributed.pipelining import schedules as sched_mod
        from torch.distributed.pipelining.stage import PipelineStage
    except Exception as exc:  # pragma: no cover - depends on the torch build
        raise TorchScheduleUnavailable(f"cannot import torch.distributed.pipelining: {exc!r}") from exc
    return torch, sched_mod, PipelineStage


def _stand_in(PipelineStage, *, rank: int, stages: int, vstage: int, vstages: int):
    st = mock.create_autospec(PipelineStage, instance=True)
    st.group_rank = rank
    st.group_size = stages
    st.num_stages = vstages
    st.stage_index = vstage
    st.is_first = vstage == 0
    st.is_last = vstage == vstages - 1
    st.submod = None
    for name in ("get_fwd_recv_ops", "get_fwd_send_ops", "get_bwd_recv_ops", "get_bwd_send_ops"):
        getattr(st, name).return_value = []
    return st


def _record_single(cls, PipelineStage, spec: PipelineSpec) -> tuple[tuple[Action, ...], ...]:
    out = []
    m = spec.microbatches
    for r in range(spec.stages):
        st = _stand_in(PipelineStage, rank=r, stages=spec.stages, vstage=r, vstages=spec.stages)
        log: list[Action] = []
        st.forward_one_chunk.side_effect = lambda i, *a, _r=r, _l=log, **k: _l.append(Action(_r, "F", i))
        st.backward_one_chunk.side_effect = lambda i, *a, _r=r, _l=log, **k: _l.append(Action(_r, "B", i))
        sch = cls(st, m)
        # Loss and stage-shape set-up need a model; they do not change the order of compute calls.
        for hook in ("_initialize_stage", "_maybe_compute_loss", "_maybe_get_loss", "_update_losses"):
            setattr(sch, hook, lambda *a, **k: None)
        sch._step_microbatches([()] * m, [{}] * m)
        out.append(tuple(log))
    return tuple(out)


def _read_multi(cls, PipelineStage, spec: PipelineSpec) -> tuple[tuple[tuple[Action, ...], ...], str]:
    stages = [_stand_in(PipelineStage, rank=0, stages=spec.stages, vstage=vs, vstages=spec.virtual_stages)
              for vs in spec.vstages_of(0)]
    sch = cls(stages, spec.microbatches)
    order = getattr(sch, "pipeline_order_with_comms", None)
    source = "pipeline_order_with_comms"
    if not order:
        order, source = getattr(sch, "pipeline_order", None), "pipeline_order"
    if not order:
        raise TorchScheduleUnavailable(f"{cls.__name__} exposes neither pipeline_order_with_comms nor "
                                       f"pipeline_order on this torch")
    kinds = {"F": "F", "B": "B"}
    out = []
    for r in range(spec.stages):
        acts = []
        for a in order[r]:
            if a is None:
                continue
            kind = getattr(a.computation_type, "value", str(a.computation_type))
            if kind in kinds:
                acts.append(Action(int(a.stage_index), kinds[kind], int(a.microbatch_index)))
            elif kind in ("I", "W", "OVERLAP_F_B"):
                raise TorchScheduleUnavailable(f"{cls.__name__} emits {kind} actions; the planner models "
                                               f"full backwards only")
        out.append(tuple(acts))
    return tuple(out), source


def torch_action_lists(spec: PipelineSpec) -> TorchActions:
    """Per rank, the compute actions torch.distributed.pipelining runs for ``spec``."""
    torch, sched_mod, PipelineStage = _import()
    defn = SCHEDULES[spec.schedule]
    cls = getattr(sched_mod, defn.torch_class, None)
    if cls is None:
        raise TorchScheduleUnavailable(f"torch {torch.__version__} has no {defn.torch_class}")
    try:
        if defn.multi_chunk:
            acts, source = _read_multi(cls, PipelineStage, spec)
        else:
            acts, source = _record_single(cls, PipelineStage, spec), "runtime"
    except TorchScheduleUnavailable:
        raise
    except Exception as exc:
        raise TorchScheduleUnavailable(
            f"torch {torch.__version__} {defn.torch_class}(stages={spec.stages}, "
            f"microbatches={spec.microbatches}, chunks={spec.chunks}) could not be read without a "
            f"process group: {type(exc).__name__}: {exc}") from exc
    return TorchActions(actions=acts, source=source, torch_version=str(torch.__version__))


def compare_with_torch(spec: PipelineSpec) -> list[str]:
    """Differences between our action lists and torch's ([] when they agree action for action)."""
    ours = schedule_actions(spec)
    theirs = torch_action_lists(spec)
    diffs = []
    for r, (a, b) in enumerate(zip(ours, theirs.actions)):
        if a != b:
            i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            diffs.append(f"rank {r}: first difference at action {i}: ours "
                         f"{' '.join(map(str, a[i:i + 4]))} vs torch ({theirs.source}) "
                         f"{' '.join(map(str, b[i:i + 4]))}")
    return diffs
