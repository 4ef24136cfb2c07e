"""Workers of test_rank_agreement (spawned processes import them by module path)."""
from __future__ import annotations

import os


def _attempt(fn) -> str | None:
    """None if ``fn`` passed, the message of its BackendMismatchError otherwise (anything else propagates)."""
    from agoq_core.errors import BackendMismatchError

    try:
        fn()
    except BackendMismatchError as exc:
        return str(exc)
    return None


def mismatched_backends(rank: int, world: int) -> dict:
    """Rank 0 runs the reference backend, rank 1 the dummy plugin's: every place where ranks start working
    together must raise the same BackendMismatchError on every rank (and leave them in step for the next)."""
    import torch
    import torch.distributed as dist

    from agoq_core.backend import check_same_backend_across_ranks, manager
    from agoq_core.quangrad import QuanGradDDP, all_reduce_, reduce_scatter, register_comm_hook
    from agoq_core.quangrad import fsdp as qg_fsdp
    from agoq_core.train.config import TrainConfig
    from agoq_core.train.runtime import init_runtime

    os.environ.update(AGOQ_DUMMY_AVAILABLE="1", AGOQ_BACKEND="reference" if rank == 0 else "dummy")
    manager.reset()
    result: dict = {"check": _attempt(check_same_backend_across_ranks)}
    result["QuanGradDDP"] = _attempt(lambda: QuanGradDDP(torch.nn.Linear(8, 8), lambda ps: torch.optim.SGD(ps, lr=0.1)))
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
    result["register_comm_hook"] = _attempt(lambda: register_comm_hook(ddp))
    result["all_reduce_"] = _attempt(lambda: all_reduce_(torch.ones(300)))
    result["reduce_scatter"] = _attempt(lambda: reduce_scatter(torch.ones(300)))
    if qg_fsdp.supported()[0]:
        from tests.quangrad.qg_fsdp_workers import build

        result["fsdp.enable"] = _attempt(lambda: qg_fsdp.enable(build()))
    # the same backend on every rank (named explicitly) passes and is usable
    t = torch.full((300,), float(rank + 1))
    all_reduce_(t, backend="reference")
    result["explicit_same_backend_sum"] = float(t[0])
    # agoq train's runtime (last: on failure it takes the process group down)
    result["agoq train"] = _attempt(lambda: init_runtime(TrainConfig(device="cpu", threads=1, nproc=2), rank, world))
    result["group_destroyed"] = not dist.is_initialized()
    return result
