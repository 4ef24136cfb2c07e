"""What every ``benchmarks/bench_*.py`` shares: the ``--json`` option and where the JSON goes, the
environment record that goes with every number (date, command, host, versions, device), and the model
shapes (agoq_core.models, the one registry).

A script imports it from beside itself (it may be run as ``python benchmarks/bench_x.py`` or loaded
by path from a test)::

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import harness
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from agoq_core.models import get_model_shape
from agoq_core.testing.dist import exit_spawned_rank, free_port

__all__ = ["add_json_arg", "json_path", "write_json", "environment", "hf_config", "free_port", "exit_spawned_rank",
           "cuda_median_ms", "kernel_median_ms"]


def add_json_arg(ap: argparse.ArgumentParser, name: str) -> None:
    """``--json PATH``: where the report goes (default ``$OUT/<name>.json`` when $OUT is set)."""
    ap.add_argument("--json", default=None, help=f"write the JSON here (default $OUT/{name}.json if $OUT is set)")


def json_path(arg: str | None, name: str) -> str | None:
    """``--json``'s value, else ``$OUT/<name>.json`` (the GPU machine's output folder), else None."""
    if arg:
        return arg
    return os.path.join(os.environ["OUT"], f"{name}.json") if os.environ.get("OUT") else None


def write_json(report: Any, arg: str | None, name: str, *, indent: int = 1) -> str | None:
    """Write ``report`` where :func:`json_path` says (creating the folder); returns the path or None."""
    path = json_path(arg, name)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(report, indent=indent, default=str))
        print(f"wrote {path}")
    return path


def environment(device: Any = None, **extra: Any) -> dict[str, Any]:
    """Date (UTC), command, host, Python / torch (and triton / transformers when the script loaded
    them) versions, and the device: its name, and for CUDA the SM count and memory."""
    import torch

    env: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "host": platform.node(), "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
        "python": platform.python_version(), "torch": torch.__version__,
    }
    for mod in ("triton", "transformers"):  # only what the script itself imported: no import side effects
        if mod in sys.modules:
            env[mod] = getattr(sys.modules[mod], "__version__", None)
    if device is not None:
        dev = torch.device(device)
        env["device"] = str(dev)
        if dev.type == "cuda":
            p = torch.cuda.get_device_properties(dev)
            env.update(gpu=p.name, sms=p.multi_processor_count, memory_gib=round(p.total_memory / 2**30, 1))
    env.update(extra)
    return env


def hf_config(name: str, **overrides: Any) -> Any:
    """The transformers config of registry shape ``name`` (agoq_core.models) with ``overrides``."""
    return get_model_shape(name).to_hf_config(**overrides)


def cuda_median_ms(fn: Any, reps: int = 20, warmup: int = 3) -> float:
    """Median wall time of ``fn()`` in ms, one CUDA-event pair per call (host launch cost included), after
    ``warmup`` calls."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2]


def kernel_median_ms(fn: Any, rep_ms: float = 100.0, warmup_ms: float = 25.0) -> float:
    """Median device time of ``fn()`` in ms without the host's launch cost: Triton's ``do_bench`` (calls queued
    back to back, the L2 flushed between them). For kernel benchmarks; :func:`cuda_median_ms` when the host's
    per-call cost is part of what is measured (an eager call)."""
    import triton

    return triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


def kernel_ms_or_run(fn: Any, device: Any) -> float:
    """:func:`kernel_median_ms` of ``fn`` on a CUDA ``device``; elsewhere (a --smoke run in the interpreter, which
    checks the script, not the speed) one call and 0.0."""
    if getattr(device, "type", device) == "cuda":
        return kernel_median_ms(fn)
    fn()
    return 0.0


def cprofile_steps(step: Any, steps: int, sync: Any, top_n: int) -> dict[str, Any]:
    """``steps`` calls of ``step()`` under cProfile with the autograd engine on the calling thread (else the
    backward's Python functions run on a device thread cProfile does not see), ``sync()`` before and after:
    ``wall_ms`` per step under the profiler, ``own`` (the functions with the most own time), ``agoq_cum`` (agoq's
    functions by cumulative time), ``agoq_own_ms`` (all of agoq's own time), every time per step."""
    import cProfile
    import pstats

    import torch

    prof = cProfile.Profile()
    torch.autograd.set_multithreading_enabled(False)
    try:
        sync()
        t0 = time.perf_counter()
        prof.enable()
        for _ in range(steps):
            step()
        sync()
        wall = (time.perf_counter() - t0) * 1e3 / steps
    finally:
        prof.disable()
        torch.autograd.set_multithreading_enabled(True)
    st = pstats.Stats(prof).stats  # {(file, line, name): (prim calls, calls, tottime, cumtime, callers)}

    def row(k, v):
        f, line, name = k
        short = f if f.startswith("<") or f == "~" else "/".join(Path(f).parts[-2:])
        return {"fn": f"{short}:{line}({name})", "calls_per_step": v[1] / steps, "own_ms": v[2] * 1e3 / steps,
                "cum_ms": v[3] * 1e3 / steps}

    ours = [(k, v) for k, v in st.items() if "agoq" in k[0]]
    own = sorted(st.items(), key=lambda kv: -kv[1][2])[:top_n]
    cum = sorted(ours, key=lambda kv: -kv[1][3])[:top_n]
    return {"wall_ms": wall, "own": [row(k, v) for k, v in own], "agoq_cum": [row(k, v) for k, v in cum],
            "agoq_own_ms": sum(v[2] for _, v in ours) * 1e3 / steps}


def cprofile_md(cp: dict[str, Any], heading: str) -> list[str]:
    """Markdown tables of :func:`cprofile_steps`' result, each under ``## {heading}: Python <what> per step``."""
    lines: list[str] = []
    for key, title in (("own", "own host time"), ("agoq_cum", "cumulative host time of agoq's functions")):
        lines += ["", f"## {heading}: Python {title} per step (cProfile, single-threaded autograd, "
                      f"{cp['wall_ms']:.1f} ms a step under it)", "",
                  "| function | calls | own ms | cum ms |", "|---|---:|---:|---:|"]
        lines += [f"| `{t['fn']}` | {t['calls_per_step']:.0f} | {t['own_ms']:.2f} | {t['cum_ms']:.2f} |" for t in cp[key]]
    return lines
