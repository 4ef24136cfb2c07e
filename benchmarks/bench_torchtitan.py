"""torchtitan Llama 3 on one GPU: activation checkpointing none/selective/full, float8, and the agoq converter.

Every configuration runs in its own process (fresh allocator, fresh compile caches) on torchtitan's own
pieces: ``model_registry(flavor, converters=[...])``, its ActivationCheckpointing policies, its
``apply_fsdp_to_decoder`` (FSDP2 world size 1, bf16 params, fp32 reduce; what ``parallelize_llama``
does), ``apply_compile`` for float8, and its ``ChunkedLossWrapper`` cross-entropy. Same seed, data,
batch, steps and sequence lengths for all; for each configuration the sequence lengths are tried
longest first, so the first that runs is the longest that fits (on this ladder). Writes
``$OUT/bench_torchtitan.json`` and ``$OUT/bench_torchtitan.md``.

    python3 benchmarks/bench_torchtitan.py --budget-s 210       # H200: Llama-3-8B layer shape
    python3 benchmarks/bench_torchtitan.py --smoke              # CPU, gloo, torchtitan's debugmodel

Deviations from torchtitan's own launcher, each for a stated reason:
- The Trainer is not used: it needs torchtitan's test assets (c4_test, tokenizer) and the
  datasets/tokenizers/torchdata/wandb packages, none on the GPU machine; tokens are random (seeded).
- Inner attention is SDPA for every configuration (flash on H200): torchtitan 0.3.0's default,
  FlexAttention, compiles with max_autotune on first use, minutes per process.
- ``--layers`` (default 8) of the 8B model's 32 layers: with fp32 master weights and AdamW state
  (16 B/parameter) the full 8B model's states alone exceed one H200; activation memory per layer is
  what the configurations differ in, and it is the same per layer at any depth.
- On torch < 2.12 ``torch.distributed.fsdp.DataParallelMeshDims`` (imported at module level by
  torchtitan 0.3.0, used only by its full-DTensor mode, which this script does not use) is given a
  placeholder so that torchtitan imports (``agoq_core.integrations.torchtitan.torch_compat``).
- On a torch whose FSDP2 lacks partly-run groups (2.11, 2.12; see ``fsdp_groups_partial_forward``)
  torchtitan's ``fully_shard([norm, lm_head])`` becomes two FSDP units, for every configuration alike:
  without it the chunked loss frees ``norm.weight`` before the decoder's backward reads it. Each result
  records the grouping (``fsdp_norm_lm_head``) and the loss.
- float8 keeps ``lm_head`` in bf16 (``filter_fqns=["lm_head"]``, torchtitan's llama3_405b recipe).
- Lengths run longest first (``--seqs``, default 16k/32k/64k), 1 warm-up + 2 timed steps each; a new
  process after each out-of-memory; each configuration gets a share of ``--budget-s`` (float8 2x, it
  compiles) and skips lengths predicted not to finish in it. The JSON is rewritten after every
  configuration, so a run stopped from outside keeps what it measured.
- LAAQ+QuanGrad at FSDP world size 1: FSDP2 does not call its reduce-scatter at world size 1, so this
  row measures the converter's installation only; the counters in the JSON say 0 compressed buckets.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    # name: (activation checkpointing, converter, compile)
    "tt_ac_none": ("none", None, False),
    "tt_ac_selective": ("selective", None, False),
    "tt_ac_full": ("full", None, False),
    "tt_float8_selective": ("selective", "float8", True),
    "agoq_laaq": ("none", "agoq", False),
    "agoq_laaq_quangrad": ("none", "agoq+qg", False),
}
WEIGHT = {"tt_float8_selective": 2.0}  # its share of the time budget, relative: it compiles the blocks first
SEQS = (16384, 32768, 65536)
SMOKE_SEQS = (64, 128)


def fsdp_groups_partial_forward() -> bool:
    """Whether this torch's FSDP2 handles a ``fully_shard([norm, lm_head])`` group of which the model's
    forward runs only ``norm`` (the chunked loss then calls ``lm_head`` per chunk): torch 2.13.0 has it
    (pytorch PR 180428, ``FSDPState._force_complete_incomplete_states``; feature-detected), 2.11.0 and
    2.12.0 do not. Without it the group's
    post-forward never runs for ``norm`` alone, no pre-backward hook goes on its output, and the
    ChunkedLossWrapper's ``lm_head.reshard()`` frees the unsharded ``norm.weight`` that the decoder's
    backward then reads: "data is not allocated yet" on CUDA, a segmentation fault on CPU."""
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    return hasattr(FSDPState, "_force_complete_incomplete_states")


def apply_fsdp(model, mesh, param_dtype, reduce_dtype, split: bool | None = None) -> str:
    """torchtitan's ``apply_fsdp_to_decoder`` (what its ``parallelize_llama`` does for FSDP2); on a torch
    without partial-forward groups (see ``fsdp_groups_partial_forward``) its ``[norm, lm_head]`` group
    becomes two FSDP units, as torchtitan itself did under the chunked loss before its PR 2937. Same
    sharding, mixed precision and reshard policy; at world size 1 no collective differs. Returns the
    grouping used (recorded in the results). ``split`` forces either grouping (tests)."""
    import torchtitan.distributed.fsdp as tt_fsdp

    if split is None:
        split = not fsdp_groups_partial_forward()
    if not split:
        tt_fsdp.apply_fsdp_to_decoder(model, mesh, param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                                      pp_enabled=False)
        return "torchtitan: fully_shard([norm, lm_head])"
    if model.enable_weight_tying:
        raise RuntimeError("torch < 2.13 FSDP2 cannot run torchtitan's tied [tok_embeddings, norm, lm_head] group "
                           "under the chunked loss, and a tied group cannot be split; use torch >= 2.13")
    orig = tt_fsdp.fully_shard

    def split_lists(module, **kw):
        if isinstance(module, (list, tuple)):
            for m in module:
                orig(m, **kw)
            return module
        return orig(module, **kw)

    tt_fsdp.fully_shard = split_lists
    try:
        tt_fsdp.apply_fsdp_to_decoder(model, mesh, param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                                      pp_enabled=False)
    finally:
        tt_fsdp.fully_shard = orig
    return "split for torch < 2.13: fully_shard(norm), fully_shard(lm_head)"


def _parallel_dims():
    """torchtitan's ParallelDims for one rank, FSDP only (apply_compile reads its TP setting)."""
    from torchtitan.distributed.parallel_dims import ParallelDims

    return ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, world_size=1)


def _converters(kind: str | None, smoke: bool):
    if kind is None:
        return None
    if kind == "float8":
        from torchtitan.components.quantization import Float8LinearConverter

        # lm_head stays bf16 as in torchtitan's own float8 recipe for the large Llamas (llama3_405b): the chunked
        # loss runs it eagerly, outside the compiled blocks, where float8's casts would only cost time
        return [Float8LinearConverter.Config(model_compile_enabled=not smoke, emulate=smoke, filter_fqns=["lm_head"])]
    from agoq_core.integrations.torchtitan import AgoqConverter

    return [AgoqConverter.Config(quangrad=kind == "agoq+qg", quangrad_threshold_bytes=0)]


def child(args) -> dict:
    import torch
    import torch.distributed as dist

    from agoq_core.integrations.torchtitan import torch_compat

    torch_compat()  # torch < 2.12: torchtitan 0.3.0's import of DataParallelMeshDims (module docstring)
    from torch.distributed.device_mesh import init_device_mesh
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import model_registry

    ac, conv, compile_ = CONFIGS[args.child]
    dev = "cpu" if args.smoke else "cuda"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    dist.init_process_group("gloo" if args.smoke else "nccl", rank=0, world_size=1)
    if dev == "cuda":
        torch.cuda.set_device(0)
    compile_ = compile_ and not args.smoke
    spec = model_registry(args.flavor, converters=_converters(conv, args.smoke))
    cfg = spec.model
    if args.layers:
        cfg.layers = cfg.layers[: args.layers]
    for layer in cfg.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    torch.manual_seed(0)
    with torch.device("meta"):
        model = cfg.build()
    if ac == "full":
        FullAC.Config().build().apply(model)
    elif ac == "selective":
        SelectiveAC.Config().build().apply(model)
    if compile_:
        from torchtitan.config import CompileConfig
        from torchtitan.distributed.compile import apply_compile

        apply_compile(model, compile_config=CompileConfig(enable=True, components=["model"]),
                      parallel_dims=_parallel_dims())
    mesh = init_device_mesh(dev, (1,), mesh_dim_names=("fsdp",))
    pdtype = torch.bfloat16 if (args.bf16 or not args.smoke) else torch.float32
    fsdp_grouping = apply_fsdp(model, mesh, pdtype, torch.float32)
    model.to_empty(device=dev)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    loss_fn = ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config()).build()
    loss_fn.set_lm_head(model.lm_head)
    model._skip_lm_head = True
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    vocab = cfg.vocab_size
    res = {"config": args.child, "ac": ac, "converter": conv, "compile": compile_, "params": n_params,
           "layers": len(cfg.layers), "flavor": args.flavor, "batch": args.batch, "param_dtype": str(pdtype),
           "fsdp_norm_lm_head": fsdp_grouping, "loss": "torchtitan ChunkedLossWrapper(CrossEntropyLoss)",
           "torch": torch.__version__, "runs": []}
    if dev == "cuda":
        res["gpu"] = torch.cuda.get_device_name(0)

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    if args.fake_oom_above:  # CPU tests of the ladder: lm_head (inside the chunked loss) "runs out of memory"
        def fake_oom(mod, inp):
            if current["seq"] > args.fake_oom_above:
                raise torch.OutOfMemoryError(f"fake OOM above {args.fake_oom_above} (--fake-oom-above)")
        model.lm_head.register_forward_pre_hook(fake_oom)
    current = {"seq": 0}
    deadline = args.deadline_at or (time.time() + args.budget_s)
    fitted = None  # (seq, step_s) of the longest length that ran: predicts the shorter ones' time
    # Longest first: the first length that runs is the longest that fits (what the comparison needs most);
    # shorter ones follow while the time share lasts, for tokens/s where every configuration fits. An
    # out-of-memory ends this process (FSDP's state after a step that failed part-way is not a fresh
    # step's); the parent goes on with the shorter lengths in a new one.
    for seq in sorted(args.seqs, reverse=True):
        left = deadline - time.time()
        predicted = None if fitted is None else (args.warmup + args.steps) * fitted[1] * seq / fitted[0] * 1.25
        if left <= 0 or (predicted is not None and predicted > left):
            res["runs"].append({"seq": seq, "status": "skipped (time budget)"})
            print("RUN " + json.dumps(res["runs"][-1]), flush=True)
            continue
        current["seq"] = seq
        g = torch.Generator().manual_seed(seq)
        data = torch.randint(0, vocab, (args.warmup + args.steps, args.batch, seq + 1), generator=g)
        if dev == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        losses, t0, run = [], None, None
        try:
            for i in range(args.warmup + args.steps):
                if i == args.warmup:
                    sync()
                    t0 = time.perf_counter()
                tok = data[i].to(dev)
                h = model(tok[:, :-1])
                loss, _ = loss_fn(h, tok[:, 1:], global_valid_tokens=torch.tensor(float(args.batch * seq), device=dev))
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                losses.append(float(loss.detach()))
            sync()
            dt = time.perf_counter() - t0
            run = {"seq": seq, "status": "ok", "tokens_per_s": args.batch * seq * args.steps / dt,
                   "step_s": dt / args.steps, "losses": losses}
            if dev == "cuda":
                run["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
                run["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
            if fitted is None:
                fitted = (seq, run["step_s"])
        except (torch.OutOfMemoryError, RuntimeError) as e:  # a Triton kernel's launch can fail as RuntimeError
            if not (isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()):
                raise
            run = {"seq": seq, "status": "oom"}
        finally:
            h = loss = tok = None
            opt.zero_grad(set_to_none=True)
            gc.collect()
        res["runs"].append(run)
        print("RUN " + json.dumps(run), flush=True)
        if run["status"] == "oom":
            break
    st = model.__dict__.get("agoq_quangrad_state")
    if st is not None:
        res["quangrad"] = {"compressed_calls": st.compressed_calls, "fallback_calls": st.fallback_calls,
                           "wire_bytes": st.wire_bytes}
    rep = model.__dict__.get("agoq_laaq_report")
    if rep is not None:
        res["laaq"] = str(rep).splitlines()[0]
    dist.destroy_process_group()
    return res


def _run_child(args, name: str, seqs: list[int], end: float, hard_end: float, port: int, env: dict) -> dict:
    """One child process for ``name`` on ``seqs`` (longest first): it starts no length predicted to end after
    ``end`` (epoch seconds) and is stopped at ``hard_end`` (what it printed until then is kept)."""
    cmd = [sys.executable, __file__, "--child", name, "--flavor", args.flavor, "--layers", str(args.layers),
           "--seqs", ",".join(map(str, seqs)), "--batch", str(args.batch), "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--deadline-at", f"{end:.1f}", "--port", str(port)]
    cmd += ["--smoke"] if args.smoke else []
    cmd += ["--bf16"] if args.bf16 else []
    cmd += ["--fake-oom-above", str(args.fake_oom_above)] if args.fake_oom_above else []
    limit = max(hard_end - time.time(), 1)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, env=env)
        res = _child_result(name, p.stdout, p.stderr)
        if "error" in res and p.returncode:
            res["error"] += f" (exit {p.returncode})"
    except subprocess.TimeoutExpired as e:
        res = _child_result(name, e.stdout, e.stderr)
        res["error"] = f"timed out after {limit:.0f}s" + (f"; {res['error']}" if res.get("error") else "")
    return res


def _child_result(name: str, stdout, stderr) -> dict:
    """The child's RESULT line, or what its RUN lines measured before it died or was stopped."""
    text = lambda x: x.decode(errors="replace") if isinstance(x, bytes) else (x or "")  # noqa: E731
    out, err = text(stdout), text(stderr)
    for ln in out.splitlines():
        if ln.startswith("RESULT "):
            return json.loads(ln[7:])
    runs = [json.loads(ln[4:]) for ln in out.splitlines() if ln.startswith("RUN ")]
    tail = err.strip().splitlines()[-1:] if err.strip() else []
    return {"config": name, "error": f"no result: {tail}", "runs": runs, "stderr_tail": err[-3000:]}


def _table(results: list[dict]) -> str:
    seqs = sorted({r["seq"] for res in results for r in res.get("runs", [])})
    lines = ["| config | " + " | ".join(f"seq {s}: tok/s, peak GiB" for s in seqs) + " | longest fitting |",
             "|---|" + "---|" * (len(seqs) + 1)]
    for res in results:
        cells = []
        by = {r["seq"]: r for r in res.get("runs", [])}
        for s in seqs:
            r = by.get(s)
            if r is None:
                cells.append("")
            elif r["status"] == "ok":
                cells.append(f"{r['tokens_per_s']:,.0f}, " + (f"{r['peak_gib']:.1f}" if "peak_gib" in r else "-"))
            else:
                cells.append(r["status"])
        ok = [r["seq"] for r in res.get("runs", []) if r["status"] == "ok"]
        oom = any(r["status"] == "oom" for r in res.get("runs", []))
        longest = (str(max(ok)) if oom else f">= {max(ok)}") if ok else ("none" if oom else "not run")
        err = f" ({res['error'][:80]})" if res.get("error") else ""
        lines.append(f"| {res['config']}{err} | " + " | ".join(cells) + f" | {longest} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="CPU/gloo, torchtitan's debugmodel, tiny sequences")
    ap.add_argument("--bf16", action="store_true", help="bf16 parameters with --smoke too (always on the GPU)")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--flavor", default=None, help="torchtitan llama3 flavor (default 8B; debugmodel with --smoke)")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers kept (default 8; 2 with --smoke)")
    ap.add_argument("--seqs", default=None)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2, help="timed steps per sequence length")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per sequence length before them")
    ap.add_argument("--budget-s", type=float, default=210.0,
                    help="total wall-clock budget for all configs (each gets an equal share of what is left; a "
                         "configuration skips the sequence lengths predicted not to finish in its share)")
    ap.add_argument("--deadline-at", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--fake-oom-above", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=29611, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.flavor = args.flavor or ("debugmodel" if args.smoke else "8B")
    args.layers = args.layers if args.layers is not None else (2 if args.smoke else 8)
    args.seqs = [int(s) for s in args.seqs.split(",")] if args.seqs else list(SMOKE_SEQS if args.smoke else SEQS)
    if args.child:
        try:
            res = child(args)
        except Exception as e:  # noqa: BLE001 - reported in the table, the other configs still run
            import traceback

            res = {"config": args.child, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(),
                   "runs": []}
        print("RESULT " + json.dumps(res), flush=True)
        return
    out = Path(os.environ.get("OUT", "/tmp/agoq-out"))
    out.mkdir(parents=True, exist_ok=True)
    names = [c for c in args.configs.split(",") if c]
    unknown = [c for c in names if c not in CONFIGS]
    if unknown:
        sys.exit(f"unknown configs {unknown}; known: {list(CONFIGS)}")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # as torchtitan's run_train.sh
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "argv": sys.argv,
            "flavor": args.flavor, "layers": args.layers, "batch": args.batch, "steps": args.steps,
            "warmup": args.warmup, "seqs": args.seqs, "budget_s": args.budget_s}
    try:  # versions only: the parent never touches the GPU (the children report its name)
        import torch
        import torchtitan

        meta.update(torch=torch.__version__, torchtitan=getattr(torchtitan, "__version__", "?"))
    except Exception as e:  # noqa: BLE001
        meta["env_error"] = repr(e)

    def write(results: list[dict]) -> str:  # after every configuration: a killed run keeps what it measured
        gpu = next((r["gpu"] for r in results if r.get("gpu")), None)
        m = dict(meta, **({"gpu": gpu} if gpu else {}))
        (out / "bench_torchtitan.json").write_text(json.dumps({"meta": m, "results": results}, indent=1))
        md = f"torchtitan bench {m}\n\n{_table(results)}\n"
        (out / "bench_torchtitan.md").write_text(md)
        return md

    start, results = time.time(), []
    for i, name in enumerate(names):
        left = args.budget_s - (time.time() - start)
        per = left * WEIGHT.get(name, 1.0) / sum(WEIGHT.get(n, 1.0) for n in names[i:])
        if per < (5 if args.smoke else 20):
            results.append({"config": name, "error": "skipped: time budget spent", "runs": []})
            continue
        t, end, seqs, res, port = time.time(), time.time() + per, sorted(args.seqs, reverse=True), None, 29611 + 7 * i
        while seqs:  # one process per out-of-memory: each goes on with the lengths shorter than the last one's
            # a first length that overruns the share (a compile, a slow step) may borrow from later shares, up to
            # 40% of them; the whole run never passes --budget-s
            g_end = start + args.budget_s
            hard_end = min(end + max(20.0, 0.4 * (g_end - end)), g_end)
            part = _run_child(args, name, seqs, end, hard_end, port, env)
            port += 1
            if res is None:
                res = part
            else:
                res["runs"] += part["runs"]
                for k in ("error", "traceback", "stderr_tail"):
                    if k in part:
                        res[k] = part[k]
            last = res["runs"][-1] if res["runs"] else None
            if res.get("error") or last is None or last["status"] != "oom":
                break
            seqs = [q for q in seqs if q < last["seq"]]
            if end - time.time() < (2 if args.smoke else 15):  # not even a start-up left in the share
                res["runs"] += [{"seq": q, "status": "skipped (time budget)"} for q in seqs]
                break
        res["wall_s"] = time.time() - t
        results.append(res)
        print(f"{name}: {res.get('error') or [(r['seq'], r['status'], round(r.get('tokens_per_s', 0))) for r in res['runs']]}"
              f" ({res['wall_s']:.0f}s)", flush=True)
        md = write(results)
    md = write(results)
    print(md)


if __name__ == "__main__":
    main()
