"""Plans as a table for people and as a dict for machines (``agoq plan`` and ``agoq plan --json``)."""
from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from agoq_core.planner.plan import Plan

__all__ = ["render_plan", "plan_to_dict", "fmt_bytes", "parse_bytes"]

_SUFFIX = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
           "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """``"80GiB"``, ``"12e9"``, ``"512 MiB"`` or ``"1000"`` -> bytes."""
    from agoq_core.planner.errors import PlannerError

    s = str(text).strip().lower().replace(" ", "").replace("_", "")
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    suf = s[len(num):]
    try:
        value = float(num)
    except ValueError:
        value = None
    if value is None or suf not in _SUFFIX or value < 0 or not math.isfinite(value * _SUFFIX[suf]):
        raise PlannerError(f"cannot read {text!r} as bytes (a finite number >= 0 with an optional unit); "
                           "write e.g. 80GiB, 12e9, 512MiB or 1000")
    return int(round(value * _SUFFIX[suf]))


def fmt_bytes(n: float, unit: str = "B") -> str:
    if unit != "B":
        return f"{n:,.0f} {unit}"
    for u, s in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= s:
            return f"{n / s:,.2f} {u}"
    return f"{n:,.0f} B"


def _ranges(xs: Sequence[int]) -> str:
    xs = sorted(xs)
    if not xs:
        return "-"
    out, start, prev = [], xs[0], xs[0]
    for x in xs[1:] + [None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    return ",".join(out)


def _formats(fmts: dict[int, str], order: Sequence[str]) -> str:
    c = Counter(fmts.values())
    return " ".join(f"{f}x{c[f]}" for f in order if c[f])


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(header, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(str(x).ljust(w) for x, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def render_plan(plan: "Plan", torch_check: str | None = None) -> str:
    cfg, spec, u = plan.config, plan.spec, plan.costs.unit
    out = [f"DBCA-PP plan: {plan.shape.name}, {spec.schedule}, {spec.stages} stages x {spec.chunks} chunk(s), "
           f"{spec.microbatches} micro-batches of {cfg.microbatch_size} x {cfg.seq_len} tokens, "
           f"granularity={cfg.granularity}"]
    if torch_check:
        out.append(f"schedule: {torch_check}")
    out.append(f"activations: {plan.costs.source}")
    out.append(f"fidelity: {plan.fidelity.source}; SQNR dB " + ", ".join(
        f"{f} {plan.fidelity.sqnr_db(f):.1f}" for f in cfg.candidates))
    if plan.budget_kind == "uniform-baseline":
        out.append(f"budget: activation peak of the fullest stage with {cfg.baseline_format} everywhere = "
                   f"{fmt_bytes(plan.budget, u)} per stage (the paper's rule)")
    elif plan.budget_kind == "device":
        out.append(f"budget: {fmt_bytes(plan.budget, u)} of device memory per stage (weights + gradients "
                   f"[{cfg.static.grads}] + optimizer [{cfg.static.optimizer}] + activations)")
    else:
        out.append(f"budget: {fmt_bytes(plan.budget, u)} of activations per stage")
    out.append("")
    rows = []
    for s in plan.stages:
        peaks = "+".join(str(p) for p in s.chunk_peaks) if len(s.chunk_peaks) > 1 else ""
        rows.append([
            str(s.stage), f"{s.inflight_peak}" + (f" ({peaks})" if peaks else ""),
            _ranges([layer for ch in s.layers for layer in ch]), _formats(s.formats, cfg.candidates),
            " / ".join(fmt_bytes(b, u) for b in s.chunk_bytes), fmt_bytes(s.activation_peak, u),
            fmt_bytes(s.activation_cap, u), f"{100 * s.activation_peak / s.activation_cap:.1f}%"
            if s.activation_cap > 0 else "-",
            fmt_bytes(s.baseline_peak, u), fmt_bytes(s.static_bytes) if u == "B" else "-", s.binding])
    out.append(_table(rows, ["stage", "in flight", "layers", "formats", "act/micro-batch per chunk",
                             "act peak", "act budget", "used", f"{cfg.baseline_format} peak", "static",
                             "binding constraint"]))
    out.append("in flight = peak micro-batches whose activations are alive, counted in one chunk's "
               "activations and summed over the stage's chunks (per chunk in brackets)")
    if plan.closed_form:
        out.append("")
        base_bits = plan.closed_form[0].unit_budget // max(plan.profile.peaks)
        out.append(f"paper closed form B_i = {base_bits} x N_max / N_i, rounded to the nearest available width:")
        rows = []
        for s, c in zip(plan.stages, plan.closed_form):
            rows.append([str(s.stage), str(s.inflight_peak), f"{c.bits_exact:.2f}", str(c.bits), c.format,
                         f"{c.units} vs {c.unit_budget}" + (" OVER" if c.units > c.unit_budget else ""),
                         fmt_bytes(c.peak, u), "yes" if c.fits else f"NO (+{fmt_bytes(c.peak - s.activation_cap, u)})",
                         f"{c.cost:.4g}", f"{s.cost:.4g}"])
        out.append(_table(rows, ["stage", "N_i", "B_i exact", "bits", "format", "B_i*N_i vs budget",
                                 "act peak", "fits", "error (closed form)", "error (plan)"]))
        tot_c = sum(c.cost for c in plan.closed_form)
        tot_p = sum(s.cost for s in plan.stages)
        over = [s.stage for s, c in zip(plan.stages, plan.closed_form) if not c.fits]
        if over:
            out.append(f"expected squared error per micro-batch (elements x NSR): plan {tot_p:.4g} within the budget "
                       f"on every stage; closed form {tot_c:.4g} but over the budget on stage(s) {over} (its lower "
                       f"error there uses memory the stage does not have)")
        else:
            out.append(f"expected squared error per micro-batch (elements x NSR): plan {tot_p:.4g}, closed form "
                       f"{tot_c:.4g} (both within the budget; the plan is optimal, so it is never higher)")
    return "\n".join(out)


def plan_to_dict(plan: "Plan") -> dict:
    cfg = plan.config
    return {
        "model": plan.shape.name,
        "shape": {k: getattr(plan.shape, k) for k in ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab")},
        "schedule": plan.spec.schedule, "stages": plan.spec.stages, "chunks": plan.spec.chunks,
        "microbatches": plan.spec.microbatches, "microbatch_size": cfg.microbatch_size, "seq_len": cfg.seq_len,
        "dtype": cfg.dtype, "granularity": cfg.granularity, "candidates": list(cfg.candidates), "baseline_format": cfg.baseline_format,
        "unit": plan.costs.unit, "activation_source": plan.costs.source,
        "activation_costs": {"layer_bytes": dict(plan.costs.layer_bytes),
                             "layer_fixed_bytes": plan.costs.layer_fixed_bytes,
                             "first_stage_bytes": plan.costs.first_stage_bytes,
                             "last_stage_bytes": plan.costs.last_stage_bytes,
                             "chunk_bytes": plan.costs.chunk_bytes, "tokens": plan.costs.tokens},
        "fidelity": {"source": plan.fidelity.source, "nsr": dict(plan.fidelity.nsr)},
        "budget": {"kind": plan.budget_kind, "value": plan.budget},
        "stages_plan": [{
            "stage": s.stage, "virtual_stages": list(s.vstages), "layers": [list(c) for c in s.layers],
            "formats": {str(k): v for k, v in sorted(s.formats.items())},
            "inflight_peak": s.inflight_peak, "chunk_peaks": list(s.chunk_peaks),
            "inflight_states": [list(a) for a in plan.profile.ranks[s.stage].states],
            "chunk_bytes_per_microbatch": list(s.chunk_bytes), "activation_peak": s.activation_peak,
            "activation_cap": s.activation_cap, "baseline_peak": s.baseline_peak, "static": dict(s.static),
            "device_peak": s.device_peak if plan.costs.unit == "B" else None,
            "binding_state": list(s.binding_state), "binding": s.binding, "expected_error": s.cost,
        } for s in plan.stages],
        "closed_form": None if plan.closed_form is None else [{
            "stage": i, "bits_exact": c.bits_exact, "bits": c.bits, "format": c.format, "units": c.units,
            "unit_budget": c.unit_budget, "activation_peak": c.peak, "fits": c.fits, "expected_error": c.cost,
        } for i, c in enumerate(plan.closed_form)],
    }
