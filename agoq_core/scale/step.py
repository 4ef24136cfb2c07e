"""Step time and peak memory of one training step, baseline vs AGoQ: the verb ``predict``.

Per virtual stage and micro-batch, forward and backward seconds are summed from
``agoq_core.scale.compute`` (layers, LM head, LAAQ, recomputed layers, QuanGrad's accumulation)
and the tensor-parallel collectives of ``agoq_core.scale.collectives`` (sequence parallelism:
forward 2 all-gathers + 2 reduce-scatters of T x h x 2 B per layer, backward those plus the 2
re-gathers of the saved sharded inputs; not overlapped with compute, as in Megatron without
TransformerEngine's comm overlap). The pipeline timeline is the planner's schedule simulation
(``agoq_core.planner.simulate`` over the same action lists that torch runs) with the point-to-point
send time on each cross-rank dependency. After the pipeline drains: the data-parallel gradient
synchronisation (fp32 all-reduce for the baseline, QuanGrad's all-to-all + FP32 sum + all-gather
for AGoQ; not overlapped) and the optimizer step.

The breakdown is of the busiest pipeline rank: ``compute`` (its GEMMs, attention and memory-bound
ops, head, gradient accumulation), ``recompute`` (whole recomputed layers for the baseline; LAAQ's
codecs and RMSNorm / SwiGLU recomputation for AGoQ), ``tp_comm``, ``bubble`` (the rest of the
pipeline's makespan: idle time and point-to-point waits), ``dp_comm``, ``optimizer``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from agoq_core.planner.model import TransformerShape, model_shape, split_layers
from agoq_core.planner.schedules import simulate
from agoq_core.scale import compute as C
from agoq_core.scale.collectives import Group, collective_time, quangrad_allreduce_time
from agoq_core.scale.config import Cluster, Parallel
from agoq_core.scale.errors import ScaleError
from agoq_core.scale.memory import AGOQ_CANDIDATES, Accounting, ArmMemory, agoq_memory, baseline_memory, stage_params

__all__ = ["StepTime", "ArmPrediction", "Prediction", "predict", "SCHEMA_VERSION"]

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class StepTime:
    compute: float
    recompute: float
    tp_comm: float
    bubble: float
    dp_comm: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.compute + self.recompute + self.tp_comm + self.bubble + self.dp_comm + self.optimizer

    def to_dict(self) -> dict:
        d = asdict(self)
        d["total"] = self.total
        return d


@dataclass(frozen=True)
class ArmPrediction:
    arm: str
    memory: ArmMemory
    time: StepTime
    tokens_per_step: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.time.total

    def to_dict(self) -> dict:
        m = self.memory
        return {
            "arm": self.arm,
            "fits": m.fits,
            "recompute_layers_per_virtual_stage": m.recompute_layers,
            "peak_bytes": m.peak,
            "usable_bytes": m.usable_bytes,
            "stages": [{"stage": s.stage, "static_bytes": dict(s.static), "activation_peak_bytes": s.activation_peak,
                        "total_bytes": s.total, "recompute_layers": s.recompute_layers,
                        "formats": _format_counts(s.formats)} for s in m.stages],
            "step_s": self.time.to_dict(),
            "tokens_per_s": self.tokens_per_s,
        }


def _format_counts(formats: dict[int, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in formats.values():
        out[f] = out.get(f, 0) + 1
    return out


@dataclass(frozen=True)
class Prediction:
    model: TransformerShape
    cluster: Cluster
    parallel: Parallel
    seq_len: int
    accounting: str
    baseline: ArmPrediction
    agoq: ArmPrediction
    notes: tuple[str, ...] = field(default=())

    @property
    def speedup(self) -> float:
        return self.baseline.time.total / self.agoq.time.total

    def to_dict(self) -> dict[str, Any]:
        net = self.cluster.network
        return {
            "schema": SCHEMA_VERSION,
            "kind": "agoq-cluster-prediction",
            "model": {"name": self.model.name, "hidden": self.model.hidden, "layers": self.model.layers,
                      "heads": self.model.heads, "kv_heads": self.model.kv_heads,
                      "intermediate": self.model.intermediate, "vocab": self.model.vocab},
            "cluster": {"devices": self.cluster.devices, "device": self.cluster.device.name,
                        "gpus_per_node": self.cluster.gpus_per_node, "nodes": self.cluster.nodes,
                        "device_source": self.cluster.device.source, "device_measured": self.cluster.device.measured,
                        "network": net.to_dict()},
            "parallel": {"tp": self.parallel.tp, "pp": self.parallel.pp, "dp": self.parallel.dp,
                         "schedule": self.parallel.spec.schedule, "chunks": self.parallel.spec.chunks,
                         "microbatches": self.parallel.microbatches,
                         "microbatch_size": self.parallel.microbatch_size, "zero": self.parallel.zero},
            "seq_len": self.seq_len,
            "accounting": self.accounting,
            "baseline": self.baseline.to_dict(),
            "agoq": self.agoq.to_dict(),
            "speedup": self.speedup,
            "notes": list(self.notes),
            "what_this_is": "a prediction of an alpha-beta + roofline cost model, not a measurement (docs/scale.md)",
        }


# ---- groups on the cluster ------------------------------------------------------------------------

def _groups(cluster: Cluster, par: Parallel) -> tuple[Group, Group, tuple[float, float]]:
    """TP group, DP group and the point-to-point (alpha, bytes/s) of pipeline neighbours.

    Megatron's rank order: tp fastest, then dp, then pp."""
    g = cluster.gpus_per_node
    net = cluster.network
    tp_per_node = min(par.tp, g)
    tp_group = Group(size=par.tp, per_node=tp_per_node, network=net, concurrent=max(1, g // tp_per_node))
    dp_per_node = max(1, min(par.dp, g // par.tp)) if par.tp < g else 1
    dp_group = Group(size=par.dp, per_node=dp_per_node, network=net, concurrent=max(1, g // dp_per_node))
    if par.tp * par.dp >= g:  # pipeline neighbours sit on different nodes; every GPU of a node sends at once
        p2p = (net.inter.alpha, min(net.inter_bandwidth_per_gpu(g), net.intra.bandwidth))
    else:
        p2p = (net.intra.alpha, net.intra.bandwidth)
    return tp_group, dp_group, p2p


# ---- the verb ------------------------------------------------------------------------------------

def predict(model: object, cluster: Cluster, parallel: Parallel, seq_len: int, *, accounting: Accounting = "project",
            elementwise: C.Elementwise = "fused", recompute: int | None = None,
            agoq_candidates: tuple[str, ...] = AGOQ_CANDIDATES, quantize_attn_out: bool | None = None) -> Prediction:
    """Predict peak memory per stage and step time for the baseline and for AGoQ.

    ``recompute`` forces the baseline's recomputed layers per virtual stage (default: the fewest that
    fit). ``accounting``: "project" (this project's kept tensors) or "paper" (Table 1 units)."""
    shape = model_shape(model)
    parallel.check(cluster)
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ScaleError(f"seq_len must be an int >= 1, got {seq_len!r}")
    if accounting not in ("project", "paper"):
        raise ScaleError(f"accounting must be 'project' or 'paper', got {accounting!r}")
    if shape.heads % parallel.tp or (shape.kv_heads % parallel.tp and parallel.tp % shape.kv_heads):
        raise ScaleError(f"tp({parallel.tp}) must divide the {shape.heads} attention heads (and the {shape.kv_heads} "
                         f"KV heads, or be a multiple of them)")
    spec = parallel.spec
    tokens = parallel.microbatch_size * seq_len
    dev = cluster.device
    usable = dev.usable_bytes
    qa = accounting == "paper" if quantize_attn_out is None else quantize_attn_out
    base_mem = baseline_memory(shape, spec, tokens=tokens, tp=parallel.tp, dp=parallel.dp, usable_bytes=usable,
                               accounting=accounting, zero=parallel.zero, recompute=recompute)
    agoq_mem = agoq_memory(shape, spec, tokens=tokens, seq=seq_len, microbatch_size=parallel.microbatch_size,
                           tp=parallel.tp, dp=parallel.dp, usable_bytes=usable, accounting=accounting,
                           zero=parallel.zero, candidates=agoq_candidates)
    tokens_step = tokens * parallel.microbatches * parallel.dp
    notes = []
    if not base_mem.fits:
        notes.append(f"baseline does not fit even recomputing every layer ({base_mem.peak / 2**30:.1f} GiB > "
                     f"{usable / 2**30:.1f} GiB usable): its time is for a device that would hold it")
    if not agoq_mem.fits:
        notes.append(f"AGoQ does not fit even recomputing every layer ({agoq_mem.peak / 2**30:.1f} GiB > "
                     f"{usable / 2**30:.1f} GiB usable)")
    base_t = _step_time(shape, cluster, parallel, seq_len, tokens, base_mem, "baseline", elementwise, qa)
    agoq_t = _step_time(shape, cluster, parallel, seq_len, tokens, agoq_mem, "agoq", elementwise, qa)
    return Prediction(model=shape, cluster=cluster, parallel=parallel, seq_len=seq_len, accounting=accounting,
                      baseline=ArmPrediction("baseline", base_mem, base_t, tokens_step),
                      agoq=ArmPrediction("agoq", agoq_mem, agoq_t, tokens_step), notes=tuple(notes))


def _step_time(shape: TransformerShape, cluster: Cluster, par: Parallel, seq: int, tokens: int, mem: ArmMemory,
               arm: str, elementwise: C.Elementwise, quantize_attn_out: bool) -> StepTime:
    spec = par.spec
    dev = cluster.device
    tp = par.tp
    tp_group, dp_group, (p2p_alpha, p2p_bw) = _groups(cluster, par)
    lc = C.layer_cost(shape, tokens, seq, dev, tp=tp, elementwise=elementwise)
    layer_f = lc.forward + dev.layer_overhead_s / 3
    layer_b = lc.backward + 2 * dev.layer_overhead_s / 3
    head_f, head_b = C.head_cost(shape, tokens, dev, tp=tp, elementwise=elementwise)
    act = 2.0 * tokens * shape.hidden  # bytes of one gathered activation
    if tp > 1:
        n_fwd, n_bwd = (4, 6) if par.sequence_parallel else (2, 2)
        coll = "all_gather" if par.sequence_parallel else "all_reduce"
        one = collective_time(coll, act, tp_group)
        if par.sequence_parallel:
            one = 0.5 * (collective_time("all_gather", act, tp_group) + collective_time("reduce_scatter", act, tp_group))
        tp_f, tp_b = n_fwd * one, n_bwd * one
    else:
        tp_f = tp_b = 0.0
    layers = split_layers(shape.layers, spec)
    last = spec.virtual_stages - 1
    laaq_cache: dict[str, tuple[float, float]] = {}
    fwd, bwd, parts = [], [], []
    for vs in range(spec.virtual_stages):
        rank = spec.rank_of(vs)
        n = len(layers[vs])
        R = min(mem.stages[rank].recompute_layers, n)
        comp_f = n * layer_f + (head_f if vs == last else 0.0)
        comp_b = n * layer_b + (head_b if vs == last else 0.0)
        rec_f = rec_b = 0.0
        rec_b += R * layer_f  # whole layers recomputed (Megatron full recompute)
        tpc_f, tpc_b = n * tp_f, n * tp_b + R * tp_f
        if arm == "agoq":
            for layer in layers[vs]:
                fmt = mem.stages[rank].formats.get(layer, "nf4")
                if fmt not in laaq_cache:
                    laaq_cache[fmt] = C.laaq_overhead(shape, tokens, dev, fmt, tp=tp, quantize_attn_out=quantize_attn_out,
                                                      elementwise=elementwise)
                rec_f += laaq_cache[fmt][0]
                rec_b += laaq_cache[fmt][1]
            vs_params = n * shape.layer_params + (shape.embed_params if vs == 0 else 0) + \
                (shape.head_params if vs == last else 0)
            comp_b += C.accumulate_seconds(vs_params / tp, dev)
        fwd.append(comp_f + rec_f + tpc_f)
        bwd.append(comp_b + rec_b + tpc_b)
        parts.append((rank, comp_f + comp_b, rec_f + rec_b, tpc_f + tpc_b))
    p2p = (p2p_alpha + act / tp / p2p_bw) if spec.stages > 1 else 0.0
    tl = simulate(spec, forward_cost=fwd, backward_cost=bwd, p2p_cost=p2p)
    m = par.microbatches
    per_rank = {}
    for rank, comp, rec, tpc in parts:
        c = per_rank.setdefault(rank, [0.0, 0.0, 0.0])
        c[0] += m * comp
        c[1] += m * rec
        c[2] += m * tpc
    busiest = max(per_rank, key=lambda r: sum(per_rank[r]))
    comp, rec, tpc = per_rank[busiest]
    bubble = max(0.0, tl.makespan - (comp + rec + tpc))
    # data-parallel gradient sync and optimizer, for the rank with the most parameters
    params = max(stage_params(shape, spec, r) for r in range(spec.stages)) / tp
    if par.dp > 1:
        if arm == "agoq":
            codec = C.quangrad_codec_seconds(params, par.dp, dev)
            dp = quangrad_allreduce_time(int(params), dp_group, codec_seconds=codec).total
        elif par.zero >= 1:
            dp = collective_time("reduce_scatter", 4 * params, dp_group) + collective_time("all_gather", 2 * params,
                                                                                            dp_group)
        else:
            dp = collective_time("all_reduce", 4 * params, dp_group)
    else:
        dp = 0.0
    opt_params = params / (par.dp if par.zero >= 1 else 1)
    opt = C.optimizer_seconds(opt_params, dev, "adam8bit" if arm == "agoq" else "adam")
    return StepTime(compute=comp, recompute=rec, tp_comm=tpc, bubble=bubble, dp_comm=dp, optimizer=opt)
