"""The end-of-run table (markdown, so it reads in a terminal and pastes into docs) and its numbers.

Rows are metrics, columns the arms; each arm after the baseline also gets a ``/ baseline`` ratio
column. Memory rows are measured (see agoq_core/train/memory.py) per data-parallel rank.
"""
from __future__ import annotations

from typing import Any

from agoq_core.train.memory import format_bytes

__all__ = ["render_table", "compare_arms", "MEMORY_ROWS"]

# (summary key, row label). "activations" is one micro-batch's saved-for-backward bytes.
MEMORY_ROWS = (
    ("activations", "activations (saved for backward, 1 micro-batch)"),
    ("activations_decoder_layers", "  of which in decoder layers"),
    ("gradients", "gradient storage"),
    ("optimizer_state", "optimizer state"),
    ("master_weights", "fp32 master weights (bf16 runs)"),
    ("act+grad+opt", "activations + gradients + optimizer"),
    ("peak_device", "peak device memory"),
)


def _mem(arm: dict[str, Any], key: str) -> float | None:
    m = arm.get("memory") or {}
    if key == "act+grad+opt":
        parts = [m.get(k) for k in ("activations", "gradients", "optimizer_state")]
        return None if any(p is None for p in parts) else float(sum(parts))
    v = m.get(key)
    return None if v is None else float(v)


def _metric(arm: dict[str, Any], key: str) -> float | None:
    if key.startswith("mem:"):
        return _mem(arm, key[4:])
    return arm.get(key)


def _rows(summary: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(key, label, kind) for each table row; memory rows that no arm measured are dropped."""
    rows = [
        ("final_train_loss", f"train loss (mean of last {summary.get('train_loss_window', 10)} steps)", "loss"),
        ("final_val_loss", "validation loss (held-out test.txt)", "loss"),
        ("tokens_per_s", "tokens/s (all ranks)", "rate"),
    ]
    if any(a.get("skipped_steps") for a in summary["arms"] if a["status"] == "ok"):
        rows.append(("skipped_steps", "steps skipped (non-finite gradient)", "count"))
    pp = summary["config"].get("pp", 1)
    for key, label in MEMORY_ROWS:
        if pp > 1 and key == "activations":
            label = "activations: peak of the fullest pipeline stage"
        elif pp > 1 and key in ("gradients", "optimizer_state"):
            label += " (largest stage)"
        if any(_mem(a, key) is not None for a in summary["arms"] if a["status"] == "ok"):
            rows.append((f"mem:{key}", label, "bytes"))
        if pp > 1 and key == "activations":
            for s in range(pp):
                for k, lbl in ((f"activations_stage{s}", f"  stage {s}, measured peak"),
                               (f"planned_activations_stage{s}", f"  stage {s}, DBCA-PP plan")):
                    if any(_mem(a, k) is not None for a in summary["arms"] if a["status"] == "ok"):
                        rows.append((f"mem:{k}", lbl, "bytes"))
    return rows


def _fmt(v: float | None, kind: str) -> str:
    if v is None:
        return "n/a"
    if kind == "loss":
        return f"{v:.4f}"
    if kind == "rate":
        return f"{v:,.0f}"
    if kind == "count":
        return f"{v:d}"
    return format_bytes(v)


def compare_arms(summary: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """Ratio arm / baseline for every metric row, per non-baseline arm that ran."""
    arms = {a["name"]: a for a in summary["arms"]}
    base = arms.get("baseline")
    out: dict[str, dict[str, float | None]] = {}
    if base is None or base["status"] != "ok":
        return out
    for name, arm in arms.items():
        if name == "baseline" or arm["status"] != "ok":
            continue
        ratios: dict[str, float | None] = {}
        for key, _, _ in _rows(summary):
            b, v = _metric(base, key), _metric(arm, key)
            ratios[key.removeprefix("mem:")] = (v / b) if (b not in (None, 0) and v is not None) else None
        out[name] = ratios
    return out


def render_table(summary: dict[str, Any]) -> str:
    """The comparison as a markdown table, followed by one line per unavailable or failed arm."""
    arms = summary["arms"]
    ratios = compare_arms(summary)
    header = ["metric"]
    for a in arms:
        header.append(a["name"])
        if a["name"] in ratios:
            header.append(f"{a['name']} / baseline")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for key, label, kind in _rows(summary):
        cells = [label]
        for a in arms:
            cells.append(_fmt(_metric(a, key), kind) if a["status"] == "ok" else a["status"])
            if a["name"] in ratios:
                r = ratios[a["name"]].get(key.removeprefix("mem:"))
                cells.append("n/a" if r is None else f"{r:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    for a in arms:
        if a["status"] != "ok":
            lines.append(f"\n{a['name']}: {a['status']}: {a['reason']}")
    env = summary.get("environment", {})
    lines.append(
        f"\nmodel {summary['config']['model']} ({_params(arms)} parameters), {summary['config']['steps']} steps x "
        f"{summary['tokens_per_step']:,} tokens, device {env.get('device')} ({env.get('dtype')}), "
        f"{env.get('world', 1)} process(es)"
        + (f" simulating {env['virtual_ranks']} data-parallel ranks" if env.get("virtual_ranks") else "")
        + f", agoq backend {env.get('agoq_backend')}"
    )
    costs = [_costs_text(a) for a in arms if a["status"] == "ok" and (a.get("step_costs") or {}).get("timed_steps")]
    if costs:
        lines.append("per timed step (Python GC; device allocator calls): " + "; ".join(costs))
    for arm, c in (summary.get("checks") or {}).items():
        where = "within" if c["within_tolerance"] else "outside"
        lines.append(f"{arm}: validation loss {c['val_loss_rel_diff']:+.2%} vs baseline ({where} the "
                     f"{c['tolerance']:.0%} convergence criterion; short runs lag more, see docs/convergence.md)")
    return "\n".join(lines)


def _costs_text(arm: dict[str, Any]) -> str:
    c = arm["step_costs"]
    n = c["timed_steps"]
    g = "/".join(f"{x / n:.2g}" for x in c["gc_collections"])
    text = f"{arm['name']} GC {c['gc_ms_per_step']:.1f} ms ({g} collections of gen 0/1/2)"
    if "device_allocs" in c:
        text += f", {c['device_allocs'] / n:.1f} allocs, {c['device_frees'] / n:.1f} frees"
        if c.get("alloc_retries"):
            text += f", {c['alloc_retries']} allocator retries (flushed the cache: near the memory limit)"
    return text


def _params(arms: list[dict[str, Any]]) -> str:
    n = max((a.get("params") or 0) for a in arms) if arms else 0
    return f"{n / 1e6:.2f}M" if n else "?"
