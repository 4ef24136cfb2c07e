"""Per-rank work: torchtitan's tiny Llama with the agoq converter under torchtitan's own FSDP2 wrapping
(apply_fsdp_to_decoder on a CPU device mesh), on real gloo ranks."""
from __future__ import annotations

import torch

from .tt_helpers import build, loss_of, tiny_spec, tokens

STEPS = 3


def fsdp_train(rank: int, world: int, quangrad: bool) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder

    from agoq_core.integrations.torchtitan import STATE_ATTR, AgoqConverter

    # threshold 64 KiB: the blocks (~1 MiB fp32 each) go through QuanGrad, the root (embedding + head,
    # 2048 x 256 x 2 = 4 MiB) too; nothing small enough to fall back except what FSDP keeps at the root.
    conv = AgoqConverter.Config(quangrad=quangrad, quangrad_threshold_bytes=64 << 10)
    model = build(tiny_spec([conv]))
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    apply_fsdp_to_decoder(model, mesh, param_dtype=torch.float32, reduce_dtype=torch.float32, pp_enabled=False)
    if not quangrad:
        # torchtitan sets gradient_divide_factor=1 (it scales the loss by the global token count), so FSDP
        # asks for PREMUL_SUM(1.0), which gloo lacks; SUM is the same reduction. QuanGrad's comm takes
        # PREMUL_SUM itself, so its run keeps torchtitan's setting.
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_force_sum_reduction_for_comms(True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(STEPS):
        loss = loss_of(model, tokens(1000 * step + rank))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    state = model.__dict__.get(STATE_ATTR)
    params = {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}
    return {"losses": losses, "params": params,
            "state": None if state is None else (state.compressed_calls, state.fallback_calls, state.wire_bytes,
                                                 state.fp32_equivalent_bytes, dict(state.modules))}


def session(rank: int, world: int) -> dict:
    return {"laaq": fsdp_train(rank, world, False), "laaq_quangrad": fsdp_train(rank, world, True)}


def _bench_module():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_torchtitan.py"
    spec = importlib.util.spec_from_file_location("bench_torchtitan", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def chunked_train(rank: int, world: int, mode: str) -> dict:
    """benchmarks/bench_torchtitan.py's model setup and loss on one rank: torchtitan's FSDP2 wrapping
    ("grouped": fully_shard([norm, lm_head]); "split": the bench's torch < 2.13 grouping; "none": no
    FSDP), torchtitan's ChunkedLossWrapper over the model's hidden states, 3 AdamW steps."""
    from torch.distributed.device_mesh import init_device_mesh
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss

    bench = _bench_module()
    model = build(tiny_spec())
    if mode != "none":
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
        bench.apply_fsdp(model, mesh, torch.float32, torch.float32, split=mode == "split")
    loss_fn = ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config()).build()
    loss_fn.set_lm_head(model.lm_head)
    model._skip_lm_head = True
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(STEPS):
        tok = tokens(1000 * step + rank)
        loss, _ = loss_fn(model(tok[:, :-1]), tok[:, 1:], global_valid_tokens=torch.tensor(float(tok[:, 1:].numel())))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    full = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in model.named_parameters()}
    return {"losses": losses, "params": full}


def chunked_session(rank: int, world: int) -> dict:
    """``chunked_train`` in every mode this torch runs ("grouped" needs FSDP2 partial-forward groups)."""
    partial = _bench_module().fsdp_groups_partial_forward()
    modes = ("split", "none") + (("grouped",) if partial else ())
    return {"partial_forward_groups": partial, **{m: chunked_train(rank, world, m) for m in modes}}
