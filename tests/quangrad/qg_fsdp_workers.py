"""Per-rank work for the FSDP2 + QuanGrad tests (real fully_shard on gloo ranks, run by qg_dist.run_ranks).

Inputs come from (seed, rank) so that the parent can rebuild them and check each rank's result against
the independent reference in qg_ref.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .qg_workers import RecordingBackend, rank_input

# Shard sizes C (elements per rank): one element, a ragged block, exactly one block, a few blocks + tail.
COMM_SHARDS = (1, 255, 256, 1031)
COMM_OPS = ("sum", "avg", "premul_0.5")
STEPS = 4
LR = 0.05
# Blocks of 64x200 + 200x64 (+ biases) = 25,864 elements (103 KB fp32) go through QuanGrad; the root
# keeps only the 64x8 head (520 elements, 2 KB), below the 8 KiB threshold: FSDP's own reduce-scatter.
THRESHOLD = 8 << 10


def _op(name: str):
    R = dist.ReduceOp
    if name == "sum":
        return R.SUM
    if name == "avg":
        return R.AVG
    return dist._make_nccl_premul_sum(float(name.split("_")[1]))


def comm(rank: int, world: int) -> dict:
    """The comm object called as FSDP2 calls it, on a real group, for odd shard sizes, dtypes and ops."""
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter

    from agoq_core.backend import get_backend
    from agoq_core.quangrad.config import resolve_spec
    from agoq_core.quangrad.fsdp import QuanGradFSDPState, QuanGradReduceScatter

    out = {}
    spec = resolve_spec("fp8_e4m3", None)
    rec = RecordingBackend()
    state = QuanGradFSDPState(fmt=spec.name, block=spec.block, threshold_bytes=0, backend="reference")
    c = QuanGradReduceScatter(fqn="t", spec=spec, backend=rec, state=state, fallback=DefaultReduceScatter())
    g = dist.group.WORLD
    for n in COMM_SHARDS:
        for dtype in (torch.float32, torch.bfloat16):
            for opn in COMM_OPS:
                inp = rank_input(21 + n, rank, world * n, dtype)
                o = c.allocate((n,), dtype=dtype, device=inp.device)
                ret = c(o, inp, g, _op(opn))
                assert ret is None
                o2 = torch.empty_like(o)
                c(o2, inp.clone(), g, _op(opn))
                out[(n, str(dtype), opn)] = (o.clone(), torch.equal(o.view(torch.uint8), o2.view(torch.uint8)))
    out["a2a_bytes"] = [t.numel() for t in rec.a2a]
    out["state"] = (state.compressed_calls, state.wire_bytes, state.fp32_equivalent_bytes)
    # async_op=True: the work is done on return and its handle says so
    inp = rank_input(40, rank, world * 300)
    o = torch.empty(300)
    w = c(o, inp, g, _op("sum"), async_op=True)
    out["async"] = (w.wait(), w.is_completed())
    return out


class Block(torch.nn.Module):
    def __init__(self, dim: int = 64, hidden: int = 200) -> None:
        super().__init__()
        self.up = torch.nn.Linear(dim, hidden)
        self.down = torch.nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class Stack(torch.nn.Module):
    def __init__(self, n: int = 3, dim: int = 64) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(dim) for _ in range(n))
        self.head = torch.nn.Linear(dim, 8)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def build(mp=None):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)  # the same initial parameters on every rank
    model = Stack()
    kw = {"mp_policy": MixedPrecisionPolicy(**mp)} if mp else {}
    for b in model.blocks:
        fully_shard(b, **kw)
    fully_shard(model, **kw)
    return model


def full_params(model) -> dict[str, torch.Tensor]:
    return {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}


def train(model, rank: int, steps: int = STEPS, dtype=torch.float32):
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    w = torch.randn(64, 8, generator=torch.Generator().manual_seed(7))
    losses, grads = [], []
    for step in range(steps):
        x = torch.randn(16, 64, generator=g)
        y = torch.tanh(x @ w) + 0.1 * torch.randn(16, 8, generator=g)
        loss = torch.nn.functional.mse_loss(model(x.to(dtype)).float(), y)
        loss.backward()
        if step == 0:
            grads = {n: p.grad.full_tensor().clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, grads


def training(rank: int, world: int) -> dict:
    from agoq_core.quangrad import fsdp as qg_fsdp

    out = {}
    model = build()
    out["init"] = full_params(model)
    out["default"] = (*train(model, rank), full_params(model))
    runs = []
    for _ in range(2):  # twice, to check that QuanGrad's run is bit-identical
        model = build()
        rec = RecordingBackend()
        state = qg_fsdp.enable(model, threshold_bytes=THRESHOLD, backend=rec)
        losses, grads = train(model, rank)
        runs.append((losses, grads, full_params(model), dict(state.modules), state.compressed_calls,
                     state.fallback_calls, state.wire_bytes, state.fp32_equivalent_bytes, state.fallback_bytes,
                     sum(t.numel() for t in rec.a2a), state.summary()))
        qg_fsdp.disable(model)
    out["quangrad"] = runs
    # bf16 compute, bf16 reduction (FSDP2 mixed precision): the comm writes bf16 shards
    model = build({"param_dtype": torch.bfloat16, "reduce_dtype": torch.bfloat16})
    ref = build({"param_dtype": torch.bfloat16, "reduce_dtype": torch.bfloat16})
    state = qg_fsdp.enable(model, threshold_bytes=0)
    out["bf16"] = (train(model, rank, 2)[0], full_params(model), train(ref, rank, 2)[0], full_params(ref),
                   state.compressed_calls)
    return out


def errors(rank: int, world: int) -> dict:
    """Bad input: each must raise a clear error on every rank before any gradient collective."""
    from torch.distributed.fsdp import fully_shard

    from agoq_core.quangrad import fsdp as qg_fsdp

    res = {}

    def catch(key, fn):
        try:
            fn()
            res[key] = None
        except Exception as e:  # noqa: BLE001 - the test reads type and message
            res[key] = (type(e).__name__, str(e))

    catch("not_wrapped", lambda: qg_fsdp.enable(Stack()))
    mixed = Stack()
    mixed.head.to(torch.bfloat16)
    fully_shard(mixed)
    catch("mixed", lambda: qg_fsdp.enable(mixed))
    # ranks disagree: rank 1 asks for another format / threshold
    catch("fmt", lambda: qg_fsdp.enable(build(), fmt="fp8_e5m2" if rank == 1 else "fp8_e4m3"))
    catch("threshold", lambda: qg_fsdp.enable(build(), threshold_bytes=1 if rank == world - 1 else 0))
    # ranks disagree on the model: the last rank has a wider head
    def other_model():
        torch.manual_seed(0)
        m = Stack()
        if rank == world - 1:
            m.head = torch.nn.Linear(64, 9)
        for b in m.blocks:
            fully_shard(b)
        fully_shard(m)
        qg_fsdp.enable(m)
    catch("layout", other_model)
    m = build()
    qg_fsdp.enable(m)
    catch("twice", lambda: qg_fsdp.enable(m))
    catch("bad_threshold", lambda: qg_fsdp.enable(build(), threshold_bytes=-1))
    # the group still works after all of the above (nothing hung or left a collective pending)
    t = torch.ones(1)
    dist.all_reduce(t)
    res["alive"] = t.item()
    return res


def session(rank: int, world: int, parts: tuple[str, ...]) -> dict:
    fns = {"comm": comm, "training": training, "errors": errors}
    return {p: fns[p](rank, world) for p in parts}
