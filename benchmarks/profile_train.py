"""Where an ``agoq train`` step's time goes, per arm (issue 17's end-to-end gap): synced phase times and a
torch.profiler kernel breakdown of the same steps the training loop runs.

Each arm is built exactly as ``agoq train`` builds it (``agoq_core.train.loop.make_arm`` on the same model,
seed, corpus and options, decoder layers ``torch.compile``'d with ``--compile``), warmed up, then:

* ``phases``: ``--steps`` steps (interleaved: one step of every arm per round, all arms built first) timed with a device sync after each phase: forward+backward of every
  micro-batch (the loop's own ``Arm.forward_backward``, whose loss read syncs) and the optimizer step
  (``Arm.step``: QuanGrad's reduce + dequantize + optimizer for AGoQ arms; master-weight copies, clipping
  and AdamW for the baseline) — median ms per step;
* ``kernels``: ``--profile-steps`` more steps under torch.profiler: CUDA kernel ms per step by group (GEMM,
  attention, codec, optimizer, elementwise, copy, collective, other), kernels launched per step, the
  device's busy time (union of kernel intervals) against the wall time (the rest is the GPU waiting for
  the host), and the heaviest kernels.

    PYTHONPATH=.:backends/triton_common:backends/cuda python benchmarks/profile_train.py \\
        --model llama-1b --seq-len 2048 --micro-batch 4 --compile inductor

Writes ``$OUT/profile_train.json`` and ``.md`` (or ``--json``). ``--smoke`` runs the tiny model on CPU
(checks the script; measures nothing).
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

#: host-side ranges timed under the profiler (CPU ms per step, calls per step): (label, owner, attribute)
HOST_RANGES = (
    ("backward", "torch.autograd", "backward"),
    ("qg.hook", "agoq_core.quangrad.wrapper:QuanGradDDP", "_on_grad"),
    ("qg.fold", "agoq_core.quangrad.storage:GradStorage", "fold_"),
    ("qg.launch", "agoq_core.quangrad.wrapper:QuanGradDDP", "_launch"),
    ("qg.finish_all", "agoq_core.quangrad.wrapper:QuanGradDDP", "_finish_all"),
    ("qg.global_norm", "agoq_core.quangrad.wrapper:QuanGradDDP", "_global_norm"),
    ("qg.step_replicated", "agoq_core.quangrad.wrapper:QuanGradDDP", "_step_replicated"),
    ("qg.zero_grad", "agoq_core.quangrad.wrapper:QuanGradDDP", "zero_grad"),
    ("laaq.store", "agoq_core.laaq.storage", "store"),
    ("laaq.load", "agoq_core.laaq.storage", "load"),
    ("base.load_grads", "agoq_core.train.arms:MasterWeights", "load_grads"),
    ("base.store", "agoq_core.train.arms:MasterWeights", "store"),
    ("base.clip", "torch.nn.utils", "clip_grad_norm_"),
)

GROUPS = ("gemm", "attention", "codec", "optimizer", "elementwise", "copy", "collective", "other")


def group_of(name: str) -> str:
    """Kernel (or, on CPU, ATen op) name -> one of GROUPS: the layer profile's groups plus the optimizer's
    fused/foreach kernels and collectives."""
    from bench_layer_profile import group_of as layer_group

    n = name.lower()
    if "nccl" in n or "c10d::" in n:
        return "collective"
    if "adam" in n or "multi_tensor" in n or "foreach" in n or "fused_adam" in n:
        return "optimizer"
    return layer_group(name)


def _parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-1b")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--arms", default="baseline,agoq,laaq-only,quangrad-only")
    ap.add_argument("--compile", default=None, help="torch.compile backend for the decoder layers (e.g. inductor)")
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8, help="synced phase-timed steps")
    ap.add_argument("--profile-steps", type=int, default=2)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--cprofile", type=int, default=0, metavar="N",
                    help="N more steps per arm under cProfile (autograd's device threads off, so the backward's Python "
                         "runs in the profiled thread): host time per step by Python function")
    ap.add_argument("--sequential", dest="interleave", action="store_false",
                    help="one arm at a time (as agoq train); default: every arm built first and the timed steps "
                         "interleaved in rounds")
    ap.add_argument("--smoke", action="store_true", help="tiny model on CPU, 1 step each: checks the script")
    harness.add_json_arg(ap, "profile_train")
    return ap.parse_args(argv)


def _label_host_ranges() -> None:
    """Wrap each HOST_RANGES callable in a profiler range, for this benchmark process only."""
    import importlib

    import torch

    for label, owner, attr in HOST_RANGES:
        mod, _, cls = owner.partition(":")
        try:
            obj = importlib.import_module(mod)
            obj = getattr(obj, cls) if cls else obj
            f = getattr(obj, attr)
        except (ImportError, AttributeError):
            continue

        def wrap(*a, __f=f, __label=label, **k):
            with torch.profiler.record_function(__label):
                return __f(*a, **k)

        setattr(obj, attr, wrap)


def _busy_ms(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (us in, ms out)."""
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total / 1e3


class _ArmRun:
    """One arm built as ``agoq train`` builds it, and its steps (synced per phase when timed)."""

    def __init__(self, name: str, cfg, rt, corpus) -> None:
        import torch

        from agoq_core.train.loop import make_arm
        from agoq_core.train.models import build_model

        self.name, self.cfg, self.rt, self.corpus = name, cfg, rt, corpus
        model = build_model(cfg.model, vocab_size=corpus.vocab_size, seq_len=cfg.seq_len, seed=cfg.seed,
                            device=rt.device)
        if rt.dtype == "bf16":
            model.to(torch.bfloat16)
        self.arm = make_arm(name, model, rt, cfg)
        if cfg.compile:
            from agoq_core.laaq.policy import decoder_layers

            for _, _, layer in decoder_layers(model):
                layer.compile(backend=cfg.compile)
        model.train()
        self.step_no = 0
        self.timed = {"fwd_bwd": [], "step": []}

    def one_step(self, timed: bool) -> None:
        from agoq_core.train.loop import _sync

        cfg, rt = self.cfg, self.rt
        batches = self.corpus.step_batches(self.step_no, seed=cfg.seed, micro_batch=cfg.micro_batch,
                                           grad_accum=cfg.grad_accum, dp=1, rank=0)
        self.step_no += 1
        _sync(rt)
        t0 = time.perf_counter()
        for k, b in enumerate(batches):
            self.arm.forward_backward(b, scale=1.0 / cfg.grad_accum, last=k == len(batches) - 1)
        _sync(rt)
        t1 = time.perf_counter()
        self.arm.step(cfg.lr)
        _sync(rt)
        t2 = time.perf_counter()
        if timed:
            self.timed["fwd_bwd"].append((t1 - t0) * 1e3)
            self.timed["step"].append((t2 - t1) * 1e3)

    def phases(self) -> dict:
        out = {"phases_ms": {k: statistics.median(v) for k, v in self.timed.items()}}
        out["phases_ms"]["total"] = out["phases_ms"]["fwd_bwd"] + out["phases_ms"]["step"]
        out["tokens_per_s"] = self.cfg.tokens_per_step / (out["phases_ms"]["total"] / 1e3)
        return out

    def profile(self, steps: int, top_n: int) -> dict:
        """``steps`` steps under torch.profiler: kernel ms by group, launches, busy vs wall, host ranges."""
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        from agoq_core.train.loop import _sync

        cuda = self.rt.device.type == "cuda"
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        _sync(self.rt)
        t0 = time.perf_counter()
        with profile(activities=acts) as prof:
            for _ in range(steps):
                self.one_step(False)
        wall_ms = (time.perf_counter() - t0) * 1e3 / steps
        n = steps
        ms = {g: 0.0 for g in GROUPS}
        count = {g: 0 for g in GROUPS}
        per_kernel: dict[str, list] = {}
        intervals = []
        labels = {lab for lab, _, _ in HOST_RANGES}
        host: dict[str, list] = {}
        for e in prof.events():
            if e.device_type == DeviceType.CPU and e.name in labels:
                h = host.setdefault(e.name, [0.0, 0])
                h[0] += e.cpu_time_total / 1e3 / n
                h[1] += 1
                continue
            if cuda:
                # ranges the profiler mirrors onto the device timeline (record_function, Optimizer.step#...) are not kernels
                if e.device_type != DeviceType.CUDA or getattr(e, "is_user_annotation", False) or "#" in e.name \
                        or e.name in labels:
                    continue
                us = e.time_range.elapsed_us()
                intervals.append((e.time_range.start, e.time_range.end))
            else:
                if e.device_type != DeviceType.CPU or not e.name.startswith("aten::"):
                    continue
                us = e.self_cpu_time_total  # on CPU: every ATen op's own time (aten::mm under aten::linear is GEMM)
            g = group_of(e.name)
            ms[g] += us / 1e3 / n
            count[g] += 1
            k = per_kernel.setdefault(e.name, [0.0, 0, g])
            k[0] += us / 1e3 / n
            k[1] += 1
        top = sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:top_n]
        return {
            "wall_ms": wall_ms,
            "busy_ms": _busy_ms(intervals) / n if cuda else None,
            "ms": ms,
            "per_step": {g: c / n for g, c in count.items()},
            "launches_per_step": sum(count.values()) / n,
            "host_ranges": {k: {"cpu_ms": v[0], "calls_per_step": v[1] / n} for k, v in sorted(host.items())},
            "top": [{"name": name[:110], "ms": v[0], "calls_per_step": v[1] / n, "group": v[2]} for name, v in top],
        }

    def cprofile(self, steps: int, top_n: int) -> dict:
        """``steps`` steps under cProfile with the autograd engine on the calling thread: the Python functions with
        the most host time per step (own time, and cumulative time of agoq's own functions)."""
        from agoq_core.train.loop import _sync

        return harness.cprofile_steps(lambda: self.one_step(False), steps, lambda: _sync(self.rt), top_n)

    def close(self) -> None:
        import torch

        self.arm.close()
        del self.arm
        gc.collect()
        if self.rt.device.type == "cuda":
            torch.cuda.empty_cache()


def _measure(names: list[str], cfg, rt, corpus, args, report: dict) -> None:
    """Build and warm up ``names``, time ``args.steps`` rounds of one step per arm, then profile each; a failing
    arm is reported and dropped, the others go on."""
    import torch

    def fail(name, exc):
        report["arms"][name] = {"error": f"{type(exc).__name__}: {exc}"}

    runs = {}
    for name in names:
        print(f"--- build + warm up {name}", flush=True)
        try:
            runs[name] = _ArmRun(name, cfg, rt, corpus)
            for _ in range(args.warmup):
                runs[name].one_step(False)
        except Exception as exc:  # one arm failing keeps the others
            fail(name, exc)
            if name in runs:
                runs.pop(name).close()
    for _ in range(args.steps):
        for name, run in list(runs.items()):
            try:
                run.one_step(True)
            except Exception as exc:
                fail(name, exc)
                runs.pop(name).close()
    for name, run in runs.items():
        try:
            res = run.phases()
            res["kernels"] = run.profile(args.profile_steps, args.top)
            if args.cprofile:
                res["cprofile"] = run.cprofile(args.cprofile, args.top)
            res["notes"] = list(run.arm.notes)
            report["arms"][name] = res
        except Exception as exc:
            fail(name, exc)
    if rt.device.type == "cuda":  # the peak of every arm measured together (one arm when sequential)
        peak = torch.cuda.max_memory_allocated(rt.device) / 2**30
        for name in runs:
            report["arms"][name]["peak_gib"] = peak
        torch.cuda.reset_peak_memory_stats(rt.device)
    for run in runs.values():
        run.close()


def run_arms(names: list[str], cfg, rt, corpus, args, report: dict) -> None:
    """Sequential (one arm at a time, as ``agoq train``) or interleaved: every arm built first, then the timed
    steps in rounds (one step of each arm per round), so slow drifts of the host or the device hit every arm alike."""
    for batch in ([names] if args.interleave else [[n] for n in names]):
        _measure(batch, cfg, rt, corpus, args, report)
        report["arms"] = {n: report["arms"][n] for n in names if n in report["arms"]}
        harness.write_json(report, args.json, "profile_train")


def render(report: dict) -> str:
    arms = report["arms"]
    base = arms.get("baseline", {}).get("phases_ms", {}).get("total")
    lines = [f"# agoq train step profile ({report['env'].get('date', '')}, {report['env'].get('device', '')})", "",
             f"`{report['env'].get('command', '')}`", "",
             "| arm | fwd+bwd ms | step ms | total ms | x baseline tokens/s | kernel busy ms | wall ms (profiled) "
             "| launches/step | " + " | ".join(GROUPS) + " |",
             "|---|" + "---:|" * (7 + len(GROUPS))]
    for name, r in arms.items():
        if "error" in r:
            lines.append(f"| {name} | {r['error']} |")
            continue
        p, k = r["phases_ms"], r["kernels"]
        ratio = f"{base / p['total']:.3f}" if base else "–"
        busy = f"{k['busy_ms']:.1f}" if k["busy_ms"] is not None else "–"
        lines.append(f"| {name} | {p['fwd_bwd']:.1f} | {p['step']:.1f} | {p['total']:.1f} | {ratio} | {busy} | "
                     f"{k['wall_ms']:.1f} | {k['launches_per_step']:.0f} | "
                     + " | ".join(f"{k['ms'][g]:.1f}" for g in GROUPS) + " |")
    for name, r in arms.items():
        if "error" in r:
            continue
        hr = r["kernels"].get("host_ranges") or {}
        if hr:
            lines += ["", f"## {name}: host time in ranges per step (CPU ms, profiled; nested ranges overlap)", "",
                      "| range | CPU ms | calls |", "|---|---:|---:|"]
            lines += [f"| {k} | {v['cpu_ms']:.2f} | {v['calls_per_step']:.0f} |" for k, v in hr.items()]
        lines += ["", f"## {name}: heaviest kernels per step", "", "| kernel | group | ms | calls |", "|---|---|---:|---:|"]
        lines += [f"| `{t['name']}` | {t['group']} | {t['ms']:.2f} | {t['calls_per_step']:.0f} |" for t in r["kernels"]["top"]]
        cp = r.get("cprofile")
        if cp:
            lines += harness.cprofile_md(cp, name)
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    args = _parse(argv)
    import torch

    from agoq_core.train.config import TrainConfig
    from agoq_core.train.data import load_corpus
    from agoq_core.train.runtime import init_runtime, shutdown

    if args.smoke:
        args.model, args.seq_len, args.micro_batch = "tiny", 64, 2
        args.warmup, args.steps, args.profile_steps = 1, 1, 1
    arms = [a for a in args.arms.split(",") if a]
    ablations = tuple(a for a in arms if a not in ("baseline", "agoq"))
    cfg = TrainConfig(model=args.model, seq_len=args.seq_len, micro_batch=args.micro_batch, grad_accum=args.grad_accum,
                      steps=args.warmup + args.steps + args.profile_steps, device="cpu" if args.smoke else "auto",
                      ablations=ablations, compile=args.compile or "", baseline="baseline" in arms, agoq="agoq" in arms, grad_clip=args.grad_clip, eval_every=0)
    rt = init_runtime(cfg)
    corpus = load_corpus(seq_len=cfg.seq_len, eval_tokens=cfg.seq_len)
    env_dev = rt.device if rt.device.type != "cpu" else None
    report = {"env": harness.environment(env_dev), "config": cfg.to_dict(), "arms": {}}
    report["env"].setdefault("device", str(rt.device))
    _label_host_ranges()
    try:
        run_arms(arms, cfg, rt, corpus, args, report)
    finally:
        shutdown(rt)
    md = render(report)
    print(md)
    path = harness.json_path(args.json, "profile_train")
    if path:
        Path(path).with_suffix(".md").write_text(md)
    return report


if __name__ == "__main__":
    main()
