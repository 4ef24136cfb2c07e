#!/usr/bin/env python
"""Where one decoder layer's time and memory go: plain vs compiled SAC vs LAAQ (and the other per-layer options
of the memory-budget policy), per kernel group, forward and backward.

One LLaMA-2-7B decoder layer (HF transformers, bf16, batch 1, SDPA), called exactly as the model calls it (its
arguments are captured from one forward of a one-layer model). For every method and sequence length:

* forward and backward milliseconds (CUDA events, median of ``--reps``, after warm-up steps that compile);
* bytes the layer keeps from forward to backward (``saved``: allocated after forward, with the caller's
  reference to the input -- a non-leaf, as the previous layer's output -- dropped, minus before, minus the
  output -- the next layer's input) and bytes on top
  of those while its backward runs (``transient``, the incoming gradient included): the planner's
  per-layer ``saved_bytes``/``transient_bytes``;
* one profiled step (torch.profiler, forward and backward profiled separately): CUDA kernel time grouped as
  GEMM, attention, codec (LAAQ's quantize/dequantize kernels), norm/elementwise (eager ATen kernels and
  inductor's fused Triton kernels), copy/fill, other; GEMM kernel counts (backward GEMMs beyond twice the
  forward's are recomputed ones); the gap between wall time and kernel time (launch/CPU-bound idle).

Methods (``--methods``):
  bf16, bf16-c      the layer as is, eager / torch.compile'd
  sac, sac-c        torchtitan's op-level selective checkpointing (agoq_core.laaq.policy.sac_context_fn)
  ckpt, ckpt-c      full checkpointing (non-reentrant checkpoint_wrapper)
  laaq:F, laaq-c:F  LAAQ on this layer, every role in format F (nf4, int8, ...); -c compiles around it
  laaq-mlp[-c]:F    LAAQ on the MLP half only (post-attention norm + gated MLP), attention half as is
  qckpt:F, qckpt-c:F  QuantizedCheckpoint (layer input kept in F, layer recomputed); -c compiles the layer
                    inside the wrapper (as apply_policy does)
  fp8-M             torchao float8 (tensorwise) on every Linear, then method M (fp8-bf16-c, fp8-sac-c: the
                    issue's bar, compiled float8 + SAC; fp8-laaq-c:nf4: LAAQ with float8 GEMMs on the inputs it
                    rebuilds, LAAQConfig(float8_gemms=True)); CUDA SM89+, emulated on CPU
  fp8attn+M         float8 on q/k/v/o only, then M (fp8attn+laaq-c:nf4: LAAQ on the norms and the MLP of the
                    same layer -- LAAQ cannot convert a Float8Linear, which keeps its own bf16 input)

Then a delta table: each method against compiled SAC, per kernel group, so the gap reads as "x ms more GEMM
(recomputed), y ms codecs, z ms unfused norms, w ms idle".

  python benchmarks/bench_layer_profile.py --seqs 16K,32K            # H200, ~1 minute
  python benchmarks/bench_layer_profile.py --smoke                    # tiny layer on CPU, op-level groups

Writes $OUT/bench_layer_profile.json (or --json). Also the ``layer-profile`` step of
``bench_equal_memory.py --quick``.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent
K = 1024

#: Most informative first (a time budget may cut the tail): the gap (LAAQ vs compiled SAC), the ceiling
#: (compiled plain: what no recomputation at all would give), the compiled-float8 bar, then the rest.
QUICK_METHODS = ("bf16", "sac-c", "laaq:nf4", "bf16-c", "laaq-c:nf4", "laaq-mlp-c:nf4", "fp8-sac-c",
                 "fp8attn+laaq-c:nf4", "ckpt", "qckpt:nf4", "laaq:int8")
SMOKE_METHODS = ("bf16", "bf16-c", "sac", "sac-c", "ckpt", "laaq:nf4", "laaq-c:nf4", "laaq-mlp-c:nf4", "laaq:int8",
                 "qckpt:nf4", "fp8-sac-c", "fp8attn+laaq-c:nf4")
GROUPS = ("gemm", "attention", "codec", "elementwise", "copy", "other")
"""Kernel groups. ``copy`` includes eager dtype casts (HF's RMSNorm upcasts to fp32: direct_copy kernels);
``elementwise`` the rest of ATen's pointwise/reduction kernels and every inductor-generated kernel."""


def _use_checkout():
    for sub in ("", "backends/triton_common", "backends/cuda"):
        p = str(_ROOT / sub) if sub else str(_ROOT)
        if Path(p).is_dir() and p not in sys.path:
            sys.path.append(p)


# ============================================================ kernel / op names -> groups
#: Entries of a CUDA profile that are not kernels: CUPTI's marker for a host blocked on a full launch queue.
NOT_KERNELS = frozenset({"Command Buffer Full"})


def is_kernel(e) -> bool:
    """Whether a profiler event with a CUDA device type is device work: not a user annotation
    (``record_function`` ranges such as ``Optimizer.step#AdamW8bit.step`` show up on the GPU timeline spanning
    the kernels they enclose) and not a marker of NOT_KERNELS. Counting those double-counts kernel time.
    ``e``: a FunctionEvent (``name``) or a key_averages() FunctionEventAvg (``key``)."""
    name = getattr(e, "name", None) or getattr(e, "key", "")
    return not getattr(e, "is_user_annotation", False) and name not in NOT_KERNELS and "#" not in name


def group_of(name: str) -> str:
    """CUDA kernel name (or, on CPU, ATen op name) -> one of GROUPS. Codec first (LAAQ's Triton kernels are
    named quantize_kernel / dequantize_kernel / _rmsnorm_quant_kernel), then attention, GEMM, copies, and
    the rest of the ATen / inductor kernels as elementwise (norms, RoPE, SiLU, casts, residual adds)."""
    n = name.lower()
    if "quantize" in n or "rmsnorm_quant" in n or n.startswith("agoq"):
        return "codec"
    if any(k in n for k in ("flash", "fmha", "attention", "attn", "sdpa")):
        return "attention"
    if any(k in n for k in ("gemm", "nvjet", "xmma", "cutlass", "cublas", "sm90_", "sm80_", "_scaled_mm",
                            "aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "splitk", "triton_tem")):
        return "gemm"
    if n.startswith("triton_"):  # inductor's generated kernels (triton_poi/red/per_fused_...): fused elementwise
        return "elementwise"
    if any(k in n for k in ("memcpy", "memset", "copy", "fill", "aten::to", "aten::_to_copy", "aten::clone",
                            "aten::contiguous", "aten::zero", "aten::empty", "cat")):
        return "copy"
    if any(k in n for k in ("elementwise", "triton_", "reduce", "norm", "vectorized", "unrolled", "aten::",
                            "silu", "mul", "add", "pow", "rsqrt", "mean", "softmax", "index", "where")):
        return "elementwise"
    return "other"


def _kernel_totals(prof, cuda: bool) -> tuple[dict, dict]:
    """(ms per group, GEMM count): CUDA kernels on GPU; on CPU the self time of ATen ops (ops inside an
    ``agoq_codec`` range count as codec)."""
    from torch.autograd import DeviceType

    ms = {g: 0.0 for g in GROUPS}
    counts = {"gemm": 0}
    for e in prof.events():
        if cuda:
            if e.device_type != DeviceType.CUDA or not is_kernel(e):
                continue
            us = e.time_range.elapsed_us()  # a device event's own duration (device_time_total is 0 if async)
            g = group_of(e.name)
        else:
            if e.device_type != DeviceType.CPU or not e.name.startswith("aten::"):
                continue
            us = e.self_cpu_time_total
            p, g = e.cpu_parent, group_of(e.name)
            while p is not None:
                if p.name == "agoq_codec":
                    g = "codec"
                    break
                p = p.cpu_parent
        ms[g] += us / 1e3
        if g == "gemm" and (cuda or e.name in ("aten::mm", "aten::addmm", "aten::bmm")):
            counts["gemm"] += 1
    return ms, counts


def _label_codecs():
    """On CPU the codecs are ATen ops like any other: label LAAQ's store/load calls with a profiler range."""
    import torch

    from agoq_core.laaq import storage

    for name in ("store", "load", "load_rows"):
        f = getattr(storage, name)
        if getattr(f, "_agoq_labelled", False):
            continue

        def wrap(*a, __f=f, **k):
            with torch.profiler.record_function("agoq_codec"):
                return __f(*a, **k)

        wrap._agoq_labelled = True
        setattr(storage, name, wrap)


# ============================================================ one layer, its call, the methods
def build(smoke: bool, seq: int, device):
    """(decoder layer, its call kwargs captured from the model, hidden size)."""
    import torch
    from transformers import AutoModelForCausalLM

    from agoq_core.models import get_model_shape

    shape = get_model_shape("micro").replace(layers=1, intermediate=352) if smoke else \
        get_model_shape("llama2-7b").replace(layers=1)
    cfg = shape.to_hf_config(max_position_embeddings=seq)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.train()
    layer = model.model.layers[0]
    got = {}

    def grab(mod, args, kwargs):
        got["args"], got["kwargs"] = args[1:], {k: v for k, v in kwargs.items()}
        raise _Captured

    h = layer.register_forward_pre_hook(grab, with_kwargs=True)
    ids = torch.zeros(1, seq, dtype=torch.long, device=device)
    try:
        with torch.no_grad():
            model.model(input_ids=ids, use_cache=False)
    except _Captured:
        pass
    finally:
        h.remove()
    kw = {k: (v.detach() if isinstance(v, torch.Tensor) else
              tuple(t.detach() for t in v) if isinstance(v, tuple) else v) for k, v in got["kwargs"].items()}
    layer = model.model.layers[0]
    model.model.layers = torch.nn.ModuleList()  # the layer alone is what is measured
    del model
    return layer, got["args"], kw, cfg.hidden_size


class _Captured(Exception):
    pass


def make(method: str, base, compile_backend: str):
    """A fresh copy of ``base`` turned into ``method`` (a module called like the layer).

    ``fp8-`` before a method puts torchao float8 (tensorwise) on every Linear first, ``fp8attn+`` on the
    attention projections only (q, k, v, o: LAAQ then converts the norms and the SwiGLU MLP, whose Linears
    stay bf16 -- LAAQ leaves a Float8Linear unconverted, it keeps its own bf16 input). On CPU float8 runs
    torchao's emulation (Float8LinearConfig(emulate=True))."""
    import torch.nn as nn
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    from agoq_core.laaq.policy import sac_context_fn

    layer = copy.deepcopy(base)
    fp8 = None
    if method.startswith("fp8attn+"):
        fp8, method = "attn", method[len("fp8attn+"):]
    elif method.startswith("fp8-"):
        fp8, method = "all", method[len("fp8-"):]
    kind, _, fmt = method.partition(":")
    compiled = kind.endswith("-c")
    kind = kind[:-2] if compiled else kind
    if fp8:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        cpu = next(layer.parameters()).device.type == "cpu"
        attn = ("q_proj", "k_proj", "v_proj", "o_proj")
        convert_to_float8_training(
            layer, config=Float8LinearConfig(emulate=cpu),
            module_filter_fn=lambda m, fqn: isinstance(m, nn.Linear) and (fp8 == "all" or fqn.split(".")[-1] in attn))
    if kind == "bf16":
        mod = layer
    elif kind == "ckpt":
        mod = checkpoint_wrapper(layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    elif kind == "sac":
        mod = checkpoint_wrapper(layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT, context_fn=sac_context_fn())
    elif kind == "laaq":
        from agoq_core.laaq.config import LAAQConfig
        from agoq_core.laaq.integrate import apply as laaq_apply

        rep = laaq_apply(layer, LAAQConfig(norm_input=fmt, mlp_act_input=fmt, attn_out_input=fmt, linear_input=fmt,
                                           convert_final_norm=False, float8_gemms=fp8 == "all"))
        mod = layer
        mod.__dict__["_agoq_profile_skipped"] = [f"{k.path}: {k.reason}" for k in getattr(rep, "skipped", [])]
    elif kind == "laaq-mlp":
        from agoq_core.laaq.policy import _laaq_mlp

        _laaq_mlp(layer, 0, fmt, None)
        mod = layer
    elif kind == "qckpt":
        from agoq_core.laaq.qcheckpoint import QuantizedCheckpoint

        if compiled:  # the layer inside, as apply_policy compiles qckpt-c (the wrapper would graph-break)
            layer.compile(backend=compile_backend, dynamic=False)
            compiled = False
        mod = QuantizedCheckpoint(layer, fmt, layer_index=0)
    else:
        raise SystemExit(f"unknown method {method!r}; see --help")
    if compiled:
        mod.compile(backend=compile_backend, dynamic=False)
    return mod


# ============================================================ measure one (method, seq)
def make_inputs(seq, hidden, device):
    """The layer input and the gradient arriving from above (same for every method at this length)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seq)
    x0 = torch.randn(1, seq, hidden, generator=gen, device=device, dtype=torch.bfloat16)
    g0 = torch.randn(1, seq, hidden, generator=gen, device=device, dtype=torch.bfloat16) * 1e-2
    return x0, g0


def measure(method, base, args_, kw, inputs, seq, *, device, reps, warmup, compile_backend, profile=True):
    import torch

    cuda = device.type == "cuda"
    mod = make(method, base, compile_backend)
    params = [p for p in mod.parameters() if p.requires_grad]
    x0, g0 = inputs
    nbytes = x0.numel() * x0.element_size()

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def fwd():
        x = x0.detach().requires_grad_(True)
        return x, mod(x, *args_, **kw)

    def zero():
        for p in params:
            if p.grad is not None:
                p.grad.zero_()

    t_first = time.perf_counter()
    for _ in range(warmup):  # compiles; allocates the gradients (kept: the full step zeroes them in place)
        x, y = fwd()
        y.backward(g0)
        del x, y
    zero()
    sync()
    first_s = time.perf_counter() - t_first
    # memory: saved and transient, as the planner counts them
    saved = transient = None
    if cuda:
        torch.cuda.empty_cache()
        # the input as the previous layer's output: a fresh non-leaf, freed unless this layer keeps it. (Until
        # 2026-12-02 a leaf clone: its AccumulateGrad node kept it alive, so every method that does not keep its
        # bf16 input -- plain eager, LAAQ, quantized checkpointing -- was measured 2 x T x h bytes high.)
        lead = torch.zeros((), dtype=x0.dtype, device=x0.device, requires_grad=True)
        x = x0 + lead
        a0 = torch.cuda.memory_allocated(device)
        y = mod(x, *args_, **kw)
        del x
        sync()
        saved = torch.cuda.memory_allocated(device) - (a0 - nbytes) - y.numel() * y.element_size()
        torch.cuda.reset_peak_memory_stats(device)
        b0 = torch.cuda.memory_allocated(device)
        g = g0.clone()
        b0 += g.numel() * g.element_size()
        y.backward(g)
        del g
        sync()
        transient = torch.cuda.max_memory_allocated(device) - b0 + nbytes
        del y, lead
        zero()
    # time
    fw, bw = [], []
    for _ in range(reps):
        if cuda:
            e = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            e[0].record()
            x, y = fwd()
            e[1].record()
            y.backward(g0)
            e[2].record()
            sync()
            fw.append(e[0].elapsed_time(e[1]))
            bw.append(e[1].elapsed_time(e[2]))
        else:
            t0 = time.perf_counter()
            x, y = fwd()
            t1 = time.perf_counter()
            y.backward(g0)
            t2 = time.perf_counter()
            fw.append((t1 - t0) * 1e3)
            bw.append((t2 - t1) * 1e3)
        del x, y
    zero()
    res = {"method": method, "seq": seq, "fwd_ms": statistics.median(fw), "bwd_ms": statistics.median(bw),
           "first_s": round(first_s, 2), "saved_bytes": saved, "transient_bytes": transient}
    res["ms"] = res["fwd_ms"] + res["bwd_ms"]
    if mod.__dict__.get("_agoq_profile_skipped"):
        res["laaq_skipped"] = mod.__dict__["_agoq_profile_skipped"]
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as tprofile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with tprofile(activities=acts) as pf:
            x, y = fwd()
            sync()
        with tprofile(activities=acts) as pb:
            y.backward(g0)
            sync()
        del x, y
        zero()
        for phase, p in (("fwd", pf), ("bwd", pb)):
            ms, counts = _kernel_totals(p, cuda)
            res[f"{phase}_groups_ms"] = ms
            res[f"{phase}_gemm_kernels"] = counts["gemm"]
        kern = sum(res["fwd_groups_ms"].values()) + sum(res["bwd_groups_ms"].values())
        res["idle_ms"] = max(0.0, res["ms"] - kern) if cuda else None
    del mod
    return res


# ============================================================ report
def table(rows, ref="sac-c") -> str:
    gb = 1e9
    lines = [f"{'method':<20} {'seq':>6} {'fwd ms':>8} {'bwd ms':>8} {'total':>8} "
             + " ".join(f"{g[:9]:>9}" for g in GROUPS) + f" {'idle':>7} {'+bwGEMM':>7} {'saved GB':>9} {'trans GB':>9}"]
    for r in rows:
        if r.get("failed") or r.get("oom"):
            lines.append(f"{r['method']:<20} {r['seq']:>6}  {'OOM' if r.get('oom') else 'failed'}: "
                         f"{(r.get('failed') or r.get('error') or '')[:80]}")
            continue
        grp = {g: r.get("fwd_groups_ms", {}).get(g, 0) + r.get("bwd_groups_ms", {}).get(g, 0) for g in GROUPS}
        sv = f"{r['saved_bytes'] / gb:.3f}" if r.get("saved_bytes") is not None else "-"
        tr = f"{r['transient_bytes'] / gb:.3f}" if r.get("transient_bytes") is not None else "-"
        idle = f"{r['idle_ms']:.1f}" if r.get("idle_ms") is not None else "-"
        lines.append(f"{r['method']:<20} {r['seq']:>6} {r['fwd_ms']:>8.1f} {r['bwd_ms']:>8.1f} {r['ms']:>8.1f} "
                     + " ".join(f"{grp[g]:>9.1f}" for g in GROUPS)
                     + f" {idle:>7} {r.get('recomputed_gemms', '-'):>7} {sv:>9} {tr:>9}")
    return "\n".join(lines)


def add_recompute(rows) -> None:
    """Backward GEMM kernels and GEMM ms beyond the eager plain layer's at the same length: the GEMMs a
    method recomputes (SAC: k, o, up; full checkpointing: all seven)."""
    for r in rows:
        base = next((b for b in rows if b["method"] == "bf16" and b["seq"] == r["seq"] and "bwd_groups_ms" in b), None)
        if base is None or "bwd_groups_ms" not in r:
            continue
        r["recomputed_gemms"] = r["bwd_gemm_kernels"] - base["bwd_gemm_kernels"]
        r["recomputed_gemm_ms"] = r["bwd_groups_ms"]["gemm"] - base["bwd_groups_ms"]["gemm"]


def explain(rows, ref="sac-c") -> list[dict]:
    """Per sequence, each method minus ``ref`` per kernel group (ms per layer, forward + backward)."""
    out = []
    for seq in sorted({r["seq"] for r in rows}):
        here = {r["method"]: r for r in rows if r["seq"] == seq and "fwd_groups_ms" in r}
        base = here.get(ref)
        if base is None:
            continue
        for m, r in here.items():
            if m == ref:
                continue
            d = {g: (r["fwd_groups_ms"][g] + r["bwd_groups_ms"][g])
                 - (base["fwd_groups_ms"][g] + base["bwd_groups_ms"][g]) for g in GROUPS}
            if r.get("idle_ms") is not None and base.get("idle_ms") is not None:
                d["idle"] = r["idle_ms"] - base["idle_ms"]
            out.append({"seq": seq, "method": m, "vs": ref, "total_ms": r["ms"] - base["ms"],
                        "ratio": base["ms"] / r["ms"] if r["ms"] else None,
                        "recomputed_gemms": r.get("recomputed_gemms"), "ref_recomputed_gemms": base.get("recomputed_gemms"),
                        "delta_ms": d,
                        "saved_ratio": (r["saved_bytes"] / base["saved_bytes"]) if r.get("saved_bytes") and base.get("saved_bytes") else None})
    return out


def ceilings(rows, ref="sac-c") -> list[dict]:
    """Per length: compiled plain (nothing recomputed, nothing quantized) against ``ref`` per layer -- the most
    any memory-saving method could gain over ``ref`` at that length, whatever memory it frees."""
    out = []
    for seq in sorted({r["seq"] for r in rows}):
        here = {r["method"]: r for r in rows if r["seq"] == seq and "ms" in r}
        if "bf16-c" in here and ref in here:
            out.append({"seq": seq, "ref": ref, "ref_ms": here[ref]["ms"], "bf16-c_ms": here["bf16-c"]["ms"],
                        "ceiling": here[ref]["ms"] / here["bf16-c"]["ms"]})
    return out


def planner_check(rows, smoke: bool) -> None:
    """Next to each measured eager row, the planner's per-layer bytes (agoq_core.planner.budget.layer_options)."""
    from agoq_core.models import get_model_shape
    from agoq_core.planner.budget import layer_options, parse_option

    shape = get_model_shape("micro").replace(layers=1, intermediate=352) if smoke else get_model_shape("llama2-7b")
    for r in rows:
        if "ms" not in r or "+" in r["method"] or r["method"].startswith("fp8"):
            continue
        try:
            kind, fmt = parse_option(r["method"])
        except Exception:  # noqa: BLE001 - not a planner option
            continue
        name = (kind[:-2] if kind.endswith("-c") else kind) + (f":{fmt}" if fmt else "")
        (o,) = layer_options(shape, seq_len=r["seq"], options=[name])
        r["planner_saved_bytes"], r["planner_transient_bytes"], r["planner_ms"] = (
            o.saved_bytes, o.transient_bytes, o.time_s * 1e3)


def explain_text(ex, ceil=()) -> str:
    if not ex:
        return "(no reference rows to compare against)"
    keys = list(GROUPS) + (["idle"] if any("idle" in e["delta_ms"] for e in ex) else [])
    lines = [f"per layer, method minus {ex[0]['vs']} (ms, forward + backward; + = slower):",
             f"{'method':<20} {'seq':>6} {'total':>8} {'speed':>6} " + " ".join(f"{k[:9]:>9}" for k in keys)
             + f" {'saved x':>8}"]
    for e in ex:
        sv = f"{e['saved_ratio']:.2f}" if e.get("saved_ratio") else "-"
        lines.append(f"{e['method']:<20} {e['seq']:>6} {e['total_ms']:>+8.1f} {e['ratio'] or 0:>6.3f} "
                     + " ".join(f"{e['delta_ms'].get(k, 0):>+9.1f}" for k in keys) + f" {sv:>8}")
    for c in ceil:
        lines.append(f"ceiling at {c['seq']}: compiled plain is {c['ceiling']:.3f}x {c['ref']} per layer "
                     f"({c['bf16-c_ms']:.1f} vs {c['ref_ms']:.1f} ms): no method that only changes what is kept "
                     f"for backward can beat {c['ref']} by more at this length")
    return "\n".join(lines)


def costs(rows) -> dict:
    """The measured per-layer costs the planner reads (agoq_core.planner.budget.plan_budget(measured=...)):
    {seq: {method: {saved_bytes, transient_bytes, time_s[, attention_s]}}}; ``attention_s``: the attention
    kernels' share of time_s, forward + backward (where the kernels were grouped), which the planner scales with the
    square of the length when it plans another one (budget.costs_at_length)."""
    from agoq_core.planner.budget import attention_seconds

    out: dict = {}
    for r in rows:
        if r.get("saved_bytes") is None or r.get("failed") or r.get("oom"):
            continue
        c = {"saved_bytes": int(r["saved_bytes"]), "transient_bytes": int(r["transient_bytes"]),
             "time_s": r["ms"] / 1e3}
        att = attention_seconds(r)
        if att is not None:
            c["attention_s"] = att
        out.setdefault(str(r["seq"]), {})[r["method"]] = c
    return out


#: meta["input"] of this profile (= agoq_core.planner.budget.INPUT_NON_LEAF): saved bytes measured with a
#: non-leaf layer input (since 2026-12-02).
INPUT_NON_LEAF = "non-leaf"


def input_leaf_correction(costs, hidden, batch=1, meta=None):
    """agoq_core.planner.budget.input_leaf_correction (the planner that reads the costs owns it)."""
    _use_checkout()
    from agoq_core.planner.budget import input_leaf_correction as correct

    return correct(costs, hidden, batch, meta)


def _seqs(text):
    return [int(x[:-1]) * K if x.lower().endswith("k") else int(x) for x in text.split(",")]


def run(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny layer on CPU (logic only)")
    ap.add_argument("--seqs", default=None, help="sequence lengths (default 32K,16K; --smoke 128)")
    ap.add_argument("--methods", default=None, help=f"comma-separated (default {','.join(QUICK_METHODS)})")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--budget-s", type=float, default=None, help="start no (method, seq) after this many seconds")
    ap.add_argument("--compile-backend", default=None, help="default inductor; eager with --smoke")
    ap.add_argument("--ref", default="sac-c", help="the method the others are compared with [sac-c]")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    _use_checkout()
    import torch

    if a.smoke:
        torch.set_num_threads(min(2, torch.get_num_threads()))
    device = torch.device("cpu" if a.smoke or not torch.cuda.is_available() else "cuda")
    if device.type == "cpu":
        _label_codecs()
    seqs = _seqs(a.seqs) if a.seqs else ([128] if a.smoke else [32 * K, 16 * K])
    methods = a.methods.split(",") if a.methods else list(SMOKE_METHODS if a.smoke else QUICK_METHODS)
    be = a.compile_backend or ("eager" if a.smoke else "inductor")
    t0 = time.time()
    rows, skipped = [], []
    path = a.json or (os.path.join(os.environ["OUT"], "bench_layer_profile.json") if os.environ.get("OUT") else None)
    for seq in seqs:
        base, args_, kw, hidden = build(a.smoke, seq, device)
        inputs = make_inputs(seq, hidden, device)
        for m in methods:
            if a.budget_s is not None and time.time() - t0 > a.budget_s:
                skipped.append(f"{m}@{seq}")
                continue
            try:
                r = measure(m, base, args_, kw, inputs, seq, device=device, reps=a.reps, warmup=a.warmup,
                            compile_backend=be, profile=not a.no_profile)
            except torch.OutOfMemoryError as exc:
                r = {"method": m, "seq": seq, "oom": True, "error": " ".join(str(exc).split())[:200]}
            except ImportError as exc:
                r = {"method": m, "seq": seq, "failed": f"unavailable: {exc}"[:300]}
            except Exception as exc:  # noqa: BLE001 - one failing method must not lose the others
                import traceback

                r = {"method": m, "seq": seq, "failed": f"{type(exc).__name__}: {str(exc)[:300]}",
                     "traceback": traceback.format_exc()[-1500:]}
            rows.append(r)
            if path:  # after every method: a run killed later still leaves what it measured
                _write(path, {"meta": _environment(device, a), "rows": rows, "costs": costs(rows), "partial": True})
            print(f"[{time.time() - t0:5.0f} s] {m} @ {seq}: " + (
                f"{r['ms']:.1f} ms" if "ms" in r else ("OOM" if r.get("oom") else r.get("failed", "")[:120])),
                flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        del base, inputs
    add_recompute(rows)
    planner_check(rows, a.smoke)
    ex, ceil = explain(rows, a.ref), ceilings(rows, a.ref)
    report = {"meta": _environment(device, a), "rows": rows, "explain": ex, "ceilings": ceil, "costs": costs(rows),
              "skipped": skipped, "wall_s": round(time.time() - t0, 1)}
    print(table(rows))
    print(explain_text(ex, ceil))
    for r in rows:
        if r.get("saved_bytes") is not None and r.get("planner_saved_bytes"):
            print(f"planner vs measured, {r['method']} @ {r['seq']}: saved {r['planner_saved_bytes'] / 1e9:.3f} vs "
                  f"{r['saved_bytes'] / 1e9:.3f} GB, transient {r['planner_transient_bytes'] / 1e9:.3f} vs "
                  f"{r['transient_bytes'] / 1e9:.3f} GB, {r['planner_ms']:.1f} vs {r['ms']:.1f} ms")
    for s in skipped:
        print("skipped (time budget):", s)
    if path:
        _write(path, report)
        print(f"wrote {path}")
    return report


def _write(path, report):
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str))
    tmp.replace(p)


def _environment(device, a):
    try:
        sys.path.insert(0, str(_HERE))
        import harness

        env = harness.environment(device.type)
    except Exception:  # noqa: BLE001
        import torch

        env = {"torch": torch.__version__}
    return env | {"model": "tiny LLaMA layer (CPU smoke)" if a.smoke else "one LLaMA-2-7B decoder layer",
                  "batch": 1, "reps": a.reps, "warmup": a.warmup, "input": INPUT_NON_LEAF}


if __name__ == "__main__":
    run()
    sys.exit(0)
