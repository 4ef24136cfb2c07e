"""Per-arm step-time statistics of `agoq train` run folders: the median step (robust to the one-off slow steps that
move a 40-step run's mean, e.g. a Triton compile or an allocator flush) and each arm's ratio to the baseline arm.

    python benchmarks/train_step_stats.py RUN_DIR [RUN_DIR ...] [--skip 2] [--json stats.json]

Reads RUN_DIR/metrics.jsonl (docs/training.md); steps 1..SKIP are left out (step 1 is outside agoq train's own
tokens/s too). One line per run: ``arm median_s (ratio)``; the ratio is baseline median / arm median, the
tokens/s ratio at equal tokens per step.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

#: Per-step cost fields of agoq train's step records (agoq_core.train.stepcosts) summarised as means.
COST_KEYS = ("gc_ms", "device_allocs", "device_frees", "alloc_retries")


def step_stats(run_dir: str | Path, skip: int = 2) -> dict[str, dict[str, float]]:
    """{arm: {"median_s", "mean_s", "steps", "ratio", "seconds"}} from one run folder (ratio: None without a baseline
    arm; seconds: the steps' times in order), plus the mean per step of the step costs the records carry
    (agoq_core.train.stepcosts: ``gc_ms``, ``device_allocs``...) as ``<name>_mean``."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not an agoq train run folder (no metrics.jsonl)")
    arms: dict[str, list[float]] = {}
    costs: dict[str, dict[str, list[float]]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            if r.get("kind") == "step" and r["step"] > skip:
                arms.setdefault(r["arm"], []).append(float(r["seconds"]))
                for k in COST_KEYS:
                    if r.get(k) is not None:
                        costs.setdefault(r["arm"], {}).setdefault(k, []).append(float(r[k]))
    if not arms:
        raise ValueError(f"{path}: no step records after step {skip}")
    out = {a: {"median_s": statistics.median(v), "mean_s": statistics.fmean(v), "steps": len(v), "seconds": v,
               **{f"{k}_mean": statistics.fmean(c) for k, c in costs.get(a, {}).items()}}
           for a, v in arms.items()}
    base = out.get("baseline", {}).get("median_s")
    for rec in out.values():
        rec["ratio"] = base / rec["median_s"] if base else None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="agoq train run folders")
    ap.add_argument("--skip", type=int, default=2, help="leave out steps 1..SKIP (default 2)")
    ap.add_argument("--json", help="write {run: stats} here")
    args = ap.parse_args(argv)
    report = {}
    for run in args.runs:
        st = report[str(run)] = step_stats(run, args.skip)
        print(Path(run).name + ": " + ", ".join(
            f"{a} {r['median_s']:.4f} s" + (f" ({r['ratio']:.3f})" if r["ratio"] is not None else "")
            + (f" [gc {r['gc_ms_mean']:.1f} ms, {r.get('device_allocs_mean', 0):.1f} device allocs per step]"
               if "gc_ms_mean" in r else "")
            for a, r in st.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
