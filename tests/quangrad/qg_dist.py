"""Run a function on W real gloo ranks (torch.multiprocessing spawn) and collect what each returns.

Used by the QuanGrad tests and benchmarks/bench_quangrad.py. Each rank's return value is pickled to a
file; an exception on any rank is re-raised in the parent with that rank's traceback.
"""
from __future__ import annotations

import datetime
import os
import pickle
import tempfile
import traceback
from typing import Any, Callable

import torch.multiprocessing as mp

from agoq_core.testing.dist import exit_spawned_rank, free_port


def _entry(rank: int, fn: Callable, world: int, port: int, outdir: str, args: tuple, threads: int,
           timeout_s: float = 120.0) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
    try:
        result: Any = ("ok", fn(rank, world, *args))
    except BaseException as exc:  # reported to the parent, which raises
        result = ("error", f"rank {rank}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    try:
        with open(os.path.join(outdir, f"rank{rank}.pkl"), "wb") as f:
            pickle.dump(result, f)
    finally:
        if dist.is_initialized():  # fn may have taken the group down itself (e.g. agoq train's runtime on error)
            dist.destroy_process_group()
    exit_spawned_rank()  # the result file is closed: skip torch's racy teardown


def run_ranks(fn: Callable, world: int, *args: Any, threads: int = 1, timeout_s: float = 120.0) -> list[Any]:
    """``fn(rank, world, *args)`` on ``world`` gloo ranks; returns the per-rank results in rank order.
    ``timeout_s`` is the process group's timeout: a collective some rank never joins raises after it."""
    with tempfile.TemporaryDirectory() as outdir:
        mp.start_processes(_entry, args=(fn, world, free_port(), outdir, args, threads, timeout_s), nprocs=world,
                           start_method="spawn", join=True)
        results = []
        for r in range(world):
            with open(os.path.join(outdir, f"rank{r}.pkl"), "rb") as f:
                status, value = pickle.load(f)
            if status == "error":
                raise RuntimeError(value)
            results.append(value)
        return results
