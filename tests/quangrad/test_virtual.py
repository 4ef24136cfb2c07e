"""Virtual data-parallel ranks (agoq_core.quangrad.virtual) against real gloo ranks.

W spawned gloo processes train a small model for a few steps with QuanGradDDP (or DDP for the
baseline), each on its own data; one process does the same with W virtual ranks. The parameters must
end bit-identical: same bytes, not "close".
"""
from __future__ import annotations

import contextlib

import pytest
import torch

from agoq_core.quangrad import QuanGradConfig, QuanGradDDP
from agoq_core.quangrad.virtual import VirtualGradSum, VirtualQuanGradDDP, reduce_bucket

from .qg_dist import run_ranks

pytestmark = pytest.mark.dist

STEPS, ACCUM, BATCH, DIM = 3, 2, 6, 48


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    # Odd sizes: parameters that do not fill whole blocks, buckets padded differently at W = 2 and 4.
    return torch.nn.Sequential(torch.nn.Linear(DIM, 130), torch.nn.GELU(), torch.nn.Linear(130, 77),
                               torch.nn.GELU(), torch.nn.Linear(77, DIM))


def _batch(step: int, rank: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10_000 * step + 100 * rank + k)
    x = torch.randn(BATCH, DIM, generator=g) * (1 + rank)  # ranks differ in scale: the sum order matters
    return x, torch.randn(BATCH, DIM, generator=g)


def _loss(model, x, y) -> torch.Tensor:
    return ((model(x) - y) ** 2).mean() / ACCUM


def _config(collective: str) -> dict:
    # 24K-element buckets: several buckets; min_compress_bytes decides QuanGrad vs the vendor fallback.
    return dict(collective=collective, bucket_cap_mb=24_000 / (1 << 20), max_grad_norm=1.0,
                min_compress_bytes=(1 << 30) if collective == "fp32" else 0)


def _opt(ps):
    return torch.optim.AdamW(ps, lr=1e-2)


def _params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _real_one(rank: int, collective: str) -> dict:
    model = _model()
    if collective == "ddp":
        ddp = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
        opt = _opt(model.parameters())
        for step in range(STEPS):
            for k in range(ACCUM):
                with ddp.no_sync() if k < ACCUM - 1 else contextlib.nullcontext():
                    _loss(ddp, *_batch(step, rank, k)).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
        return {"params": _params(model)}
    qg = QuanGradDDP(model, _opt, config=QuanGradConfig(**_config(collective)))
    norms = []
    for step in range(STEPS):
        for k in range(ACCUM):
            with qg.no_sync() if k < ACCUM - 1 else contextlib.nullcontext():
                _loss(qg, *_batch(step, rank, k)).backward()
        rep = qg.step()
        norms.append(rep.grad_norm)
    qg.remove_hooks()
    return {"params": _params(model), "paths": sorted({b.path for b in qg.layout.buckets}), "norms": norms,
            "wire": rep.wire_bytes}


def _real_worker(rank: int, world: int, collectives: tuple[str, ...]) -> dict:
    return {c: _real_one(rank, c) for c in collectives}


@contextlib.contextmanager
def _threads(n: int):
    """torch's intra-op thread count for a block. GEMM results on CPU may depend on it (MKL on AMD EPYC
    splits the sums differently on 1 and 2 threads), so the one-process run must use the real ranks'
    count (run_ranks: 1) for the bytes to match."""
    prev = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


def _virtual(world: int, collective: str, track_errors: bool = False, batches_of: int = 0) -> dict:
    """W virtual ranks; ``batches_of=N`` (W = 1): the one rank runs the micro-batches of N ranks.
    One torch thread, as each real rank has."""
    with _threads(1):
        return _virtual_run(world, collective, track_errors, batches_of)


def _virtual_run(world: int, collective: str, track_errors: bool, batches_of: int) -> dict:
    model = _model()
    if collective == "ddp":
        vs = VirtualGradSum(list(model.parameters()), world)
        opt = _opt(model.parameters())
        for step in range(STEPS):
            for r in range(world):
                for k in range(ACCUM):
                    _loss(model, *_batch(step, r, k)).backward()
                vs.end_rank()
            vs.finish()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
        return {"params": _params(model)}
    qg = VirtualQuanGradDDP(model, _opt, world_size=world, config=QuanGradConfig(**_config(collective)),
                            track_errors=track_errors)
    norms, errors = [], []
    for step in range(STEPS):
        for r in range(world):
            qg.set_rank(r)
            for src in range(batches_of) if batches_of else [r]:
                for k in range(ACCUM):
                    with qg.no_sync() if (k < ACCUM - 1 or src < batches_of - 1) else contextlib.nullcontext():
                        _loss(qg, *_batch(step, src, k)).backward()
        rep = qg.step()
        norms.append(rep.grad_norm)
        errors.append(dict(qg.last_errors))
    return {"params": _params(model), "paths": sorted({b.path for b in qg.layout.buckets}), "norms": norms,
            "wire": rep.wire_bytes, "errors": errors, "qg": qg}


def _same_bytes(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(a, b))


# One spawned session per world size (spawning dominates the time); every collective runs in it.
COLLECTIVES = {2: ("quangrad", "naive_fp8", "fp32", "ddp"), 4: ("quangrad", "naive_fp8")}


@pytest.fixture(scope="module", params=sorted(COLLECTIVES), ids=lambda w: f"w{w}")
def real_run(request):
    world = request.param
    return world, run_ranks(_real_worker, world, COLLECTIVES[world])


def test_virtual_ranks_end_bit_identical_to_real_gloo_ranks(real_run):
    world, real = real_run
    before = _params(_model())
    for collective in COLLECTIVES[world]:
        for r in range(1, world):
            assert _same_bytes(real[r][collective]["params"], real[0][collective]["params"])
        virt, ref = _virtual(world, collective), real[0][collective]
        assert not _same_bytes(virt["params"], before), "training changed nothing: the comparison would be empty"
        assert _same_bytes(virt["params"], ref["params"]), f"{collective} at W={world}: parameters differ"
        if collective != "ddp":
            assert virt["paths"] == ref["paths"] == [collective]
            assert virt["norms"] == ref["norms"]
            assert virt["wire"] == ref["wire"]  # what one real rank sends, by the same accounting


def test_virtual_ranks_keep_each_rank_apart():
    """QuanGrad equals the fp32 sum of the ranks' 8-bit gradients (it is precision-preserving), differs
    from the naive FP8 all-reduce, and from one rank accumulating every micro-batch in 8 bits."""
    q = _virtual(4, "quangrad")["params"]
    assert _same_bytes(q, _virtual(4, "fp32")["params"])
    assert not _same_bytes(q, _virtual(4, "naive_fp8")["params"])
    assert not _same_bytes(q, _virtual(1, "quangrad", batches_of=4)["params"])


def test_gradient_errors_against_an_independent_exact_sum():
    out = _virtual(4, "naive_fp8", track_errors=True)
    qerr = _virtual(4, "quangrad", track_errors=True)["errors"]
    # Independent exact gradient of step 0 (same initial weights): plain autograd over every micro-batch.
    model = _model()
    for r in range(4):
        for k in range(ACCUM):
            _loss(model, *_batch(0, r, k)).backward()
    names = [n for n, _ in model.named_parameters()]
    assert sorted(out["errors"][0]) == sorted(names)
    for n, p in model.named_parameters():
        e_naive, e_q = out["errors"][0][n], qerr[0][n]
        assert e_q.norm == pytest.approx(float(p.grad.norm()), rel=1e-5)
        assert 0 < e_q.error < 0.05          # FP8 E4M3 storage + QuanGrad: a few % at most
        assert e_q.collective_error < 0.05
        assert e_naive.collective_error > e_q.collective_error  # one shared scale, FP8 partial sums


def test_reduce_bucket_rejects_bad_input():
    from agoq_core.quangrad.config import resolve_spec
    from agoq_core.quangrad.protocol import ChunkPlan

    plan = ChunkPlan.for_numel(512, 2, resolve_spec("fp8_e4m3", None))
    c = torch.zeros(plan.code_bytes, dtype=torch.uint8)
    s = torch.zeros(plan.num_blocks)
    with pytest.raises(ValueError, match="planned for 2 ranks"):
        reduce_bucket("quangrad", [c], [s], plan, c, s)
    with pytest.raises(ValueError, match="unknown bucket path"):
        reduce_bucket("ring", [c, c], [s, s], plan, c, s)
    with pytest.raises(ValueError, match="virtual world_size"):
        VirtualQuanGradDDP(_model(), _opt, world_size=0)
    with pytest.raises(ValueError, match="sharded"):
        VirtualQuanGradDDP(_model(), _opt, world_size=2, config=QuanGradConfig(sharded=True))
    qg = VirtualQuanGradDDP(_model(), _opt, world_size=2)
    with pytest.raises(ValueError, match=r"virtual rank must be in \[0, 2\)"):
        qg.set_rank(2)
    vs = VirtualGradSum(list(_model().parameters()), 3)
    vs.end_rank()
    with pytest.raises(RuntimeError, match="1 of 3 virtual ranks"):
        vs.finish()
