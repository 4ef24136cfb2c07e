"""Host time of one eager QuanGrad codec call on CUDA (issue 17): the launcher's normal path vs its fast path.

For accumulate_ and quantize_into (through the CudaBackend methods GradStorage.fold_ calls) and QuanGrad's
reduce_requantize_into (4 ranks' rows summed, what its all-reduce calls per bucket) at 2^20 and 2^25 elements, each path (``old``: Launcher.fast off; ``fast``: the direct launch of the cached compiled kernel):

* ``host_us``: time.perf_counter around N back-to-back calls without a sync, / N (what the Python caller pays
  per call while the GPU queue absorbs the work; the queue does not fill in N calls);
* ``queued_us``: the same N calls until sync() returns, / N (max(host, device) per call);
* ``synced_us``: median of single calls each followed by sync() (host + device + sync);
* ``kernels_per_call``: CUDA kernels torch.profiler records per call (and driver/runtime launch calls);
* ``fast_hits``: calls that took the fast path (0 for ``old``), and whether both paths give the same bits.

Writes ``$OUT/bench_host.json`` and ``$OUT/bench_host.md``. About 20 s on an H200 (kernels compiled or cached).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def _parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", "--smoke", dest="tiny", action="store_true",
                    help="CPU smoke run in Triton's interpreter (2^10 elements, a few calls; the fast path built "
                         "with Launcher.fast_interpreted): checks the script, measures nothing")
    ap.add_argument("--formats", nargs="*", default=["fp8_e4m3", "int8"])
    ap.add_argument("--sizes-log2", type=int, nargs="*", default=[20, 25])
    ap.add_argument("--calls", type=int, default=200, help="calls per back-to-back timing")
    ap.add_argument("--synced", type=int, default=50, help="single synced calls (median)")
    harness.add_json_arg(ap, "bench_host")
    return ap.parse_args(argv)


def main(argv=None) -> dict:
    args = _parse(argv)
    if args.tiny:
        os.environ["TRITON_INTERPRET"] = "1"  # before any @triton.jit decorator runs
        args.sizes_log2, args.calls, args.synced = [10], 3, 3
    import torch
    from torch.profiler import ProfilerActivity, profile

    from agoq_core.formats.spec import get_format
    from agoq_cuda import launch
    from agoq_cuda.backend import CudaBackend

    t_start = time.time()
    dev = torch.device("cpu" if args.tiny else "cuda")
    backend = CudaBackend.create()
    la = launch.LAUNCHER
    saved = la.fast, la.fast_interpreted  # restored at the end (the smoke test runs in a test process)
    la.fast_interpreted = args.tiny

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []

    def timed(fn):
        for _ in range(5):
            fn()
        sync()
        t0 = time.perf_counter()
        for _ in range(args.calls):
            fn()
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        synced = []
        for _ in range(args.synced):
            s0 = time.perf_counter()
            fn()
            sync()
            synced.append(time.perf_counter() - s0)
        return (t1 - t0) / args.calls * 1e6, (t2 - t0) / args.calls * 1e6, statistics.median(synced) * 1e6

    def launches(fn, reps=10):
        sync()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        with profile(activities=acts) as prof:
            for _ in range(reps):
                fn()
            sync()
        kernels = api = 0
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                kernels += 1
            elif "LaunchKernel" in e.name:
                api += 1
        return kernels / reps, api / reps

    def measure_all():
        for fmt in args.formats:
            spec = get_format(fmt)
            for lg in args.sizes_log2:
                n = 1 << lg
                g = (torch.randn(n, generator=gen, device=dev) * 1e-3).to(torch.bfloat16)
                cb, nb = spec.code_bytes(n), spec.num_blocks(n)
                out_bits = {}
                for path in ("old", "fast"):
                    la.fast = path == "fast"
                    codes = torch.zeros(cb, dtype=torch.uint8, device=dev)
                    scales = torch.zeros(nb, dtype=torch.float32, device=dev)
                    ops = {"quantize_into": lambda: backend.quantize_into(g, spec, codes, scales),
                           "accumulate_": lambda: backend.accumulate_(codes, scales, spec, g)}
                    # reduce_requantize: W = 4 rows of codes/scales (the rows QuanGrad's all-to-all gathers), into a
                    # second pair of buffers (its input rows are made once from the codes quantized below)
                    rows_c = torch.zeros(4, cb, dtype=torch.uint8, device=dev)
                    rows_s = torch.zeros(4, nb, dtype=torch.float32, device=dev)
                    red_c, red_s = torch.zeros_like(codes), torch.zeros_like(scales)
                    ops["reduce_requantize_into"] = lambda: backend.reduce_requantize_into(
                        rows_c, rows_s, spec, n, red_c, red_s)
                    # bits: one quantize then one accumulate, per path (on scratch buffers first: the fast path's entries
                    # are made by a first call, so the measured pair runs through it)
                    c2, s2 = torch.zeros_like(codes), torch.zeros_like(scales)
                    backend.quantize_into(g, spec, c2, s2)
                    backend.accumulate_(c2, s2, spec, g)
                    del c2, s2
                    ops["quantize_into"]()
                    ops["accumulate_"]()
                    rows_c.copy_(codes.expand(4, cb))
                    rows_s.copy_(scales.expand(4, nb))
                    backend.reduce_requantize_into(rows_c, rows_s, spec, n, torch.zeros_like(codes),
                                                   torch.zeros_like(scales))  # the entry, on scratch outputs
                    ops["reduce_requantize_into"]()
                    out_bits[path] = (codes.clone(), scales.clone(), red_c.clone(), red_s.clone())
                    for op, fn in ops.items():
                        h0 = la.fast_hits
                        host, queued, synced = timed(fn)
                        kern, api = launches(fn)
                        rows.append({"op": op, "fmt": fmt, "numel": n, "path": path, "host_us": host, "queued_us": queued,
                                     "synced_us": synced, "kernels_per_call": kern, "launch_api_per_call": api,
                                     "fast_hits": la.fast_hits - h0})
                        r = rows[-1]
                        print(f"{op:<14}{fmt:<10}2^{lg:<3}{path:<5} host {host:7.1f} us  queued {queued:7.1f} us  synced "
                              f"{synced:7.1f} us  kernels/call {kern:.1f} (launch API {api:.1f})  fast hits {r['fast_hits']}",
                              flush=True)
                same = all(torch.equal(a, b) for a, b in zip(out_bits["old"], out_bits["fast"]))
                for r in rows:
                    if r["fmt"] == fmt and r["numel"] == n:
                        r["same_bits"] = same
                del g, codes, scales, out_bits, rows_c, rows_s, red_c, red_s

    try:
        measure_all()
    finally:
        la.fast, la.fast_interpreted = saved
    speedups = []
    for r in rows:
        if r["path"] == "fast":
            old = next(o for o in rows if o["path"] == "old" and o["op"] == r["op"] and o["fmt"] == r["fmt"]
                       and o["numel"] == r["numel"])
            speedups.append({"op": r["op"], "fmt": r["fmt"], "numel": r["numel"], "host_old_us": old["host_us"],
                             "host_fast_us": r["host_us"], "host_ratio": old["host_us"] / r["host_us"],
                             "synced_old_us": old["synced_us"], "synced_fast_us": r["synced_us"]})
    result = {"env": harness.environment(dev), "rows": rows, "summary": speedups,
              "all_same_bits": all(r.get("same_bits") for r in rows), "seconds": time.time() - t_start}
    harness.write_json(result, args.json, "bench_host")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_host.md"), "w") as f:
            f.write(markdown(result))
    print(f"same bits old vs fast: {result['all_same_bits']}  ({result['seconds']:.0f} s)")
    return result


def markdown(result: dict) -> str:
    e = result["env"]
    out = [f"{e['date']}, {e.get('gpu', e.get('device'))}, torch {e['torch']}, triton {e.get('triton')}; "
           f"command `{e['command']}`", "",
           "| op | format | elements | path | host us/call | queued us/call | synced us/call | kernels/call | "
           "fast hits | same bits |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        out.append(f"| {r['op']} | {r['fmt']} | 2^{r['numel'].bit_length() - 1} | {r['path']} | {r['host_us']:.1f} | "
                   f"{r['queued_us']:.1f} | {r['synced_us']:.1f} | {r['kernels_per_call']:.1f} | {r['fast_hits']} | "
                   f"{r.get('same_bits')} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
