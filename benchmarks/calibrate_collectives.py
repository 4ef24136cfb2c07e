"""Measure alpha and beta of the collectives on this machine and write a network profile for the cost model.

One command, on any torch.distributed backend:

    python benchmarks/calibrate_collectives.py --backend gloo --world 4 --out agoq_core/scale/profiles/gloo-localhost.json
    torchrun --nproc-per-node 8 benchmarks/calibrate_collectives.py --out $OUT/nccl-8xH200.json       # NCCL, one node
    torchrun --nnodes 2 --nproc-per-node 8 ... benchmarks/calibrate_collectives.py --out ...          # + inter-node
    python benchmarks/calibrate_collectives.py --smoke                                                 # CI: seconds

Without torchrun it spawns ``--world`` local processes (gloo on CPU; NCCL / HCCL when a GPU / NPU is
visible, one device per process). Every rank times all_reduce (fp32), reduce_scatter, all_gather and
all_to_all over a ladder of sizes (best of ``--reps`` after ``--warmup``, barrier-separated, device
synchronised; ``--stat median`` for the median); rank 0 fits ``t = steps(p) alpha + factor(p) n beta`` per collective and jointly
(agoq_core.scale.fit), and writes a ``NetworkProfile`` JSON whose links the cost model reads
(``agoq plan --cluster ... --network PATH``). A single-node run measures the intra-node link (the
profile's inter link is then the same numbers, flagged in ``fitted``); a multi-node run fits the
inter-node link from a group with one rank per node as well. Unsupported collectives (gloo has no
reduce_scatter in some torch builds) are reported and skipped.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the shared harness beside this script
import harness  # noqa: E402

OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
_RS = _AG = None
FIT_OP = {"all_reduce": "ring_allreduce", "reduce_scatter": "reduce_scatter", "all_gather": "all_gather",
          "all_to_all": "all_to_all"}


def _sizes(args) -> list[int]:
    if args.sizes:
        return [int(float(s)) for s in args.sizes.split(",")]
    if args.smoke:
        return [1 << 10, 1 << 14, 1 << 18]
    return [1 << k for k in range(10, 27, 2)]


def _device(backend: str, local_rank: int):
    import torch

    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), torch.cuda.synchronize
    if backend == "hccl":  # pragma: no cover - needs an NPU
        import torch_npu  # noqa: F401

        torch.npu.set_device(local_rank)
        return torch.device("npu", local_rank), torch.npu.synchronize
    return torch.device("cpu"), lambda: None


def _time(fn, sync, reps: int, warmup: int, stat: str = "min") -> float:
    import torch.distributed as dist

    for _ in range(warmup):
        fn()
    sync()
    ts = []
    for _ in range(reps):
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    # the minimum, not the median: on a shared machine the noise only ever adds time (and NCCL tests
    # report the best of their iterations the same way)
    return min(ts) if stat == "min" else statistics.median(ts)


def _collective_fns():
    import torch.distributed as dist

    # torch 2.13 renamed the tensor forms (*_single) and deprecates the old names; 2.11 has only the old
    return (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor,
            getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)


def _measure(args, group=None) -> dict:
    """{op: [(nbytes, p, seconds)]} on ``group`` (default: the world); seconds are the max over ranks."""
    import torch
    import torch.distributed as dist

    global _RS, _AG
    _RS, _AG = _collective_fns()
    backend = dist.get_backend()
    dev, sync = _device(backend, int(os.environ.get("LOCAL_RANK", "0")))
    p = dist.get_world_size(group)
    out: dict[str, list] = {op: [] for op in OPS}
    skipped: dict[str, str] = {}
    for n in _sizes(args):
        numel = max(p, n // 4 // p * p)  # fp32 elements, divisible by p
        x = torch.ones(numel, dtype=torch.float32, device=dev)
        shard = torch.empty(numel // p, dtype=torch.float32, device=dev)
        full = torch.empty(numel, dtype=torch.float32, device=dev)
        fns = {
            "all_reduce": lambda: dist.all_reduce(x, group=group),
            "reduce_scatter": lambda: _RS(shard, x, group=group),
            "all_gather": lambda: _AG(full, shard, group=group),
            "all_to_all": lambda: dist.all_to_all_single(full, x, group=group),
        }
        for op, fn in fns.items():
            if op in skipped:
                continue
            try:
                t = _time(fn, sync, args.reps, args.warmup, args.stat)
            except (RuntimeError, NotImplementedError, ValueError) as exc:
                msg = str(exc).splitlines()[0][:160] if str(exc) else ""
                # only "this backend does not have it" is skipped; a timeout or a crash is an error
                if not (isinstance(exc, NotImplementedError) or "support" in msg.lower() or "implement" in msg.lower()):
                    raise
                skipped[op] = f"{type(exc).__name__}: {msg}"
                continue
            tt = torch.tensor([t], dtype=torch.float64, device=dev if backend != "gloo" else "cpu")
            dist.all_reduce(tt, op=dist.ReduceOp.MAX, group=group)
            out[op].append((numel * 4, p, float(tt.item())))
    return {"rows": {k: v for k, v in out.items() if v}, "skipped": skipped}


def _fit(rows: dict) -> dict:
    from agoq_core.scale.fit import fit_alpha_beta, fit_joint

    per = {op: fit_alpha_beta(r, FIT_OP[op]).to_dict() for op, r in rows.items() if len({n for n, _, _ in r}) >= 2}
    joint = fit_joint([(FIT_OP[op], n, p, t) for op, r in rows.items() for n, p, t in r])
    return {"per_collective": per, "joint": {"alpha_s": joint[0], "beta_s_per_byte": joint[1],
                                             "bandwidth_Bps": 1.0 / joint[1] if joint[1] > 0 else None}}


def _link(name: str, fit: dict, source: str):
    from agoq_core.scale.network import Link

    ar = fit["per_collective"].get("all_reduce")
    a, b = (ar["alpha_s"], ar["beta_s_per_byte"]) if ar else (fit["joint"]["alpha_s"], fit["joint"]["beta_s_per_byte"])
    if not b > 0:  # every size was latency-bound: no bandwidth can be read from these sizes
        b = 1e-15
        source += "; WARNING: no size was bandwidth-bound, bandwidth unknown (measure larger sizes)"
    return Link(name=name, line_rate=1.0 / b, alpha=a, efficiency=1.0, source=source)


def _worker(args) -> int:
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    backend = dist.get_backend()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    nodes = max(1, world // local_world)
    result = {"world": _measure(args)}
    if nodes > 1:  # one rank per node: the inter-node link alone
        ranks = [i * local_world for i in range(nodes)]
        g = dist.new_group(ranks)
        if rank in ranks:
            result["inter"] = _measure(args, g)
        dist.barrier()
    if rank == 0:
        from agoq_core.scale.network import NetworkProfile

        date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        where = f"{world} ranks, {backend}, {nodes} node(s), host {socket.gethostname()}, torch {torch.__version__}"
        fit_world = _fit(result["world"]["rows"])
        intra = _link(f"{backend}-measured", fit_world, f"measured by benchmarks/calibrate_collectives.py, {date}, {where}")
        if "inter" in result:
            fit_inter = _fit(result["inter"]["rows"])
            inter = _link(f"{backend}-inter-measured", fit_inter, intra.source + " (one rank per node)")
        else:
            fit_inter, inter = None, intra
        name = args.name or f"{backend}-{'localhost' if nodes == 1 and backend == 'gloo' else f'{world}ranks'}"
        prof = NetworkProfile(
            name=name, intra=intra, inter=inter, nics_per_node=1, source="measured", date=date,
            fitted={"command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]), "backend": backend, "world": world,
                    "nodes": nodes, "platform": platform.platform(), "torch": torch.__version__,
                    "world_fit": fit_world, "inter_fit": fit_inter,
                    "inter_is_intra": "inter" not in result,
                    "measurements": {k: v["rows"] for k, v in result.items()},
                    "skipped": {k: v["skipped"] for k, v in result.items()}})
        text = json.dumps(prof.to_dict(), indent=2) + "\n"
        out = harness.json_path(args.out, name)
        if out:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).write_text(text)
        print(f"{name}: alpha {intra.alpha * 1e6:.1f} us, bus bandwidth {intra.bandwidth / 1e9:.3f} GB/s "
              f"(all_reduce fit over {len(result['world']['rows'].get('all_reduce', []))} sizes)")
        for op, f in fit_world["per_collective"].items():
            print(f"  {op:<15} alpha {f['alpha_s'] * 1e6:9.1f} us  bandwidth {min(f['bandwidth_Bps'], 1e15) / 1e9:8.3f} GB/s  "
                  f"max rel. error {f['max_relative_error']:.1%}")
        for op, why in result["world"]["skipped"].items():
            print(f"  {op:<15} skipped: {why}")
        if out:
            print(f"wrote {out}")
    return 0


def _spawned(local_rank: int, args, port: int, backend: str) -> None:
    import torch.distributed as dist

    os.environ.update({"RANK": str(local_rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(args.world),
                       "LOCAL_WORLD_SIZE": str(args.world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    dist.init_process_group(backend, rank=local_rank, world_size=args.world)
    try:
        _worker(args)
    finally:
        dist.destroy_process_group()
    harness.exit_spawned_rank()


def _auto_backend() -> str:
    import torch

    if torch.cuda.is_available():
        return "nccl"
    try:  # pragma: no cover - needs an NPU
        import torch_npu  # noqa: F401

        if torch.npu.is_available():
            return "hccl"
    except ImportError:
        pass
    return "gloo"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl", "hccl"))
    ap.add_argument("--world", type=int, default=None, help="processes to spawn without torchrun [2 on CPU, all GPUs]")
    ap.add_argument("--sizes", default=None, help="comma-separated message sizes in bytes [1 KiB .. 64 MiB, x4]")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions per size [15; smoke 3]")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", default=None, help="profile JSON to write [$OUT/<name>.json when $OUT is set]")
    ap.add_argument("--name", default=None, help="profile name [<backend>-localhost / <backend>-<N>ranks]")
    ap.add_argument("--smoke", action="store_true", help="few small sizes and reps (seconds; CI)")
    ap.add_argument("--stat", default="min", choices=("min", "median"),
                    help="statistic over repetitions [min: contention on a shared machine only adds time]")
    args = ap.parse_args(argv)
    args.reps = args.reps or (3 if args.smoke else 15)
    import torch
    import torch.distributed as dist

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
        backend = _auto_backend() if args.backend == "auto" else args.backend
        dist.init_process_group(backend)
        try:
            return _worker(args)
        finally:
            dist.destroy_process_group()
    backend = _auto_backend() if args.backend == "auto" else args.backend
    if args.world is None:
        args.world = torch.cuda.device_count() if backend == "nccl" else 2
    if args.world < 2:
        ap.error(f"--world must be >= 2 to measure a collective, got {args.world}")
    port = harness.free_port()
    import torch.multiprocessing as mp

    mp.spawn(_spawned, args=(args, port, backend), nprocs=args.world, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
