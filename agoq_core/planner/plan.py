"""DBCA-PP plans: the activation format of every layer on every pipeline stage.

``plan_for_pipeline(model, stages, microbatches, schedule, **options)`` walks the schedule to find what each
stage keeps in flight, prices each layer's activations per format, and picks formats with the exact
solver so that every stage stays within the budget while the summed expected quantization error is
as small as it can be. The paper's closed form (B_i = 4 N_1 / N_i rounded to {4,5,6,8}) is evaluated
alongside, against the same budget, so the table shows where it overshoots or leaves memory unused.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

from agoq_core.formats.spec import get_format
from agoq_core.planner.errors import BudgetError, PlannerError
from agoq_core.planner.fidelity import FidelityTable, measure_fidelity
from agoq_core.planner.memory import ActivationCostTable, StaticMemoryConfig, check_candidates, static_bytes
from agoq_core.planner.model import TransformerShape, model_shape, split_layers, stage_params
from agoq_core.planner.schedules import SCHEDULES, InflightProfile, PipelineSpec, inflight
from agoq_core.planner.solver import Option, peak_bytes, solve_rank

__all__ = ["PlanConfig", "Plan", "StagePlan", "ClosedFormStage", "plan_for_pipeline", "DEFAULT_CANDIDATES"]

DEFAULT_CANDIDATES = ("int4", "int5", "int6", "int8", "fp4_e2m1", "nf4")
Granularity = Literal["layer", "chunk", "stage"]
ActivationSource = Literal["measured", "formula", "bits"]

#: Integer cost scale: the largest per-layer error maps to 2^40. Sums of Python ints are exact, so
#: equal plans tie exactly; int8's error is ~290x below int4's (24.6 dB), so its cost is still ~4e9
#: units and the rounding of any single cost stays below 1e-9 relative.
_COST_SCALE_BITS = 40
_ACT_BYTES = {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "float32": 4, "fp32": 4}


@dataclass(frozen=True, kw_only=True)
class PlanConfig:
    """Everything a plan depends on besides the model."""

    schedule: str = "interleaved-1f1b"
    stages: int = 4
    microbatches: int = 8
    chunks: int | None = None
    """Virtual chunks per stage (None: 2 for interleaved-1f1b, else 1)."""
    microbatch_size: int = 1
    seq_len: int = 4096
    candidates: tuple[str, ...] = DEFAULT_CANDIDATES
    baseline_format: str = "nf4"
    """The uniform 4-bit format whose fullest-stage peak is the default budget (LAAQ's default)."""
    granularity: Granularity = "layer"
    """One format per layer (default), per chunk, or per stage (the paper's choice)."""
    budget_bytes: int | None = None
    """Device memory per stage: weights + gradients + optimizer + activation peak must fit."""
    activation_budget_bytes: int | None = None
    """Activation peak per stage must fit (static memory not counted). Exclusive with budget_bytes.
    Neither given: the uniform ``baseline_format`` activation peak of the fullest stage (the paper)."""
    activations: ActivationSource = "measured"
    """Where activation bytes come from: LAAQ's measurement, the shape formula, or the paper's bits."""
    static: StaticMemoryConfig = field(default_factory=StaticMemoryConfig)
    dtype: str = "bfloat16"
    """Training dtype of the activations LAAQ leaves in 16-bit (bfloat16, float16 or float32)."""
    measure_device: str = "cpu"
    """Where LAAQ measures (activations="measured"): a 2-layer model of the shape runs there, at 32-96
    tokens extrapolated exactly when the sequence is longer. Measure on the device you train on when
    its attention kernel keeps other tensors. "meta" (no data) is accepted but its SDPA keeps what the
    math path keeps (about 25% more than CPU flash here) and LAAQ cannot see the out-projection alias."""
    pipeline_buffers: bool = True
    """Count what torch.distributed.pipelining itself holds: each in-flight micro-batch's stage
    output (kept for backward; logits on the last stage) and, as static memory, the receive buffers
    it allocates for every micro-batch of every non-first virtual stage. Off in the bits accounting."""
    block: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "candidates", check_candidates(self.candidates, self.block))
        base = check_candidates([self.baseline_format], self.block)[0]
        object.__setattr__(self, "baseline_format", base)
        for f in ("microbatch_size", "seq_len"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise PlannerError(f"PlanConfig.{f} must be an int >= 1, got {v!r}")
        if self.granularity not in ("layer", "chunk", "stage"):
            raise PlannerError(f"granularity must be layer, chunk or stage, got {self.granularity!r}")
        if self.activations not in ("measured", "formula", "bits"):
            raise PlannerError(f"activations must be measured, formula or bits, got {self.activations!r}")
        if self.budget_bytes is not None and self.activation_budget_bytes is not None:
            raise PlannerError("give budget_bytes (device memory) or activation_budget_bytes, not both")
        for f in ("budget_bytes", "activation_budget_bytes"):
            v = getattr(self, f)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise PlannerError(f"PlanConfig.{f} must be an int >= 0 (bytes), got {v!r}")
        if str(self.dtype).lower() not in _ACT_BYTES:
            raise PlannerError(f"dtype must be one of {sorted(_ACT_BYTES)}, got {self.dtype!r}")
        if not isinstance(self.static, StaticMemoryConfig):
            raise PlannerError(f"PlanConfig.static must be a StaticMemoryConfig, got {type(self.static).__name__}")
        PipelineSpec(schedule=self.schedule, stages=self.stages, microbatches=self.microbatches, chunks=self.chunks)

    @property
    def spec(self) -> PipelineSpec:
        return PipelineSpec(schedule=self.schedule, stages=self.stages, microbatches=self.microbatches,
                            chunks=self.chunks)


@dataclass(frozen=True)
class ClosedFormStage:
    """The paper's rule on one stage: B_i = base_bits * N_max / N_i, rounded to the nearest width."""

    bits_exact: float
    bits: int
    format: str
    units: int
    """B_i * N_i (the paper's bits x micro-batches), against base_bits * N_max."""
    unit_budget: int
    peak: int
    """Activation peak of the stage with every layer in ``format`` (the plan's accounting)."""
    fits: bool
    cost: float


@dataclass(frozen=True)
class StagePlan:
    stage: int
    vstages: tuple[int, ...]
    layers: tuple[tuple[int, ...], ...]
    """Global decoder-layer indices per local chunk."""
    formats: Mapping[int, str]
    """Global layer index -> chosen format."""
    inflight_peak: int
    chunk_peaks: tuple[int, ...]
    chunk_bytes: tuple[int, ...]
    """Activation bytes per in-flight micro-batch of each chunk."""
    activation_peak: int
    baseline_peak: int
    """Activation peak with every layer in the baseline format."""
    activation_cap: int
    """What the activation peak may reach on this stage."""
    chunk_io_bytes: tuple[int, ...]
    """Of ``chunk_bytes``: what the pipeline runtime holds (the stage output), not autograd."""
    chunk_held_bytes: tuple[int, ...]
    """Bytes per micro-batch *forwarded* that the runtime holds until the step ends (pending sends)."""
    stale_output_bytes: int
    """Bytes of the one extra output Schedule1F1B keeps referenced after the rank's first backward."""
    constraints: tuple[tuple[tuple[int, ...], int], ...]
    """(in-flight vector, held bytes) pairs the peak is checked at."""
    static: Mapping[str, int]
    binding_state: tuple[int, ...]
    binding: str
    cost: float
    """Summed expected squared error (elements x NSR) of the stage's stored activations per micro-batch."""

    @property
    def static_bytes(self) -> int:
        return sum(self.static.values())

    @property
    def device_peak(self) -> int:
        return self.static_bytes + self.activation_peak


@dataclass(frozen=True)
class Plan:
    config: PlanConfig
    shape: TransformerShape
    spec: PipelineSpec
    profile: InflightProfile
    costs: ActivationCostTable
    fidelity: FidelityTable
    budget_kind: str
    """"device" (budget_bytes), "activations" (activation_budget_bytes) or "uniform-baseline"."""
    budget: int
    stages: tuple[StagePlan, ...]
    closed_form: tuple[ClosedFormStage, ...] | None

    @property
    def layer_formats(self) -> dict[int, str]:
        return {layer: f for s in self.stages for layer, f in s.formats.items()}

    def stage_layer_formats(self, stage: int) -> dict[int, str]:
        self._check_stage(stage)
        return dict(self.stages[stage].formats)

    def laaq_config_for_stage(self, stage: int, base: Any = None) -> Any:
        """The LAAQConfig stage ``stage`` should train with: ``base`` (default LAAQ's paper policy)
        with every quantized role of each of the stage's layers set to the planned format."""
        from agoq_core.planner.apply import laaq_config_for_layers

        self._check_stage(stage)
        return laaq_config_for_layers(self.stages[stage].formats, base=base)

    def _check_stage(self, stage: int) -> None:
        if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < len(self.stages):
            raise PlannerError(f"stage must be an int in [0, {len(self.stages) - 1}], got {stage!r}")

    def to_dict(self) -> dict:
        from agoq_core.planner.explain import plan_to_dict

        return plan_to_dict(self)

    def explain(self) -> str:
        from agoq_core.planner.explain import render_plan

        return render_plan(self)


# ---- building blocks -----------------------------------------------------------------------------

def _activation_table(cfg: PlanConfig, shape: TransformerShape) -> ActivationCostTable:
    formats = tuple(dict.fromkeys(cfg.candidates + (cfg.baseline_format,)))
    tokens = cfg.microbatch_size * cfg.seq_len
    if cfg.activations == "bits":
        return ActivationCostTable.from_bits(formats, block=cfg.block)
    if cfg.activations == "formula":
        return ActivationCostTable.from_formula(shape, tokens=tokens, formats=formats, block=cfg.block,
                                                act_bytes=_ACT_BYTES[str(cfg.dtype).lower()], seq_len=cfg.seq_len,
                                                final_norm_format=cfg.baseline_format)
    from agoq_core.planner.measure import measure_activation_costs

    return measure_activation_costs(shape, microbatch_size=cfg.microbatch_size, seq_len=cfg.seq_len,
                                    formats=cfg.candidates, baseline_format=cfg.baseline_format, block=cfg.block,
                                    dtype=cfg.dtype, device=cfg.measure_device)


def _extras(costs: ActivationCostTable, spec: PipelineSpec, rank: int, io: Sequence[int]) -> list[int]:
    last = spec.virtual_stages - 1
    return [costs.chunk_bytes + (costs.first_stage_bytes if vs == 0 else 0)
            + (costs.last_stage_bytes if vs == last else 0) + o for vs, o in zip(spec.vstages_of(rank), io)]


def _pipeline_io(cfg: PlanConfig, shape: TransformerShape, spec: PipelineSpec, rank: int,
                 loss_bytes: int = 0) -> tuple[list[int], list[int], int, int]:
    """What torch.distributed.pipelining itself holds on ``rank``, per chunk and micro-batch.

    Returns (in-flight bytes per chunk, held-until-step-end bytes per chunk, static receive buffers,
    bytes of one stale output held after the rank's first backward).
    Each forward's stage output is kept in the stage's forward cache until its backward (hidden
    states; logits on the last virtual stage). Multi-chunk schedules (torch's _PipelineScheduleRuntime)
    also keep every forward send's tensor referenced by its pending work until the end of the step
    ("while send_ops: _wait_batch_p2p(send_ops.pop())"), so non-last chunks hold one output per
    micro-batch forwarded so far. Receive buffers: PipelineStage allocates one input per micro-batch for
    every non-first virtual stage when the step starts (torch 2.13 _setup_forward_recv_info)."""
    zero = [0] * spec.chunks
    if not cfg.pipeline_buffers or cfg.activations == "bits":
        return zero, list(zero), 0, 0
    T, ab = cfg.microbatch_size * cfg.seq_len, _ACT_BYTES[str(cfg.dtype).lower()]
    last = spec.virtual_stages - 1
    holds_sends = SCHEDULES[spec.schedule].multi_chunk
    inflight_io, held = [], []
    for vs in spec.vstages_of(rank):
        out = T * (shape.vocab if vs == last else shape.hidden) * ab
        if holds_sends and vs != last:
            inflight_io.append(0)
            held.append(out)
        else:
            inflight_io.append(out)
            held.append(0)
    recv = sum(spec.microbatches * T * shape.hidden * ab for vs in spec.vstages_of(rank) if vs != 0)
    stale = 0
    if spec.schedule == "1f1b":
        stale = inflight_io[0] if rank != spec.stages - 1 else max(0, inflight_io[0] - loss_bytes)
    return inflight_io, held, recv, stale


def _constraints(rank_inflight, held: Sequence[int], stale: int = 0) -> tuple[list[tuple[int, ...]], list[int]]:
    """In-flight vectors after each forward, with the format-independent bytes held at that moment
    (pending sends; a stale output once a backward ran); dominated pairs dropped (the peak is always
    reached right after some forward)."""
    pairs = set()
    backward_seen = False
    for vec, fwd, kind in zip(rank_inflight.trace, rank_inflight.forwarded, rank_inflight.kinds):
        if kind == "B":
            backward_seen = True
        else:
            pairs.add((vec, sum(f * h for f, h in zip(fwd, held)) + (stale if backward_seen else 0)))
    keep = [p for p in pairs
            if not any(q != p and q[1] >= p[1] and all(x <= y for x, y in zip(p[0], q[0])) for q in pairs)]
    keep.sort(reverse=True)
    return [p[0] for p in keep], [p[1] for p in keep]


def _int_costs(costs: ActivationCostTable, fid: FidelityTable, formats: Sequence[str]) -> tuple[dict, dict]:
    real = {f: costs.quantized_numel * fid[f] for f in formats}
    top = max(real.values()) or 1.0
    scale = float(2 ** _COST_SCALE_BITS) / top
    return real, {f: int(round(v * scale)) for f, v in real.items()}


def _uniform_peak(costs: ActivationCostTable, layers_per_chunk: Sequence[int], extras: Sequence[int],
                  states, offsets, fmt: str) -> int:
    cb = [x + n * costs.bytes_for(fmt) for n, x in zip(layers_per_chunk, extras)]
    return peak_bytes(cb, states, offsets)[0]


def _nearest_width(x: float, widths: Sequence[int]) -> int:
    # Nearest available width; a tie goes to the narrower one (it cannot use more memory).
    return min(widths, key=lambda w: (abs(w - x), w))


def _best_format_of_width(bits: int, formats: Sequence[str], fid: FidelityTable, block: int | None) -> str:
    same = [f for f in formats if get_format(f, block).bits == bits]
    return min(same, key=lambda f: fid[f])


def _describe_state(state: Sequence[int], vstages: Sequence[int]) -> str:
    parts = [f"{n}x vs{vs}" for n, vs in zip(state, vstages) if n]
    return " + ".join(parts) if parts else "nothing in flight"


# ---- the verb ------------------------------------------------------------------------------------

def plan_for_pipeline(model_config: object, stages: int | None = None, microbatches: int | None = None,
                      schedule: str | None = None, *, fidelity: FidelityTable | None = None,
                      costs: ActivationCostTable | None = None, **options: Any) -> Plan:
    """Plan the activation formats of every layer for a pipeline-parallel run.

    ``model_config``: a preset name of agoq_core.models (``"tiny"``, ``"llama2-7b"`` ...), an HF config
    or model, or a ModelShape. Every option is a :class:`PlanConfig` field given by name (``stages``,
    ``microbatches`` and ``schedule`` may also come first, positionally), e.g. ``budget_bytes``: device
    bytes per stage (weights + gradients + optimizer + activations); not given = the paper's rule, the
    uniform 4-bit activation peak of the fullest stage. ``fidelity`` and ``costs`` override the
    measured NSR table and the activation cost table (tests, what-if studies).
    """
    import dataclasses

    for k, v in (("stages", stages), ("microbatches", microbatches), ("schedule", schedule)):
        if v is not None:
            options[k] = v
    known = [f.name for f in dataclasses.fields(PlanConfig)]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise PlannerError(f"unknown plan options {unknown}; PlanConfig fields: {known}")
    cfg = PlanConfig(**options)
    shape = model_shape(model_config)
    spec = cfg.spec
    profile = inflight(spec)
    layers = split_layers(shape.layers, spec)
    costs = costs if costs is not None else _activation_table(cfg, shape)
    formats = cfg.candidates
    for f in formats + (cfg.baseline_format,):
        costs.bytes_for(f)
    fid = fidelity if fidelity is not None else measure_fidelity(
        tuple(dict.fromkeys(formats + (cfg.baseline_format,))), block=cfg.block)
    real_cost, int_cost = _int_costs(costs, fid, tuple(dict.fromkeys(formats + (cfg.baseline_format,))))

    per_rank = []
    for r in range(spec.stages):
        vss = spec.vstages_of(r)
        n_layers = [len(layers[vs]) for vs in vss]
        io, held, recv, stale = _pipeline_io(cfg, shape, spec, r, costs.last_stage_bytes)
        extras = _extras(costs, spec, r, io)
        states, offsets = _constraints(profile.ranks[r], held, stale)
        static = static_bytes(stage_params(shape, spec, r, layers), cfg.static)
        if cfg.activations != "bits":
            static["pipeline_buffers"] = recv
        base_peak = _uniform_peak(costs, n_layers, extras, states, offsets, cfg.baseline_format)
        per_rank.append((vss, n_layers, extras, (states, offsets), static, base_peak))

    if cfg.budget_bytes is not None:
        kind, budget_value = "device", cfg.budget_bytes
        caps = [cfg.budget_bytes - sum(st.values()) for (_, _, _, _, st, _) in per_rank]
    elif cfg.activation_budget_bytes is not None:
        kind, budget_value = "activations", cfg.activation_budget_bytes
        caps = [cfg.activation_budget_bytes] * spec.stages
    else:
        kind = "uniform-baseline"
        budget_value = max(bp for (*_, bp) in per_rank)
        caps = [budget_value] * spec.stages

    options_of = [Option(f, costs.bytes_for(f), int_cost[f]) for f in formats]
    stage_plans = []
    for r, (vss, n_layers, extras, (states, offsets), static, base_peak) in enumerate(per_rank):
        cap = caps[r]
        io, held, _, stale = _pipeline_io(cfg, shape, spec, r, costs.last_stage_bytes)
        sol = _solve(cfg.granularity, options_of, n_layers, extras, states, offsets, cap)
        if sol is None:
            _raise_infeasible(cfg, kind, budget_value, r, per_rank, costs, formats, profile)
        choices, cb, peak, arg = sol
        fmts: dict[int, str] = {}
        for c, vs in enumerate(vss):
            for layer, j in zip(layers[vs], choices[c]):
                fmts[layer] = formats[j]
        cost = sum(real_cost[f] for f in fmts.values())
        best_fmt = min(formats, key=lambda f: real_cost[f])
        if all(f == best_fmt or real_cost[f] == real_cost[best_fmt] for f in fmts.values()):
            binding = "not binding: every layer already has the most accurate candidate"
        else:
            k = dict(zip(states, offsets)).get(tuple(arg), 0)
            sends = f" (+{k:,} {costs.unit} of pending sends)" if k else ""
            binding = f"{_describe_state(arg, vss)} in flight{sends}; {cap - peak:,} {costs.unit} left"
        stage_plans.append(StagePlan(
            stage=r, vstages=vss, layers=tuple(layers[vs] for vs in vss), formats=fmts,
            inflight_peak=profile.ranks[r].peak, chunk_peaks=profile.ranks[r].chunk_peaks,
            chunk_bytes=tuple(cb), chunk_io_bytes=tuple(io), chunk_held_bytes=tuple(held), stale_output_bytes=stale,
            constraints=tuple(zip(states, offsets)), activation_peak=peak, baseline_peak=base_peak,
            activation_cap=cap, static=static, binding_state=arg, binding=binding, cost=cost))

    closed = _closed_form(cfg, costs, fid, per_rank, caps, real_cost, profile)
    return Plan(config=cfg, shape=shape, spec=spec, profile=profile, costs=costs, fidelity=fid,
                budget_kind=kind, budget=budget_value, stages=tuple(stage_plans), closed_form=closed)


def _solve(granularity: str, options: Sequence[Option], n_layers: Sequence[int], extras: Sequence[int],
           states, offsets, cap: int):
    if granularity == "stage":  # one format for the whole stage: try each
        best = None
        for j, o in enumerate(options):
            cb = [x + n * o.bytes for n, x in zip(n_layers, extras)]
            peak, arg = peak_bytes(cb, states, offsets)
            cost = o.cost * sum(n_layers)
            if peak <= cap and (best is None or (cost, peak) < best[0]):
                best = ((cost, peak), [[j] * n for n in n_layers], cb, peak, arg)
        return None if best is None else best[1:]
    if granularity == "chunk":
        chunks = [[[Option(o.name, n * o.bytes, n * o.cost) for o in options]] if n else [] for n in n_layers]
        sol = solve_rank(chunks, extras, states, cap, offsets)
        if sol is None:
            return None
        choices = [[sol.choices[c][0]] * n if n else [] for c, n in enumerate(n_layers)]
        return choices, sol.chunk_bytes, sol.peak, sol.binding_state
    chunks = [[list(options) for _ in range(n)] for n in n_layers]
    sol = solve_rank(chunks, extras, states, cap, offsets)
    if sol is None:
        return None
    return [list(c) for c in sol.choices], sol.chunk_bytes, sol.peak, sol.binding_state


def _raise_infeasible(cfg, kind, budget_value, r, per_rank, costs, formats, profile) -> None:
    smallest = min(formats, key=costs.bytes_for)
    need = []
    for (vss, n_layers, extras, (states, offsets), static, _) in per_rank:
        cb = [x + n * costs.bytes_for(smallest) for n, x in zip(n_layers, extras)]
        need.append((peak_bytes(cb, states, offsets)[0], sum(static.values())))
    act, st = need[r]
    if kind == "device":
        fit = max(a + s for a, s in need)
        what = (f"stage {r} holds {st:,} B of weights, gradients and optimizer state and needs {act:,} B of "
                f"activations even with {smallest} everywhere ({profile.ranks[r].peak} chunk micro-batches in "
                f"flight): {st + act:,} B > budget {budget_value:,} B")
    else:
        fit = max(a for a, _ in need)
        what = (f"stage {r} needs {act:,} {costs.unit} of activations even with {smallest} everywhere "
                f"({profile.ranks[r].peak} chunk micro-batches in flight) > budget {budget_value:,} {costs.unit}")
    raise BudgetError(
        f"{what}. Smallest budget that fits every stage: {fit:,} {costs.unit}"
        f"{' (device)' if kind == 'device' else ' (activations)'}; or fewer micro-batches in flight "
        f"(1f1b keeps at most `stages` per stage), a shorter sequence or a smaller micro-batch.")


def _closed_form(cfg, costs, fid, per_rank, caps, real_cost, profile) -> tuple[ClosedFormStage, ...] | None:
    base_bits = get_format(cfg.baseline_format, cfg.block).bits
    widths = sorted({get_format(f, cfg.block).bits for f in cfg.candidates})
    if base_bits not in widths:
        return None
    n = [rk.peak for rk in profile.ranks]
    n_max = max(n)
    out = []
    for r, (vss, n_layers, extras, (states, offsets), static, _) in enumerate(per_rank):
        exact = base_bits * n_max / n[r]
        bits = _nearest_width(exact, widths)
        # Each width in its most accurate candidate code (the paper does not name its 5/6-bit codes).
        fmt = _best_format_of_width(bits, cfg.candidates, fid, cfg.block)
        peak = _uniform_peak(costs, n_layers, extras, states, offsets, fmt)
        out.append(ClosedFormStage(bits_exact=exact, bits=bits, format=fmt, units=bits * n[r],
                                   unit_budget=base_bits * n_max, peak=peak, fits=peak <= caps[r],
                                   cost=real_cost[fmt] * sum(n_layers) if fmt in real_cost else math.nan))
    return tuple(out)
