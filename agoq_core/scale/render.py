"""The text table ``agoq plan --cluster`` prints for a :class:`~agoq_core.scale.step.Prediction`."""
from __future__ import annotations

from agoq_core.scale.step import Prediction

__all__ = ["render_prediction"]

GiB = float(1 << 30)


def _gib(n: float) -> str:
    return f"{n / GiB:.2f}"


def _fmts(formats: dict[int, str]) -> str:
    counts: dict[str, int] = {}
    for f in formats.values():
        counts[f] = counts.get(f, 0) + 1
    return " ".join(f"{f}x{n}" for f, n in counts.items()) or "-"


def render_prediction(p: Prediction) -> str:
    cl, par, net = p.cluster, p.parallel, p.cluster.network
    spec = par.spec
    b, a = p.baseline, p.agoq
    lines = [
        f"AGoQ cluster prediction: {p.model.name} on {cl.name} ({cl.nodes} node(s) x {cl.gpus_per_node}), "
        f"tp {par.tp} x pp {par.pp} x dp {par.dp}{f' (ZeRO-{par.zero})' if par.zero else ''}, {spec.schedule}"
        f"{f' ({spec.chunks} chunks)' if spec.chunks > 1 else ''}, {par.microbatches} micro-batches x "
        f"{par.microbatch_size} x {p.seq_len:,} tokens",
        f"links: intra {net.intra.name} {net.intra.bandwidth / 1e9:.1f} GB/s usable, alpha {net.intra.alpha * 1e6:.1f} us; "
        f"inter {net.inter.name} {net.inter.bandwidth / 1e9:.2f} GB/s usable per NIC x {net.nics_per_node} per node, "
        f"alpha {net.inter.alpha * 1e6:.1f} us",
        f"device: {cl.device.name}, {cl.device.memory_bytes / GiB:.1f} GiB ({cl.device.usable_bytes / GiB:.1f} usable), "
        f"{cl.device.peak_flops / 1e12:.0f} TFLOP/s bf16 peak; {cl.device.measured or cl.device.source}",
        f"activation accounting: {p.accounting}. PREDICTION of a cost model, not a measurement (docs/scale.md).",
        "",
        f"baseline = bf16 + fp32 gradients + fp32 Adam + fp32 all-reduce, recomputing {b.memory.recompute_layers} "
        f"layer(s) per virtual stage{'' if b.memory.fits else ' (DOES NOT FIT)'}; "
        f"AGoQ = LAAQ (DBCA-PP plan) + QuanGrad + 8-bit Adam, recomputing {a.memory.recompute_layers} layer(s)"
        f"{'' if a.memory.fits else ' (DOES NOT FIT)'}",
        "",
        "peak memory per stage, GiB     baseline                     AGoQ",
        "stage  static  activations  total    static  activations  total   formats",
    ]
    for sb, sa in zip(b.memory.stages, a.memory.stages):
        lines.append(f"{sb.stage:<6} {_gib(sum(sb.static.values())):>6}  {_gib(sb.activation_peak):>11}  "
                     f"{_gib(sb.total):>6}   {_gib(sum(sa.static.values())):>6}  {_gib(sa.activation_peak):>11}  "
                     f"{_gib(sa.total):>6}   {_fmts(sa.formats)}")
    lines += ["", "step time, s          baseline      AGoQ"]
    bt, at = b.time.to_dict(), a.time.to_dict()
    labels = {"compute": "compute", "recompute": "recompute", "tp_comm": "TP communication",
              "bubble": "pipeline bubble", "dp_comm": "DP gradient sync", "optimizer": "optimizer", "total": "total"}
    for k, lab in labels.items():
        lines.append(f"{lab:<20} {bt[k]:>10.3f} {at[k]:>10.3f}")
    lines.append(f"{'tokens/s':<20} {b.tokens_per_s:>10,.0f} {a.tokens_per_s:>10,.0f}")
    lines.append(f"predicted speedup of AGoQ: {p.speedup:.2f}x; peak memory {_gib(b.memory.peak)} -> {_gib(a.memory.peak)} GiB")
    lines.append("(recompute: whole layers for the baseline; LAAQ's codecs and RMSNorm/SwiGLU recomputation for AGoQ. "
                 "Breakdown of the busiest pipeline rank.)")
    for n in p.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)
