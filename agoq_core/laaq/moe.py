"""LAAQ for transformers 5 mixture-of-experts MLPs: keep each routed token's SiLU&Mul input at 4 bits.

transformers 5.x stores the experts of Mixtral, Qwen2-MoE and Qwen3-MoE as fused 3-D parameters
(``gate_up_proj`` [E, 2I, H], ``down_proj`` [E, H, I]) in an ``*Experts`` module whose forward
dispatches on ``config._experts_implementation``: ``"grouped_mm"`` (the default wherever
``torch._grouped_mm`` runs: CPU with torch >= 2.9, CUDA SM80+), ``"batched_mm"`` or ``"eager"`` (a
Python loop over experts). Per routed (token, expert) pair PyTorch keeps the gathered input, the
gate/up output, SiLU(gate), the SwiGLU output (down GEMM input) and the down output (for the routing
weight): 2H + 4I 16-bit values.

:class:`MoEExpertsFunction` runs transformers' own ``grouped_mm_experts_forward`` unchanged (so the
forward is the model's, bit for bit) with ``_apply_gate`` -- the SiLU&Mul both grouped and batched
implementations call -- wrapped to keep its input (the S x 2I gate/up rows, sorted by expert) in the
``mlp_act_input`` format. Nothing else is kept but the layer input by reference (the router's GEMM
keeps that same tensor anyway), the routing weights and the sort order. Backward rebuilds SiLU(gate)*up
and runs the per-expert GEMMs; the routing-weight gradient <dY, down(h)> is taken as <dY Wd, h>,
from the GEMM the input gradient needs anyway (no extra GEMM).

Converted only where the forward can be reproduced exactly: ``_experts_implementation ==
"grouped_mm"``, concatenated gate/up (not transposed, no bias, no post-expert norm, not expert
parallel) and the default ``_apply_gate``. Anything else is left plain with the reason in the report.
"""
from __future__ import annotations

from typing import Any

import torch

from agoq_core.laaq import storage
from agoq_core.laaq.linears import amp_state

__all__ = ["experts_problem", "MoEExpertsFunction"]


def experts_problem(m: Any) -> str | None:
    """Why LAAQ cannot convert ``m`` as a transformers 5 experts module (None: it can)."""
    try:
        from transformers.integrations import moe as hf_moe
    except ImportError:  # pragma: no cover - MoE models come from transformers
        return "transformers.integrations.moe not importable"
    if not isinstance(getattr(m, "gate_up_proj", None), torch.nn.Parameter) or \
            not isinstance(getattr(m, "down_proj", None), torch.nn.Parameter):
        return "no fused 3-D gate_up_proj/down_proj parameters (not a transformers 5 experts module)"
    impl = getattr(getattr(m, "config", None), "_experts_implementation", None)
    if impl != "grouped_mm":
        return (f"experts_implementation={impl!r}: LAAQ reproduces transformers' 'grouped_mm' experts forward "
                "only (load the model with experts_implementation='grouped_mm', the default where "
                "torch._grouped_mm runs)")
    for flag, want in (("has_gate", True), ("has_bias", False), ("is_transposed", False),
                       ("has_post_expert_norm", False), ("_is_expert_parallel", False), ("is_concatenated", True)):
        if getattr(m, flag, want) != want:
            return f"{flag}={getattr(m, flag)} (LAAQ handles concatenated gate/up, no bias, untransposed, no EP)"
    if getattr(type(m), "_apply_gate", None) is not hf_moe._default_apply_gate or "_apply_gate" in m.__dict__:
        return "a custom _apply_gate (gating other than act(gate) * up)"
    if gate_up_dims(m) is None:
        return f"gate_up_proj {tuple(m.gate_up_proj.shape)} / down_proj {tuple(m.down_proj.shape)} do not match [E, 2I, H] / [E, H, I]"
    return None


def gate_up_dims(m: Any) -> tuple[int, int, int] | None:
    e, two_i, h = m.gate_up_proj.shape
    if two_i % 2 or tuple(m.down_proj.shape) != (e, h, two_i // 2):
        return None
    return e, h, two_i // 2


def _order(top_k_index: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, list[int]]:
    """The sort transformers' grouped_mm forward applies (same call, same input: same permutation) and
    the row ranges per expert."""
    _, perm = torch.sort(top_k_index.reshape(-1))
    counts = torch.bincount(top_k_index.reshape(-1), minlength=num_experts)[:num_experts]
    ends = torch.cumsum(counts, 0).tolist()
    return perm, ends


class MoEExpertsFunction(torch.autograd.Function):
    """``experts(x, top_k_index, top_k_weights)`` keeping only the gate/up rows (mlp_act_input)."""

    @staticmethod
    def forward(ctx, x, top_k_index, top_k_weights, gate_up, down, module, spec, layer, backend):
        from transformers.integrations import moe as hf_moe

        kept: list = []

        def apply_gate(gate_up_out: torch.Tensor) -> torch.Tensor:
            kept.append(storage.store(gate_up_out, spec, role="mlp_act_input", layer=layer, backend=backend))
            return hf_moe._default_apply_gate(module, gate_up_out)

        module.__dict__["_apply_gate"] = apply_gate
        try:
            out = hf_moe.grouped_mm_experts_forward(module, x, top_k_index, top_k_weights)
        finally:
            del module.__dict__["_apply_gate"]
        if len(kept) != 1:
            raise RuntimeError(f"LAAQ MoE: transformers' grouped_mm experts forward called _apply_gate {len(kept)} "
                               "times (expected once); this transformers version is not supported")
        ctx.kept = kept[0]
        ctx.act, ctx.backend, ctx.x_dtype = module.act_fn, backend, x.dtype
        ctx.amp = amp_state(x.device.type)
        ctx.save_for_backward(x, top_k_index, top_k_weights, gate_up, down)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, idx, tkw, wgu, wd = ctx.saved_tensors
        e_count, hid, inter = wgu.shape[0], wgu.shape[2], wd.shape[2]
        k = idx.shape[-1]
        wdt = wgu.dtype  # grouped_mm ran in the weights' dtype (transformers casts its input; no autocast)
        with torch.autocast(ctx.amp[0], enabled=False) if ctx.amp[1] else _null():
            perm, ends = _order(idx, e_count)
            tok = perm // k
            gu = storage.load(ctx.kept, None, ctx.backend).detach()
            g, u = gu.chunk(2, dim=-1)
            with torch.enable_grad():
                g = g.detach().requires_grad_(True)
                a = ctx.act(g)
            a_d = a.detach()
            h = a_d * u                                               # the SwiGLU output, rebuilt
            sw = tkw.reshape(-1)[perm].to(wdt)                        # routing weight per sorted row
            gy = grad_out[tok].to(wdt)                                # dL/d(weighted expert output) per row
            dh = torch.empty_like(h)
            dsw = torch.empty(gy.shape[0], dtype=wdt, device=gy.device)
            dwd = torch.zeros_like(wd) if ctx.needs_input_grad[4] else None
            lo = 0
            for e, hi in enumerate(ends):
                if hi > lo:
                    g_e = gy[lo:hi]
                    dproj = g_e * sw[lo:hi, None]
                    if dwd is not None:
                        dwd[e] = dproj.t().mm(h[lo:hi])
                    dh_unw = g_e.mm(wd[e])                            # dL/dh before the routing weight
                    dsw[lo:hi] = (dh_unw * h[lo:hi]).sum(-1)          # <dY, h Wdᵀ> = <dY Wd, h>
                    dh[lo:hi] = dh_unw * sw[lo:hi, None]
                lo = hi
            du = dh * a_d
            (dg,) = torch.autograd.grad(a, (g,), dh * u)
            dgu = torch.cat([dg, du], dim=-1)
            del a, a_d, g, u, h, dh, du, dg
            need_x = ctx.needs_input_grad[0]
            xg = x[tok].to(wdt) if ctx.needs_input_grad[3] else None
            dwgu = torch.zeros_like(wgu) if ctx.needs_input_grad[3] else None
            dxg = torch.empty(dgu.shape[0], hid, dtype=wdt, device=dgu.device) if need_x else None
            lo = 0
            for e, hi in enumerate(ends):
                if hi > lo:
                    if dwgu is not None:
                        dwgu[e] = dgu[lo:hi].t().mm(xg[lo:hi])
                    if need_x:
                        dxg[lo:hi] = dgu[lo:hi].mm(wgu[e])
                lo = hi
            dx = None
            if need_x:
                dx = torch.zeros(x.shape[0], hid, dtype=wdt, device=x.device).index_add_(0, tok, dxg).to(ctx.x_dtype)
            dtkw = None
            if ctx.needs_input_grad[2]:
                flat = torch.empty_like(dsw)
                flat[perm] = dsw
                dtkw = flat.view(idx.shape).to(tkw.dtype)
        del inter
        return dx, None, dtkw, dwgu, dwd, None, None, None, None


def _null():
    import contextlib

    return contextlib.nullcontext()
