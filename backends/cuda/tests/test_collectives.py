"""Byte collectives on a real process group: QuanGrad's all-reduce protocol end to end (quantize ->
all-to-all of 8-bit chunks -> fused reduce-requantize -> all-gather), compared with the reference.

Interpreter mode uses gloo on CPU; on a GPU machine it needs one GPU per rank (NCCL)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from agoq_core.testing.dist import free_port

WORLD = 2
_N_PER_RANK = 3  # blocks of the gradient each rank reduces


def _grad(rank: int, n: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(100 + rank)) * (rank + 1) * 1e-3


def _all_reduce_one(be, dev, fmt: str) -> None:
    from agoq_core.formats import reference as ref
    from agoq_core.formats.spec import get_format

    spec = get_format(fmt)
    n = WORLD * _N_PER_RANK * spec.block
    cb, nb = spec.code_bytes(n) // WORLD, spec.num_blocks(n) // WORLD  # per-rank chunk
    codes = torch.empty(spec.code_bytes(n), dtype=torch.uint8, device=dev)
    scales = torch.empty(spec.num_blocks(n), device=dev)
    be.quantize_into(_grad(dist.get_rank(), n).to(dev), spec, codes, scales)
    # all-to-all: rank r receives chunk r of every rank (async handles, as QuanGrad overlaps them)
    rc = torch.empty(WORLD, cb, dtype=torch.uint8, device=dev)
    rs = torch.empty(WORLD, nb, device=dev)
    works = [be.all_to_all_bytes(rc, codes, async_op=True), be.all_to_all_bytes(rs, scales, async_op=True)]
    for w in works:
        w.wait()
    mine_c = torch.empty(cb, dtype=torch.uint8, device=dev)
    mine_s = torch.empty(nb, device=dev)
    be.reduce_requantize_into(rc, rs, spec, n // WORLD, mine_c, mine_s)
    all_c = torch.empty(WORLD * cb, dtype=torch.uint8, device=dev)
    all_s = torch.empty(WORLD * nb, device=dev)
    be.all_gather_bytes(all_c, mine_c, async_op=True).wait()
    be.all_gather_bytes(all_s, mine_s)
    # the expected result, from every rank's gradient, with the reference on CPU
    q = [ref.quantize_blocks(_grad(r, n), spec) for r in range(WORLD)]
    want_c, want_s = [], []
    for chunk in range(WORLD):
        c = torch.stack([qc[chunk * cb:(chunk + 1) * cb] for qc, _ in q])
        s = torch.stack([qs[chunk * nb:(chunk + 1) * nb] for _, qs in q])
        wc, ws = ref.reduce_requantize(c, s, spec, n // WORLD)
        want_c.append(wc)
        want_s.append(ws)
    assert torch.equal(all_c.cpu(), torch.cat(want_c)), "codes differ from the reference all-reduce"
    assert torch.equal(all_s.cpu().view(torch.int32), torch.cat(want_s).view(torch.int32)), "scales differ"


def _worker(rank: int, port: int, fmts: tuple[str, ...], errors) -> None:
    try:
        from agoq_core.backend import get_backend

        be = get_backend("cuda")
        dev = torch.device(be.device_type, rank) if be.device_type == "cuda" else torch.device("cpu")
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group(be.dist_backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=WORLD)
        for fmt in fmts:
            _all_reduce_one(be, dev, fmt)
        # fp8 tensors travel as bytes (gloo and NCCL cannot move fp8 dtypes)
        f8 = torch.full((4,), float(rank + 1), device=dev).to(torch.float8_e4m3fn)
        out8 = torch.empty(WORLD * 4, dtype=torch.float8_e4m3fn, device=dev)
        be.all_gather_bytes(out8, f8)
        assert out8.float().cpu().tolist() == [1.0] * 4 + [2.0] * 4
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as exc:  # reported to the parent, which fails the test with it
        errors.put(f"rank {rank}: {type(exc).__name__}: {exc}")
        raise


@pytest.mark.dist
def test_quangrad_all_reduce_protocol_on_a_process_group(backend):
    if backend.device_type == "cuda" and torch.cuda.device_count() < WORLD:
        pytest.skip(f"needs {WORLD} GPUs for NCCL")
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, ("fp8_e4m3", "int5"), errors)) for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
    msgs = []
    while not errors.empty():
        msgs.append(errors.get())
    for p in procs:
        if p.is_alive():
            p.kill()
            msgs.append(f"pid {p.pid} timed out")
    assert not msgs and all(p.exitcode == 0 for p in procs), (msgs, [p.exitcode for p in procs])
