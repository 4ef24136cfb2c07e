"""``agoq plan``: DBCA-PP activation formats per pipeline stage, with the reasons, as a table or JSON."""
from __future__ import annotations

import argparse
import json
import os
import types


def _load_model(arg: str):
    from agoq_core.planner.errors import PlannerError

    path = arg
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if os.path.isfile(path):
        try:
            with open(path) as fh:
                data = json.load(fh)
        except (OSError, ValueError) as exc:
            raise PlannerError(f"--model {arg!r}: cannot read an HF config.json: {exc}") from None
        return types.SimpleNamespace(name_or_path=os.path.basename(os.path.dirname(os.path.abspath(path))) or arg,
                                     **data)
    return arg  # a preset name; model_shape() names the presets if it is unknown


def _torch_check(spec) -> str:
    from agoq_core.planner.errors import TorchScheduleUnavailable
    from agoq_core.planner.torch_schedules import compare_with_torch, torch_action_lists

    try:
        diffs = compare_with_torch(spec)
        ta = torch_action_lists(spec)
    except TorchScheduleUnavailable as exc:
        return f"not checked against torch ({exc})"
    if diffs:
        return "DIFFERS from torch: " + "; ".join(diffs)
    return (f"action lists identical to torch {ta.torch_version} "
            f"{'ScheduleInterleaved1F1B' if spec.chunks > 1 else ('Schedule1F1B' if spec.schedule == '1f1b' else 'ScheduleGPipe')}"
            f" ({ta.source})")


def _run(args: argparse.Namespace) -> int:
    from agoq_core.planner import PlanConfig, StaticMemoryConfig, plan_for_pipeline
    from agoq_core.planner.explain import parse_bytes, render_plan

    cfg = PlanConfig(
        schedule=args.schedule, stages=args.stages, microbatches=args.microbatches, chunks=args.chunks,
        microbatch_size=args.microbatch_size, seq_len=args.seq_len,
        candidates=tuple(f.strip() for f in args.candidates.split(",") if f.strip()),
        baseline_format=args.baseline, granularity=args.granularity,
        budget_bytes=parse_bytes(args.budget_bytes) if args.budget_bytes is not None else None,
        activation_budget_bytes=(parse_bytes(args.activation_budget_bytes)
                                 if args.activation_budget_bytes is not None else None),
        activations=args.activations, dtype=args.dtype, measure_device=args.measure_device,
        static=StaticMemoryConfig(param_bytes=args.param_bytes, grads=args.grads, optimizer=args.optimizer))
    plan = plan_for_pipeline(_load_model(args.model), config=cfg)
    check = _torch_check(plan.spec)
    run = None
    if args.run_check:
        from agoq_core.planner.pipeline_run import run_planned_pipeline

        run = run_planned_pipeline(plan, steps=args.run_check)
    if args.json:
        d = plan.to_dict()
        d["torch_check"] = check
        if run is not None:
            d["run_check"] = run.to_dict()
        print(json.dumps(d, indent=2))
    else:
        print(render_plan(plan, torch_check=check))
        if run is not None:
            print(f"\nplan vs a real torch.distributed.pipelining run ({plan.spec.stages} CPU processes, gloo, "
                  f"{args.run_check} steps, last step measured; bytes above what was alive when it started):")
            print(run.table())
    return 0


def register(p: argparse.ArgumentParser) -> None:
    from agoq_core.planner.plan import DEFAULT_CANDIDATES

    p.add_argument("--stages", type=int, default=4, help="pipeline stages (ranks) [4]")
    p.add_argument("--microbatches", type=int, default=8, help="micro-batches per step [8]")
    p.add_argument("--schedule", default="interleaved-1f1b", help="gpipe, 1f1b or interleaved-1f1b [interleaved-1f1b]")
    p.add_argument("--chunks", type=int, default=None, help="virtual chunks per stage (interleaved: 2)")
    p.add_argument("--model", default="llama2-7b",
                   help="preset (tiny, llama-1b, llama2-7b, llama3-8b, llama2-13b) or an HF config.json / "
                        "model directory [llama2-7b]")
    p.add_argument("--seq-len", type=int, default=4096, help="tokens per sequence [4096]")
    p.add_argument("--microbatch-size", type=int, default=1, help="sequences per micro-batch [1]")
    p.add_argument("--candidates", default=",".join(DEFAULT_CANDIDATES), help="candidate formats, comma-separated")
    p.add_argument("--baseline", default="nf4", help="uniform 4-bit format of the default budget [nf4]")
    p.add_argument("--granularity", default="layer", choices=("layer", "chunk", "stage"),
                   help="one format per layer (default), per chunk, or per stage (the paper)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--budget-bytes", default=None,
                   help="device memory per stage incl. weights, gradients, optimizer (e.g. 80GiB)")
    g.add_argument("--activation-budget-bytes", default=None, help="activation memory per stage (e.g. 12GiB)")
    p.add_argument("--activations", default="measured", choices=("measured", "formula", "bits"),
                   help="activation bytes from LAAQ's measurement (default), a shape formula, or the paper's "
                        "bits x micro-batches accounting")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                   help="training dtype of what LAAQ keeps in 16-bit [bfloat16]")
    p.add_argument("--measure-device", default="cpu",
                   help="where LAAQ measures a 2-layer model of the shape [cpu]; use the training device "
                        "(e.g. cuda) when its attention kernel keeps other tensors")
    p.add_argument("--param-bytes", type=int, default=2, help="bytes per weight (2 = bf16, 4 = fp32) [2]")
    p.add_argument("--grads", default="quangrad", choices=("quangrad", "bf16", "fp32"), help="gradient storage")
    p.add_argument("--optimizer", default="adam8bit", choices=("adam", "adam8bit", "sgd", "none"), help="optimizer state")
    p.add_argument("--run-check", type=int, default=0, metavar="STEPS",
                   help="also train STEPS steps of the plan on a real CPU pipeline (one process per stage, "
                        "gloo; small models only) and print measured vs planned memory per stage")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=_run)
