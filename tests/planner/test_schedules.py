"""Schedules: in-flight counts from our action lists vs the paper, textbook formulas and torch's lists."""
from __future__ import annotations

import pytest

from agoq_core.planner import PipelineSpec, ScheduleError, inflight, schedule_actions, simulate
from agoq_core.planner.errors import TorchScheduleUnavailable


def _valid(schedule, S, m, v):
    try:
        return PipelineSpec(schedule=schedule, stages=S, microbatches=m, chunks=v)
    except ScheduleError:
        return None


def test_paper_example_interleaved_4_stages_8_microbatches_is_11_9_7_5():
    # Paper §4.1 (Fig. 1): Device 1..4 hold 11, 9, 7, 5 micro-batches of activations.
    prof = inflight(PipelineSpec(schedule="interleaved-1f1b", stages=4, microbatches=8))
    assert prof.peaks == (11, 9, 7, 5)
    # The corrected Eq. 21 (notes §4.3): N_i = 3n - 2i + 1 for i = 1..n (1-based devices).
    n = 4
    assert prof.peaks == tuple(3 * n - 2 * i + 1 for i in range(1, n + 1))
    # Units: one chunk (half a device's layers) per micro-batch, summed over the device's two chunks.
    for r in prof.ranks:
        assert max(sum(v) for v in r.trace) == r.peak
        assert len(r.chunk_peaks) == 2 and r.peak <= sum(r.chunk_peaks)


@pytest.mark.parametrize("S", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("m", [1, 2, 5, 8, 13])
def test_gpipe_and_1f1b_textbook_counts(S, m):
    assert inflight(PipelineSpec(schedule="gpipe", stages=S, microbatches=m)).peaks == (m,) * S
    if m >= S:  # 1F1B: rank r keeps S - r micro-batches (design.md), never more than m
        assert inflight(PipelineSpec(schedule="1f1b", stages=S, microbatches=m)).peaks == \
            tuple(min(m, S - r) for r in range(S))


@pytest.mark.parametrize("S,v", [(2, 2), (3, 2), (4, 2), (4, 3), (5, 4)])
@pytest.mark.parametrize("rounds", [1, 2, 3])
def test_interleaved_matches_megatron_warmup_formula_when_m_is_a_multiple_of_stages(S, v, rounds):
    # Megatron-LM: warm-up = (v-1)*p + 2*(p-1-r) forwards, then one more in steady state, capped at v*m.
    m = rounds * S
    peaks = inflight(PipelineSpec(schedule="interleaved-1f1b", stages=S, microbatches=m, chunks=v)).peaks
    assert peaks == tuple(min(v * m, (v - 1) * S + 2 * (S - 1 - r) + 1) for r in range(S))


def _count_peak(actions):
    """Independent counter: +1 per forward, -1 per backward, per rank; max of the running sum."""
    cur = best = 0
    for a in actions:
        cur += 1 if str(a.kind) == "F" else -1
        best = max(best, cur)
    return best


GRID = [("gpipe", S, m, 1) for S in (1, 2, 4) for m in (1, 3, 8)] + \
       [("1f1b", S, m, 1) for S in (1, 2, 3, 4) for m in (4, 5, 9)] + \
       [("interleaved-1f1b", S, m, v) for S in (2, 3, 4) for m in (1, 2, 3, 4, 6, 8, 10, 12) for v in (2, 3)
        if _valid("interleaved-1f1b", S, m, v) is not None]


@pytest.mark.parametrize("schedule,S,m,v", GRID)
def test_action_lists_and_counts_equal_torchs(schedule, S, m, v):
    spec = PipelineSpec(schedule=schedule, stages=S, microbatches=m, chunks=v)
    from agoq_core.planner.torch_schedules import torch_action_lists

    try:
        theirs = torch_action_lists(spec)
    except TorchScheduleUnavailable as exc:
        pytest.skip(str(exc))
    assert schedule_actions(spec) == theirs.actions
    prof = inflight(spec)
    assert prof.peaks == tuple(_count_peak(a) for a in theirs.actions)


def test_torch_source_is_what_the_runtime_runs():
    from agoq_core.planner.torch_schedules import torch_action_lists

    try:
        single = torch_action_lists(PipelineSpec(schedule="1f1b", stages=4, microbatches=8))
        multi = torch_action_lists(PipelineSpec(schedule="interleaved-1f1b", stages=4, microbatches=8))
    except TorchScheduleUnavailable as exc:
        pytest.skip(str(exc))
    assert single.source == "runtime"
    assert multi.source in ("pipeline_order_with_comms", "pipeline_order")
    # The recorded 1F1B runtime of the last rank forwards micro-batch 0 first (torch 2.13's display IR
    # labels it 1: we do not read that IR for single-chunk schedules).
    assert str(single.actions[3][0]) == "3F0"


@pytest.mark.parametrize("schedule,S,m,v", [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("1f1b", 3, 7, 1),
                                            ("interleaved-1f1b", 4, 8, 2), ("interleaved-1f1b", 2, 6, 3)])
def test_simulated_timeline_bubble_matches_textbook(schedule, S, m, v):
    t = simulate(PipelineSpec(schedule=schedule, stages=S, microbatches=m, chunks=v),
                 forward_cost=1.0, backward_cost=2.0)
    # Narayanan et al. 2021: bubble = (p-1) / (v*m + p - 1) of the time (v = 1 for GPipe and 1F1B).
    assert t.bubble_fraction == pytest.approx((S - 1) / (v * m + S - 1), abs=1e-12)
    assert t.makespan == pytest.approx(3.0 * (m + (S - 1) / v))


def test_inflight_rejects_inconsistent_lists():
    from agoq_core.planner.schedules import Action, inflight_of_actions

    spec = PipelineSpec(schedule="gpipe", stages=1, microbatches=2)
    with pytest.raises(ScheduleError, match="not in flight"):
        inflight_of_actions(spec, ((Action(0, "B", 0),),))
    with pytest.raises(ScheduleError, match="twice"):
        inflight_of_actions(spec, ((Action(0, "F", 0), Action(0, "F", 0)),))
    with pytest.raises(ScheduleError, match="still in flight"):
        inflight_of_actions(spec, ((Action(0, "F", 0),),))


@pytest.mark.parametrize("kw,msg", [
    (dict(schedule="zero-bubble", stages=4, microbatches=8), "unknown schedule 'zero-bubble'; known schedules: gpipe"),
    (dict(schedule="1f1b", stages=4, microbatches=3), "microbatches >= stages"),
    (dict(schedule="1f1b", stages=4, microbatches=8, chunks=2), "use --schedule interleaved-1f1b"),
    (dict(schedule="gpipe", stages=4, microbatches=8, chunks=2), "one chunk per stage"),
    (dict(schedule="interleaved-1f1b", stages=4, microbatches=9), r"nearest that work: 8 or 10"),
    (dict(schedule="interleaved-1f1b", stages=4, microbatches=8, chunks=1), "chunks >= 2"),
    (dict(schedule="interleaved-1f1b", stages=1, microbatches=8), "at least 2 stages"),
    (dict(schedule="gpipe", stages=0, microbatches=8), "stages must be >= 1"),
    (dict(schedule="gpipe", stages=2, microbatches=2.0), "microbatches must be an int"),
    (dict(schedule="gpipe", stages=True, microbatches=2), "stages must be an int"),
])
def test_bad_schedule_input(kw, msg):
    with pytest.raises(ScheduleError, match=msg):
        PipelineSpec(**kw)


def test_interleaved_validity_rule_agrees_with_torch():
    """Every interleaved size we reject, torch rejects too (and the other way round)."""
    import math

    from agoq_core.planner.torch_schedules import _import

    torch, sched, PipelineStage = _import()
    from unittest import mock

    for S in (2, 3, 4):
        for m in range(1, 14):
            ours = _valid("interleaved-1f1b", S, m, 2) is not None
            st = []
            for vs in (0, S):
                s = mock.create_autospec(PipelineStage, instance=True)
                s.group_rank, s.group_size, s.num_stages, s.stage_index, s.submod = 0, S, 2 * S, vs, None
                st.append(s)
            try:
                sched.ScheduleInterleaved1F1B(st, m)
                theirs = True
            except ValueError:
                theirs = False
            assert ours == theirs, (S, m, math.gcd(S, m))
