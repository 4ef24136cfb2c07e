"""Where a training process runs: device, dtype, and its place in the process group.

``agoq train`` runs in one of three ways, all ending in :func:`init_runtime`:
- one process (``--nproc 1``): no process group;
- launched by ``torchrun`` (``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` set): joins the group torchrun
  describes (``env://``);
- ``--nproc N`` without torchrun: the parent spawns N processes with torch.multiprocessing and gives
  them a free localhost port.
The process-group backend is gloo on CPU and, on an accelerator, the selected agoq backend's
``dist_backend`` (nccl, hccl, ...) when it serves that device type, else torch's default for it.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from datetime import timedelta

import torch

from agoq_core.testing.dist import free_port
from agoq_core.train.config import ConfigError, TrainConfig

__all__ = ["Runtime", "resolve_device", "init_runtime", "under_torchrun", "shutdown"]

log = logging.getLogger("agoq.train")

_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Runtime:
    rank: int
    world: int
    local_rank: int
    device: torch.device
    dtype: str                  # "fp32", or "bf16" (bf16 weights and activations, fp32 master weights)
    dist_backend: str | None    # None when no process group is needed (one process, baseline only)
    threads_note: str = ""      # how the torch thread count was chosen (CPU runs)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.dtype == "bf16" else torch.float32


def under_torchrun() -> bool:
    return all(v in os.environ for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))



def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``auto`` -> the current accelerator if torch has one, else CPU; a device type gets the local rank's
    index. A device torch cannot use is an error that names what is available."""
    if name == "auto":
        acc = torch.accelerator.current_accelerator() if hasattr(torch, "accelerator") else None
        if acc is not None and torch.accelerator.is_available():
            name = acc.type
        else:
            name = "cpu"
    try:
        dev = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(f"unknown device {name!r}: {exc}") from None
    if dev.type == "cpu":
        return torch.device("cpu")
    try:
        mod = torch.get_device_module(dev.type)
    except Exception:
        mod = None
    available = bool(mod is not None and getattr(mod, "is_available", lambda: False)())
    if not available:
        raise ConfigError(f"device {name!r} was asked for but torch sees no {dev.type} device here; "
                          "use --device cpu or --device auto")
    index = dev.index if dev.index is not None else local_rank
    count = mod.device_count() if hasattr(mod, "device_count") else 1
    if index >= count:
        raise ConfigError(f"process {local_rank} needs {dev.type}:{index} but only {count} {dev.type} "
                          f"device(s) exist; lower --nproc to at most {count}")
    return torch.device(dev.type, index)


def _busy_cores(interval: float = 0.25) -> float | None:
    """Cores kept busy by other work right now, from two /proc/stat samples (None off Linux)."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat", encoding="ascii") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
        return sum(v), idle

    try:
        t0, i0 = sample()
        time.sleep(interval)
        t1, i1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    total = t1 - t0
    return (os.cpu_count() or 1) * (1.0 - (i1 - i0) / total) if total > 0 else None


def auto_threads(local_world: int) -> tuple[int, str]:
    """Torch threads per process: this host's cores split between its processes, minus the cores other
    work keeps busy now. Why: on the 2-core CI machine a tiny-model step took 0.36 s with 1 thread but
    1.96 s with 2 while another process kept one core busy (threads wait for each other at every op),
    against 0.20 s with 2 threads on an idle machine."""
    cores = os.cpu_count() or 1
    share = max(1, cores // max(1, local_world))
    busy = _busy_cores()
    if busy is None:
        return share, f"{cores} cores / {local_world} process(es)"
    free = max(1, int(cores - busy + 0.5))
    if free >= cores or local_world > 1:
        return share, f"{cores} cores / {local_world} process(es), {busy:.1f} busy with other work"
    n = max(1, min(share, free // max(1, local_world)))
    return n, f"{busy:.1f} of {cores} cores busy with other work; --threads overrides"


def _dist_backend_for(device: torch.device) -> str:
    if device.type == "cpu":
        return "gloo"
    from agoq_core.backend import get_backend

    be = get_backend()
    if getattr(be, "device_type", None) == device.type:
        return be.dist_backend
    return torch.distributed.Backend.default_device_backend_map.get(device.type, "gloo")


def init_runtime(cfg: TrainConfig, rank: int = 0, world: int = 1) -> Runtime:
    """Set up this process: device, threads, and (if world > 1) the process group."""
    if under_torchrun():
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ["LOCAL_RANK"])
    else:
        local_rank = rank
    device = resolve_device(cfg.device, local_rank)
    dtype = cfg.dtype if cfg.dtype != "auto" else ("fp32" if device.type == "cpu" else "bf16")
    if device.type != "cpu":
        torch.get_device_module(device.type).set_device(device)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world)) if under_torchrun() else world
    why = ""
    if device.type == "cpu":
        threads, why = (cfg.threads, "--threads") if cfg.threads else auto_threads(local_world)
        torch.set_num_threads(threads)
        if rank == 0:
            log.info("agoq train: %d torch thread(s) per process (%s)", threads, why)
    backend = None
    # QuanGrad's wrapper runs on a process group even with one process (its collectives are then
    # local), so an AGoQ arm gets a one-rank group; a baseline-only single process needs none.
    if world > 1 or any(a != "baseline" for a in cfg.arms):
        import torch.distributed as dist

        backend = _dist_backend_for(device)
        if not dist.is_initialized():
            kwargs = {"backend": backend, "timeout": timedelta(minutes=10)}
            if under_torchrun():
                dist.init_process_group(**kwargs, device_id=device if device.type != "cpu" else None)
            else:
                port = os.environ.get("AGOQ_TRAIN_PORT") if world > 1 else str(free_port())
                dist.init_process_group(**kwargs, rank=rank, world_size=world,
                                        init_method=f"tcp://127.0.0.1:{port}")
        if world > 1:  # every rank must run the same agoq backend: one clear error on all ranks, not a hang
            from agoq_core.backend import check_same_backend_across_ranks

            try:
                check_same_backend_across_ranks()
            except BaseException:
                dist.destroy_process_group()
                raise
    return Runtime(rank=rank, world=world, local_rank=local_rank, device=device, dtype=dtype,
                   dist_backend=backend, threads_note=why)


def shutdown(rt: Runtime, *, barrier: bool = True) -> None:
    if rt.dist_backend is not None:
        import torch.distributed as dist

        if dist.is_initialized():
            if barrier and rt.world > 1:
                dist.barrier()
            dist.destroy_process_group()
