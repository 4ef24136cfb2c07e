#!/usr/bin/env python
"""LAAQ vs what users would do instead, on one GPU: LLaMA-2-7B shape, random init, bf16, batch 1,
SDPA attention, no optimizer (forward + backward only), HF transformers, gradient checkpointing off
unless it is the method.

Methods
  plain     the model as is, HF's loss
  ckpt      full activation checkpointing (HF gradient_checkpointing_enable, non-reentrant), HF's loss
  laaq      agoq_core.laaq.apply (paper policy: nf4 block 128, attention core 16-bit) + the chunked linear
            cross-entropy of agoq_core.laaq (logits never materialised; the final norm is recomputed)
  laaq-hf   LAAQ with HF's loss (fixed sequence lengths only): separates LAAQ's saving from the loss's

Measured per method and sequence length: peak allocated memory of one step and its parts (weights,
gradients, activations alive after forward = allocator delta; saved tensors per part from LAAQ's meter;
logits + loss; the rest = transient), tokens/s (mean of --steps steps after one warm-up), and the
longest sequence that fits (ladder, stopped at the first OOM or when the time budget would be
exceeded; each rung's time is predicted from the 4K/16K step times). Everything finishes within
--budget-s (default 400 s). Prints a table and writes JSON to $OUT/bench_laaq.json (or --json).

  python benchmarks/bench_laaq.py            # on the H200 (at most ~7 minutes: no rung starts past --budget-s)
  python benchmarks/bench_laaq.py --tiny     # CPU smoke test of the same logic (seconds)
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the shared harness beside this script
import harness  # noqa: E402

GIB = 1 << 30  # the unit of the table (MiB with --tiny)


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="tiny LLaMA on CPU (tests the script's logic)")
    ap.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    ap.add_argument("--seqs", default=None, help="fixed sequence lengths (default 4096,16384; tiny 64,256)")
    ap.add_argument("--ladder", default=None,
                    help="max-seq ladder (default 24K,32K,40K,48K,56K,64K,72K,80K,96K,112K,128K; tiny 512,1024,2048)")
    ap.add_argument("--methods", default="plain,ckpt,laaq,laaq-hf")
    ap.add_argument("--ladder-methods", default="laaq,ckpt,plain", help="order = priority for the time budget")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per point (after one warm-up)")
    ap.add_argument("--budget-s", type=float, default=400.0,
                    help="start no step predicted to end after this many seconds (default 400: < 8 min in all)")
    ap.add_argument("--layers", type=int, default=None, help="override the number of layers (default 32)")
    ap.add_argument("--backend", default=None, help="agoq backend for LAAQ's codecs (default: auto)")
    ap.add_argument("--fmt", default=None, help="LAAQ format for every quantized role (default: the paper policy)")
    harness.add_json_arg(ap, "bench_laaq")
    ap.add_argument("--fake-oom-above", type=int, default=None,
                    help="testing: raise a simulated OOM for sequences longer than this")
    ap.add_argument("--ladder-only", default=None, help=argparse.SUPPRESS)  # internal: one method's ladder
    ap.add_argument("--fits-at", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--time-model", default="0,0", help=argparse.SUPPRESS)  # a,b of t = a*s + b*s^2
    ap.add_argument("--deadline-epoch", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--in-process-ladder", action="store_true",
                    help="run the ladders in this process (default: one fresh process per method, so that "
                         "memory an OOM leaves behind cannot shrink the next method's ladder)")
    ap.add_argument("--no-expandable-segments", action="store_true",
                    help="do not set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    return ap.parse_args(argv)


ARGS = parse()
if not ARGS.no_expandable_segments and "PYTORCH_CUDA_ALLOC_CONF" not in os.environ:
    # Long-sequence runs otherwise fail on fragmentation at different points for each method.
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"

import torch  # noqa: E402

_ROOT = Path(__file__).resolve().parents[1]


def _use_checkout_plugins():
    """Run from a plain checkout (the GPU machine has no pip): put the core and the in-tree CUDA plugin on
    sys.path and, if the plugin is importable but not registered, register its entry point through a
    throw-away dist-info folder (the same thing `pip install -e backends/cuda` would write)."""
    import importlib.metadata as md
    import importlib.util
    import tempfile

    for sub in ("", "backends/triton_common", "backends/cuda"):
        p = str(_ROOT / sub) if sub else str(_ROOT)
        if Path(p).is_dir() and p not in sys.path:
            sys.path.insert(0 if not sub else len(sys.path), p)
    if importlib.util.find_spec("agoq_cuda") is None:
        return "agoq_cuda not importable"
    if any(ep.name == "cuda" for ep in md.entry_points(group="agoq.backends")):
        return "registered"
    d = Path(tempfile.mkdtemp(prefix="agoq-bench-ep-")) / "agoq_cuda-0.1.0.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: agoq-cuda\nVersion: 0.1.0\n")
    (d / "entry_points.txt").write_text("[agoq.backends]\ncuda = agoq_cuda.plugin\n")
    sys.path.append(str(d.parent))
    return f"registered from the checkout ({d.parent})"


_CUDA_PLUGIN = _use_checkout_plugins()


class _FakeOOM(torch.OutOfMemoryError if hasattr(torch, "OutOfMemoryError") else RuntimeError):
    pass


# ---- model -------------------------------------------------------------------------------------------
def build(args, device):
    from transformers import AutoModelForCausalLM

    name = "micro" if args.tiny else "llama2-7b"
    cfg = harness.hf_config(name, max_position_embeddings=max(args.ladder + args.seqs),
                            **({"num_hidden_layers": args.layers} if args.layers else {}))
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.train()
    return model


class Mem:
    """Device memory services (None on CPU, where torch keeps no allocator statistics)."""

    def __init__(self, device):
        self.device = device
        mod = torch.get_device_module(device.type) if device.type != "cpu" else None
        self.mod = mod if mod is not None and hasattr(mod, "max_memory_allocated") else None

    def sync(self):
        if self.mod is not None:
            self.mod.synchronize()

    def allocated(self):
        return self.mod.memory_allocated() if self.mod else None

    def reset_peak(self):
        if self.mod:
            self.mod.reset_peak_memory_stats()

    def peak(self):
        return self.mod.max_memory_allocated() if self.mod else None

    def total(self):
        return self.mod.get_device_properties(self.device).total_memory if self.mod else None

    def free(self):
        gc.collect()
        if self.mod:
            self.mod.empty_cache()


# ---- one training step (no optimizer) --------------------------------------------------------------------
def set_method(model, method, state, args):
    """Switch the (shared) model to ``method``; returns the loss kind."""
    from agoq_core import laaq

    if state.get("laaq") is not None and not method.startswith("laaq"):
        state.pop("laaq").undo()
    if state.get("ckpt") and method != "ckpt":
        model.gradient_checkpointing_disable()
        state["ckpt"] = False
    if method == "ckpt" and not state.get("ckpt"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        state["ckpt"] = True
    if method.startswith("laaq") and state.get("laaq") is None:
        cfg = laaq.LAAQConfig(backend=args.backend)
        if args.fmt:
            cfg = laaq.LAAQConfig.uniform(args.fmt, backend=args.backend)
        state["laaq"] = laaq.apply(model, cfg)
        state["laaq_report"] = str(state["laaq"])
    return "chunked" if method == "laaq" else "hf"


def step(model, ids, loss_kind, mem, meter=None):
    """Forward + backward; returns (loss, allocated after forward, saved-bytes result)."""
    from agoq_core.laaq import chunked_linear_cross_entropy

    with (meter if meter is not None else contextlib.nullcontext()):
        if loss_kind == "hf":
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        else:
            hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
            loss = chunked_linear_cross_entropy(hidden, model.lm_head.weight, ids)
            del hidden
    mem.sync()
    after_fwd = mem.allocated()
    saved = meter.result() if meter is not None else None
    loss.backward()
    mem.sync()
    return float(loss.detach()), after_fwd, saved


def run_point(model, method, seq, args, mem, state, timed=True):
    """One metered step (memory) and, if ``timed``, warm-up + timed steps. OOM -> {"oom": True}."""
    from agoq_core.laaq import SavedBytesMeter

    loss_kind = set_method(model, method, state, args)
    gen = torch.Generator().manual_seed(seq)
    ids = torch.randint(0, model.config.vocab_size, (1, seq), generator=gen).to(mem.device)
    res = {"method": method, "seq": seq, "loss_kind": loss_kind, "oom": False}
    oom = None
    try:
        if args.fake_oom_above is not None and seq > args.fake_oom_above:
            raise _FakeOOM(f"simulated OOM above {args.fake_oom_above} tokens")
        model.zero_grad(set_to_none=False)  # gradients stay allocated, as in gradient accumulation
        mem.sync()
        mem.free()
        base = mem.allocated()
        mem.reset_peak()
        t0 = time.perf_counter()
        meter = SavedBytesMeter(model, label=method) if method != "ckpt" else None
        loss, after_fwd, saved = step(model, ids, loss_kind, mem, meter)
        res["first_step_s"] = time.perf_counter() - t0
        res["loss"] = loss
        res["peak_bytes"] = mem.peak()
        res["base_bytes"] = base
        res["activations_bytes"] = (after_fwd - base) if after_fwd is not None else None
        if saved is not None:
            res["saved_bytes"] = saved.total
            res["saved_layers_bytes"] = saved.layers_total
            res["saved_outside"] = dict(saved.outside)
            res["saved_mean_layer"] = saved.mean_layer()
        if timed:
            step(model, ids, loss_kind, mem)  # warm-up (kernels, allocator)
            t0 = time.perf_counter()
            for _ in range(args.steps):
                model.zero_grad(set_to_none=False)
                step(model, ids, loss_kind, mem)
            dt = (time.perf_counter() - t0) / args.steps
            res["step_s"] = dt
            res["tokens_per_s"] = seq / dt
    except torch.OutOfMemoryError as exc:  # noqa: PERF203
        oom = f"{type(exc).__name__}: {' '.join(str(exc).split())[:700]}"
    except Exception as exc:  # a failing point must not lose the rest of the one GPU run
        import traceback

        res["failed"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:400]
        res["traceback"] = traceback.format_exc()[-2000:]
        print(f"  {method} {seq}: FAILED {res['failed']}", file=sys.stderr, flush=True)
    if oom is not None:  # outside the except block: its frame no longer pins the graph
        res["oom"] = True
        res["error"] = oom
        res["peak_bytes"] = mem.peak()
    mem.free()
    if res.get("oom") or res.get("failed"):  # what an aborted step left allocated (should be weights+grads)
        res["allocated_after_cleanup"] = mem.allocated()
    return res


# ---- report ------------------------------------------------------------------------------------------------
def _g(x):
    return "-" if x is None else f"{x / GIB:.2f}"


def parts(res, weights, grads):
    """Split the peak (bytes): weights, gradients, activations alive after forward (allocator), saved
    tensors of the decoder layers and logits + loss (LAAQ's meter), and the transient rest."""
    out = {"weights": weights, "grads": grads}
    if res.get("activations_bytes") is not None:
        out["activations"] = res["activations_bytes"]
    so = res.get("saved_outside")
    if so is not None:
        out["logits_loss"] = so.get("other", 0) + so.get("head", 0)
        out["saved_layers"] = res["saved_layers_bytes"]
    if res.get("peak_bytes") is not None and res.get("activations_bytes") is not None:
        out["transient"] = res["peak_bytes"] - weights - grads - res["activations_bytes"]
    return out


def main(args=ARGS):
    global GIB
    if args.tiny:
        GIB = 1 << 20
    t_start = time.perf_counter()
    deadline = time.time() + args.budget_s
    args.seqs = [int(s) for s in (args.seqs or ("32,64" if args.tiny else "4096,16384")).split(",")]
    default_ladder = "128,256,512" if args.tiny else "24576,32768,40960,49152,57344,65536,73728,81920,98304,114688,131072"
    args.ladder = [int(s) for s in (args.ladder or default_ladder).split(",")]
    device = torch.device(args.device or ("cpu" if args.tiny or not torch.accelerator.is_available()
                                          else torch.accelerator.current_accelerator().type))
    args.device_str = str(device)
    mem = Mem(device)
    import transformers

    from agoq_core.backend import selected_backend_name

    try:
        import liger_kernel  # noqa: F401
        liger = "installed (not used: agoq_core.laaq.chunked_linear_cross_entropy also drops the final norm)"
    except ImportError:
        liger = "not installed"
    model = build(args, device)
    for p in model.parameters():  # bf16 gradients, allocated once and kept (as with gradient accumulation)
        p.grad = torch.zeros_like(p)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    meta = {
        **harness.environment(),
        "device": (torch.get_device_module(device.type).get_device_name(device) if mem.mod else str(device)),
        "device_total_bytes": mem.total(), "torch": torch.__version__, "transformers": transformers.__version__,
        "agoq_backend": args.backend or selected_backend_name(), "liger_kernel": liger,
        "params": sum(p.numel() for p in model.parameters()), "weights_bytes": weights,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "tiny": args.tiny,
        "cuda_plugin": _CUDA_PLUGIN,
        "build_s": time.perf_counter() - t_start,
    }
    print(f"# LAAQ benchmark: {meta['device']}, torch {meta['torch']}, transformers {meta['transformers']}, "
          f"agoq backend {meta['agoq_backend']} (cuda plugin: {_CUDA_PLUGIN}), {meta['params'] / 1e9:.3f}B params")
    state: dict = {}
    runs = []
    # 1) fixed sequence lengths: memory parts + throughput
    for seq in args.seqs:
        for method in args.methods.split(","):
            if time.time() > deadline:
                runs.append({"method": method, "seq": seq, "skipped": "time budget"})
                continue
            r = run_point(model, method, seq, args, mem, state)
            r["parts"] = parts(r, weights, grads)
            runs.append(r)
            print(f"  {method:8s} {seq:>7d} tokens: peak {_g(r.get('peak_bytes'))} GiB, "
                  f"{r.get('tokens_per_s', 0):.0f} tok/s{'  OOM' if r['oom'] else ''}", flush=True)
    # 2) longest sequence that fits
    max_seq = {}
    ladder_methods = [m for m in args.ladder_methods.split(",") if m]
    laaq_report = None
    if args.in_process_ladder:
        for method in ladder_methods:
            a, b = time_model(runs, method)
            fits_at, failed = fixed_bounds(runs, method)
            new, max_seq[method] = ladder(model, method, args, mem, state, weights, grads, fits_at, failed,
                                          lambda s, a=a, b=b: a * s + b * s * s, deadline)
            runs += new
        set_method(model, "plain", state, args)
    laaq_report = laaq_report or state.get("laaq_report")
    if not args.in_process_ladder:
        set_method(model, "plain", state, args)
        del model  # the ladder processes need the whole device
        state.clear()
        mem.free()
        for method in ladder_methods:
            new, max_seq[method] = ladder_subprocess(method, args, runs, deadline)
            runs += new
    meta["elapsed_s"] = time.perf_counter() - t_start
    report = {"meta": meta, "laaq_report": laaq_report, "runs": runs, "max_seq": max_seq,
              "goals": goals(runs, max_seq, args)}
    print_table(report, args)
    harness.write_json(report, args.json, "bench_laaq", indent=2)
    return report


def time_model(runs, method):
    """(a, b) of t = a*s + b*s^2 through the method's timed fixed-length points."""
    pts = [(r["seq"], r["step_s"]) for r in runs if r.get("method") == method and r.get("step_s")]
    if not pts:
        return 0.0, 0.0
    if len(pts) < 2:
        return pts[0][1] / pts[0][0], 0.0
    (s1, t1), (s2, t2) = pts[0], pts[-1]
    b = max(0.0, (t2 / s2 - t1 / s1) / (s2 - s1))
    return max(0.0, t1 / s1 - b * s1), b


def fixed_bounds(runs, method):
    fits_at = max((r["seq"] for r in runs if r.get("method") == method and r.get("oom") is False
                   and not r.get("failed")), default=None)
    failed = min((r["seq"] for r in runs if r.get("method") == method and r.get("oom")), default=None)
    return fits_at, failed


def ladder(model, method, args, mem, state, weights, grads, fits_at, failed, predict, deadline):
    """Climb args.ladder from above ``fits_at`` until the first OOM, a failure or the deadline."""
    runs, stop = [], "ladder exhausted"
    for seq in args.ladder:
        if failed is not None and seq >= failed:
            stop = f"OOM at {failed}"
            break
        if fits_at is not None and seq <= fits_at:
            continue
        # a rung costs its first step (colder than a timed step) plus the method switch: ~1.3x + 5 s
        need = 1.3 * predict(seq) + 5
        if time.time() + need > deadline:
            stop = f"time budget (next rung {seq} predicted {need:.0f} s)"
            break
        r = run_point(model, method, seq, args, mem, state, timed=False)
        r["parts"] = parts(r, weights, grads)
        r["ladder"] = True
        runs.append(r)
        if r.get("failed"):
            stop = f"failed at {seq}: {r['failed'][:80]}"
            break
        print(f"  ladder {method:8s} {seq:>7d}: {'OOM' if r['oom'] else 'fits'} (peak {_g(r.get('peak_bytes'))} "
              f"{'GiB' if GIB == 1 << 30 else 'MiB'}, {r.get('first_step_s', 0):.1f} s)", flush=True)
        if r["oom"]:
            failed, stop = seq, f"OOM at {seq}"
            break
        fits_at = seq
    return runs, {"max_fit": fits_at, "first_oom": failed, "stopped": stop}


def ladder_subprocess(method, args, runs, deadline):
    """One method's ladder in a fresh process (fresh allocator, nothing left over from an OOM)."""
    import subprocess
    import tempfile

    fits_at, failed = fixed_bounds(runs, method)
    a, b = time_model(runs, method)
    left = deadline - time.time()
    if left < 30 and not args.tiny:
        return [], {"max_fit": fits_at, "first_oom": failed, "stopped": "time budget (no time for a process)"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ladder.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--ladder-only", method, "--json", str(out),
               "--time-model", f"{a!r},{b!r}", "--deadline-epoch", repr(deadline),
               "--ladder", ",".join(map(str, args.ladder)), "--device", args.device_str]
        cmd += ["--fits-at", str(fits_at)] if fits_at is not None else []
        cmd += ["--tiny"] if args.tiny else []
        cmd += ["--layers", str(args.layers)] if args.layers else []
        cmd += ["--backend", args.backend] if args.backend else []
        cmd += ["--fmt", args.fmt] if args.fmt else []
        cmd += ["--fake-oom-above", str(args.fake_oom_above)] if args.fake_oom_above is not None else []
        try:
            proc = subprocess.run(cmd, timeout=max(10.0, left + 30), text=True, capture_output=True)
        except subprocess.TimeoutExpired:
            return [], {"max_fit": fits_at, "first_oom": failed, "stopped": "ladder process timed out"}
        sys.stdout.write(proc.stdout)
        if proc.returncode != 0 or not out.exists():
            tail = proc.stderr.strip().splitlines()[-1:] or ["?"]
            return [], {"max_fit": fits_at, "first_oom": failed,
                        "stopped": f"ladder process failed (rc {proc.returncode}): {tail[0][:160]}"}
        got = json.loads(out.read_text())
    if failed is not None and got["max_seq"].get("first_oom") is None:
        got["max_seq"]["first_oom"] = failed
    return got["runs"], got["max_seq"]


def ladder_main(args):
    """Entry point of a ladder process (--ladder-only METHOD)."""
    global GIB
    if args.tiny:
        GIB = 1 << 20
    args.ladder = [int(x) for x in args.ladder.split(",")]
    args.seqs = []
    device = torch.device(args.device)
    mem = Mem(device)
    model = build(args, device)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    a, b = (float(x) for x in args.time_model.split(","))
    runs, max_seq = ladder(model, args.ladder_only, args, mem, {}, weights, grads, args.fits_at, None,
                           lambda s: a * s + b * s * s, args.deadline_epoch)
    Path(args.json).write_text(json.dumps({"runs": runs, "max_seq": max_seq}, default=str))


def goals(runs, max_seq, args):
    """The issue's goals, evaluated on this run's numbers (None where a number is missing)."""
    def get(method, seq, key):
        r = next((r for r in runs if r.get("method") == method and r.get("seq") == seq and not r.get("ladder")), {})
        return r.get(key)

    long = max(args.seqs)
    out = {}
    for seq in args.seqs:
        pl, la = get("plain", seq, "saved_layers_bytes"), get("laaq", seq, "saved_layers_bytes")
        out[f"saved_layers_ratio_{seq}"] = la / pl if pl and la else None
        pa, laa = get("plain", seq, "activations_bytes"), get("laaq", seq, "activations_bytes")
        out[f"activations_ratio_{seq}"] = laa / pa if pa and laa else None
    tp, tc, tl = (get(m, long, "tokens_per_s") for m in ("plain", "ckpt", "laaq"))
    out[f"tokens_per_s_vs_plain_{long}"] = tl / tp if tl and tp else None
    out[f"tokens_per_s_vs_ckpt_{long}"] = tl / tc if tl and tc else None
    out["laaq_max_fit"] = max_seq.get("laaq", {}).get("max_fit")
    return out


def print_table(rep, args):
    print()
    print(f"{'method':<8} {'seq':>7} {'peak':>7} {'weights':>8} {'grads':>6} {'activ.':>7} {'saved L':>8} "
          f"{'logit+L':>8} {'trans.':>7} {'tok/s':>8}   ({'GiB' if GIB == 1 << 30 else 'MiB'}; "
          "activ. = allocated after forward - before)")
    for r in rep["runs"]:
        if r.get("skipped"):
            print(f"{r['method']:<8} {r['seq']:>7}  skipped: {r['skipped']}")
            continue
        p = r.get("parts", {})
        f = lambda k: _g(p.get(k))  # noqa: E731
        tps = f"{r['tokens_per_s']:.0f}" if r.get("tokens_per_s") else "-"
        tag = " OOM" if r.get("oom") else (" FAILED" if r.get("failed") else (" (ladder)" if r.get("ladder") else ""))
        print(f"{r['method']:<8} {r['seq']:>7} {_g(r.get('peak_bytes')):>7} {f('weights'):>8} {f('grads'):>6} "
              f"{f('activations'):>7} {f('saved_layers'):>8} {f('logits_loss'):>8} "
              f"{f('transient'):>7} {tps:>8}{tag}")
    print()
    for m, d in rep["max_seq"].items():
        print(f"max sequence {m:<8}: fits {d['max_fit']}, first OOM {d['first_oom']} ({d['stopped']})")
    print("goals:", json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in rep["goals"].items()}))
    if rep.get("laaq_report"):
        print(rep["laaq_report"])
    print(f"elapsed {rep['meta']['elapsed_s']:.0f} s (budget {args.budget_s:.0f} s)")


if __name__ == "__main__":
    if ARGS.ladder_only:
        ladder_main(ARGS)
    else:
        main()
