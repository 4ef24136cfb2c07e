"""The run's figure: loss curves (train, smoothed, and held-out) and gradient norms, one line per arm."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

__all__ = ["plot_curves", "plot_val_gap", "plot_grad_errors", "grad_error_table", "layer_type", "read_metrics"]

_COLORS = {"baseline": "#1f77b4", "agoq": "#d62728", "uniform4-attn": "#9467bd",
           "naive-fp8-allreduce": "#ff7f0e", "int8-everywhere": "#2ca02c", "laaq-only": "#8c564b",
           "quangrad-only": "#e377c2"}


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a run's metrics.jsonl."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _ema(xs: list[float], alpha: float) -> list[float]:
    out, acc = [], None
    for x in xs:
        acc = x if acc is None else alpha * x + (1 - alpha) * acc
        out.append(acc)
    return out


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display on servers; also keeps tests headless
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, out: str | Path) -> Path:
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=110)
    _pyplot().close(fig)
    return out


def plot_curves(records: Iterable[dict[str, Any]], out: str | Path, *, title: str = "") -> Path:
    """Write a two-panel PNG: (left) loss vs tokens, (right) global gradient norm vs step."""
    plt = _pyplot()
    steps: dict[str, list[dict[str, Any]]] = {}
    evals: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r["kind"] in ("step", "eval"):
            (steps if r["kind"] == "step" else evals).setdefault(r["arm"], []).append(r)
    fig, (ax_l, ax_g) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, arm in enumerate(dict.fromkeys([*steps, *evals])):
        color = _COLORS.get(arm, f"C{i}")
        srs = steps.get(arm, [])
        if srs:
            tok = [r["tokens"] / 1e6 for r in srs]
            loss = [r["loss"] for r in srs]
            alpha = 2.0 / (1 + max(2, min(50, len(srs) // 10)))
            ax_l.plot(tok, loss, color=color, alpha=0.15, lw=0.8)
            ax_l.plot(tok, _ema(loss, alpha), color=color, lw=1.6, label=f"{arm} train (EMA)")
            ax_g.plot([r["step"] for r in srs], [r["grad_norm"] for r in srs], color=color, lw=1.0, label=arm,
                      alpha=0.8)
        ers = evals.get(arm, [])
        if ers:
            ax_l.plot([r["tokens"] / 1e6 for r in ers], [r["val_loss"] for r in ers], color=color, ls="--",
                      marker="o", ms=3.5, lw=1.2, label=f"{arm} validation")
    ax_l.set_xlabel("training tokens (millions)")
    ax_l.set_ylabel("cross-entropy (nats/token)")
    ax_l.set_title("loss")
    ax_l.grid(alpha=0.3)
    ax_l.legend(fontsize=8)
    ax_g.set_xlabel("optimizer step")
    ax_g.set_ylabel("global gradient norm (before clipping)")
    ax_g.set_yscale("log")
    ax_g.set_title("gradient norm")
    ax_g.grid(alpha=0.3, which="both")
    ax_g.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, out)


def plot_val_gap(records: Iterable[dict[str, Any]], out: str | Path, *, title: str = "",
                 tolerance: float = 0.01) -> Path:
    """Write a PNG of each arm's held-out loss relative to the baseline's, (arm - base) / base, per
    evaluation, with the +-``tolerance`` band (the convergence criterion)."""
    plt = _pyplot()

    evals: dict[str, dict[int, float]] = {}
    for r in records:
        if r["kind"] == "eval":
            evals.setdefault(r["arm"], {})[r["step"]] = r["val_loss"]
    base = evals.get("baseline")
    if not base:
        raise ValueError("plot_val_gap needs the baseline arm's evaluations")
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.axhspan(-100 * tolerance, 100 * tolerance, color="0.9", label=f"within {tolerance:.0%}")
    ax.axhline(0, color=_COLORS["baseline"], lw=1)
    for i, (arm, ev) in enumerate(evals.items()):
        if arm == "baseline":
            continue
        steps = sorted(s for s in ev if s in base)
        ax.plot(steps, [100 * (ev[s] - base[s]) / base[s] for s in steps], marker="o", ms=3.5,
                color=_COLORS.get(arm, f"C{i}"), label=arm)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("validation loss vs baseline (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    return _save(fig, out)


#: Parameter name fragment -> layer type, in the order the figures and tables list them.
LAYER_TYPES = {"embed_tokens": "embed", "q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o",
               "gate_proj": "gate", "up_proj": "up", "down_proj": "down", "input_layernorm": "norm",
               "post_attention_layernorm": "norm", "model.norm": "norm", "lm_head": "head"}


def layer_type(name: str) -> str:
    """``model.layers.3.self_attn.q_proj.weight`` -> ``q`` (see LAYER_TYPES); other names -> ``other``."""
    for frag, t in LAYER_TYPES.items():
        if frag in name:
            return t
    return "other"


def _layer_index(name: str) -> int | None:
    parts = name.split(".")
    for a, b in zip(parts, parts[1:]):
        if a == "layers" and b.isdigit():
            return int(b)
    return None


def grad_error_table(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """From ``grad_error`` records (``agoq train --grad-error-every``): per arm, per layer type, the
    mean over recorded steps and parameters of the normalised error and of the collective's share."""
    acc: dict[str, dict[str, list[list[float]]]] = {}
    for r in records:
        if r["kind"] != "grad_error":
            continue
        for name, (err, coll, _norm) in r["errors"].items():
            acc.setdefault(r["arm"], {}).setdefault(layer_type(name), []).append([err, coll])
    order = list(dict.fromkeys([*LAYER_TYPES.values(), "other"]))
    return {arm: {t: {"error": sum(e for e, _ in v) / len(v), "collective_error": sum(c for _, c in v) / len(v),
                      "params_x_steps": len(v)}
                  for t in order if (v := types.get(t))}
            for arm, types in acc.items()}


def plot_grad_errors(records: Iterable[dict[str, Any]], out: str | Path, *, title: str = "") -> Path:
    """Write a three-panel PNG of the reduced gradients' normalised L2 error against the exact fp32 sum
    (``grad_error`` records): by layer type, by decoder layer, and over the steps, one colour per arm."""
    plt = _pyplot()
    recs = [r for r in records if r["kind"] == "grad_error"]
    if not recs:
        raise ValueError("no grad_error records: run agoq train with --virtual-ranks W --grad-error-every N")
    table = grad_error_table(recs)
    arms = list(table)
    fig, (ax_t, ax_l, ax_s) = plt.subplots(1, 3, figsize=(16, 4.5))
    types = [t for t in dict.fromkeys([*LAYER_TYPES.values(), "other"]) if any(t in table[a] for a in arms)]
    width = 0.8 / max(1, len(arms))
    for i, arm in enumerate(arms):
        color = _COLORS.get(arm, f"C{i}")
        xs = [j + (i - (len(arms) - 1) / 2) * width for j in range(len(types))]
        ax_t.bar(xs, [table[arm].get(t, {}).get("error", 0.0) for t in types], width, color=color, label=arm)
        ax_t.bar(xs, [table[arm].get(t, {}).get("collective_error", 0.0) for t in types], width * 0.4,
                 color="k", alpha=0.35)
        per_layer: dict[int, list[float]] = {}
        by_step: dict[int, list[tuple[float, float]]] = {}
        for r in recs:
            if r["arm"] != arm:
                continue
            for name, (err, coll, _n) in r["errors"].items():
                li = _layer_index(name)
                if li is not None:
                    per_layer.setdefault(li, []).append(err)
                by_step.setdefault(r["step"], []).append((err, coll))
        layers = sorted(per_layer)
        ax_l.plot(layers, [sum(per_layer[k]) / len(per_layer[k]) for k in layers], marker="o", ms=3.5,
                  color=color, label=arm)
        steps = sorted(by_step)
        med = [sorted(e for e, _ in by_step[s])[len(by_step[s]) // 2] for s in steps]
        cmed = [sorted(c for _, c in by_step[s])[len(by_step[s]) // 2] for s in steps]
        mx = [max(e for e, _ in by_step[s]) for s in steps]
        ax_s.plot(steps, med, color=color, lw=1.5, label=f"{arm} median")
        ax_s.plot(steps, mx, color=color, lw=0.8, ls=":", label=f"{arm} worst parameter")
        ax_s.plot(steps, cmed, color=color, lw=1.0, ls="--", label=f"{arm} median, collective only")
    ax_t.set_xticks(range(len(types)), types)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("||reduced - exact|| / ||exact||")
    ax_t.set_title("by layer type (mean; dark: the collective's share)")
    ax_l.set_yscale("log")
    ax_l.set_xlabel("decoder layer")
    ax_l.set_title("by decoder layer (mean over its parameters)")
    ax_s.set_yscale("log")
    ax_s.set_xlabel("optimizer step")
    ax_s.set_title("over training")
    for ax in (ax_t, ax_l, ax_s):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, out)


def main(argv: list[str] | None = None) -> None:
    """python -m agoq_core.train.plot RUN_DIR [OUT_PREFIX]: curves.png and val-gap.png of a run."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        raise SystemExit("usage: python -m agoq_core.train.plot RUN_DIR [OUT_PREFIX]")
    run_dir = Path(args[0])
    prefix = args[1] if len(args) > 1 else str(run_dir / "")
    recs = read_metrics(run_dir / "metrics.jsonl")
    title = ""
    cfg_path = run_dir / "config.json"
    if cfg_path.is_file():
        cfg = json.loads(cfg_path.read_text())
        dp = cfg.get("virtual_ranks") or cfg["nproc"] // cfg["pp"]
        tokens = cfg["seq_len"] * cfg["micro_batch"] * cfg["grad_accum"] * dp
        title = f"{cfg['model']}, {cfg['steps']} steps x {tokens:,} tokens, {cfg['nproc']} proc"
        if cfg.get("virtual_ranks"):
            title += f", {cfg['virtual_ranks']} virtual ranks"
    print(plot_curves(recs, f"{prefix}curves.png", title=title))
    if any(r["arm"] == "baseline" and r["kind"] == "eval" for r in recs):
        print(plot_val_gap(recs, f"{prefix}val-gap.png", title=title))
    if any(r["kind"] == "grad_error" for r in recs):
        print(plot_grad_errors(recs, f"{prefix}grad-errors.png", title=title))


if __name__ == "__main__":
    main()
