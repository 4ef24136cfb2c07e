"""The AGoQ arms: LAAQ on the model's activations + QuanGrad on its gradients (+ DBCA-PP with --pp)."""
from __future__ import annotations

from agoq_core.train.arms import Arm, ArmUnavailable
from agoq_core.train.config import TrainConfig
from agoq_core.train.runtime import Runtime

__all__ = ["make_agoq_arm"]


def _require(module: str, attr: str, what: str):
    import importlib

    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise ArmUnavailable(f"{what} is not available: {module} is not installed ({exc})") from None
    if not hasattr(mod, attr):
        raise ArmUnavailable(f"{what} is not available yet: {module} has no {attr!r}")
    return getattr(mod, attr)


def make_agoq_arm(name: str, model, rt: Runtime, cfg: TrainConfig) -> Arm:
    _require("agoq_core.laaq", "apply", "LAAQ (activation quantization)")
    _require("agoq_core.quangrad", "QuanGradDDP", "QuanGrad (8-bit gradients)")
    raise ArmUnavailable("the AGoQ arm is not wired yet")  # replaced when LAAQ and QuanGrad land
