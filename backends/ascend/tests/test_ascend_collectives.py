"""QuanGrad's all-reduce protocol through the ascend backend on a real process group: quantize with the
Ascend-launched kernels, all-to-all of 8-bit chunks (fp8 moved as uint8), fused reduce-requantize,
all-gather, compared with the reference. Interpreter mode: CPU tensors over gloo, the same code path
an NPU takes over HCCL (which cannot reduce uint8/fp8 either, hence all-to-all + all-gather)."""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from agoq_core.testing.dist import free_port

WORLD = 2
_BLOCKS_PER_RANK = 3


def _grad(rank: int, n: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(100 + rank)) * (rank + 1) * 1e-3


def _protocol(be, fmt: str) -> None:
    from agoq_core.formats import reference as ref
    from agoq_core.formats.spec import get_format

    spec = get_format(fmt)
    n = WORLD * _BLOCKS_PER_RANK * spec.block
    cb, nb = spec.code_bytes(n) // WORLD, spec.num_blocks(n) // WORLD
    codes = torch.empty(spec.code_bytes(n), dtype=torch.uint8)
    scales = torch.empty(spec.num_blocks(n))
    be.quantize_into(_grad(dist.get_rank(), n), spec, codes, scales)
    rc, rs = torch.empty(WORLD, cb, dtype=torch.uint8), torch.empty(WORLD, nb)
    for w in (be.all_to_all_bytes(rc, codes, async_op=True), be.all_to_all_bytes(rs, scales, async_op=True)):
        w.wait()
    mine_c, mine_s = torch.empty(cb, dtype=torch.uint8), torch.empty(nb)
    be.reduce_requantize_into(rc, rs, spec, n // WORLD, mine_c, mine_s)
    all_c, all_s = torch.empty(WORLD * cb, dtype=torch.uint8), torch.empty(WORLD * nb)
    be.all_gather_bytes(all_c, mine_c, async_op=True).wait()
    be.all_gather_bytes(all_s, mine_s)
    q = [ref.quantize_blocks(_grad(r, n), spec) for r in range(WORLD)]
    for chunk in range(WORLD):
        c = torch.stack([qc[chunk * cb:(chunk + 1) * cb] for qc, _ in q])
        s = torch.stack([qs[chunk * nb:(chunk + 1) * nb] for _, qs in q])
        wc, ws = ref.reduce_requantize(c, s, spec, n // WORLD)
        assert torch.equal(all_c[chunk * cb:(chunk + 1) * cb], wc), f"{fmt}: codes of chunk {chunk} differ"
        assert torch.equal(all_s[chunk * nb:(chunk + 1) * nb], ws), f"{fmt}: scales of chunk {chunk} differ"


def _worker(rank: int, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        dist.init_process_group("gloo", rank=rank, world_size=WORLD)
        from agoq_ascend.backend import AscendBackend
        from agoq_ascend.geometry import DeviceProps
        from agoq_ascend.soc import INTERPRETER_SOC

        be = AscendBackend(soc=INTERPRETER_SOC, props=DeviceProps(vector_cores=3), interpreted=True)
        for fmt in ("fp8_e4m3", "fp8_e5m2", "int8"):
            _protocol(be, fmt)
        # fp8 tensors themselves (gloo and HCCL reject the dtype) travel as bytes
        x = torch.full((WORLD * 4,), float(rank + 1)).to(torch.float8_e4m3fn)
        y = torch.empty_like(x)
        be.all_to_all_bytes(y, x)
        assert torch.equal(y.float(), torch.tensor([1.0] * 4 + [2.0] * 4)), y.float()
        dist.barrier()
        queue.put((rank, "ok"))
    except Exception as exc:  # report, do not hang the parent
        queue.put((rank, f"{type(exc).__name__}: {exc}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.dist
def test_quangrad_protocol_over_a_real_process_group():
    if os.environ.get("TRITON_INTERPRET") != "1":  # the spawned ranks inherit it before they import triton
        pytest.skip("needs TRITON_INTERPRET=1 (CPU interpreter)")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=240) for _ in range(WORLD))
    for p in procs:
        p.join(timeout=60)
    assert results == {r: "ok" for r in range(WORLD)}, results
