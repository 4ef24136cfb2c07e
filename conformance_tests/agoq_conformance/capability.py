"""Capability cases: the core's own code paths, run on the backend's device under a mode that rejects what
some devices lack, so a hidden assumption fails here rather than on the first NPU run.

``capability/no_float64/quangrad_step`` -- a QuanGradDDP step with gradient clipping (global norm) whose
every tensor operation is checked by :class:`NoFloat64Mode`: Ascend's vector units and its norm operator
have no float64 (the core used to ask for ``vector_norm(dtype=float64)`` on the device), and HCCL reduces
float64 only on Ascend 950. Level ``capability``: compared by verdict; the step's grad norm must also agree
with a float64 CPU computation to 1e-5 (fp32 partial sums per bucket, combined in fp64 on the host).
"""
from __future__ import annotations

import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["NoFloat64Mode", "Float64OnDeviceError", "capability_cases", "run_capability_case"]


class Float64OnDeviceError(RuntimeError):
    """An aten op saw a float64 tensor (or was asked to make one) inside :class:`NoFloat64Mode`."""


class NoFloat64Mode(TorchDispatchMode):
    """Raise on every aten op with a float64 tensor argument or result, or a ``dtype=torch.float64``
    argument. Host-side Python floats (fp64 by nature) are fine: only tensors are checked."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for a in tree_leaves((args, kwargs)):
            if (isinstance(a, torch.Tensor) and a.dtype == torch.float64) or a is torch.float64:
                raise Float64OnDeviceError(f"{func} got a float64 argument: devices without float64 (Ascend A2/A3) "
                                           "cannot run it")
        out = func(*args, **kwargs)
        for o in tree_leaves(out):
            if isinstance(o, torch.Tensor) and o.dtype == torch.float64:
                raise Float64OnDeviceError(f"{func} produced a float64 tensor")
        return out


CASES = ("capability/no_float64/quangrad_step", "capability/no_float64/quangrad_step_sharded")


def capability_cases() -> list[str]:
    return list(CASES)


def _step(be, device: torch.device, sharded: bool) -> tuple[float, float]:
    from agoq_core.quangrad import QuanGradConfig, QuanGradDDP

    g = torch.Generator().manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(48, 96), torch.nn.ReLU(), torch.nn.Linear(96, 8)).to(device)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_((torch.randn(p.shape, generator=g) * 0.2).to(device))
    x = torch.randn(32, 48, generator=g).to(device)
    y = torch.randn(32, 8, generator=g).to(device)
    qg = QuanGradDDP(model, lambda ps: torch.optim.SGD(ps, lr=0.1),
                     config=QuanGradConfig(max_grad_norm=0.05, backend=be, sharded=sharded, bucket_cap_mb=0.01))
    with NoFloat64Mode():
        torch.nn.functional.mse_loss(qg(x), y).backward()
        stored = [qg.gradient(n).detach().cpu().clone() for n in qg.param_names]
        rep = qg.step()
    want = float(torch.linalg.vector_norm(torch.cat([s.reshape(-1).double() for s in stored])))
    return rep.grad_norm, want


def run_capability_case(case_id: str, be, device: torch.device) -> dict:
    rec: dict = {"id": case_id, "op": "quangrad_step", "fmt": None, "block": None, "level": "capability",
                 "verdict": "pass", "detail": "", "output_sha256": None, "mismatches": 0}
    t0 = time.perf_counter()
    try:
        got, want = _step(be, device, sharded=case_id.endswith("_sharded"))
        if not abs(got - want) <= 1e-5 * want:
            rec.update(verdict="fail", mismatches=1, detail=f"grad norm {got!r} != float64 reference {want!r} (rel 1e-5)")
    except Float64OnDeviceError as exc:
        rec.update(verdict="fail", mismatches=1, detail=f"float64 on the device: {exc}")
    except Exception as exc:  # a crash is a failing case, reported with its error
        rec.update(verdict="error", detail=f"{type(exc).__name__}: {exc}")
    rec["seconds"] = round(time.perf_counter() - t0, 6)
    return rec
