"""The virtual-rank study (docs/convergence.md): the naive FP8 all-reduce against QuanGrad and the
baseline at W data-parallel ranks simulated on one device (``agoq train --virtual-ranks W``), with the
reduced gradients' per-layer error against the exact fp32 sum beside the loss curves.

One ``agoq train`` process per (W, arm), run ``--jobs`` at a time (the small model leaves the GPU mostly
idle, so concurrent processes cost little; their tokens/s are not speed measurements). Each process is
stopped at ``--time-limit`` seconds; metrics.jsonl is written step by step, so a stopped run still
gives its curves up to there and the table compares arms at the last evaluation all of them reached.

    # H200 (< 4 minutes): small model, W = 8 and 32
    source benchmarks/gpu_env.sh && python benchmarks/gpu_virtual_ranks.py
    # CPU study (docs/convergence.md): tiny model, W = 8
    python benchmarks/gpu_virtual_ranks.py --cpu
    # seconds-long check of the script itself
    python benchmarks/gpu_virtual_ranks.py --smoke
    # the table and plots again, from the run folders already there
    python benchmarks/gpu_virtual_ranks.py --cpu --report-only

Writes to $OUT (or --out): runs/ (one run folder per process), w<W>-curves.png, w<W>-val-gap.png,
w<W>-grad-errors.png, virtual_ranks.json and virtual_ranks.md.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

from agoq_core.train.plot import grad_error_table, plot_curves, plot_grad_errors, plot_val_gap, read_metrics  # noqa: E402

ARMS = {"baseline": ["--no-agoq"], "agoq": ["--no-baseline"],
        "naive-fp8-allreduce": ["--no-baseline", "--no-agoq", "--ablation", "naive-fp8-allreduce"]}

# GPU preset, sized for < 4 minutes on one H200 with 6 concurrent processes: the 27M-parameter `small`
# model on 128-token windows is launch-bound, so a step costs about W micro-batch passes of fixed
# latency; W = 32 x 4 x 128 = 16K tokens per step (120 steps: 2M tokens, 6.7 epochs of the 292K-token
# training text: a small-data regime, like the llama-1b study).
PRESETS = {
    "gpu": dict(device="cuda", model="small", ranks="8,32", steps=120, seq_len=128, micro_batch=4, eval_every=20,
                eval_tokens=16384, grad_error_every=10, jobs=6, time_limit=190, threads=2),
    "cpu": dict(device="cpu", model="tiny", ranks="8", steps=40, seq_len=64, micro_batch=2, eval_every=10,
                eval_tokens=4096, grad_error_every=5, jobs=1, time_limit=3000, threads=1),
    "smoke": dict(device="cpu", model="tiny", ranks="2,4", steps=4, seq_len=32, micro_batch=2, eval_every=2,
                  eval_tokens=256, grad_error_every=2, jobs=2, time_limit=600, threads=1),
}


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--cpu", action="store_true", help="the CPU study preset (tiny model, W = 8)")
    mode.add_argument("--smoke", action="store_true", help="seconds-long CPU check (W = 2, 4; 4 steps)")
    for k, v in PRESETS["gpu"].items():
        ap.add_argument("--" + k.replace("_", "-"), type=type(v), default=None, help=f"(GPU preset: {v})")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing: rebuild the table and plots from the run folders already in --out")
    ap.add_argument("--out", default=None, help="output folder (default $OUT, else /tmp/agoq-virtual-ranks)")
    a = ap.parse_args(argv)
    preset = PRESETS["smoke" if a.smoke else "cpu" if a.cpu else "gpu"]
    for k, v in preset.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    a.ranks = [int(w) for w in str(a.ranks).split(",") if w.strip()]
    a.out = Path(a.out or os.environ.get("OUT") or "/tmp/agoq-virtual-ranks")
    return a


def _command(a: argparse.Namespace, world: int, arm: str) -> list[str]:
    return [sys.executable, "-m", "agoq_core.cli.main", "train", "--model", a.model, "--device", a.device,
            "--seq-len", str(a.seq_len), "--micro-batch", str(a.micro_batch), "--steps", str(a.steps),
            "--eval-every", str(a.eval_every), "--eval-tokens", str(a.eval_tokens), "--seed", str(a.seed),
            "--virtual-ranks", str(world), "--grad-error-every", str(a.grad_error_every), "--threads", str(a.threads),
            "--out-dir", str(a.out / "runs"), "--run-name", f"w{world}-{arm}", "--no-progress", "--no-plot",
            "--json", *ARMS[arm]]


def _run_jobs(a: argparse.Namespace) -> list[dict]:
    """Every (W, arm) process, ``a.jobs`` at a time, each stopped at ``a.time_limit`` seconds."""
    pending = [(w, arm) for w in sorted(a.ranks, reverse=True) for arm in ARMS]  # the slowest (largest W) first
    running: list[tuple[dict, subprocess.Popen, float]] = []
    done: list[dict] = []
    logs = a.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    while pending or running:
        while pending and len(running) < a.jobs:
            w, arm = pending.pop(0)
            job = {"world": w, "arm": arm, "command": " ".join(_command(a, w, arm)[1:])}
            out = open(logs / f"w{w}-{arm}.json", "w")
            err = open(logs / f"w{w}-{arm}.log", "w")
            running.append((job, subprocess.Popen(_command(a, w, arm), stdout=out, stderr=err), time.monotonic()))
            print(f"started W={w} {arm}", flush=True)
        time.sleep(1.0)
        for item in list(running):
            job, proc, t0 = item
            elapsed = time.monotonic() - t0
            if proc.poll() is None and elapsed > a.time_limit:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                job["stopped_by_time_limit"] = True
            if proc.poll() is not None:
                job.update(returncode=proc.returncode, seconds=round(elapsed, 1))
                job.setdefault("stopped_by_time_limit", False)
                running.remove(item)
                done.append(job)
                print(f"finished W={job['world']} {job['arm']}: rc {proc.returncode}, {elapsed:.0f} s"
                      + (" (time limit)" if job["stopped_by_time_limit"] else ""), flush=True)
    return done


def _records(a: argparse.Namespace, world: int) -> list[dict]:
    recs: list[dict] = []
    for arm in ARMS:
        path = a.out / "runs" / f"w{world}-{arm}" / "metrics.jsonl"
        if path.is_file():
            recs += read_metrics(path)
    return recs


def _study(a: argparse.Namespace, world: int, jobs: list[dict]) -> dict:
    recs = _records(a, world)
    evals: dict[str, dict[int, float]] = {}
    steps: dict[str, list[dict]] = {}
    for r in recs:
        if r["kind"] == "eval":
            evals.setdefault(r["arm"], {})[r["step"]] = r["val_loss"]
        elif r["kind"] == "step":
            steps.setdefault(r["arm"], []).append(r)
    common = set.intersection(*(set(v) for v in evals.values())) if len(evals) == len(ARMS) else set()
    at = max(common) if common else None
    arms = {}
    for arm in ARMS:
        st = steps.get(arm, [])
        job = next((j for j in jobs if j["world"] == world and j["arm"] == arm), {})
        val = evals.get(arm, {}).get(at) if at else None
        base = evals.get("baseline", {}).get(at) if at else None
        arms[arm] = {
            "steps_done": len(st), "val_loss": val,
            "val_loss_vs_baseline": (val - base) / base if (val is not None and base) else None,
            "skipped_steps": sum(1 for r in st if r.get("skipped")),
            "final_grad_norm": st[-1]["grad_norm"] if st else None,
            "seconds": job.get("seconds"), "returncode": job.get("returncode"),
            "stopped_by_time_limit": job.get("stopped_by_time_limit"),
        }
    title = (f"{a.model}, W = {world} virtual ranks x {a.micro_batch} x {a.seq_len} tokens, {a.device}, "
             f"seed {a.seed}")
    plots = []
    if recs:
        plots.append(str(plot_curves(recs, a.out / f"w{world}-curves.png", title=title)))
        if evals.get("baseline"):
            plots.append(str(plot_val_gap(recs, a.out / f"w{world}-val-gap.png", title=title)))
        if any(r["kind"] == "grad_error" for r in recs):
            plots.append(str(plot_grad_errors(recs, a.out / f"w{world}-grad-errors.png", title=title)))
    return {"world": world, "compared_at_step": at, "tokens_per_step": world * a.micro_batch * a.seq_len,
            "arms": arms, "grad_errors": grad_error_table(recs), "plots": plots}


def _markdown(report: dict) -> str:
    lines = ["| W | arm | steps | val loss @ step | vs baseline | skipped steps |", "|---|---|---:|---:|---:|---:|"]
    for s in report["studies"]:
        for arm, r in s["arms"].items():
            rel = r["val_loss_vs_baseline"]
            lines.append(f"| {s['world']} | {arm} | {r['steps_done']} | "
                         + (f"{r['val_loss']:.4f} @ {s['compared_at_step']}" if r["val_loss"] is not None else "–")
                         + f" | {'' if rel is None or arm == 'baseline' else f'{rel:+.2%}'} | {r['skipped_steps']} |")
    lines += ["", "Normalised gradient error ||reduced − exact|| / ||exact|| by layer type (mean over steps and "
              "layers; in brackets: against the fp32 sum of the ranks' stored 8-bit gradients, i.e. the collective's own):", ""]
    for s in report["studies"]:
        ge = s["grad_errors"]
        types = list(dict.fromkeys(t for arm in ge.values() for t in arm))
        lines += [f"W = {s['world']}:", "", "| arm | " + " | ".join(types) + " |", "|---|" + "---:|" * len(types)]
        for arm, tab in ge.items():
            lines.append(f"| {arm} | " + " | ".join(
                f"{tab[t]['error']:.4f} ({tab[t]['collective_error']:.4f})" if t in tab else "–" for t in types) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    jobs = [] if a.report_only else _run_jobs(a)
    report = {
        "environment": harness.environment(a.device, preset="smoke" if a.smoke else "cpu" if a.cpu else "gpu"),
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        "jobs": jobs, "studies": [_study(a, w, jobs) for w in sorted(a.ranks)],
        "wall_seconds": round(time.monotonic() - t0, 1),
    }
    md = _markdown(report)
    (a.out / "virtual_ranks.json").write_text(json.dumps(report, indent=1, default=str))
    (a.out / "virtual_ranks.md").write_text(md + "\n")
    print(md)
    print(f"\nwrote {a.out}/virtual_ranks.json, virtual_ranks.md and the plots; total {report['wall_seconds']} s")
    failed = [j for j in jobs if j["returncode"] not in (0, None) and not j["stopped_by_time_limit"]]
    if a.report_only and not any(s["compared_at_step"] for s in report["studies"]):
        print(f"no comparable runs under {a.out}/runs")
        return 1
    for j in failed:
        print(f"FAILED: W={j['world']} {j['arm']} (rc {j['returncode']}): see {a.out}/logs/w{j['world']}-{j['arm']}.log")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
