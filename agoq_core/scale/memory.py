"""Peak memory of every pipeline stage on one GPU, for the baseline and for AGoQ.

Built from the planner's accounting, not a copy of it:

- in-flight micro-batches per stage and chunk: ``agoq_core.planner.inflight`` (the schedule walk);
- peak over the schedule: ``agoq_core.planner.solver.peak_bytes`` at the schedule's maximal states;
- static memory: ``agoq_core.planner.memory.static_bytes`` of the parameters a GPU holds
  (its stage's layers, embedding / head, split ``tp`` ways; ZeRO stages split further ``dp`` ways);
- AGoQ's activations: the DBCA-PP plan of ``plan_for_pipeline`` with the LAAQ cost table
  (``ActivationCostTable.from_formula``, which equals LAAQ's measurement byte for byte) split ``tp``
  ways (Megatron tensor + sequence parallelism shards every saved activation of a layer).

Two activation accountings:

- ``project``: what this project's code keeps. Baseline = Hugging Face bf16 (``hf_plain_layer_bytes``,
  checked against LAAQ's ``measure_saved_bytes`` in tests/scale), AGoQ = LAAQ as planned.
- ``paper``: the paper's Table 1 units (U = tokens x hidden x 2 B): Megatron 28U per layer,
  AGoQ 5U (attention, 16-bit) + 11U of quantized inputs at the format's bits / 16.

A baseline that does not fit recomputes whole layers (Megatron ``--recompute-granularity full
--recompute-method block --recompute-num-layers R``: R layers of every virtual stage keep only their
input); the smallest R that fits is chosen. AGoQ recomputes no layer unless even its plan does not fit.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from agoq_core.formats.spec import get_format
from agoq_core.planner.memory import ActivationCostTable, StaticMemoryConfig, static_bytes
from agoq_core.planner.model import TransformerShape, split_layers, stage_params
from agoq_core.planner.plan import Plan, plan_for_pipeline
from agoq_core.planner.schedules import PipelineSpec, inflight
from agoq_core.planner.solver import peak_bytes
from agoq_core.scale.errors import ScaleError

__all__ = ["Accounting", "ZeroStage", "StageMemory", "ArmMemory", "hf_plain_layer_bytes", "paper_cost_table",
           "stage_params", "stage_static", "baseline_memory", "agoq_memory", "AGOQ_CANDIDATES"]

Accounting = Literal["project", "paper"]
ZeroStage = Literal[0, 1, 2, 3]
AGOQ_CANDIDATES = ("nf4", "int5", "int6", "int8")
"""DBCA-PP candidates of the cluster plans (the paper's widths 4/5/6/8; nf4 is LAAQ's 4-bit default)."""


def hf_plain_layer_bytes(shape: TransformerShape, tokens: int) -> int:
    """Bytes a Hugging Face LLaMA decoder layer keeps for backward in bf16 (no LAAQ), per micro-batch.

    Counted per tensor (docs/bench/laaq.md's per-part table at 7B / 4K: 728.5 MiB): each RMSNorm keeps
    its fp32 upcast input (4 B) and the bf16 normalized tensor (2 B) = 12 B x T x h for two; the q/k/v
    and gate/up GEMMs keep the norm outputs (2 x 2 B x T x h); SDPA keeps q, k, v, its output and an
    fp32 logsumexp; SwiGLU keeps gate and up outputs and silu(gate), the down projection its input
    (4 x 2 B x T x i). The out-projection input is SDPA's output (kept once). Each RMSNorm also keeps its
    fp32 reciprocal RMS (4 B x T). Equal byte for byte to ``agoq_core.laaq.measure_saved_bytes`` on a real
    bf16 HF model (tests/scale/test_memory.py)."""
    T, h = tokens, shape.hidden
    norms = 2 * (6 * T * h + 4 * T)
    gemm_inputs = 4 * T * h
    attention = 4 * T * h + 4 * T * shape.kv_dim + 4 * T * shape.heads
    return norms + gemm_inputs + attention + 8 * T * shape.intermediate


def _div(x: int, t: int) -> int:
    return -(-x // t)


def _shard(table: ActivationCostTable, tp: int) -> ActivationCostTable:
    if tp == 1:
        return table
    return dataclasses.replace(
        table, layer_bytes={k: _div(v, tp) for k, v in table.layer_bytes.items()},
        layer_fixed_bytes=_div(table.layer_fixed_bytes, tp), quantized_numel=_div(table.quantized_numel, tp),
        first_stage_bytes=_div(table.first_stage_bytes, tp), last_stage_bytes=_div(table.last_stage_bytes, tp),
        chunk_bytes=_div(table.chunk_bytes, tp), source=table.source + f", split {tp} ways (tensor + sequence parallel)")


def paper_cost_table(shape: TransformerShape, tokens: int, formats=AGOQ_CANDIDATES) -> ActivationCostTable:
    """The paper's Table 1 accounting as a planner cost table: 5U in 16 bits + 11U at the format's bits
    (two RMSNorm inputs 2U, the SiLU&Mul input 8U, the out-projection input 1U; 7.75U at 4 bits
    without block scales, 7.84U with nf4's fp32 scale per 128). Last stage: fp32 logits."""
    U = 2 * tokens * shape.hidden
    per = {}
    for f in formats:
        spec = get_format(f)
        per[spec.name] = 5 * U + round(11 * U * spec.bits_per_element / 16)
    return ActivationCostTable(layer_bytes=per, layer_fixed_bytes=5 * U, quantized_numel=11 * tokens * shape.hidden,
                               first_stage_bytes=8 * tokens, last_stage_bytes=U + 4 * tokens * shape.vocab,
                               tokens=tokens, source=f"paper Table 1 units ({tokens} tokens/micro-batch)")


def _baseline_layer(shape: TransformerShape, tokens: int, accounting: Accounting) -> tuple[int, int, int]:
    """(bytes per layer, first-stage extra, last-stage extra) of the bf16 baseline, unsharded."""
    U = 2 * tokens * shape.hidden
    logits = 4 * tokens * shape.vocab
    if accounting == "paper":
        return 28 * U, 8 * tokens, U + logits
    # HF: final norm (3U) + LM-head input (1U) + fp32 logits
    return hf_plain_layer_bytes(shape, tokens), 8 * tokens, 4 * U + logits


def stage_static(params: int, cfg: StaticMemoryConfig, *, tp: int, dp: int, zero: int) -> dict[str, int]:
    """Static bytes on one GPU: the planner's static_bytes of its 1/tp share, ZeRO-sharded over dp."""
    if zero not in (0, 1, 2, 3):
        raise ScaleError(f"zero must be 0, 1, 2 or 3 (3 = FSDP), got {zero!r}")
    st = static_bytes(_div(params, tp), cfg)
    if zero >= 1:
        st["optimizer"] = _div(st["optimizer"], dp)
    if zero >= 2:
        st["grads"] = _div(st["grads"], dp)
    if zero >= 3:
        st["params"] = _div(st["params"], dp)
    return st


@dataclass(frozen=True)
class StageMemory:
    stage: int
    static: dict[str, int]
    activation_peak: int
    recompute_layers: int
    """Whole layers recomputed per virtual stage (Megatron --recompute-num-layers)."""
    formats: dict[int, str] = field(default_factory=dict)
    """AGoQ: global layer -> activation format (DBCA-PP plan); empty for the baseline."""

    @property
    def total(self) -> int:
        return sum(self.static.values()) + self.activation_peak


@dataclass(frozen=True)
class ArmMemory:
    arm: str
    stages: tuple[StageMemory, ...]
    usable_bytes: int
    fits: bool
    recompute_layers: int
    accounting: str
    plan: Plan | None = None

    @property
    def peak(self) -> int:
        return max(s.total for s in self.stages)


def _peaks(spec: PipelineSpec, shape: TransformerShape, full: int, kept: int, first: int, last: int,
           recompute: int) -> list[int]:
    """Activation peak of each rank with ``recompute`` layers of every chunk keeping only ``kept`` bytes."""
    prof = inflight(spec)
    layers = split_layers(shape.layers, spec)
    out = []
    for r in range(spec.stages):
        cb = []
        for vs in spec.vstages_of(r):
            n = len(layers[vs])
            rc = min(recompute, n)
            b = (n - rc) * full + rc * kept
            b += first if vs == 0 else 0
            b += last if vs == spec.virtual_stages - 1 else 0
            cb.append(b)
        # while a recomputed layer runs its backward, its full activations exist once more
        transient = full if recompute else 0
        out.append(peak_bytes(cb, prof.ranks[r].states)[0] + transient)
    return out


def _max_layers_per_chunk(shape: TransformerShape, spec: PipelineSpec) -> int:
    return max(len(x) for x in split_layers(shape.layers, spec))


def baseline_memory(shape: TransformerShape, spec: PipelineSpec, *, tokens: int, tp: int, dp: int,
                    usable_bytes: int, accounting: Accounting = "project", zero: int = 0,
                    recompute: int | None = None,
                    static: StaticMemoryConfig = StaticMemoryConfig(grads="fp32", optimizer="adam")) -> ArmMemory:
    """bf16 baseline (Megatron: fp32 main gradients, fp32 Adam) with the fewest recomputed layers that fit
    (or exactly ``recompute`` layers per virtual stage when given)."""
    full, first, last = (_div(x, tp) for x in _baseline_layer(shape, tokens, accounting))
    kept = _div(2 * tokens * shape.hidden, tp)  # a recomputed layer keeps its (sequence-sharded) input
    statics = [stage_static(stage_params(shape, spec, r), static, tp=tp, dp=dp, zero=zero) for r in range(spec.stages)]
    top = _max_layers_per_chunk(shape, spec)
    choices = [recompute] if recompute is not None else list(range(top + 1))
    for R in choices:
        if R < 0 or R > top:
            raise ScaleError(f"recompute must be in [0, {top}] layers per virtual stage, got {R}")
        peaks = _peaks(spec, shape, full, kept, first, last, R)
        fits = all(sum(st.values()) + p <= usable_bytes for st, p in zip(statics, peaks))
        if fits or R == choices[-1]:
            stages = tuple(StageMemory(stage=r, static=statics[r], activation_peak=peaks[r], recompute_layers=R)
                           for r in range(spec.stages))
            return ArmMemory(arm="baseline", stages=stages, usable_bytes=usable_bytes, fits=fits, recompute_layers=R,
                             accounting=accounting)
    raise AssertionError("unreachable")  # pragma: no cover


def agoq_memory(shape: TransformerShape, spec: PipelineSpec, *, tokens: int, seq: int, microbatch_size: int, tp: int,
                dp: int, usable_bytes: int, accounting: Accounting = "project", zero: int = 0,
                candidates=AGOQ_CANDIDATES,
                static: StaticMemoryConfig = StaticMemoryConfig(grads="quangrad", optimizer="adam8bit")) -> ArmMemory:
    """AGoQ: DBCA-PP plan (the planner's exact solver, paper budget rule: the uniform nf4 peak of the
    fullest stage), QuanGrad gradients, 8-bit Adam. Whole layers are recomputed only if even that plan
    does not fit the device."""
    if accounting == "paper":
        table = paper_cost_table(shape, tokens, tuple(dict.fromkeys(tuple(candidates) + ("nf4",))))
    else:
        table = ActivationCostTable.from_formula(shape, tokens=tokens, seq_len=seq,
                                                 formats=tuple(dict.fromkeys(tuple(candidates) + ("nf4",))))
    table = _shard(table, tp)
    plan = plan_for_pipeline(shape, spec.stages, spec.microbatches, spec.schedule, costs=table, chunks=spec.chunks,
                             microbatch_size=microbatch_size, seq_len=seq, candidates=tuple(candidates),
                             baseline_format="nf4", activations="formula", pipeline_buffers=False, static=static)
    statics = [stage_static(stage_params(shape, spec, r), static, tp=tp, dp=dp, zero=zero) for r in range(spec.stages)]
    stages = tuple(StageMemory(stage=r, static=statics[r], activation_peak=plan.stages[r].activation_peak,
                               recompute_layers=0, formats=dict(plan.stages[r].formats)) for r in range(spec.stages))
    fits = all(s.total <= usable_bytes for s in stages)
    R = 0
    if not fits:  # nf4 everywhere plus the fewest recomputed layers that fit
        full = table.bytes_for("nf4")
        kept = _div(2 * tokens * shape.hidden, tp)
        top = _max_layers_per_chunk(shape, spec)
        for R in range(1, top + 1):
            peaks = _peaks(spec, shape, full, kept, table.first_stage_bytes, table.last_stage_bytes, R)
            fits = all(sum(st.values()) + p <= usable_bytes for st, p in zip(statics, peaks))
            if fits or R == top:
                layers = split_layers(shape.layers, spec)
                stages = tuple(StageMemory(stage=r, static=statics[r], activation_peak=peaks[r], recompute_layers=R,
                                           formats={l: "nf4" for vs in spec.vstages_of(r) for l in layers[vs]})
                               for r in range(spec.stages))
                break
    return ArmMemory(arm="agoq", stages=stages, usable_bytes=usable_bytes, fits=fits, recompute_layers=R,
                     accounting=accounting, plan=plan)
