"""Pipeline schedules as per-rank action lists, and the activations each rank keeps alive.

Terms (as torch.distributed.pipelining uses them):

- a *stage* here is one pipeline rank (one device), as in the paper ("Device 1..4");
- a *chunk* is one virtual stage on a rank. Interleaved 1F1B gives every rank ``chunks`` model pieces;
  virtual stage ``k`` lives on rank ``k % stages`` as its local chunk ``k // stages`` (torch's
  ``stage_index = local_index * pp_group_size + rank``). GPipe and 1F1B have one chunk per rank;
- a micro-batch is *in flight* on a chunk from the start of its forward until the end of its backward:
  that is when its saved activations exist.

The action lists are generated here from each schedule's definition (warm-up, steady 1F1B, cool-down),
with torch 2.13's rules for interleaved rounds, and ``agoq_core.planner.torch_schedules`` checks them
against the lists torch itself runs. In-flight counts come from walking each rank's list, never from a
closed formula: for 4 stages x 8 micro-batches interleaved (2 chunks) the peaks are 11/9/7/5 chunk
activations (see docs/planner.md for the derivation).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from agoq_core.planner.errors import ScheduleError

__all__ = [
    "SCHEDULES",
    "Action",
    "PipelineSpec",
    "RankInflight",
    "InflightProfile",
    "Timeline",
    "normalize_schedule",
    "schedule_actions",
    "inflight",
    "simulate",
]

FORWARD = "F"
BACKWARD = "B"


@dataclass(frozen=True, slots=True)
class Action:
    """One compute action: forward or full backward of ``microbatch`` on virtual stage ``stage``."""

    stage: int
    kind: str
    microbatch: int

    def __str__(self) -> str:  # torch's _Action spelling, e.g. "4F0"
        return f"{self.stage}{self.kind}{self.microbatch}"


@dataclass(frozen=True, slots=True)
class _ScheduleDef:
    name: str
    multi_chunk: bool  # torch PipelineScheduleMulti (several chunks per rank)?
    torch_class: str
    generate: Callable[["PipelineSpec", int], list[Action]]
    check: Callable[[int, int, int], None]


def _valid_interleaved_microbatches(stages: int, m: int) -> bool:
    rounds = max(1, m // stages)
    return m % rounds == 0


def _check_gpipe(stages: int, microbatches: int, chunks: int) -> None:
    if chunks != 1:
        raise ScheduleError(f"gpipe holds one chunk per stage, got chunks={chunks}; "
                            f"use --schedule interleaved-1f1b for {chunks} chunks per stage")


def _check_1f1b(stages: int, microbatches: int, chunks: int) -> None:
    if chunks != 1:
        raise ScheduleError(f"1f1b holds one chunk per stage, got chunks={chunks}; "
                            f"use --schedule interleaved-1f1b for {chunks} chunks per stage")
    if microbatches < stages:
        raise ScheduleError(
            f"1f1b needs microbatches >= stages (torch Schedule1F1B refuses fewer): got "
            f"microbatches={microbatches} < stages={stages}; use microbatches >= {stages}, or gpipe")


def _check_interleaved(stages: int, microbatches: int, chunks: int) -> None:
    if stages < 2:
        raise ScheduleError(f"interleaved-1f1b needs at least 2 stages, got stages={stages}; "
                            f"with one stage there is no pipeline (use gpipe)")
    if chunks < 2:
        raise ScheduleError(f"interleaved-1f1b needs chunks >= 2 per stage, got chunks={chunks}; "
                            f"with one chunk use --schedule 1f1b")
    if not _valid_interleaved_microbatches(stages, microbatches):
        rounds = max(1, microbatches // stages)
        below = next((m for m in range(microbatches - 1, 0, -1)
                      if _valid_interleaved_microbatches(stages, m)), None)
        above = next(m for m in range(microbatches + 1, 2 * microbatches + 2)
                     if _valid_interleaved_microbatches(stages, m))
        raise ScheduleError(
            f"interleaved-1f1b with stages={stages} runs micro-batches in rounds = max(1, "
            f"microbatches // stages) = {rounds}, and microbatches must be a multiple of it (torch "
            f"ScheduleInterleaved1F1B): {microbatches} % {rounds} = {microbatches % rounds}; "
            f"nearest that work: {below} or {above} (any multiple of {stages} always works)")


def _gen_gpipe(spec: "PipelineSpec", rank: int) -> list[Action]:
    m = spec.microbatches
    return ([Action(rank, FORWARD, i) for i in range(m)]
            + [Action(rank, BACKWARD, i) for i in range(m)])


def _gen_1f1b(spec: "PipelineSpec", rank: int) -> list[Action]:
    # Warm-up: rank r runs (stages - r) forwards before its first backward (the last rank runs one),
    # then alternates one backward / one forward, then drains the remaining backwards.
    m = spec.microbatches
    warmup = min(m, spec.stages - rank)
    acts = [Action(rank, FORWARD, i) for i in range(warmup)]
    f, b = warmup, 0
    while b < m:
        acts.append(Action(rank, BACKWARD, b))
        b += 1
        if f < m:
            acts.append(Action(rank, FORWARD, f))
            f += 1
    return acts


def _gen_interleaved(spec: "PipelineSpec", rank: int) -> list[Action]:
    # Megatron's interleaved 1F1B with torch 2.13's "flex" rounds: micro-batches go round by round,
    # `per_round` of them through local chunk 0, then the same ones through chunk 1, ...; backwards
    # visit the chunks in reverse. Warm-up: all but the last chunk of the first round, plus two
    # forwards per hop from the last rank (Narayanan et al. 2021, sec. 2.2).
    S, m, v = spec.stages, spec.microbatches, spec.chunks
    rounds = max(1, m // S)
    per_round = m // rounds
    total = v * m
    warmup = min((v - 1) * per_round + 2 * (S - 1 - rank), total)
    fwd_mb = [0] * v
    bwd_mb = [0] * v

    def fwd(step: int) -> Action:
        local = (step // per_round) % v
        mb, fwd_mb[local] = fwd_mb[local], fwd_mb[local] + 1
        return Action(local * S + rank, FORWARD, mb)

    def bwd(step: int) -> Action:
        local = v - 1 - (step // per_round) % v
        mb, bwd_mb[local] = bwd_mb[local], bwd_mb[local] + 1
        return Action(local * S + rank, BACKWARD, mb)

    acts = [fwd(k) for k in range(warmup)]
    for k in range(warmup, total):  # steady state: one forward, one backward
        acts.append(fwd(k))
        acts.append(bwd(k - warmup))
    for k in range(total - warmup, total):  # cool-down
        acts.append(bwd(k))
    return acts


SCHEDULES: dict[str, _ScheduleDef] = {
    d.name: d
    for d in (
        _ScheduleDef("gpipe", False, "ScheduleGPipe", _gen_gpipe, _check_gpipe),
        _ScheduleDef("1f1b", False, "Schedule1F1B", _gen_1f1b, _check_1f1b),
        _ScheduleDef("interleaved-1f1b", True, "ScheduleInterleaved1F1B", _gen_interleaved,
                     _check_interleaved),
    )
}
_ALIASES = {"interleaved": "interleaved-1f1b", "interleaved1f1b": "interleaved-1f1b",
            "interleaved_1f1b": "interleaved-1f1b", "one-f-one-b": "1f1b"}


def normalize_schedule(name: str) -> str:
    """Canonical schedule name (``gpipe``, ``1f1b``, ``interleaved-1f1b``) or a ScheduleError."""
    if not isinstance(name, str):
        raise ScheduleError(f"schedule must be a name, got {type(name).__name__}")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in SCHEDULES:
        raise ScheduleError(f"unknown schedule {name!r}; known schedules: {', '.join(SCHEDULES)}")
    return key


def _positive_int(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScheduleError(f"{what} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ScheduleError(f"{what} must be >= 1, got {value}")
    return value


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineSpec:
    """A schedule with its sizes, validated: ``stages`` ranks, ``chunks`` virtual chunks per rank."""

    schedule: str
    stages: int
    microbatches: int
    chunks: int | None = None
    """Virtual chunks per stage; None = 2 for interleaved-1f1b (the paper's setting), else 1."""

    def __post_init__(self) -> None:
        name = normalize_schedule(self.schedule)
        object.__setattr__(self, "schedule", name)
        _positive_int("stages", self.stages)
        _positive_int("microbatches", self.microbatches)
        chunks = self.chunks if self.chunks is not None else (2 if SCHEDULES[name].multi_chunk else 1)
        _positive_int("chunks", chunks)
        object.__setattr__(self, "chunks", chunks)
        SCHEDULES[name].check(self.stages, self.microbatches, chunks)

    @property
    def virtual_stages(self) -> int:
        return self.stages * self.chunks

    def rank_of(self, vstage: int) -> int:
        return vstage % self.stages

    def vstages_of(self, rank: int) -> tuple[int, ...]:
        """Virtual stages held by ``rank``, in local chunk order."""
        return tuple(c * self.stages + rank for c in range(self.chunks))


def schedule_actions(spec: PipelineSpec) -> tuple[tuple[Action, ...], ...]:
    """Per rank, the compute actions in the order that rank runs them (no idle slots, no comms)."""
    gen = SCHEDULES[spec.schedule].generate
    return tuple(tuple(gen(spec, r)) for r in range(spec.stages))


@dataclass(frozen=True, slots=True)
class RankInflight:
    """Micro-batches in flight on one rank, in units of one chunk's activations per micro-batch."""

    rank: int
    vstages: tuple[int, ...]
    """Virtual stages on this rank, local chunk order."""
    chunk_peaks: tuple[int, ...]
    """Peak in-flight micro-batches of each chunk taken alone."""
    peak: int
    """Peak of the sum over the rank's chunks (what the rank's memory must hold)."""
    states: tuple[tuple[int, ...], ...]
    """The maximal in-flight vectors (per chunk) reached after a forward: every rank-memory peak is
    reached at one of these, whatever bytes each chunk costs per micro-batch."""
    trace: tuple[tuple[int, ...], ...]
    """In-flight vector after each action of the rank's list."""
    forwarded: tuple[tuple[int, ...], ...] = ()
    """Forwards done so far per chunk after each action (what send buffers held to the end depend on)."""
    kinds: tuple[str, ...] = ()
    """The action kind ("F"/"B") at each trace position."""


@dataclass(frozen=True, slots=True)
class InflightProfile:
    spec: PipelineSpec
    ranks: tuple[RankInflight, ...]

    @property
    def peaks(self) -> tuple[int, ...]:
        return tuple(r.peak for r in self.ranks)


def _maximal(vectors: set[tuple[int, ...]]) -> tuple[tuple[int, ...], ...]:
    def dominated(a: tuple[int, ...]) -> bool:
        return any(b != a and all(x <= y for x, y in zip(a, b)) for b in vectors)

    return tuple(sorted((v for v in vectors if not dominated(v)), reverse=True))


def inflight_of_actions(spec: PipelineSpec, actions: tuple[tuple[Action, ...], ...]) -> InflightProfile:
    """Walk each rank's action list and count the micro-batches whose activations are alive.

    A forward adds its micro-batch to its chunk; the matching backward removes it once done. Raises
    ScheduleError on a list that backwards a micro-batch it never forwarded or forwards one twice.
    """
    ranks = []
    for r in range(spec.stages):
        local = {vs: i for i, vs in enumerate(spec.vstages_of(r))}
        alive: list[set[int]] = [set() for _ in local]
        trace, states, fwd, kinds = [], set(), [], []
        done = [0] * len(local)
        for a in actions[r]:
            if a.stage not in local:
                raise ScheduleError(f"rank {r} was given action {a} of virtual stage {a.stage}, which "
                                    f"lives on rank {spec.rank_of(a.stage)}")
            c = local[a.stage]
            if a.kind == FORWARD:
                if a.microbatch in alive[c]:
                    raise ScheduleError(f"rank {r}: {a} forwards micro-batch {a.microbatch} twice")
                alive[c].add(a.microbatch)
                done[c] += 1
            else:
                if a.microbatch not in alive[c]:
                    raise ScheduleError(f"rank {r}: {a} runs backward of micro-batch {a.microbatch} "
                                        f"that is not in flight on stage {a.stage}")
                alive[c].discard(a.microbatch)
            vec = tuple(len(s) for s in alive)
            trace.append(vec)
            fwd.append(tuple(done))
            kinds.append(a.kind)
            if a.kind == FORWARD:
                states.add(vec)
        if any(alive):
            raise ScheduleError(f"rank {r}: micro-batches still in flight at the end: "
                                f"{[sorted(s) for s in alive]}")
        ranks.append(RankInflight(
            rank=r, vstages=spec.vstages_of(r),
            chunk_peaks=tuple(max((v[c] for v in trace), default=0) for c in range(len(local))),
            peak=max((sum(v) for v in trace), default=0),
            states=_maximal(states), trace=tuple(trace), forwarded=tuple(fwd), kinds=tuple(kinds)))
    return InflightProfile(spec=spec, ranks=tuple(ranks))


def inflight(spec: PipelineSpec) -> InflightProfile:
    """In-flight micro-batches per rank and chunk, by walking the schedule's action lists."""
    return inflight_of_actions(spec, schedule_actions(spec))


@dataclass(frozen=True, slots=True)
class Timeline:
    """ASAP execution of the per-rank lists: ``start[r][i]`` is when rank r starts its i-th action."""

    start: tuple[tuple[float, ...], ...]
    makespan: float
    bubble_fraction: float
    """Idle share of ranks x makespan."""


def simulate(spec: PipelineSpec, *, forward_cost: float | Sequence[float] = 1.0,
             backward_cost: float | Sequence[float] = 2.0, p2p_cost: float = 0.0) -> Timeline:
    """Run every rank's list as soon as dependencies allow (a forward needs the previous virtual
    stage's forward of the same micro-batch; a backward needs its own forward and the next virtual
    stage's backward). Proves the lists are deadlock-free. Costs are for a whole stage's layers
    (default B = 2F); a chunk costs ``1/chunks`` of them, so makespans compare across schedules.

    ``forward_cost`` / ``backward_cost`` may instead be sequences with one cost per *virtual stage*
    (used as given, not divided by chunks): the cluster cost model (agoq_core.scale) prices each
    virtual stage's layers, embedding and head. ``p2p_cost`` delays a dependency on another
    rank's action (sending the activation or its gradient)."""
    actions = schedule_actions(spec)
    fwd = _per_vstage(spec, forward_cost, "forward_cost")
    bwd = _per_vstage(spec, backward_cost, "backward_cost")
    if not p2p_cost >= 0:
        raise ScheduleError(f"p2p_cost must be >= 0, got {p2p_cost!r}")
    last = spec.virtual_stages - 1
    done: dict[tuple[int, str, int], float] = {}
    pos = [0] * spec.stages
    free = [0.0] * spec.stages
    start: list[list[float]] = [[] for _ in range(spec.stages)]
    remaining = sum(len(a) for a in actions)
    while remaining:
        progressed = False
        for r in range(spec.stages):
            while pos[r] < len(actions[r]):
                a = actions[r][pos[r]]
                if a.kind == FORWARD:
                    deps = [(a.stage - 1, FORWARD, a.microbatch)] if a.stage > 0 else []
                else:
                    deps = [(a.stage, FORWARD, a.microbatch)]
                    if a.stage < last:
                        deps.append((a.stage + 1, BACKWARD, a.microbatch))
                if any(d not in done for d in deps):
                    break
                t0 = max([free[r]] + [done[d] + (p2p_cost if spec.rank_of(d[0]) != r else 0.0) for d in deps])
                cost = (fwd if a.kind == FORWARD else bwd)[a.stage]
                start[r].append(t0)
                free[r] = t0 + cost
                done[(a.stage, a.kind, a.microbatch)] = free[r]
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {r: str(actions[r][pos[r]]) for r in range(spec.stages) if pos[r] < len(actions[r])}
            raise ScheduleError(f"schedule {spec.schedule} deadlocks: ranks wait forever at {stuck}")
    makespan = max(free)
    busy = sum((fwd if a.kind == FORWARD else bwd)[a.stage] for acts in actions for a in acts)
    return Timeline(start=tuple(tuple(s) for s in start), makespan=makespan,
                    bubble_fraction=1.0 - busy / (makespan * spec.stages))


def _per_vstage(spec: PipelineSpec, cost: float | Sequence[float], what: str) -> tuple[float, ...]:
    if isinstance(cost, (int, float)) and not isinstance(cost, bool):
        if not cost >= 0:
            raise ScheduleError(f"{what} must be >= 0, got {cost!r}")
        return (float(cost) / spec.chunks,) * spec.virtual_stages
    costs = tuple(float(c) for c in cost)
    if len(costs) != spec.virtual_stages or any(not c >= 0 for c in costs):
        raise ScheduleError(f"{what} needs one cost >= 0 per virtual stage ({spec.virtual_stages}), got {cost!r}")
    return costs
