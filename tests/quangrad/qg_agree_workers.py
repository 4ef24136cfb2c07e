"""Rank functions for test_quangrad_agreement.py (spawned on real gloo groups by qg_dist.run_ranks)."""
from __future__ import annotations

import gc
import time

import torch


def _try(fn) -> tuple[str, str]:
    """("ok", repr of the result) or (exception type name, message)."""
    try:
        out = fn()
        return "ok", out
    except Exception as exc:  # the test inspects type and message
        return type(exc).__name__, str(exc)


def mismatches(rank: int, world: int) -> dict:
    from agoq_core.backend.reference import ReferenceBackend
    from agoq_core.quangrad import all_reduce_, reduce_scatter, register_comm_hook

    class OtherBackend(ReferenceBackend):
        name = "other"
        device_type = "cpu"  # set by the manager for registered backends; this one is passed as an object

    def ar(n, **kw):
        t = torch.full((n,), float(rank + 1), dtype=kw.pop("dtype", torch.float32))
        all_reduce_(t, **kw)
        return t.tolist()

    out = {
        "size": _try(lambda: ar(100 if rank == 0 else 200)),
        "fmt": _try(lambda: ar(64, fmt="fp8_e4m3" if rank == 0 else "int8")),
        "block": _try(lambda: ar(64, block=32 if rank == 0 else 64)),
        "dtype": _try(lambda: ar(64, dtype=torch.float32 if rank == 0 else torch.bfloat16)),
        "backend": _try(lambda: ar(64, backend="reference" if rank == 0 else OtherBackend())),
        # a rank with an empty tensor still joins the header exchange: an error on both, no hang
        "empty_one": _try(lambda: ar(0 if rank == 0 else 10)),
        "empty_all": _try(lambda: ar(0)),
        "rs_size": _try(lambda: reduce_scatter(torch.ones(64 + 64 * rank)).numel),
    }
    # the group stays usable after every mismatch: a matching call gives the exact sum
    out["after"] = _try(lambda: ar(64))

    def hook():
        torch.manual_seed(0)
        ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
        try:
            register_comm_hook(ddp, fmt="fp8_e4m3" if rank == 0 else "fp8_e5m2")
        finally:
            del ddp
            gc.collect()  # DDP's reducer must go before the process group is destroyed (else gloo aborts at exit)
        return "registered"

    out["hook_fmt"] = _try(hook)
    gc.collect()
    return out


def fault(rank: int, world: int, timeout_s: float) -> dict:
    """Rank 1 raises between QuanGrad's all-to-all and its all-gather and stays alive (a caught
    exception, a stuck rank); rank 0 must raise once the process group's timeout has passed, not hang."""
    from agoq_core.quangrad import all_reduce_, collective

    t = torch.ones(4096)
    all_reduce_(t)  # warm-up: both ranks healthy
    if rank == 1:
        def boom(self):
            raise RuntimeError("injected fault")
        collective.QuanGradOp.advance = boom
        got = _try(lambda: all_reduce_(torch.ones(4096)))
        time.sleep(timeout_s + 4)  # alive but never joins the all-gather rank 0 waits in
        return {"result": got}
    t0 = time.monotonic()
    got = _try(lambda: all_reduce_(torch.ones(4096)))
    return {"result": got, "elapsed": time.monotonic() - t0}
