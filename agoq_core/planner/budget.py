"""Memory-budget policy: per decoder layer, the cheapest way (in step time) to keep what backward needs
within one device's memory budget.

Quick start::

    from agoq_core.planner.budget import plan_budget
    plan = plan_budget("llama2-7b", budget="80GiB", seq_len=32768)
    print(plan.render())                       # the mix, predicted peak and step time
    from agoq_core.laaq.policy import apply_policy
    report = apply_policy(model, plan)         # one call: LAAQ / checkpointing per layer

``agoq plan --budget 80GiB --model llama2-7b --seq-len 32768`` prints the same.

Per layer the options are (names as printed):

================  ====================================================  =================================
option            what the layer keeps for backward                      extra time
================  ====================================================  =================================
``bf16``          everything HF keeps (``hf_plain_layer_bytes``)         none
``laaq:FMT``      LAAQ (paper policy, every quantized role in FMT)       codecs + norm/SwiGLU recompute
``laaq-mlp:FMT``  attention half as bf16, MLP half as LAAQ                MLP codecs + norm/SwiGLU recompute
``sac``           input + every other GEMM output + attention output     3 of 7 GEMMs + elementwise again
                  (torchtitan's op-level selective checkpointing)
``ckpt``          its bf16 input (torch.utils.checkpoint)                one more forward of the layer
``qckpt:FMT``     its input in FMT (QuantizedCheckpoint)                 one more forward + input codec
================  ====================================================  =================================

A kind ending in ``-c`` (``bf16-c``, ``sac-c``, ``laaq-c:nf4``, ...) is the same layer ``torch.compile``'d;
its costs must be measured (``measured=``; ``benchmarks/bench_layer_profile.py`` measures every option of
one layer at a sequence length), as may any other option's: then the plan is made from measured per-layer
costs, not from the model.

Memory (peak allocated bytes of a training step, batch ``b`` x sequence ``S`` = ``T`` tokens)::

    peak = static + fixed + max(sum_l saved(l) + head_saved + head_transient,
                                max_l (sum_{j <= l} saved(j) + transient(l)))

``static``: weights, gradients and optimizer state (``planner.memory.static_bytes``; gradients are
counted for the whole step: the benchmark zeroes them without freeing, as torch's DDP/FSDP buckets and
Megatron's grad buffer do). ``fixed``: token ids and the RoPE tables. ``saved(l)``: what layer ``l`` keeps
from its forward to its backward. ``transient(l)``: what exists on top while its backward runs (for a
recomputed layer, the whole recomputed layer). The head (final norm, LM head, loss) keeps
``head_saved`` until its backward, which needs ``head_transient`` more. Backward runs from the last layer
to the first and each layer frees what it kept, so while layer ``l``'s backward runs only layers
``0..l`` still hold theirs: a recomputed layer placed first costs its recomputation on top of almost
nothing. (Until 2026-12-01 the planner added the largest transient to *all* layers' saved bytes: 10%
over the measured peak at 64K on the H200, where the plan had 7 recomputed layers.)

The solver (:func:`solve_budget`) is exact: the layers of one model are interchangeable, any mix is best
run with the largest transients first (lowest layer indices), and a dynamic programme over the layers
keeps every assignment not beaten in (saved bytes so far, running peak, time) at once -- so no answer
exceeds the budget and none is slower than another that fits.

Where the numbers come from (docs/laaq.md "Memory-budget policy"):

- bytes: the planner's accounting (``ActivationCostTable.from_formula`` for LAAQ, equal to LAAQ's
  measurement byte for byte; ``scale.memory.hf_plain_layer_bytes`` for plain HF layers, equal to the
  measurement on a real bf16 model; format sizes from ``agoq_core.formats``) -- exact;
- transients: modelled from shapes; the LAAQ backward's coefficients are fitted to the H200 LAAQ rows
  of docs/bench/h200-2026-11-29/run2 (16K-64K tokens, within 4%), the HF loss's 8 B per logit is
  measured there;
- time: ``agoq_core.scale.compute`` (roofline with the H200's measured GEMM throughput, copy bandwidth
  and codec shares, and the attention efficiency and per-layer overhead fitted to the plain steps of
  the same run); recomputation = one more forward of the layer, as in ``scale.single_gpu.h200_check``.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

from agoq_core.formats.spec import get_format
from agoq_core.planner.errors import BudgetError, PlannerError
from agoq_core.planner.memory import ActivationCostTable, StaticMemoryConfig, check_candidates, static_bytes
from agoq_core.planner.model import TransformerShape, model_shape

__all__ = ["plan_budget", "BudgetPlan", "LayerOption", "layer_options", "solve_budget", "HeadCost", "head_cost",
           "DEFAULT_OPTIONS", "parse_option", "BUDGET_STATIC", "LAAQ_TRANSIENT_FIT", "plan_for_choices",
           "sequence_peak", "option_name", "load_layer_costs", "input_leaf_correction", "plan_options",
           "costs_at_length", "SCALED_FROM"]

Loss = Literal["chunked", "hf"]

DEFAULT_OPTIONS: tuple[str, ...] = ("bf16", "laaq:nf4", "laaq:int5", "laaq:int6", "laaq:int8", "ckpt",
                                    "qckpt:nf4", "qckpt:int8")
"""The per-layer options considered unless told otherwise (4/5/6/8-bit LAAQ as DBCA-PP's widths)."""

#: A single-GPU user's static state: bf16 weights and gradients, 8-bit AdamW (bitsandbytes/torchao:
#: two 1-byte states + fp32 absmax per 256), no fp32 master copy (pure bf16 training, as the benchmark).
BUDGET_STATIC = StaticMemoryConfig(param_bytes=2, grads="bf16", optimizer="adam8bit", master_weights=False)

#: LAAQ backward transient (bytes) = a * rows * intermediate + b * T * hidden, rows = the SwiGLU backward's
#: token chunk (laaq.functions.BACKWARD_CHUNK_ELEMS). a: dequantized gate/up, act, dh, du, dg (6 x 2 B);
#: b fitted to the H200 LAAQ rows of run2 (transient 3.59 / 5.81 / 8.12 GB at 16K / 32K / 64K; this
#: model: 3.44 / 5.77 / 8.32, within 4%).
LAAQ_TRANSIENT_FIT = (12, 19)

#: HF's loss holds ~8 bytes per logit on top of what it keeps while its backward runs (fp32 grad of the
#: log-softmax and of the upcast): 1,048,576,000 B at 4,096 tokens x 32,000 (run2, plain, measured).
HF_LOSS_TRANSIENT_PER_LOGIT = 8
#: Tokens per chunk of agoq_core.laaq.chunked_linear_cross_entropy (its default).
CE_CHUNK = 4096
#: Bytes per hidden element alive while the LAAQ-kept final norm runs its backward under the chunked loss (HF's
#: fp32 RMSNorm through autograd): the recomputed norm's fp32 input and bf16 output (6), its dequantized input (2),
#: the incoming dh (2) and autograd's fp32 temporaries (20). Read off the allocator's history at the peak of an H100
#: step of LLaMA-2-7B at 128K tokens (benchmarks/mem_peak.py; docs/benchmarks.md §5.14): 16.11e9 bytes = 30.0 x
#: 131072 x 4096. Until then the head was modelled at the loss's moment only (10 B per element + one chunk's logits),
#: and a float8 plan whose peak is that moment came out 6.1% under at 128K.
HEAD_NORM_BACKWARD_B = 30
_SWIGLU_CHUNK_ELEMS = 1 << 28  # = agoq_core.laaq.functions.BACKWARD_CHUNK_ELEMS (no torch import here)


@dataclass(frozen=True)
class LayerOption:
    """One way to run a decoder layer: bytes it keeps, bytes on top during its backward, seconds."""

    name: str
    saved_bytes: int
    transient_bytes: int
    time_s: float
    """Forward + backward seconds of the layer (one micro-batch), recomputation and codecs included."""

    @property
    def kind(self) -> str:
        return self.name.split(":")[0]

    @property
    def fmt(self) -> str | None:
        return self.name.split(":", 1)[1] if ":" in self.name else None


@dataclass(frozen=True)
class HeadCost:
    saved_bytes: int
    transient_bytes: int
    time_s: float
    loss: str


def parse_option(name: str) -> tuple[str, str | None]:
    """``"laaq:int5"`` -> ("laaq", "int5"); checks the kind and the format. A kind may end in ``-c``
    (``bf16-c``, ``sac-c``, ``laaq-c:nf4``): the layer is torch.compile'd (such options need measured costs,
    ``plan_budget(measured=...)``: the analytic time model is for eager layers)."""
    if not isinstance(name, str):
        raise PlannerError(f"a budget option must be a string like 'laaq:nf4', got {name!r}")
    kind, _, fmt = name.strip().lower().partition(":")
    base = kind[:-2] if kind.endswith("-c") else kind
    if base in ("bf16", "ckpt", "sac"):
        if fmt:
            raise PlannerError(f"option {name!r}: {base} takes no format")
        return kind, None
    if base in ("laaq", "laaq-mlp", "qckpt"):
        if not fmt:
            raise PlannerError(f"option {name!r} needs a format, e.g. {kind}:nf4")
        return kind, check_candidates([fmt])[0]
    raise PlannerError(f"unknown budget option {name!r}; options are bf16, ckpt, sac, laaq:FMT, laaq-mlp:FMT, "
                       f"qckpt:FMT (FMT an activation format; a kind ending in -c is compiled), default "
                       f"{','.join(DEFAULT_OPTIONS)}")


def plan_options(costs: Mapping[str, Any], *, prefix: str = "") -> dict[str, Any]:
    """The entries of ``costs`` (a bench_layer_profile ``costs[seq]``) that are budget options, by option name.
    ``prefix``: only methods named ``prefix + option`` (e.g. ``"fp8-"``: the float8 variants), prefix dropped;
    without one, prefixed variants (``fp8-...``, ``fp8attn+...``) are not options and are left out."""
    out = {}
    for name, c in costs.items():
        if not name.startswith(prefix):
            continue
        try:
            parse_option(name[len(prefix):])
        except PlannerError:
            continue
        out[name[len(prefix):]] = c
    return out


#: Scaling measured costs up by more than this factor is flagged in the note (docs/benchmarks.md §5.12: 64K plans
#: from 32K costs were within 0.35% of the measured peak on an H100; 128K plans under-predicted it by 1.5-5.7%).
FAR_SCALE = 2.0

def costs_at_length(costs: Mapping[str, Mapping], seq_len: int, shape: TransformerShape, *, batch: int = 1,
                    device="H200") -> tuple[dict, str | None]:
    """The measured per-layer costs (``load_layer_costs``' ``{seq: {option: costs}}``) at ``seq_len``: as measured
    if the profile has that length, else those of the nearest measured length L scaled to ``seq_len`` (returned
    note says so): bytes by r = seq_len / L (a layer's saved and transient bytes are per token, flash attention
    included); times, where the profile grouped its kernels (``attention_s``), as attention x r^2 + the rest x r
    (causal attention is quadratic in the length, GEMMs and elementwise work linear), else by the analytic bf16
    layer's time at seq_len over its time at L (agoq_core.scale.compute). The analytic ratio fits bf16 layers
    (H200, 32K -> 64K: within 0.4%) but not float8 ones, whose faster GEMMs leave attention a larger share: 6-11%
    short there. With the measured split (and the H100's own device profile) the predicted step's error on an H100
    halved: 16K -> 32K -9.2% -> -4.4%, 64K -18.8% -> -10.0% (docs/laaq.md). Scaled costs rank the options as the
    measured ones do, except that an option measured faster than keeping the layer is not planned faster at the
    scaled length (:func:`layer_options`; each scaled entry carries ``SCALED_FROM``); their predicted peak is an
    extrapolation (check it against a run). ({}, None) when there are no costs at all."""
    from agoq_core.scale import compute as C

    if not costs:
        return {}, None
    if str(seq_len) in costs:
        return dict(costs[str(seq_len)]), None
    import math

    near = min((int(k) for k in costs), key=lambda L: (abs(math.log(L / seq_len)), L))
    dev = _dev(device)

    def t(n: int) -> float:
        lc = C.layer_cost(shape, n * batch, n, dev, elementwise="hf")
        return lc.forward + lc.backward + dev.layer_overhead_s

    fb, ft = seq_len / near, t(seq_len) / t(near)
    out, split = {}, 0
    for name, c in costs[str(near)].items():
        e = {k: v for k, v in c.items() if k != "attention_s"}
        e.update(saved_bytes=int(round(c["saved_bytes"] * fb)), transient_bytes=int(round(c["transient_bytes"] * fb)),
                 time_s=c["time_s"] * ft, **{SCALED_FROM: near})
        att = c.get("attention_s")
        if att is not None and 0 <= att <= c["time_s"]:  # the measured split: attention x r^2, the rest x r
            e.update(time_s=(c["time_s"] - att) * fb + att * fb * fb, attention_s=att * fb * fb)
            split += 1
        out[name] = e
    how = (f"time: attention x {fb * fb:.3g}, the rest x {fb:.3g}" if split == len(out) else
           f"time x {ft:.3g}" if not split else
           f"time: attention x {fb * fb:.3g} and the rest x {fb:.3g} for {split} options, x {ft:.3g} for the others")
    note = f"per-layer costs measured at {near} tokens, scaled to {seq_len} (bytes x {fb:.3g}, {how})"
    if fb > FAR_SCALE:
        note += (f"; more than {FAR_SCALE:g}x the measured length: such a plan under-predicted its peak by 1.5-5.7% "
                 "(H100, 128K from 32K; 2x was within 0.35%), so profile this length (bench_layer_profile.py --seqs "
                 f"{seq_len}) or leave more headroom")
    return out, note


def attention_seconds(row: Mapping) -> float | None:
    """The attention kernels' seconds, forward + backward, of a bench_layer_profile row that grouped its kernels
    (``fwd_groups_ms`` / ``bwd_groups_ms``), else None."""
    f, b = row.get("fwd_groups_ms"), row.get("bwd_groups_ms")
    if not isinstance(f, Mapping) or not isinstance(b, Mapping) or "attention" not in f or "attention" not in b:
        return None
    return (float(f["attention"]) + float(b["attention"])) / 1e3


def option_name(kind: str, fmt: str | None) -> str:
    return kind if fmt is None else f"{kind}:{fmt}"


def _dev(device):
    from agoq_core.scale.devices import device_profile

    return device_profile(device)


def layer_options(shape: TransformerShape, *, seq_len: int, batch: int = 1, device="H200",
                  options: Sequence[str] = DEFAULT_OPTIONS, measured: Mapping[str, Mapping] | None = None
                  ) -> list[LayerOption]:
    """Bytes and seconds of each option for one decoder layer of ``shape``.

    ``measured``: option name -> ``{"saved_bytes", "transient_bytes", "time_s"}`` measured for one layer at
    this sequence length and batch (``benchmarks/bench_layer_profile.py`` writes them under ``costs``);
    those replace the model's numbers. Compiled options (``-c``) exist only measured."""
    from agoq_core.scale import compute as C
    from agoq_core.scale.memory import hf_plain_layer_bytes

    dev = _dev(device)
    S, T = seq_len, seq_len * batch
    h, i = shape.hidden, shape.intermediate
    lc = C.layer_cost(shape, T, S, dev, elementwise="hf")
    base = lc.forward + lc.backward + dev.layer_overhead_s
    # HF's checkpointed layer runs its forward once more (non-reentrant); launches counted as a third of
    # the layer's forward+backward overhead (scale.single_gpu.h200_check, the same rule)
    recompute = lc.forward + dev.layer_overhead_s / 3
    plain = hf_plain_layer_bytes(shape, T)
    # backward workspace of a plain HF layer: dgate, dup, dh (3 x 2 B x i) + the attention / norm part
    work = 6 * T * i + LAAQ_TRANSIENT_FIT[1] * T * h
    rows = min(T, max(1, _SWIGLU_CHUNK_ELEMS // i))
    laaq_work = LAAQ_TRANSIENT_FIT[0] * rows * i + LAAQ_TRANSIENT_FIT[1] * T * h
    names = [parse_option(o) for o in options]
    fmts = sorted({f for k, f in names if k in ("laaq", "laaq-mlp")})
    table = ActivationCostTable.from_formula(shape, tokens=T, formats=fmts, seq_len=S) if fmts else None
    out, seen = [], set()
    measured = {option_name(*parse_option(k)): v for k, v in (measured or {}).items()}
    for kind, fmt in names:
        name = option_name(kind, fmt)
        if name in seen:
            continue
        seen.add(name)
        if name in measured:
            m = measured[name]
            try:
                out.append(LayerOption(name, int(m["saved_bytes"]), int(m["transient_bytes"]), float(m["time_s"])))
            except (KeyError, TypeError, ValueError) as exc:
                raise PlannerError(f"measured costs for {name!r} need saved_bytes, transient_bytes and time_s "
                                   f"(numbers), got {m!r}") from exc
            continue
        if kind.endswith("-c"):
            raise PlannerError(f"option {name!r} (compiled) has no analytic time model; give its measured per-layer "
                               f"costs (plan_budget(measured=...), from benchmarks/bench_layer_profile.py) or use "
                               f"{option_name(kind[:-2], fmt)!r}")
        if kind == "bf16":
            out.append(LayerOption(name, plain, work, base))
        elif kind == "laaq":
            lf, lb = C.laaq_overhead(shape, T, dev, fmt, quantize_attn_out=False, elementwise="hf")
            out.append(LayerOption(name, table.bytes_for(fmt), laaq_work, base + lf + lb))
        elif kind == "laaq-mlp":
            # the MLP half of hf_plain_layer_bytes (post-norm fp32 input + normalized + rstd, the gate/up input,
            # gate, up, silu(gate), down input) replaced by LAAQ's (post-norm input, gate and up in fmt)
            spec = get_format(fmt)
            mlp_plain = 6 * T * h + 4 * T + 2 * T * h + 8 * T * i
            mlp_laaq = spec.storage_bytes(T * h) + 2 * spec.storage_bytes(T * i)
            lf, lb = C.laaq_overhead(shape, T, dev, fmt, quantize_attn_out=False, elementwise="hf")
            share = (h + 2 * i) / (2 * h + 2 * i)  # of LAAQ's codec and recompute work: one norm and the MLP
            out.append(LayerOption(name, plain - mlp_plain + mlp_laaq, laaq_work, base + share * (lf + lb)))
        elif kind == "ckpt":
            out.append(LayerOption(name, 2 * T * h, plain + work, base + recompute))
        elif kind == "sac":
            # torchtitan's op-level SAC on an HF Llama layer (agoq_core.laaq.policy.sac_context_fn): keeps the
            # layer input, the outputs of mm 1, 3, 5, 7 of q, k, v, o, gate, up, down (q, v, gate, down) and
            # SDPA's output + fp32 logsumexp; recomputes k, o and up and every elementwise op
            kv = shape.kv_dim
            sac = 2 * T * (4 * h + kv + i) + 4 * T * shape.heads
            frac = (h * kv + h * h + h * i) / (2 * h * h + 2 * h * kv + 3 * h * i)
            out.append(LayerOption(name, sac, max(0, plain - sac + 2 * T * h) + work,
                                   base + frac * lc.gemm_fwd + lc.elementwise_fwd + dev.layer_overhead_s / 3))
        else:  # qckpt: the input in fmt, dequantized (2 B x T x h) while the layer is recomputed
            codec = C._codec_s(dev, "quantize", fmt, T * h) + C._codec_s(dev, "dequantize", fmt, T * h)
            out.append(LayerOption(name, get_format(fmt).storage_bytes(T * h), plain + work + 2 * T * h,
                                   base + recompute + codec))
    return _no_faster_than_keeping(out, {n for n, m in measured.items()
                                         if isinstance(m, Mapping) and m.get(SCALED_FROM) is not None})


#: Key of a :func:`costs_at_length` entry scaled from another length (its value: that length).
SCALED_FROM = "scaled_from"
#: Seconds an option is planned slower than keeping the layer at least, where :func:`_no_faster_than_keeping` applies:
#: at equal time the plan keeps the layer.
KEEP_TIE_S = 1e-6


def _no_faster_than_keeping(opts: list[LayerOption], scaled: set[str]) -> list[LayerOption]:
    """Options of ``scaled`` (costs scaled from another length) measured faster than keeping the layer in bf16 (same
    build, eager or ``-c``) are planned at bf16's time + :data:`KEEP_TIE_S`, so the plan keeps layers in bf16 wherever
    they fit. Whether LAAQ beats keeping a layer depends on the length: with float8 GEMMs on the H200 a LAAQ layer
    measured 1.6% faster at 32K, and whole models at 1.04x at 16K but 0.96x at 8K (docs/benchmarks.md §5.5), which a
    scaling of the 32K costs cannot tell apart -- planned from them, 8K quantized every layer and ran slower than
    keeping them. Costs measured at the length itself are trusted as they are; slower options keep their time."""
    keep = {o.name: o.time_s for o in opts if o.kind in ("bf16", "bf16-c")}
    out = []
    for o in opts:
        k = keep.get("bf16-c" if o.kind.endswith("-c") else "bf16")
        if o.name in scaled and k is not None and o.kind not in ("bf16", "bf16-c") and o.time_s < k + KEEP_TIE_S:
            o = dataclasses.replace(o, time_s=k + KEEP_TIE_S)
        out.append(o)
    return out


#: meta["input"] of a bench_layer_profile report whose saved bytes were measured with a non-leaf layer input
#: (since 2026-12-02).
INPUT_NON_LEAF = "non-leaf"
#: Methods that do not keep their bf16 input: a profile measured with a leaf input (no meta["input"]) counted it
#: for them (docs/bench/h200-2026-12-01-s2: bf16, laaq:nf4, laaq:int8 and qckpt:nf4 each measured exactly
#: 2 x T x h bytes (+ <= 1 KiB) above the planner's byte-exact count; laaq-c:nf4 measured the same bytes as
#: laaq:nf4). Methods that keep the input anyway (ckpt, sac, and -- not known, so left as measured, at worst
#: 2 x T x h high -- compiled plain and the attention half of laaq-mlp) are unaffected.
_LEAF_COUNTED = ("bf16", "laaq", "laaq-c", "qckpt", "qckpt-c")


def input_leaf_correction(costs: Mapping, hidden: int, batch: int = 1, meta: Mapping | None = None
                          ) -> tuple[dict, list[str]]:
    """``costs`` ({seq: {method: {saved_bytes, ...}}}) of a profile measured before INPUT_NON_LEAF with the
    layer input's bytes (2 x batch x seq x hidden, bf16) taken off the methods of _LEAF_COUNTED; unchanged
    for a newer profile. Returns (costs, notes)."""
    if (meta or {}).get("input") == INPUT_NON_LEAF:
        return {k: dict(v) for k, v in costs.items()}, []
    out: dict = {}
    notes = []
    for seq, by in costs.items():
        out[seq] = {}
        for m, c in by.items():
            if m.split(":")[0] in _LEAF_COUNTED:
                x = 2 * batch * int(seq) * hidden
                c = dict(c, saved_bytes=max(0, int(c["saved_bytes"]) - x))
                notes.append(f"{m}@{seq}: saved - {x} B (the leaf input the old profile counted)")
            out[seq][m] = c
    return out, notes


def load_layer_costs(reports: Sequence, *, hidden: int) -> tuple[dict, list[str]]:
    """Measured per-layer costs from ``benchmarks/bench_layer_profile.py`` reports (paths or parsed dicts):
    {seq: {option: {saved_bytes, transient_bytes, time_s}}}, merged over the reports (a later report's (seq,
    option) wins), each corrected for its own input (input_leaf_correction). Returns (costs, notes)."""
    import json
    from pathlib import Path

    costs: dict = {}
    notes: list[str] = []
    for r in reports:
        if not isinstance(r, Mapping):
            try:
                r = json.loads(Path(r).read_text())
            except (OSError, ValueError) as exc:
                raise PlannerError(f"cannot read the layer costs {r}: {exc}") from exc
        if not isinstance(r.get("costs"), Mapping):
            raise PlannerError("a layer-cost report needs 'costs' ({seq: {option: {saved_bytes, transient_bytes, "
                               "time_s}}}), as benchmarks/bench_layer_profile.py writes")
        batch = int((r.get("meta") or {}).get("batch", 1) or 1)
        c, n = input_leaf_correction(r["costs"], hidden, batch, r.get("meta"))
        notes += n
        for row in r.get("rows") or ():  # profiles written before attention_s: its split from the grouped rows
            if not isinstance(row, Mapping):
                continue
            by = c.get(str(row.get("seq")), {})
            entry = by.get(row.get("method"))
            att = attention_seconds(row) if entry is not None and "attention_s" not in entry else None
            if att is not None:
                by[row["method"]] = dict(entry, attention_s=att)
        for seq, by in c.items():
            costs.setdefault(str(seq), {}).update(by)
    return costs, notes


def head_cost(shape: TransformerShape, *, seq_len: int, batch: int = 1, device="H200",
              loss: Loss = "chunked") -> HeadCost:
    """Final norm + LM head + loss. ``chunked``: agoq_core.laaq.chunked_linear_cross_entropy (or Liger's
    fused linear cross-entropy) with the final norm under LAAQ: keeps the norm's nf4 input, recomputes
    each chunk's logits in backward. ``hf``: the model's own loss (fp32 logits)."""
    from agoq_core.scale import compute as C

    if loss not in ("chunked", "hf"):
        raise PlannerError(f"loss must be 'chunked' or 'hf', got {loss!r}")
    dev = _dev(device)
    T, h, V = seq_len * batch, shape.hidden, shape.vocab
    hf, hb = C.head_cost(shape, T, dev, elementwise="hf")
    if loss == "hf":
        # final norm (fp32 input, normalized bf16, fp32 rstd), LM-head input, fp32 log-softmax
        saved = 4 * T * h + 2 * T * h + 4 * T + 2 * T * h + 4 * T * V
        return HeadCost(saved, HF_LOSS_TRANSIENT_PER_LOGIT * T * V, hf + hb, loss)
    c = min(T, CE_CHUNK)
    saved = get_format("nf4").storage_bytes(T * h)
    # the larger of two moments: the loss's backward (one chunk's fp32 logits + softmax + bf16 grad, the
    # recomputed norm (fp32 + bf16), dh, fp32 dW) and the final norm's own backward after it, HEAD_NORM_BACKWARD_B
    # bytes per hidden element (measured: the allocator's live set at a 128K peak, docs/benchmarks.md §5.14)
    transient = max(10 * c * V + 8 * T * h + 2 * T * h + 4 * V * h, HEAD_NORM_BACKWARD_B * T * h)
    extra = 2.0 * T * h * V / dev.gemm_flops  # the logits GEMM again in backward
    return HeadCost(saved, transient, hf + hb + extra, loss)


# ---- the exact solver ---------------------------------------------------------------------------------
def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


@dataclass(frozen=True)
class _Solved:
    choices: tuple[int, ...]
    """Per position (the order backward frees them in reverse), the index of the chosen option."""
    time_ns: int
    saved: int
    transient: int
    """Peak minus ``saved``: what the worst moment of the backward holds on top of every layer's saved bytes
    (it can be less than a layer's own transient: that layer's backward runs after the layers above it
    freed theirs)."""

    @property
    def peak(self) -> int:
        return self.saved + self.transient


def sequence_peak(picked: Sequence[LayerOption], floor_transient: int = 0) -> int:
    """Peak of a backward over layers in this order (index 0 = the first layer, whose backward runs last):
    ``max(floor + sum saved, max_l (sum_{j <= l} saved_j + transient_l))`` -- while layer ``l``'s backward
    runs, the layers above it have freed what they kept; the head (``floor``) runs with all of them alive."""
    run, peak = 0, 0
    for o in picked:
        run += o.saved_bytes
        peak = max(peak, run + o.transient_bytes)
    return max(peak, run + floor_transient)


def _prune(units: Sequence[Sequence[LayerOption]]) -> list[list[int]]:
    """Per unit, the options no other option of the unit beats in saved, transient and time alike (ties:
    the first). Removing a dominated option never loses the optimum: putting the dominating one in its
    place lowers no constraint's slack and no time."""
    keep = []
    for u in units:
        k = []
        for j, o in enumerate(u):
            key = (o.saved_bytes, o.transient_bytes, _ns(o.time_s))
            dominated = False
            for i, p in enumerate(u):
                if i == j:
                    continue
                pk = (p.saved_bytes, p.transient_bytes, _ns(p.time_s))
                if all(a <= b for a, b in zip(pk, key)) and (pk != key or i < j):
                    dominated = True
                    break
            if not dominated:
                k.append(j)
        keep.append(k)
    return keep


def solve_budget(units: Sequence[Sequence[LayerOption]], cap: int, *, floor_transient: int = 0,
                 reorder: bool = False, use_time: bool = True) -> _Solved | None:
    """Per unit one option, minimising summed time, with :func:`sequence_peak` ``<= cap``.

    ``reorder=False``: the units are layers in this order. ``reorder=True``: the units are interchangeable
    (every unit has the same options, as the decoder layers of one model) and the layers may be placed in
    any order: the answer lists them with the largest transient first (an exchange argument shows that
    order minimises the peak of any given mix: swapping a neighbouring pair into it lowers or keeps the
    larger of their two constraints), which the solver enforces while it searches.

    Exact: a dynamic programme over positions keeping, per state, only assignments no other beats in
    saved bytes so far, the running peak and time (integer nanoseconds) at once -- the rest of the
    sequence affects all of them alike. None when nothing fits. Ties: the lower peak.
    ``use_time=False`` minimises the peak alone (what the smallest budget is)."""
    if not units or any(len(u) == 0 for u in units):
        raise PlannerError("solve_budget: every unit needs at least one option")
    if reorder and any([(o.name, o.saved_bytes, o.transient_bytes, o.time_s) for o in u] !=
                       [(o.name, o.saved_bytes, o.transient_bytes, o.time_s) for o in units[0]] for u in units):
        raise PlannerError("solve_budget(reorder=True) needs units with the same options (interchangeable layers)")
    keep = _prune(units)
    if reorder:
        u0 = units[0]
        # largest transient first; the rank constrains the sequence to non-increasing transients
        ranked = sorted(keep[0], key=lambda j: (-u0[j].transient_bytes, j))
        rank = {j: r for r, j in enumerate(ranked)}
    # state key: (rank of the last option or 0) -> list of (saved, running peak, time, back-pointer)
    states: dict[int, list[tuple[int, int, int, tuple | None]]] = {0: [(0, 0, 0, None)]}
    n = len(units)
    for pos in range(n):
        u = units[pos]
        nxt: dict[int, list] = {}
        for r, lst in states.items():
            for s, m, t, bp in lst:
                for j in keep[pos]:
                    if reorder and rank[j] < r:
                        continue
                    o = u[j]
                    s2 = s + o.saved_bytes
                    m2 = max(m, s2 + o.transient_bytes)
                    if m2 > cap or s2 + floor_transient > cap:
                        continue
                    t2 = t + (_ns(o.time_s) if use_time else 0)
                    nxt.setdefault(rank[j] if reorder else 0, []).append((s2, m2, t2, (bp, j)))
        states = {r: _pareto(lst) for r, lst in nxt.items()}
        if not states:
            return None
    best = None
    for lst in states.values():
        for s, m, t, bp in lst:
            peak = max(m, s + floor_transient)
            if best is None or (t, peak) < (best[0], best[1]):
                best = (t, peak, s, bp)
    t, peak, s, bp = best
    ch: list[int] = []
    while bp is not None:
        bp, j = bp
        ch.append(j)
    ch.reverse()
    return _Solved(tuple(ch), t, s, peak - s)


def _pareto(lst: list) -> list:
    """Entries no other entry beats in (saved, running peak, time) at once; for equal triples the first."""
    import bisect

    lst.sort(key=lambda e: (e[0], e[2], e[1]))
    out: list = []
    # staircase of the kept entries' (time, peak): times ascending, peaks strictly descending, so the
    # smallest peak among entries at most as slow as t is the one just left of t's insertion point
    times: list[int] = []
    peaks: list[int] = []
    for e in lst:
        s, m, t, _ = e
        i = bisect.bisect_right(times, t)
        if i and peaks[i - 1] <= m:
            continue
        out.append(e)
        j = i
        while j < len(times) and peaks[j] >= m:
            j += 1
        times[i:j] = [t]
        peaks[i:j] = [m]
    return out


# ---- the verb -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BudgetPlan:
    """Per-layer choice, its predicted peak and step time. ``apply`` with agoq_core.laaq.apply_policy."""

    model: str
    shape: TransformerShape
    seq_len: int
    batch: int
    device: str
    budget_bytes: int
    usable_bytes: int
    headroom: float
    loss: str
    choices: tuple[str, ...]
    """Per decoder layer (index = layer): an option name (bf16, laaq:FMT, ckpt, qckpt:FMT)."""
    options: tuple[LayerOption, ...]
    head: HeadCost
    static: dict[str, int]
    fixed_bytes: int
    saved_bytes: int
    transient_bytes: int
    layer_time_s: float
    head_time_s: float
    optimizer_time_s: float
    grads_time_s: float = 0.0
    """What the gradient storage adds per step (QuanGrad's FP8 buffers: scale.compute.grad_storage_seconds)."""
    grads: str = "bf16"
    """The gradient storage planned with: bf16 / fp32 ``.grad``, or quangrad (QuanGrad's FP8 buffers)."""
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def peak_bytes(self) -> int:
        return sum(self.static.values()) + self.fixed_bytes + self.saved_bytes + self.transient_bytes

    @property
    def step_time_s(self) -> float:
        return self.layer_time_s + self.head_time_s + self.optimizer_time_s + self.grads_time_s

    @property
    def tokens_per_s(self) -> float:
        return self.seq_len * self.batch / self.step_time_s

    @property
    def mix(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.choices:
            out[c] = out.get(c, 0) + 1
        return out

    def layers_with(self, kind: str) -> list[int]:
        return [i for i, c in enumerate(self.choices) if c.split(":")[0] == kind]

    def to_dict(self) -> dict:
        return {
            "model": self.model, "seq_len": self.seq_len, "batch": self.batch, "device": self.device,
            "budget_bytes": self.budget_bytes, "usable_bytes": self.usable_bytes, "headroom": self.headroom,
            "loss": self.loss, "grads": self.grads, "choices": list(self.choices), "mix": self.mix,
            "predicted_peak_bytes": self.peak_bytes, "predicted_step_s": self.step_time_s,
            "predicted_tokens_per_s": self.tokens_per_s,
            "peak_parts": {**self.static, "fixed": self.fixed_bytes, "saved_layers": self.saved_bytes,
                           "transient": self.transient_bytes},
            "time_parts": {"layers": self.layer_time_s, "head": self.head_time_s, "optimizer": self.optimizer_time_s,
                           "grads": self.grads_time_s},
            "options": [o.__dict__ for o in self.options], "head": self.head.__dict__, "notes": list(self.notes),
        }

    def render(self) -> str:
        from agoq_core.planner.explain import fmt_bytes

        by = {o.name: o for o in self.options}
        lines = [f"memory-budget policy: {self.model}, {self.batch} x {self.seq_len} tokens, {self.device}, "
                 f"budget {fmt_bytes(self.budget_bytes)} (plans to {fmt_bytes(self.usable_bytes)}: "
                 f"{self.headroom:.0%} headroom), loss {self.loss}, gradients "
                 f"{'FP8 (QuanGrad)' if self.grads == 'quangrad' else self.grads}",
                 "", f"  {'option':<11} {'layers':>6} {'keeps/layer':>12} {'+backward':>11} {'ms/layer':>9}  which"]
        for name, n in sorted(self.mix.items(), key=lambda kv: self.choices.index(kv[0])):
            o = by[name]
            idx = [i for i, c in enumerate(self.choices) if c == name]
            lines.append(f"  {name:<11} {n:>6} {fmt_bytes(o.saved_bytes):>12} {fmt_bytes(o.transient_bytes):>11} "
                         f"{o.time_s * 1e3:>9.1f}  {_ranges(idx)}")
        st = self.static
        lines += ["", f"  predicted peak {fmt_bytes(self.peak_bytes)} = weights {fmt_bytes(st['params'])} + grads "
                      f"{fmt_bytes(st['grads'])} + optimizer {fmt_bytes(st['optimizer'])} + ids/RoPE "
                      f"{fmt_bytes(self.fixed_bytes)} + saved {fmt_bytes(self.saved_bytes)} + backward peak on top "
                      f"{fmt_bytes(self.transient_bytes)}",
                  f"  predicted step {self.step_time_s:.3f} s = layers {self.layer_time_s:.3f} + head/loss "
                  f"{self.head_time_s:.3f} + optimizer {self.optimizer_time_s:.3f}"
                  + (f" + FP8 gradients {self.grads_time_s:.3f}" if self.grads_time_s else "")
                  + f"  ->  {self.tokens_per_s:,.0f} tokens/s"]
        lines += [f"  note: {n}" for n in self.notes]
        lines += ["  options considered (per layer): " + ", ".join(
            f"{o.name} {fmt_bytes(o.saved_bytes)}/{o.time_s * 1e3:.1f} ms" for o in self.options)]
        return "\n".join(lines)


def _ranges(xs: Sequence[int]) -> str:
    out, i = [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(out)


def plan_budget(model: object, *, budget: int | str, seq_len: int, batch: int = 1, device="H200",
                options: Sequence[str] | str = DEFAULT_OPTIONS, loss: Loss | Literal["auto"] = "chunked",
                headroom: float = 0.02, static: StaticMemoryConfig = BUDGET_STATIC,
                measured: Mapping[str, Mapping] | None = None, grads: str | None = None) -> BudgetPlan:
    """The per-layer mix with the highest predicted tokens/s whose predicted peak fits ``budget``.

    ``model``: a preset name, a TransformerShape or an HF config/model. ``budget``: bytes or a string
    (``"80GiB"``) of memory the process may allocate; ``headroom`` of it is left for the allocator.
    ``measured``: per-layer costs measured at this sequence length (see :func:`layer_options`).
    ``loss="auto"``: the loss is chosen too — the model's own (``hf``: fp32 logits kept, no recomputation) where
    that plan is predicted faster and fits, else the chunked one (the plan's ``loss`` says which).
    ``grads``: the gradient storage in place of ``static.grads`` (bf16, fp32, quangrad), or ``"auto"``: QuanGrad's
    FP8 buffers where that plan is predicted faster (the memory they free buys layers out of recomputation; their
    step costs scale.compute.grad_storage_seconds), else bf16 (the plan's ``grads`` says which).
    Raises BudgetError naming the smallest budget that fits when nothing does."""
    if grads == "auto":  # bf16 first: it wins a tie
        return _fastest(lambda kind: plan_budget(
            model, budget=budget, seq_len=seq_len, batch=batch, device=device, options=options, loss=loss,
            headroom=headroom, static=dataclasses.replace(static, grads=kind), measured=measured),
            ("bf16", "quangrad"), "gradients")
    if grads is not None:
        static = dataclasses.replace(static, grads=grads)  # StaticMemoryConfig checks the name
    if loss == "auto":  # chunked first: it wins a tie
        return _fastest(lambda kind: plan_budget(
            model, budget=budget, seq_len=seq_len, batch=batch, device=device, options=options, loss=kind,
            headroom=headroom, static=static, measured=measured), ("chunked", "hf"), "loss")
    from agoq_core.planner.explain import fmt_bytes, parse_bytes
    from agoq_core.scale import compute as C

    shape = model_shape(model)
    for what, v in (("seq_len", seq_len), ("batch", batch)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise PlannerError(f"{what} must be an int >= 1, got {v!r}")
    if not 0 <= headroom < 0.5:
        raise PlannerError(f"headroom must be in [0, 0.5), got {headroom!r}")
    budget_b = parse_bytes(budget) if isinstance(budget, str) else budget
    if isinstance(budget_b, bool) or not isinstance(budget_b, int) or budget_b <= 0:
        raise PlannerError(f"budget must be a positive number of bytes or a string like '80GiB', got {budget!r}")
    if isinstance(options, str):
        options = [o for o in options.split(",") if o.strip()]
    if not options:
        raise PlannerError(f"no budget options given; choose from bf16, ckpt, laaq:FMT, qckpt:FMT "
                           f"(default {','.join(DEFAULT_OPTIONS)})")
    dev = _dev(device)
    T = seq_len * batch
    opts = layer_options(shape, seq_len=seq_len, batch=batch, device=dev, options=options, measured=measured)
    head = head_cost(shape, seq_len=seq_len, batch=batch, device=dev, loss=loss)
    params = _params(shape)
    st = static_bytes(params, static)
    fixed = _fixed(shape, T)
    usable = int(budget_b * (1.0 - headroom))
    cap = usable - sum(st.values()) - fixed  # the head's saved bytes enter through the floor
    floor = head.saved_bytes + head.transient_bytes
    sol = solve_budget([opts] * shape.layers, cap, floor_transient=floor, reorder=True)
    if sol is None:
        # the true minimum over all mixes and orders: the smallest peak, time ignored
        lo = solve_budget([opts] * shape.layers, 1 << 62, floor_transient=floor, reorder=True, use_time=False)
        need = sum(st.values()) + fixed + lo.peak
        fp8 = ""
        if static.grads != "quangrad":  # what QuanGrad's FP8 gradient buffers would bring the floor down to
            st_q = static_bytes(params, dataclasses.replace(static, grads="quangrad"))
            need_q = need - sum(st.values()) + sum(st_q.values())
            fp8 = (f", or FP8 gradients (grads='quangrad', `agoq plan --grads quangrad`: at least "
                   f"{fmt_bytes(math.ceil(need_q / (1.0 - headroom)))})")
        raise BudgetError(
            f"{shape.name} at {batch} x {seq_len} tokens does not fit {fmt_bytes(budget_b)} ({fmt_bytes(usable)} "
            f"after {headroom:.0%} headroom) with any per-layer mix of {', '.join(o.name for o in opts)}: the "
            f"smallest needs {fmt_bytes(need)} = static {fmt_bytes(sum(st.values()))} (weights, grads, optimizer) + "
            f"{fmt_bytes(need - sum(st.values()))} of activations; need a budget of at least "
            f"{fmt_bytes(math.ceil(need / (1.0 - headroom)))}, or a shorter sequence, or smaller options "
            f"(qckpt:nf4 keeps the least){fp8}")
    picked = [opts[j] for j in sol.choices]
    lf = sum(o.time_s for o in picked)
    notes = [_peak_note(picked, floor)]
    if budget_b > dev.memory_bytes:
        notes.append(f"the budget {fmt_bytes(budget_b)} is more than the {dev.name} holds ({fmt_bytes(dev.memory_bytes)}"
                     f" in its profile): on that card this plan runs out of memory; give a budget within the card's "
                     "memory, or the device the plan is for (apply_policy also warns when a plan exceeds the device "
                     "the model is on)")
    return BudgetPlan(
        model=shape.name, shape=shape, seq_len=seq_len, batch=batch, device=dev.name, budget_bytes=budget_b,
        usable_bytes=usable, headroom=headroom, loss=loss, choices=tuple(o.name for o in picked), options=tuple(opts),
        head=head, static=st, fixed_bytes=fixed, saved_bytes=sol.saved, transient_bytes=sol.transient,
        layer_time_s=lf, head_time_s=head.time_s, optimizer_time_s=C.optimizer_seconds(params, dev, static.optimizer),
        grads_time_s=C.grad_storage_seconds(params, dev, static.grads), grads=static.grads, notes=tuple(notes))


def _fastest(plan_with, kinds: Sequence[str], what: str) -> BudgetPlan:
    """The plan of ``plan_with(kind)`` predicted fastest among the ``kinds`` that fit (the first wins a tie); the
    first kind's BudgetError when none fits. The plan's notes say what each kind predicted (``what``: the choice
    made, e.g. "gradients"), so a user sees why, and how close it was."""
    plans, first_error, seen = [], None, []
    for kind in kinds:
        try:
            plans.append((kind, plan_with(kind)))
            seen.append(f"{kind} {plans[-1][1].step_time_s:.3f} s")
        except BudgetError as exc:
            first_error = first_error or exc
            seen.append(f"{kind} does not fit")
    if not plans:
        raise first_error
    picked, best = min(plans, key=lambda kp: kp[1].step_time_s)
    tie = sum(p.step_time_s == best.step_time_s for _, p in plans) > 1
    note = (f"{what} chosen by predicted step: {', '.join(seen)} -> {picked}"
            + (" (a tie: the first listed is kept)" if tie else ""))
    return dataclasses.replace(best, notes=tuple(best.notes) + (note,))


def _peak_note(picked: Sequence[LayerOption], floor: int) -> str:
    run, where, peak = 0, None, -1
    for i, o in enumerate(picked):
        run += o.saved_bytes
        if run + o.transient_bytes > peak:
            peak, where = run + o.transient_bytes, i
    if run + floor >= peak:
        return ("the peak is reached in the head's backward (the loss, then the final norm; all layers' saved bytes "
                "alive)")
    return (f"the peak is reached while layer {where}'s backward runs ({picked[where].name}: its workspace"
            f"{' and recomputation' if picked[where].kind in ('ckpt', 'qckpt') else ''}, layers 0-{where} still "
            "holding what they kept)")


def plan_for_choices(model: object, choices: Sequence[str], *, seq_len: int, batch: int = 1, device="H200",
                     loss: Loss = "chunked", static: StaticMemoryConfig = BUDGET_STATIC,
                     budget: int | str | None = None, measured: Mapping[str, Mapping] | None = None) -> BudgetPlan:
    """The predicted peak and step time of a given per-layer mix, in the given layer order (e.g. a plan
    recorded by a benchmark, or ``["laaq:nf4"] * 32``); nothing is solved. ``budget`` only fills the
    plan's budget fields (default: the predicted peak)."""
    from agoq_core.planner.explain import parse_bytes
    from agoq_core.scale import compute as C

    shape = model_shape(model)
    if len(choices) != shape.layers:
        raise PlannerError(f"{len(choices)} choices for {shape.layers} decoder layers of {shape.name}")
    names = [option_name(*parse_option(c)) for c in choices]
    dev = _dev(device)
    opts = layer_options(shape, seq_len=seq_len, batch=batch, device=dev, options=list(dict.fromkeys(names)),
                         measured=measured)
    by = {o.name: o for o in opts}
    picked = [by[n] for n in names]
    head = head_cost(shape, seq_len=seq_len, batch=batch, device=dev, loss=loss)
    params = _params(shape)
    st = static_bytes(params, static)
    fixed = _fixed(shape, seq_len * batch)
    floor = head.saved_bytes + head.transient_bytes
    saved = sum(o.saved_bytes for o in picked)
    peak = sequence_peak(picked, floor)
    total = sum(st.values()) + fixed + peak
    b = total if budget is None else (parse_bytes(budget) if isinstance(budget, str) else budget)
    return BudgetPlan(
        model=shape.name, shape=shape, seq_len=seq_len, batch=batch, device=dev.name, budget_bytes=b,
        usable_bytes=b, headroom=0.0, loss=loss, choices=tuple(names), options=tuple(opts), head=head, static=st,
        fixed_bytes=fixed, saved_bytes=saved, transient_bytes=peak - saved, layer_time_s=sum(o.time_s for o in picked),
        head_time_s=head.time_s, optimizer_time_s=C.optimizer_seconds(params, dev, static.optimizer),
        grads_time_s=C.grad_storage_seconds(params, dev, static.grads), grads=static.grads,
        notes=(_peak_note(picked, floor),))


def _params(shape: TransformerShape) -> int:
    return shape.layers * shape.layer_params + shape.embed_params + (
        0 if shape.tie_embeddings else shape.vocab * shape.hidden) + shape.hidden


def _fixed(shape: TransformerShape, tokens: int) -> int:
    return 8 * tokens + 2 * 2 * tokens * shape.head_dim  # token ids (int64) + RoPE cos/sin (bf16), shared
