"""``agoq plan``: DBCA-PP activation formats per pipeline stage, with the reasons, as a table or JSON.

With ``--budget`` it picks, per decoder layer of one device, how to keep what backward needs (bf16, LAAQ
at 4-8 bits, checkpointing, quantized-input checkpointing) for the highest predicted tokens/s within the
budget (agoq_core.planner.budget): ``agoq plan --budget 80GiB --model llama2-7b --seq-len 32768``.

With ``--cluster`` it predicts peak memory per stage and step time, baseline vs AGoQ, on a cluster
(agoq_core.scale): ``agoq plan --cluster 64xA6000 --inter 200Gbps --tp 8 --pp 4 --dp 2 --model llama2-13b``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
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


_CLUSTER_ONLY = ("tp", "pp", "dp", "zero", "inter", "intra", "network", "gpus_per_node", "nics_per_node",
                 "accounting", "recompute", "elementwise")


def _run_cluster(args: argparse.Namespace) -> int:
    from agoq_core.planner.errors import PlannerError
    from agoq_core.scale import Parallel, load_profile, parse_cluster, predict
    from agoq_core.scale.render import render_prediction

    network = load_profile(args.network) if args.network else None
    cluster = parse_cluster(args.cluster, inter=args.inter, intra=args.intra, network=network,
                            gpus_per_node=args.gpus_per_node or 8, nics_per_node=args.nics_per_node)
    tp, pp = args.tp or 1, (args.pp if args.pp is not None else args.stages)
    dp = args.dp
    if dp is None:  # the rest of the devices, as torchtitan's dp_shard=-1; the table shows the result
        if tp < 1 or pp < 1 or cluster.devices % (tp * pp):
            raise PlannerError(f"--dp not given and {cluster.devices} devices of {cluster.name} are not a multiple of "
                               f"tp({tp}) * pp({pp}) = {tp * pp}; give --tp, --pp and --dp")
        dp = cluster.devices // (tp * pp)
    par = Parallel(tp=tp, pp=pp, dp=dp,
                   schedule=args.schedule, microbatches=args.microbatches, chunks=args.chunks,
                   microbatch_size=args.microbatch_size, zero=args.zero or 0)
    pred = predict(_load_model(args.model), cluster, par, args.seq_len, accounting=args.accounting or "project",
                   recompute=args.recompute, elementwise=args.elementwise or "fused")
    print(json.dumps(pred.to_dict(), indent=2) if args.json else render_prediction(pred))
    return 0


def _run_budget(args: argparse.Namespace) -> int:
    import dataclasses

    from agoq_core.planner.budget import BUDGET_STATIC, DEFAULT_OPTIONS, plan_budget
    from agoq_core.planner.errors import PlannerError

    if args.cluster:
        raise PlannerError("--budget plans one device and --cluster predicts a cluster; give one of them")
    model = _load_model(args.model)
    options = args.options or ",".join(DEFAULT_OPTIONS)
    measured = None
    if args.layer_costs:
        from agoq_core.planner.budget import load_layer_costs, plan_options
        from agoq_core.planner.model import model_shape

        costs, _ = load_layer_costs(args.layer_costs.split(","), hidden=model_shape(model).hidden)
        if args.microbatch_size != 1:
            raise PlannerError("--layer-costs: bench_layer_profile measures one sequence per layer; plan with "
                               "--microbatch-size 1, or measure the batch you train with")
        if not costs.get(str(args.seq_len)):
            if not (args.scale_costs and costs):
                raise PlannerError(f"--layer-costs has no costs at {args.seq_len} tokens (it has "
                                   f"{', '.join(sorted(costs, key=int)) or 'none'}); profile that length "
                                   "(benchmarks/bench_layer_profile.py --seqs ...), pass --scale-costs to scale the "
                                   "nearest measured length, or plan with the analytic costs")
            from agoq_core.planner.budget import costs_at_length

            at, note = costs_at_length(costs, args.seq_len, model_shape(model))
            costs = {str(args.seq_len): at}
            print(f"agoq plan: {note}", file=sys.stderr)
        if args.float8:  # the profile's fp8-* methods, prefix dropped; no eager / MLP-only LAAQ (float8 refuses them)
            from agoq_core.laaq.policy import float8_plan_options

            measured = float8_plan_options(costs[str(args.seq_len)])
            if not measured:
                raise PlannerError(f"--float8: --layer-costs has no float8 costs at {args.seq_len} tokens (methods "
                                   "fp8-..., e.g. fp8-laaq-c:nf4, fp8-ckpt-c: benchmarks/bench_layer_profile.py)")
            if not args.options:
                options = ",".join(measured)
        else:
            measured = plan_options(costs[str(args.seq_len)])  # the profile's float8 variants are not plan options
        if not args.options and not args.float8:  # the measured options first, then the analytic eager ones
            options = ",".join(dict.fromkeys(list(measured) + list(DEFAULT_OPTIONS)))
    elif args.float8:
        raise PlannerError("--float8 plans from measured float8 per-layer costs: give --layer-costs (a "
                           "bench_layer_profile report with fp8-* methods at --seq-len)")
    # a single-GPU user's state: bf16 gradients unless --grads says otherwise (quangrad: QuanGrad's FP8 buffers)
    # (auto: QuanGrad's FP8 buffers where that plan is predicted faster)
    static = dataclasses.replace(BUDGET_STATIC, optimizer=args.optimizer, param_bytes=args.param_bytes)
    plan = plan_budget(model, budget=args.budget, seq_len=args.seq_len,
                       batch=args.microbatch_size, device=args.device or "H200",
                       options=options, loss=args.loss or "chunked", measured=measured,
                       headroom=args.headroom if args.headroom is not None else 0.02, static=static,
                       grads=args.grads or BUDGET_STATIC.grads)
    print(json.dumps(plan.to_dict(), indent=2) if args.json else plan.render())
    return 0


def _run(args: argparse.Namespace) -> int:
    from agoq_core.planner import StaticMemoryConfig, plan_for_pipeline
    from agoq_core.planner.errors import PlannerError

    if args.budget:
        return _run_budget(args)
    if args.grads == "auto":
        raise PlannerError("--grads auto chooses the gradient storage of a memory-budget plan: give --budget (e.g. "
                           "--budget 80GiB --model llama2-7b --seq-len 32768), or name the storage")
    given = [f"--{k.replace('_', '-')}" for k in ("device", "options", "loss", "headroom", "layer_costs")
             if getattr(args, k) is not None] + (["--float8"] if args.float8 else [])
    if given:
        raise PlannerError(f"{', '.join(given)} belong to the memory-budget policy and need --budget (e.g. --budget "
                           "80GiB --model llama2-7b --seq-len 32768)")
    if args.cluster:
        return _run_cluster(args)
    given = [f"--{k.replace('_', '-')}" for k in _CLUSTER_ONLY if getattr(args, k) is not None]
    if given:
        raise PlannerError(f"{', '.join(given)} describe a cluster prediction and need --cluster (e.g. --cluster "
                           f"64xA6000 --inter 200Gbps --tp 8 --pp 4 --dp 2)")
    from agoq_core.planner.explain import parse_bytes, render_plan

    candidates = tuple(f.strip() for f in args.candidates.split(",") if f.strip())
    from agoq_core.planner.plan import DEFAULT_CANDIDATES

    if args.candidates == ",".join(DEFAULT_CANDIDATES) and os.environ.get("AGOQ_BACKEND"):
        # default candidates on a named backend: drop float codes the device has no units for (Ascend A2/A3)
        from agoq_core.backend import get_backend
        from agoq_core.formats.policy import hardware_candidates

        candidates, why = hardware_candidates(get_backend().capabilities(), candidates)
        if why:
            print(f"agoq plan: {why}", file=sys.stderr)
    options = dict(
        schedule=args.schedule, stages=args.stages, microbatches=args.microbatches, chunks=args.chunks,
        microbatch_size=args.microbatch_size, seq_len=args.seq_len,
        candidates=candidates,
        baseline_format=args.baseline, granularity=args.granularity,
        budget_bytes=parse_bytes(args.budget_bytes) if args.budget_bytes is not None else None,
        activation_budget_bytes=(parse_bytes(args.activation_budget_bytes)
                                 if args.activation_budget_bytes is not None else None),
        activations=args.activations, dtype=args.dtype, measure_device=args.measure_device,
        static=StaticMemoryConfig(param_bytes=args.param_bytes, grads=args.grads or "quangrad",
                                  optimizer=args.optimizer))
    plan = plan_for_pipeline(_load_model(args.model), **options)
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
    from agoq_core.cli.argtypes import non_negative_int, positive_int
    from agoq_core.models import MODELS
    from agoq_core.planner.plan import DEFAULT_CANDIDATES

    p.add_argument("--stages", type=positive_int, default=4, help="pipeline stages (ranks) [4]")
    p.add_argument("--microbatches", type=positive_int, default=8, help="micro-batches per step [8]")
    p.add_argument("--schedule", default="interleaved-1f1b", help="gpipe, 1f1b or interleaved-1f1b [interleaved-1f1b]")
    p.add_argument("--chunks", type=positive_int, default=None, help="virtual chunks per stage (interleaved: 2)")
    p.add_argument("--model", default="llama2-7b",
                   help=f"preset ({', '.join(MODELS)}) or an HF config.json / model directory [llama2-7b]")
    p.add_argument("--seq-len", type=positive_int, default=4096, help="tokens per sequence [4096]")
    p.add_argument("--microbatch-size", type=positive_int, default=1, help="sequences per micro-batch [1]")
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
    p.add_argument("--param-bytes", type=positive_int, default=2, help="bytes per weight (2 = bf16, 4 = fp32) [2]")
    p.add_argument("--grads", default=None, choices=("quangrad", "bf16", "fp32", "auto"),
                   help="gradient storage [quangrad; with --budget: bf16, a single-GPU user's .grad]; auto (with "
                        "--budget only): QuanGrad's FP8 buffers where that plan is predicted faster, else bf16")
    p.add_argument("--optimizer", default="adam8bit", choices=("adam", "adam8bit", "sgd", "none"), help="optimizer state")
    p.add_argument("--run-check", type=non_negative_int, default=0, metavar="STEPS",
                   help="also train STEPS steps of the plan on a real CPU pipeline (one process per stage, "
                        "gloo; small models only) and print measured vs planned memory per stage")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    c = p.add_argument_group("cluster prediction (agoq_core.scale; docs/scale.md)")
    c.add_argument("--cluster", default=None, metavar="NxDEVICE",
                   help="predict memory and step time, baseline vs AGoQ, on N devices of a type "
                        "(H200, H100, A100, A6000, 910B), e.g. 64xA6000")
    c.add_argument("--inter", default=None, help="inter-node link: a rate (200Gbps, 25GbE) or a preset (ib-400, "
                                                 "ib-200, roce-200, eth-100, eth-25, eth-10) [ib-200]")
    c.add_argument("--intra", default=None, help="intra-node link preset (nvlink4, nvlink3, pcie4, hccs) [device's]")
    c.add_argument("--network", default=None, help="a network profile JSON (benchmarks/calibrate_collectives.py) or "
                                                   "the name of a shipped one; overrides --inter/--intra")
    c.add_argument("--gpus-per-node", type=int, default=None, help="devices per node [8]")
    c.add_argument("--nics-per-node", type=int, default=None,
                   help="inter-node NICs per node [one per GPU for H100/H200/A100, else 1]")
    c.add_argument("--tp", type=int, default=None, help="tensor-parallel size [1]")
    c.add_argument("--pp", type=int, default=None, help="pipeline-parallel size [--stages, i.e. 4]")
    c.add_argument("--dp", type=int, default=None, help="data-parallel size [devices / (tp x pp)]")
    c.add_argument("--zero", type=int, default=None, choices=(0, 1, 2, 3),
                   help="shard optimizer (1), + gradients (2), + weights (3 = FSDP) over dp [0]")
    c.add_argument("--accounting", default=None, choices=("project", "paper"),
                   help="activation bytes of this project's code, or the paper's Table 1 units [project]")
    c.add_argument("--recompute", type=int, default=None,
                   help="force the baseline's recomputed layers per virtual stage [fewest that fit]")
    c.add_argument("--elementwise", default=None, choices=("fused", "hf"),
                   help="memory-bound ops as fused kernels (Megatron) or Hugging Face eager [fused]")
    b = p.add_argument_group("memory-budget policy of one device (agoq_core.planner.budget; docs/laaq.md)")
    b.add_argument("--budget", default=None, metavar="BYTES",
                   help="plan per-layer bf16 / LAAQ / checkpointing for one device with this much memory (e.g. "
                        "80GiB), batch --microbatch-size x --seq-len tokens")
    b.add_argument("--device", default=None, help="device profile for the time model (H200, H100, A100, A6000, "
                                                  "910B) [H200]")
    b.add_argument("--options", default=None,
                   help="per-layer options, comma-separated: bf16, ckpt, laaq:FMT, qckpt:FMT "
                        "[bf16,laaq:nf4,laaq:int5,laaq:int6,laaq:int8,ckpt,qckpt:nf4,qckpt:int8]")
    b.add_argument("--loss", default=None, choices=("chunked", "hf", "auto"),
                   help="loss the training uses: chunked/fused linear cross-entropy, the model's own, or auto (the "
                        "model's own where that plan is predicted faster and fits) [chunked]")
    b.add_argument("--headroom", type=float, default=None, help="share of the budget left to the allocator [0.02]")
    b.add_argument("--layer-costs", default=None, metavar="JSON[,JSON]",
                   help="measured per-layer costs (benchmarks/bench_layer_profile.py reports) at --seq-len: their "
                        "options (compiled ones included: bf16-c, laaq-c:nf4, qckpt-c:nf4, ckpt-c, ...) replace the "
                        "time model's")
    b.add_argument("--scale-costs", action="store_true",
                   help="with --layer-costs: plan a --seq-len the reports lack from the nearest measured length, "
                        "scaled (bytes per token; time by the analytic layer's length dependence); says so on stderr")
    b.add_argument("--float8", action="store_true",
                   help="with --layer-costs: plan from its float8 methods (fp8-laaq-c:nf4, fp8-ckpt-c, ...): torchao "
                        "float8 on every decoder Linear, applied with apply_policy(model, plan, float8=True)")
    p.set_defaults(func=_run)
