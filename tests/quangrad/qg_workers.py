"""Per-rank work for the QuanGrad distributed tests (run on real gloo ranks by qg_dist.run_ranks).

Inputs are generated from (seed, rank) so that the parent test can rebuild them and check every
rank's result against an independent reference.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from agoq_core.backend.reference import ReferenceBackend
from agoq_core.testing.inputs import gradient_like  # noqa: F401  (used by the workers and tests)

FMTS = ("fp8_e4m3", "fp8_e5m2", "int8")
# Sizes that do and do not divide world x block (block 256): 1 element, a ragged block, one exact
# world x block unit for W=2, a few blocks plus a tail, and a bigger odd size.
SIZES = (1, 255, 512, 1031, 20011)


def rank_input(seed: int, rank: int, n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    # Magnitudes spread over blocks (10^-3 .. 10^1), as across the layers of a real gradient.
    mag = 10.0 ** (torch.rand(-(-n // 97), generator=g) * 4 - 3)
    x = torch.randn(n, generator=g) * mag.repeat_interleave(97)[:n]
    return x.to(dtype)


class RecordingBackend(ReferenceBackend):
    """The reference backend, recording every payload handed to the byte collectives."""

    name = "reference"

    def __init__(self) -> None:
        self.a2a: list[torch.Tensor] = []
        self.ag: list[torch.Tensor] = []

    def all_to_all_bytes(self, output, input, *, group=None, async_op=False):
        self.a2a.append(input.detach().reshape(-1).view(torch.uint8).clone())
        return super().all_to_all_bytes(output, input, group=group, async_op=async_op)

    def all_gather_bytes(self, output, input, *, group=None, async_op=False):
        self.ag.append(input.detach().reshape(-1).view(torch.uint8).clone())
        return super().all_gather_bytes(output, input, group=group, async_op=async_op)


# ---- collectives -------------------------------------------------------------------------------------

def collectives(rank: int, world: int, sizes=SIZES) -> dict:
    from agoq_core.quangrad import all_reduce_, baselines, reduce_scatter

    out: dict = {"all_reduce": {}, "rerun_equal": {}, "payloads": {}, "reduce_scatter": {}, "baselines": {}}
    for fmt in FMTS:
        for n in sizes:
            for dtype in (torch.float32, torch.bfloat16):
                x = rank_input(11, rank, n, dtype)
                y = x.clone()
                ret = all_reduce_(y, fmt=fmt)
                assert ret is y
                out["all_reduce"][(fmt, n, str(dtype))] = y
                y2 = x.clone()
                all_reduce_(y2, fmt=fmt)
                out["rerun_equal"][(fmt, n, str(dtype))] = torch.equal(y.view(torch.uint8), y2.view(torch.uint8))
    # the exact bytes on the wire, recorded at the backend boundary
    rec = RecordingBackend()
    x = rank_input(12, rank, 1031)
    all_reduce_(x.clone(), fmt="fp8_e4m3", backend=rec)
    out["payloads"]["fp8_e4m3"] = (rec.a2a, rec.ag)
    rec = RecordingBackend()
    all_reduce_(x.clone(), fmt="int8", block=64, backend=rec)
    out["payloads"]["int8/64"] = (rec.a2a, rec.ag)
    for fmt in FMTS:
        r = reduce_scatter(rank_input(13, rank, 1031), fmt=fmt)
        out["reduce_scatter"][fmt] = (r.shard, r.start, r.stop, r.numel)
    x = rank_input(14, rank, 1031)
    out["baselines"]["fp32"] = baselines.fp32_all_reduce_(x.clone())
    out["baselines"]["bf16"] = baselines.bf16_all_reduce_(x.clone())
    out["baselines"]["naive_fp8"] = baselines.naive_fp8_all_reduce_(x.clone())
    # non-finite: rank 1 holds a NaN at element 300 (block 1) and an Inf at 1000 (block 3)
    x = rank_input(15, rank, 1031)
    if rank == 1:
        x[300] = float("nan")
        x[1000] = float("inf")
    out["nonfinite"] = all_reduce_(x, fmt="fp8_e4m3")
    out["empty"] = all_reduce_(torch.empty(0)).numel()
    return out


def error_table(rank: int, world: int, seed: int = 5) -> dict:
    """Each method's all-reduce of the same gradient-like tensors (the parent computes the errors)."""
    from agoq_core.quangrad import all_reduce_, baselines

    x = gradient_like(seed, rank)
    res = {}
    for fmt in FMTS:
        res[fmt] = all_reduce_(x.clone(), fmt=fmt)
    res["naive_fp8"] = baselines.naive_fp8_all_reduce_(x.clone())
    res["bf16"] = baselines.bf16_all_reduce_(x.clone())
    res["fp32"] = baselines.fp32_all_reduce_(x.clone())
    return res


# ---- the data-parallel wrapper -----------------------------------------------------------------------

class TinyNet(torch.nn.Module):
    """Odd parameter sizes (37x61 weight, 61 bias, 5x61 ...) so that nothing is block-aligned."""

    def __init__(self, extra: bool = False) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(37, 61)
        self.norm = torch.nn.LayerNorm(61)
        self.fc2 = torch.nn.Linear(61, 61)
        self.head = torch.nn.Linear(61, 5)
        if extra:
            self.extra = torch.nn.Linear(5, 5)

    def forward(self, x):
        return self.head(torch.relu(self.fc2(self.norm(torch.relu(self.fc1(x))))))


def batches(seed: int, rank: int, steps: int, micro: int, bs: int = 8):
    g = torch.Generator().manual_seed(seed * 100 + rank)
    w = torch.randn(37, 5, generator=torch.Generator().manual_seed(seed))
    for _ in range(steps):
        mbs = []
        for _ in range(micro):
            x = torch.randn(bs, 37, generator=g)
            mbs.append((x, x @ w + 0.1 * torch.randn(bs, 5, generator=g)))
        yield mbs


def _train_qg(qg, rank, steps, micro, dtype=torch.float32, seed=3, inspect=False):
    losses, reports, inspected = [], [], []
    for mbs in batches(seed, rank, steps, micro):
        tot = 0.0
        for i, (x, y) in enumerate(mbs):
            ctx = qg.no_sync() if i < micro - 1 else contextlib.nullcontext()
            with ctx:
                loss = torch.nn.functional.mse_loss(qg(x.to(dtype)).float(), y) / micro
                loss.backward()
            tot += loss.item()
        if inspect:
            before = ([c.clone() for c in qg.storage.codes], [s.clone() for s in qg.storage.scales])
            qg._finish_all()
            after = ([c.clone() for c in qg.storage.codes], [s.clone() for s in qg.storage.scales],
                     [op.shard.clone() if op.shard is not None else None for op in qg._ops])
            inspected.append((before, after))
        reports.append(qg.step())
        losses.append(tot)
    return losses, reports, inspected


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _ddp_fp32(rank, steps, micro, seed=3, lr=1e-2):
    torch.manual_seed(0)
    model = TinyNet()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=lr)
    losses = []
    for mbs in batches(seed, rank, steps, micro):
        tot = 0.0
        for i, (x, y) in enumerate(mbs):
            ctx = ddp.no_sync() if i < micro - 1 else contextlib.nullcontext()
            with ctx:
                loss = torch.nn.functional.mse_loss(ddp(x), y) / micro
                loss.backward()
            tot += loss.item()
        opt.step()
        opt.zero_grad()
        losses.append(tot)
    return losses, _params(model)


def wrapper(rank: int, world: int) -> dict:
    from agoq_core.quangrad import LayoutMismatchError, QuanGradConfig, QuanGradDDP, optimizer_factory

    out: dict = {}
    steps, micro = 6, 3
    out["ddp"] = _ddp_fp32(rank, steps, micro)

    def make(cfg, opt="adamw", dtype=torch.float32, lr=1e-2, seed_model=rank):
        torch.manual_seed(seed_model)  # different init per rank: the wrapper must broadcast rank 0's
        model = TinyNet().to(dtype)
        return QuanGradDDP(model, optimizer_factory(opt, lr=lr), config=cfg)

    # 1. precise check of one window: reduced storage == independent reference of all ranks' local storage
    cfg = QuanGradConfig(bucket_cap_mb=2000 / 2**20, min_compress_bytes=0, overlap=False)  # several buckets
    qg = make(cfg, opt="sgd", lr=0.1)
    p0 = _params(qg.module)
    losses, reports, insp = _train_qg(qg, rank, 1, micro, inspect=True)
    out["inspect"] = {"before": insp[0][0], "after": insp[0][1], "p0": p0, "p1": _params(qg.module),
                      "layout": qg.layout.describe(), "report": reports[0], "setup": str(qg.report)}
    qg = make(QuanGradConfig(bucket_cap_mb=2000 / 2**20, min_compress_bytes=0, sharded=True), opt="sgd", lr=0.1)
    p0 = _params(qg.module)
    losses, reports, insp = _train_qg(qg, rank, 1, micro, inspect=True)
    out["inspect_sharded"] = {"before": insp[0][0], "after": insp[0][1], "p0": p0, "p1": _params(qg.module),
                              "layout": qg.layout.describe(), "report": reports[0]}

    # 2. training runs: overlap on/off, sharded, fallback, baselines, bf16 + master weights, 8-bit Adam
    variants = {
        "overlap": QuanGradConfig(bucket_cap_mb=3000 / 2**20, min_compress_bytes=0),
        "no_overlap": QuanGradConfig(bucket_cap_mb=3000 / 2**20, min_compress_bytes=0, overlap=False),
        "sharded": QuanGradConfig(bucket_cap_mb=3000 / 2**20, min_compress_bytes=0, sharded=True),
        "fallback": QuanGradConfig(bucket_cap_mb=3000 / 2**20, min_compress_bytes=8000),
        "clip": QuanGradConfig(min_compress_bytes=0, max_grad_norm=0.05),
        "e5m2": QuanGradConfig(fmt="fp8_e5m2", min_compress_bytes=0),
        "int8": QuanGradConfig(fmt="int8", min_compress_bytes=0),
        "naive_fp8": QuanGradConfig(collective="naive_fp8"),
        "fp32": QuanGradConfig(collective="fp32"),
        "bf16": QuanGradConfig(collective="bf16"),
        "sharded_fallback": QuanGradConfig(bucket_cap_mb=3000 / 2**20, min_compress_bytes=8000, sharded=True),
        "sharded_naive_fp8": QuanGradConfig(collective="naive_fp8", sharded=True),
    }
    for name, cfg in variants.items():
        qg = make(cfg)
        losses, reports, _ = _train_qg(qg, rank, steps, micro)
        out[name] = {"losses": losses, "params": _params(qg.module), "reports": reports,
                     "setup": qg.report, "gradient_bytes": qg.gradient_bytes}
    qg = make(QuanGradConfig(min_compress_bytes=0), dtype=torch.bfloat16)
    losses, reports, _ = _train_qg(qg, rank, steps, micro, dtype=torch.bfloat16)
    out["bf16_master"] = {"losses": losses, "params": _params(qg.module), "reports": reports, "setup": qg.report,
                          "masters": [m.detach().clone() for m in qg._masters]}
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is not None:
        qg = make(QuanGradConfig(min_compress_bytes=0), opt="adamw8bit")
        losses, reports, _ = _train_qg(qg, rank, steps, micro)
        out["adamw8bit"] = {"losses": losses, "params": _params(qg.module), "opt": type(qg.optimizer).__module__}

    # 3. a non-finite gradient on rank 1 in step 1 of 3: step skipped on every rank, others applied
    qg = make(QuanGradConfig(min_compress_bytes=0))
    reps = []
    for k, mbs in enumerate(batches(4, rank, 3, 2)):
        for i, (x, y) in enumerate(mbs):
            if k == 1 and rank == 1 and i == 0:
                x = x.clone()
                x[0, 0] = float("inf")
            with (qg.no_sync() if i == 0 else contextlib.nullcontext()):
                torch.nn.functional.mse_loss(qg(x), y).backward()
        before = _params(qg.module)
        reps.append((qg.step(), all(torch.equal(before[n], p) for n, p in qg.module.named_parameters())))
    out["nonfinite"] = reps
    qg = make(QuanGradConfig(min_compress_bytes=0, on_nonfinite="raise"))
    x, y = next(batches(4, rank, 1, 1))[0]
    x = x.clone()
    x[0, 0] = float("nan")
    torch.nn.functional.mse_loss(qg(x), y).backward()
    try:
        qg.step()
        out["nonfinite_raise"] = None
    except Exception as exc:
        out["nonfinite_raise"] = f"{type(exc).__name__}: {exc}"

    # 3b. on_nonfinite="apply", replicated and sharded: a NaN on rank 1 is applied on every rank and reported after
    out["nonfinite_apply"] = {}
    for sharded in (False, True):
        qg = make(QuanGradConfig(min_compress_bytes=0, on_nonfinite="apply", sharded=sharded), opt="sgd", lr=0.1)
        x, y = next(batches(4, rank, 1, 1))[0]
        if rank == 1:
            x = x.clone()
            x[0, 0] = float("nan")
        torch.nn.functional.mse_loss(qg(x), y).backward()
        before = _params(qg.module)
        rep = qg.step()
        out["nonfinite_apply"][sharded] = (rep, all(torch.equal(before[n], p) for n, p in qg.module.named_parameters()))

    # 4. misuse: a second backward after the window's buckets were launched (forgotten no_sync)
    qg = make(QuanGradConfig(min_compress_bytes=0))
    x, y = next(batches(5, rank, 1, 1))[0]
    torch.nn.functional.mse_loss(qg(x), y).backward()
    try:
        torch.nn.functional.mse_loss(qg(x), y).backward()
        out["second_backward"] = None
    except RuntimeError as exc:
        out["second_backward"] = str(exc)
    qg.step()
    try:
        qg.step()
        out["empty_step"] = None
    except RuntimeError as exc:
        out["empty_step"] = str(exc)

    # 5. ranks with different models must fail at setup, on every rank, without hanging
    try:
        torch.manual_seed(0)
        QuanGradDDP(TinyNet(extra=(rank == 1)), optimizer_factory("sgd", lr=0.1),
                    config=QuanGradConfig(broadcast_params=False))
        out["mismatch"] = None
    except LayoutMismatchError as exc:
        out["mismatch"] = str(exc)
    try:
        QuanGradDDP(TinyNet(), optimizer_factory("sgd", lr=0.1),
                    config=QuanGradConfig(block=256 if rank == 0 else 512, broadcast_params=False))
        out["mismatch_block"] = None
    except LayoutMismatchError as exc:
        out["mismatch_block"] = str(exc)
    return out


def ddp_hook(rank: int, world: int) -> dict:
    from agoq_core.quangrad import register_comm_hook

    steps, micro = 6, 2
    res = {}
    for name, mcb in (("hook", 0), ("hook_fallback", 1 << 30)):
        torch.manual_seed(0)
        model = TinyNet()
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.004)
        state = register_comm_hook(ddp, fmt="fp8_e4m3", min_compress_bytes=mcb)
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
        losses = []
        for mbs in batches(3, rank, steps, micro):
            tot = 0.0
            for i, (x, y) in enumerate(mbs):
                with (ddp.no_sync() if i < micro - 1 else contextlib.nullcontext()):
                    loss = torch.nn.functional.mse_loss(ddp(x), y) / micro
                    loss.backward()
                tot += loss.item()
            opt.step()
            opt.zero_grad()
            losses.append(tot)
        res[name] = {"losses": losses, "params": _params(model), "compressed": state.compressed_buckets,
                     "fallback": state.fallback_buckets, "summary": state.summary()}
    res["ddp"] = _ddp_fp32(rank, steps, micro)
    return res


# ---- a tiny HF LLaMA on real text --------------------------------------------------------------------

def _wikitext_bytes() -> torch.Tensor:
    import pathlib

    import agoq_core

    path = pathlib.Path(agoq_core.__file__).parent / "data" / "wikitext-2" / "valid.txt"  # CC BY-SA 3.0
    return torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8).long()


def _llama_batches(data, seed, rank, steps, micro, bs=4, seq=64):
    g = torch.Generator().manual_seed(seed * 100 + rank)
    for _ in range(steps):
        yield [torch.stack([data[i: i + seq] for i in torch.randint(0, data.numel() - seq, (bs,), generator=g).tolist()])
               for _ in range(micro)]


def llama(rank: int, world: int, steps: int = 30, micro: int = 4) -> dict:
    """QuanGrad (E4M3) vs plain DDP in fp32 on a byte-level LLaMA (~350K parameters), same seed and
    data, AdamW, clipping at 1.0, 4 micro-batches of accumulation."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import LlamaConfig, LlamaForCausalLM

    from agoq_core.quangrad import QuanGradConfig, QuanGradDDP, optimizer_factory

    cfg = LlamaConfig(vocab_size=256, hidden_size=96, intermediate_size=256, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=False)
    data = _wikitext_bytes()

    def build():
        torch.manual_seed(0)
        return LlamaForCausalLM(cfg)

    out: dict = {}
    model = build()
    out["numel"] = sum(p.numel() for p in model.parameters())
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-3, weight_decay=0.0)
    losses, norms = [], []
    for mbs in _llama_batches(data, 1, rank, steps, micro):
        tot = 0.0
        for i, ids in enumerate(mbs):
            with (ddp.no_sync() if i < micro - 1 else contextlib.nullcontext()):
                loss = ddp(input_ids=ids, labels=ids).loss / micro
                loss.backward()
            tot += loss.item()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
        opt.step()
        opt.zero_grad()
        losses.append(tot)
    out["ddp"] = {"losses": losses, "norms": norms, "params": _params(model)}

    qg = QuanGradDDP(build(), optimizer_factory("adamw", lr=3e-3, weight_decay=0.0),
                     config=QuanGradConfig(max_grad_norm=1.0, bucket_cap_mb=0.1, min_compress_bytes=0))
    losses, reports = [], []
    for mbs in _llama_batches(data, 1, rank, steps, micro):
        tot = 0.0
        for i, ids in enumerate(mbs):
            with (qg.no_sync() if i < micro - 1 else contextlib.nullcontext()):
                loss = qg(input_ids=ids, labels=ids).loss / micro
                loss.backward()
            tot += loss.item()
        reports.append(qg.step())
        losses.append(tot)
    out["quangrad"] = {"losses": losses, "norms": [r.grad_norm for r in reports], "params": _params(qg.module),
                       "buckets": len(qg.layout.buckets), "skipped": sum(r.skipped for r in reports),
                       "report": str(qg.report)}
    return out


def wrapper_w4(rank: int, world: int) -> dict:
    """QuanGradDDP on 4 ranks (buckets padded to 4 x 256), replicated and sharded, against an fp32
    reference computed in-process from every rank's data (no DDP: mean of the ranks' losses)."""
    from agoq_core.quangrad import QuanGradConfig, QuanGradDDP, optimizer_factory

    steps, micro = 4, 2
    torch.manual_seed(0)
    ref_model = TinyNet()
    opt = torch.optim.AdamW(ref_model.parameters(), lr=1e-2)
    streams = [batches(3, r, steps, micro) for r in range(world)]
    ref_losses = []
    for _ in range(steps):
        per_rank = [next(st) for st in streams]
        mine = 0.0
        for r, mbs in enumerate(per_rank):
            for x, y in mbs:
                loss = torch.nn.functional.mse_loss(ref_model(x), y) / micro
                (loss / world).backward()
                if r == rank:
                    mine += loss.item()
        opt.step()
        opt.zero_grad()
        ref_losses.append(mine)
    out = {"ref": {"losses": ref_losses, "params": _params(ref_model)}}
    for name, cfg in {"replicated": QuanGradConfig(bucket_cap_mb=3000 / 2**20, min_compress_bytes=0),
                      "sharded": QuanGradConfig(bucket_cap_mb=3000 / 2**20, min_compress_bytes=0, sharded=True)}.items():
        torch.manual_seed(rank)
        qg = QuanGradDDP(TinyNet(), optimizer_factory("adamw", lr=1e-2), config=cfg)
        losses, reports, _ = _train_qg(qg, rank, steps, micro)
        out[name] = {"losses": losses, "params": _params(qg.module), "buckets": [b["numel"] for b in qg.report.buckets]}
    return out


# ---- sessions: one spawn per world size runs everything the tests need ----------------------------------

def session(rank: int, world: int, parts: tuple[str, ...]) -> dict:
    fns = {"collectives": lambda: collectives(rank, world, SIZES if world == 2 else (1, 1031, 20011)),
           "error_table": lambda: error_table(rank, world), "wrapper": lambda: wrapper(rank, world),
           "ddp_hook": lambda: ddp_hook(rank, world), "llama": lambda: llama(rank, world),
           "wrapper_w4": lambda: wrapper_w4(rank, world)}
    return {p: fns[p]() for p in parts}
