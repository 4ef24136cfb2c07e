"""The run's figure: loss curves (train, smoothed, and held-out) and gradient norms, one line per arm."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

__all__ = ["plot_curves", "plot_val_gap", "read_metrics"]

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
        tokens = cfg["seq_len"] * cfg["micro_batch"] * cfg["grad_accum"] * (cfg["nproc"] // cfg["pp"])
        title = f"{cfg['model']}, {cfg['steps']} steps x {tokens:,} tokens, {cfg['nproc']} proc"
    print(plot_curves(recs, f"{prefix}curves.png", title=title))
    print(plot_val_gap(recs, f"{prefix}val-gap.png", title=title))


if __name__ == "__main__":
    main()
