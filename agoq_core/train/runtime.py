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
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch

from agoq_core.train.config import ConfigError, TrainConfig

__all__ = ["Runtime", "resolve_device", "init_runtime", "under_torchrun", "free_port", "shutdown"]

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

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.dtype == "bf16" else torch.float32


def under_torchrun() -> bool:
    return all(v in os.environ for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    # Processes on this host share its cores; several processes with all-core thread pools each thrash.
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world)) if under_torchrun() else world
    if cfg.threads or local_world > 1:
        torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 1) // local_world))
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
    return Runtime(rank=rank, world=world, local_rank=local_rank, device=device, dtype=dtype,
                   dist_backend=backend)


def shutdown(rt: Runtime) -> None:
    if rt.dist_backend is not None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
