"""``agoq_core.train.run(config)``: train every arm, write the run folder, return the summary.

Run folder (``<out_dir>/<run_name or timestamp>/``, created exclusively: agoq_core/train/rundir.py):
``status.json`` (running / completed / failed / interrupted), ``config.json`` (the resolved options),
``metrics.jsonl`` (one record per step and per evaluation, every arm; ``metrics.jsonl.partial`` while
training runs and after a failure or interruption), ``summary.json`` (final numbers, memory, ratios,
environment), ``table.md`` (the printed table) and ``curves.png``. Every file but the streamed metrics
is written atomically (temporary file + rename).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch

from agoq_core.errors import AgoqError
from agoq_core.testing.dist import exit_spawned_rank, free_port
from agoq_core.train.config import TrainConfig
from agoq_core.train.data import load_corpus
from agoq_core.train.extras import check_extras
from agoq_core.train.loop import TRAIN_LOSS_WINDOW, ArmResult, train_arm
from agoq_core.train.report import compare_arms, render_table
from agoq_core.train.rundir import create_run_dir, run_status, write_atomic
from agoq_core.train.runtime import Runtime, init_runtime, resolve_device, shutdown, under_torchrun

__all__ = ["run", "TrainError", "VAL_LOSS_TOLERANCE"]

# The convergence criterion: AGoQ's final held-out loss within 1% of the baseline's.
VAL_LOSS_TOLERANCE = 0.01


class TrainError(AgoqError, RuntimeError):
    """A training process failed (the message carries the failing rank's error)."""


def run(cfg: TrainConfig) -> dict[str, Any]:
    """Run the comparison described by ``cfg``; returns the summary (also written to summary.json).

    With ``nproc > 1`` (and no torchrun) it spawns the processes itself; under torchrun every rank calls
    this, and ranks other than 0 return a summary too (the same numbers; only rank 0 writes files).
    Raises MissingExtraError first if a package the run needs is not installed.
    """
    check_extras(cfg)
    if under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if cfg.nproc not in (1, world):
            raise TrainError(f"--nproc {cfg.nproc} disagrees with torchrun's WORLD_SIZE={world}; "
                             "leave --nproc out under torchrun")
        cfg = cfg.replace(nproc=world)
        return _worker(int(os.environ["RANK"]), world, cfg, None)
    # Fail here, before spawning, if the device cannot host every process (the error names the fix).
    resolve_device(cfg.device, cfg.nproc - 1)
    run_dir = create_run_dir(cfg.out_dir, cfg.run_name)
    with run_status(run_dir):
        if cfg.nproc == 1:
            return _worker(0, 1, cfg, str(run_dir))
        return _spawn(cfg, run_dir)


def _spawn(cfg: TrainConfig, run_dir: Path) -> dict[str, Any]:
    import torch.multiprocessing as mp

    os.environ["AGOQ_TRAIN_PORT"] = str(free_port())
    ctx = mp.start_processes(_spawned_worker, args=(cfg.nproc, cfg, str(run_dir)), nprocs=cfg.nproc,
                             start_method="spawn", join=False)
    try:
        while not ctx.join():
            pass
    except BaseException as exc:
        # SIGINT/SIGTERM to this process, or one rank failed: stop the others too (no orphans).
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
        for p in ctx.processes:
            p.join(10)
        if isinstance(exc, mp.ProcessRaisedException):
            msg = str(exc).strip().splitlines()
            raise TrainError(f"a training process failed: {msg[-1] if msg else exc}\n{exc}") from None
        if isinstance(exc, mp.ProcessExitedException):
            raise TrainError(f"a training process died: {exc}") from None
        raise
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise TrainError(f"the training processes finished without writing {summary_path}")
    return json.loads(summary_path.read_text())


def _spawned_worker(rank: int, world: int, cfg: TrainConfig, run_dir: str) -> None:
    _worker(rank, world, cfg, run_dir)  # an error propagates: torch.multiprocessing reports it to the parent
    exit_spawned_rank()  # done and written, group destroyed: skip torch's racy teardown


def _agree_run_dir(rt: Runtime, cfg: TrainConfig, run_dir: str | None) -> Path:
    """Under torchrun only rank 0 picks the folder name; the others learn it by broadcast."""
    if run_dir is None:
        import torch.distributed as dist

        box = [str(create_run_dir(cfg.out_dir, cfg.run_name)) if rt.is_main else None]
        if rt.world > 1:
            dist.broadcast_object_list(box, src=0)
        run_dir = box[0]
    return Path(run_dir)


def _worker(rank: int, world: int, cfg: TrainConfig, run_dir: str | None) -> dict[str, Any]:
    t_start = time.perf_counter()
    rt = init_runtime(cfg, rank, world)
    try:
        owner = run_dir is None and rt.is_main  # under torchrun rank 0 creates the folder and owns its status
        path = _agree_run_dir(rt, cfg, run_dir)
        with run_status(path if owner else None):
            summary = _train_and_write(cfg, rt, path, t_start)
    except BaseException:
        shutdown(rt, barrier=False)  # other ranks may be gone (error, Ctrl-C): do not wait for them
        raise
    shutdown(rt)
    return summary


def _train_and_write(cfg: TrainConfig, rt: Runtime, path: Path, t_start: float) -> dict[str, Any]:
    corpus = load_corpus(seq_len=cfg.seq_len, eval_tokens=cfg.eval_tokens)
    metrics_f = None
    partial = path / "metrics.jsonl.partial"
    if rt.is_main:
        write_atomic(path / "config.json", json.dumps(cfg.to_dict(), indent=2) + "\n")
        metrics_f = open(partial, "w", encoding="utf-8")

    def sink(rec: dict[str, Any]) -> None:
        if metrics_f is not None:
            metrics_f.write(json.dumps(rec) + "\n")
            metrics_f.flush()

    results: list[ArmResult] = []
    try:
        for name in cfg.arms:
            results.append(train_arm(name, cfg, rt, corpus, sink))
    finally:
        if metrics_f is not None:
            metrics_f.close()
    if rt.is_main:  # every arm ran to its end: the metrics are complete
        os.replace(partial, path / "metrics.jsonl")
    summary = _summary(cfg, rt, corpus, results, path, time.perf_counter() - t_start)
    if rt.is_main:
        _write_outputs(cfg, summary, path)
    return summary


def _checks(results: list[ArmResult]) -> dict[str, dict[str, Any]]:
    """Per arm: final held-out loss relative to the baseline's, and whether it is within the tolerance."""
    arms = {r.name: r for r in results if r.status == "ok" and r.final_val_loss is not None}
    out: dict[str, dict[str, Any]] = {}
    base = arms.get("baseline")
    if base is None:
        return out
    for name, r in arms.items():
        if name != "baseline":
            rel = (r.final_val_loss - base.final_val_loss) / base.final_val_loss
            out[name] = {"val_loss_rel_diff": rel, "tolerance": VAL_LOSS_TOLERANCE,
                         "within_tolerance": abs(rel) <= VAL_LOSS_TOLERANCE}
    return out


def _summary(cfg: TrainConfig, rt: Runtime, corpus, results: list[ArmResult], path: Path,
             wall: float) -> dict[str, Any]:
    from agoq_core.backend import selected_backend_name

    try:
        import transformers
        tf_version = transformers.__version__
    except Exception:  # pragma: no cover
        tf_version = None
    try:
        backend_name = selected_backend_name()
    except Exception as exc:  # the baseline does not need a backend; say why there is none
        backend_name = f"none ({exc})"
    summary: dict[str, Any] = {
        "run_dir": str(path),
        "config": cfg.to_dict(),
        "tokens_per_step": cfg.tokens_per_step,
        "train_loss_window": TRAIN_LOSS_WINDOW,
        "environment": {
            "device": str(rt.device), "dtype": rt.dtype, "world": rt.world, "dist_backend": rt.dist_backend,
            "virtual_ranks": cfg.virtual_ranks,
            "agoq_backend": backend_name, "torch": torch.__version__, "transformers": tf_version,
            "python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "threads_per_process": torch.get_num_threads(), "threads_chosen_by": rt.threads_note,
            "date": _dt.datetime.now().isoformat(timespec="seconds"),
        },
        "data": {"train": "wikitext-2 valid.txt", "eval": "wikitext-2 test.txt", "vocab_size": corpus.vocab_size,
                 "train_windows": int(corpus.train.shape[0]), "eval_windows": int(corpus.eval.shape[0]),
                 "train_tokens_total": corpus.train_tokens_total},
        "arms": [r.to_dict() for r in results],
        "checks": _checks(results),
        "wall_seconds": wall,
    }
    summary["ratios_vs_baseline"] = compare_arms(summary)
    return summary


def _write_outputs(cfg: TrainConfig, summary: dict[str, Any], path: Path) -> None:
    table = render_table(summary)
    write_atomic(path / "table.md", table + "\n")
    if cfg.plot:
        from agoq_core.train.plot import plot_curves, read_metrics

        env = summary["environment"]
        title = (f"agoq train: {cfg.model}, {cfg.steps} steps x {cfg.tokens_per_step:,} tokens, "
                 f"{env['device']} {env['dtype']}, {env['world']} proc"
                 + (f", {cfg.virtual_ranks} virtual ranks" if cfg.virtual_ranks else ""))
        records = read_metrics(path / "metrics.jsonl")
        summary["plot"] = str(plot_curves(records, path / "curves.png", title=title))
        if cfg.grad_error_every and any(r["kind"] == "grad_error" for r in records):
            from agoq_core.train.plot import plot_grad_errors

            summary["grad_error_plot"] = str(plot_grad_errors(records, path / "grad-errors.png", title=title))
    write_atomic(path / "summary.json", json.dumps(summary, indent=2) + "\n")
