"""The AGoQ arms: LAAQ on the model's activations + QuanGrad on its gradients.

Each arm is a recipe: an LAAQ policy (agoq_core.laaq.LAAQConfig) and a QuanGrad config
(agoq_core.quangrad.QuanGradConfig). The model is converted in place by ``laaq.apply`` (undone when
the arm ends) and wrapped by ``QuanGradDDP``, which owns the optimizer (it steps fp32 master copies
when the parameters are not fp32) and reduces the 8-bit gradients across data-parallel ranks. With
``--pp`` the per-stage LAAQ policies come from the DBCA-PP planner (agoq_core/train/pipeline.py).
"""
from __future__ import annotations

from typing import Any

from agoq_core import laaq, quangrad
from agoq_core.train.arms import Arm, ArmUnavailable, make_baseline_arm, make_optimizer
from agoq_core.train.config import TrainConfig
from agoq_core.train.recipes import RECIPES, Recipe
from agoq_core.train.runtime import Runtime

__all__ = ["make_agoq_arm", "laaq_policy", "quangrad_config", "check_recipe"]


def laaq_policy(name: str):
    """The LAAQConfig arm ``name`` uses (None: no LAAQ); a pipeline plan's layer overrides are added by
    the caller."""
    if RECIPES[name].laaq is None:
        return None
    return RECIPES[name].laaq(laaq.LAAQConfig)


def quangrad_config(name: str, cfg: TrainConfig, group: Any = None, *, clip: bool = True):
    return quangrad.QuanGradConfig(**RECIPES[name].quangrad,
                                   max_grad_norm=(cfg.grad_clip or None) if clip else None, group=group)


def check_recipe(name: str, cfg: TrainConfig) -> Recipe:
    """The recipe of arm ``name``, or ArmUnavailable if it cannot mean anything with this config."""
    recipe = RECIPES[name]
    if recipe.quangrad and recipe.quangrad.get("collective") == "naive_fp8" and cfg.dp < 2:
        # QuanGrad reduces nothing in a one-process group, so this arm would be the agoq arm again.
        raise ArmUnavailable("the naive FP8 all-reduce differs from QuanGrad's only when gradients are summed "
                             "across data-parallel ranks; run it with --nproc 2 or more (and --pp 1), or "
                             "--virtual-ranks 2 or more")
    if recipe.quangrad and recipe.quangrad.get("collective") == "naive_fp8":
        from agoq_core.backend import get_backend
        from agoq_core.formats.policy import fp8_cast_unavailable

        why = fp8_cast_unavailable(get_backend().capabilities(), recipe.quangrad["fmt"])
        if why:  # Ascend A2/A3: the baseline's torch FP8 casts do not exist there
            raise ArmUnavailable(why)
    if cfg.pp > 1 and (recipe.laaq is None or recipe.quangrad is None):
        raise ArmUnavailable(f"the {name} arm is not set up for --pp (it runs without pipelining)")
    return recipe


def make_agoq_arm(name: str, model, rt: Runtime, cfg: TrainConfig, *, laaq_config: Any = None,
                  group: Any = None, laaq_target: Any = None, clip_in_quangrad: bool = True) -> Arm:
    """Arm ``name`` on ``model``: LAAQ applied to ``laaq_target`` (default ``model``; a pipeline stage
    passes the whole HF model so the final norm and LM head convert too), QuanGrad around ``model``."""
    recipe = check_recipe(name, cfg)
    policy = laaq_config if laaq_config is not None else laaq_policy(name)
    report = None
    if policy is not None:
        report = laaq.apply(laaq_target if laaq_target is not None else model, policy)
    if recipe.quangrad is None:  # gradients as in the baseline (.grad, DDP, fp32 masters for bf16)
        arm = make_baseline_arm(model, rt, cfg)
        arm.name, arm.laaq_report = name, report
        arm.notes.insert(0, str(report))
        return arm
    qcfg = quangrad_config(name, cfg, group, clip=clip_in_quangrad)
    arm = Arm(name=name, model=model, rt=rt, cfg=cfg)
    arm.laaq_report = report
    try:
        build = lambda ps: make_optimizer(ps, cfg, cfg.agoq_optimizer)  # noqa: E731
        if cfg.virtual_ranks:
            from agoq_core.quangrad.virtual import VirtualQuanGradDDP

            wrapper = VirtualQuanGradDDP(model, build, world_size=cfg.virtual_ranks, config=qcfg)
        else:
            wrapper = quangrad.QuanGradDDP(model, build, config=qcfg)
    except BaseException:
        if report is not None:
            report.undo()
        raise
    arm.quangrad = wrapper
    arm.optimizer = wrapper.optimizer
    if report is not None:
        arm.notes.append(str(report))
    arm.notes.append(str(wrapper.report))
    return arm
