"""QuanGrad: gradients stored in 8 bits and a precision-preserving all-reduce (AGoQ paper §5).

Quick start (inside a torchrun / init_process_group job)::

    from agoq_core.quangrad import QuanGradDDP, QuanGradConfig
    qg = QuanGradDDP(model, lambda ps: torch.optim.AdamW(ps, lr=3e-4), config=QuanGradConfig(max_grad_norm=1.0))
    (qg(x).loss).backward(); report = qg.step()

Checking API: ``all_reduce_(t, group=None, fmt="fp8_e4m3", block=None)`` (in place, identical on every
rank), ``reduce_scatter(t, ...)``, the baselines in ``agoq_core.quangrad.baselines`` and the
single-process ``protocol.simulate_all_reduce`` for conformance vectors. FSDP2: ``agoq_core.quangrad.fsdp.enable(model)``
after ``fully_shard`` (module ``fsdp``). docs/quangrad.md has the rest.
"""
from agoq_core.quangrad.baselines import bf16_all_reduce_, fp32_all_reduce_, naive_fp8_all_reduce_
from agoq_core.quangrad.collective import ReduceScatterResult, all_reduce_, reduce_scatter
from agoq_core.quangrad.comm_hook import QuanGradHookState, quangrad_hook, register_comm_hook
from agoq_core.quangrad.config import GRADIENT_FORMATS, QuanGradConfig  # noqa: F401
from agoq_core.errors import RankMismatchError
from agoq_core.quangrad.layout import LayoutMismatchError
from agoq_core.quangrad.optim import optimizer_factory
from agoq_core.quangrad.protocol import simulate_all_reduce, simulate_reduce_scatter
from agoq_core.quangrad.wrapper import QuanGradDDP, QuanGradReport, StepReport

__all__ = [
    # data-parallel training
    "QuanGradDDP",
    "QuanGradConfig",
    "StepReport",
    "QuanGradReport",
    "optimizer_factory",
    # DDP hook (wire compression only)
    "register_comm_hook",
    "quangrad_hook",
    "QuanGradHookState",
    # checking API and baselines
    "all_reduce_",
    "reduce_scatter",
    "ReduceScatterResult",
    "fp32_all_reduce_",
    "bf16_all_reduce_",
    "naive_fp8_all_reduce_",
    # simulation (conformance)
    "simulate_all_reduce",
    "simulate_reduce_scatter",
    # errors
    "LayoutMismatchError",
    "RankMismatchError",
]
