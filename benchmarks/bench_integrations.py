#!/usr/bin/env python
"""LAAQ inside the stacks people use, on one GPU: CUDA autocast numerics and compiled-vs-eager speed.

1. autocast: a small HF Llama (fp32 weights) under torch.autocast(cuda, bf16), backward outside the
   region (as Trainer/Accelerate): loss LAAQ vs plain (must be identical), gradients with the native
   policy (max rel. error, expect ~1e-7) and the default nf4 policy (pooled per layer type); one fp16
   step with GradScaler (finite, loss identical).
2. torch.compile: a LLaMA-shaped stack (bf16 weights, SDPA, batch 1) -- tokens/s and peak memory of
   forward+backward for plain eager, plain compiled, LAAQ eager, LAAQ compiled (inductor; LAAQ compiled
   with fullgraph=True, which fails on any graph break; compile time reported apart), compiled-vs-eager
   gradient agreement (LAAQ, and the plain model's own for scale), graph breaks
   (torch._dynamo.explain) of one decoder layer and of the whole training step, and the backend whose
   codecs the agoq:: custom ops called (cuda: Triton kernels).
3. MoE: a small Mixtral (bf16, transformers' grouped_mm experts) -- loss LAAQ vs plain (identical),
   gradient error (max and experts), step time and peak memory plain vs LAAQ.

Writes $OUT/bench_integrations.json (or --json) and prints a table. About 2-3 minutes on an H200.

  python benchmarks/bench_integrations.py            # GPU
  python benchmarks/bench_integrations.py --smoke    # CPU, tiny shapes, aot_eager (tests the logic)
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, aot_eager backend")
    ap.add_argument("--seq", type=int, default=None, help="tokens for the speed runs (default 4096; smoke 64)")
    ap.add_argument("--layers", type=int, default=None, help="layers for the speed runs (default 4; smoke 2)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps (after warm-up)")
    ap.add_argument("--json", default=None)
    return ap.parse_args(argv)


def llama(hidden, inter, layers, heads, kv, vocab, dtype, device, attn="sdpa", seed=0):
    import torch
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                                   num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                                   max_position_embeddings=max(8192, hidden), use_cache=False)
    cfg._attn_implementation = attn
    torch.manual_seed(seed)
    m = transformers.LlamaForCausalLM(cfg).to(device=device, dtype=dtype)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * 0.1)
    return m


def amp_grads(model, ids, dtype, dev, scaler=None):
    import torch

    model.zero_grad(set_to_none=True)
    with torch.autocast(dev, dtype=dtype):
        loss = model(input_ids=ids, labels=ids).loss
    (scaler.scale(loss) if scaler else loss).backward()
    g = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), g


def autocast_part(args, dev):
    import torch

    from agoq_core.laaq import LAAQConfig, apply, remove
    from agoq_core.laaq.numerics import layer_type

    h, i, L, s = (64, 176, 2, 32) if args.smoke else (1024, 2816, 2, 1024)
    model = llama(h, i, L, 8 if not args.smoke else 4, 4 if not args.smoke else 2, 1024, torch.float32, dev)
    ids = torch.randint(0, 1024, (2, s), device=dev, generator=torch.Generator(device=dev).manual_seed(1))
    out = {}
    for dt_name, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        l0, g0 = amp_grads(model, ids, dt, dev)
        for pol, cfg in (("native", LAAQConfig.native()), ("nf4", LAAQConfig())):
            apply(model, cfg)
            try:
                l1, g1 = amp_grads(model, ids, dt, dev)
            finally:
                remove(model)
            num, den = {}, {}
            for n in g0:
                t = layer_type(n)
                num[t] = num.get(t, 0.0) + float((g1[n] - g0[n]).double().pow(2).sum())
                den[t] = den.get(t, 0.0) + float(g0[n].double().pow(2).sum())
            pooled = {t: (num[t] / max(den[t], 1e-300)) ** 0.5 for t in num}
            per = max(float((g1[n] - g0[n]).double().norm() / g0[n].double().norm().clamp_min(1e-300)) for n in g0)
            out[f"{dt_name}/{pol}"] = {"loss_equal": bool(torch.equal(l0, l1)), "max_param_rel": per,
                                       "max_pooled_rel": max(pooled.values())}
    scaler = torch.amp.GradScaler(dev)
    apply(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    with torch.autocast(dev, dtype=torch.float16):
        loss = model(input_ids=ids, labels=ids).loss
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    out["fp16_gradscaler_step_finite"] = bool(all(torch.isfinite(p).all() for p in model.parameters()))
    remove(model)
    return out


def timed(fn, steps, sync):
    fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    sync()
    return (time.perf_counter() - t0) / steps


def peak_mib(fn, dev):
    """Peak memory of one call above what was allocated before it (MiB; None on CPU)."""
    import torch

    if dev != "cuda":
        fn()
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _breaks(fn, *args):
    import torch

    torch._dynamo.reset()
    ex = torch._dynamo.explain(fn)(*args)
    torch._dynamo.reset()
    return ex.graph_break_count, [str(r.reason).split("\n")[0][:200] for r in ex.break_reasons]


def _max_rel(ga, gb):
    return max(float((gb[n] - ga[n]).double().norm() / ga[n].double().norm().clamp_min(1e-300)) for n in ga)


def compile_part(args, dev):
    import torch

    from agoq_core.backend import get_backend
    from agoq_core.laaq import apply, remove

    smoke = args.smoke
    seq = args.seq or (64 if smoke else 4096)
    layers = args.layers or (2 if smoke else 4)
    dtype = torch.float32 if smoke else torch.bfloat16
    h, i, heads, kv = (64, 176, 4, 2) if smoke else (2048, 5504, 16, 16)
    backend = "aot_eager" if smoke else "inductor"
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    ids = torch.randint(0, 32000 if not smoke else 128, (1, seq), device=dev)
    res = {"seq": seq, "layers": layers, "hidden": h, "backend": backend, "codec_backend": get_backend().name}
    grads = {}
    for laaq in (False, True):
        model = llama(h, i, layers, heads, kv, 32000 if not smoke else 128, dtype, dev)
        if laaq:
            apply(model)
        name = "laaq" if laaq else "plain"

        def step(m=model):
            m.zero_grad(set_to_none=True)
            m(input_ids=ids, labels=ids).loss.backward()

        res[f"{name}_eager_s"] = timed(step, args.steps, sync)
        res[f"{name}_eager_peak_mib"] = peak_mib(step, dev)
        grads[f"{name}_eager"] = {n: p.grad.float().clone() for n, p in model.named_parameters()}
        if laaq:
            layer = model.model.layers[0]
            x = torch.randn(1, seq, h, device=dev, dtype=dtype, requires_grad=True)
            pos = model.model.rotary_emb(x, torch.arange(seq, device=dev)[None])
            res["graph_breaks_per_layer"], res["layer_break_reasons"] = _breaks(
                lambda x: layer(x, position_embeddings=pos, attention_mask=None), x)
            res["graph_breaks_training_step"], res["step_break_reasons"] = _breaks(
                lambda i: model(input_ids=i, labels=i).loss, ids)
        torch._dynamo.reset()
        try:  # LAAQ: fullgraph=True proves there is no graph break on this device/backend
            compiled = torch.compile(model, backend=backend, fullgraph=laaq)
            res[f"{name}_fullgraph"] = laaq

            def cstep(m=compiled, base=model):
                base.zero_grad(set_to_none=True)
                m(input_ids=ids, labels=ids).loss.backward()

            t0 = time.perf_counter()
            cstep()
            sync()
        except Exception as e:  # recorded, then measured without fullgraph so the run still reports
            res[f"{name}_fullgraph_error"] = f"{type(e).__name__}: {str(e)[:500]}"
            res[f"{name}_fullgraph"] = False
            torch._dynamo.reset()
            compiled = torch.compile(model, backend=backend)
            t0 = time.perf_counter()
            cstep()
            sync()
        res[f"{name}_compile_first_step_s"] = time.perf_counter() - t0
        res[f"{name}_compiled_s"] = timed(cstep, args.steps, sync)
        res[f"{name}_compiled_peak_mib"] = peak_mib(cstep, dev)
        grads[f"{name}_compiled"] = {n: p.grad.float().clone() for n, p in model.named_parameters()}
        if laaq:
            remove(model)
        del model, compiled
        torch._dynamo.reset()
        if dev == "cuda":
            torch.cuda.empty_cache()
    res["laaq_compiled_vs_eager_max_rel"] = _max_rel(grads["laaq_eager"], grads["laaq_compiled"])
    res["plain_compiled_vs_eager_max_rel"] = _max_rel(grads["plain_eager"], grads["plain_compiled"])
    for k in ("plain_eager", "plain_compiled", "laaq_eager", "laaq_compiled"):
        res[f"{k}_tok_s"] = seq / res[f"{k}_s"]
    res["laaq_compiled_over_eager"] = res["laaq_eager_s"] / res["laaq_compiled_s"]
    res["laaq_compiled_over_plain_compiled"] = res["plain_compiled_s"] / res["laaq_compiled_s"]
    return res


def moe_part(args, dev):
    import torch
    import transformers

    from agoq_core.laaq import apply, remove

    smoke = args.smoke
    h, i, L, seq, e = (64, 176, 2, 64, 4) if smoke else (1024, 2816, 2, 4096, 8)
    dtype = torch.float32 if smoke else torch.bfloat16
    cfg = transformers.MixtralConfig(vocab_size=1024, hidden_size=h, intermediate_size=i, num_hidden_layers=L,
                                     num_attention_heads=8 if not smoke else 4, num_key_value_heads=4 if not smoke else 2,
                                     num_local_experts=e, num_experts_per_tok=2, use_cache=False,
                                     max_position_embeddings=max(seq, 512))
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(cfg).to(device=dev, dtype=dtype)
    out = {"hidden": h, "intermediate": i, "experts": e, "seq": seq, "layers": L,
           "experts_implementation": model.config._experts_implementation}
    ids = torch.randint(0, 1024, (1, seq), device=dev)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)

    def step():
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.detach()

    res = {}
    for laaq in (False, True):
        name = "laaq" if laaq else "plain"
        if laaq:
            rep = apply(model)
            out["experts_converted"] = sum(c.kind == "moe_experts" for c in rep.converted)
        loss = step()
        res[name] = (loss, {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None})
        out[f"{name}_s"] = timed(step, args.steps, sync)
        out[f"{name}_peak_mib"] = peak_mib(step, dev)
        if laaq:
            remove(model)
    (l0, g0), (l1, g1) = res["plain"], res["laaq"]
    out["loss_identical"] = bool(torch.equal(l0, l1))
    errs = {n: float((g1[n] - g0[n]).double().norm() / g0[n].double().norm().clamp_min(1e-300)) for n in g0}
    out["grad_max_rel"] = max(errs.values())
    out["grad_experts_max_rel"] = max(v for n, v in errs.items() if ".experts." in n)
    return out


def main(argv=None):
    args = parse(argv)
    import torch

    dev = "cpu" if args.smoke or not torch.cuda.is_available() else "cuda"
    rep = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "host": platform.node(), "torch": torch.__version__, "device": dev,
           "gpu": torch.cuda.get_device_name() if dev == "cuda" else None}
    import transformers
    rep["transformers"] = transformers.__version__
    t0 = time.perf_counter()
    rep["autocast"] = autocast_part(args, dev)
    rep["compile"] = compile_part(args, dev)
    try:
        rep["moe"] = moe_part(args, dev)
    except Exception as e:  # recorded, the other parts still report
        rep["moe"] = {"error": f"{type(e).__name__}: {str(e)[:500]}"}
    rep["wall_s"] = time.perf_counter() - t0
    print(json.dumps(rep, indent=1))
    c = rep["compile"]
    print(f"\ntokens/s and peak step memory at {c['seq']} tokens, {c['layers']} layers, hidden {c['hidden']} "
          f"({c['backend']}; codecs: {c['codec_backend']}):")
    for k in ("plain_eager", "plain_compiled", "laaq_eager", "laaq_compiled"):
        mib = c[k + "_peak_mib"]
        print(f"  {k:<16} {c[k + '_tok_s']:>10.0f} tok/s  " + (f"{mib:>9.0f} MiB" if mib is not None else ""))
    print(f"  compiled LAAQ / eager LAAQ: {c['laaq_compiled_over_eager']:.3f}x; compiled LAAQ / compiled plain: "
          f"{c['laaq_compiled_over_plain_compiled']:.3f}x; LAAQ fullgraph: {c['laaq_fullgraph']}")
    print(f"  graph breaks: decoder layer {c['graph_breaks_per_layer']}, training step {c['graph_breaks_training_step']}; "
          f"compiled vs eager gradients: LAAQ max rel {c['laaq_compiled_vs_eager_max_rel']:.2e}, plain "
          f"{c['plain_compiled_vs_eager_max_rel']:.2e}")
    m = rep["moe"]
    if "error" not in m:
        print(f"\nMoE (Mixtral, {m['experts_implementation']}, {m['experts_converted']} experts modules converted): "
              f"loss identical {m['loss_identical']}, grad max rel {m['grad_max_rel']:.3f} (experts "
              f"{m['grad_experts_max_rel']:.3f}); step {m['plain_s'] * 1e3:.0f} -> {m['laaq_s'] * 1e3:.0f} ms"
              + (f"; peak {m['plain_peak_mib']:.0f} -> {m['laaq_peak_mib']:.0f} MiB" if m["plain_peak_mib"] else ""))
    else:
        print(f"\nMoE: {m['error']}")
    path = args.json or (os.path.join(os.environ["OUT"], "bench_integrations.json") if os.environ.get("OUT") else None)
    if path:
        Path(path).write_text(json.dumps(rep, indent=1))
    return rep


if __name__ == "__main__":
    main()
