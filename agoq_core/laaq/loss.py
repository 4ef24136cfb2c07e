"""Chunked linear + cross-entropy: the LM loss without materialising the logits.

At long sequences the logits dominate what a LLaMA-2-7B step keeps: the plain HF loss holds the
bf16 logits, their fp32 copy and the fp32 log-softmax, 10 bytes x 32,000 vocabulary = 0.31 GiB per
1K tokens, 20 GiB at 64K. This function computes the loss ``chunk`` tokens at a time and recomputes
each chunk's logits in backward, so it keeps only its input (or, when the input is the output of a
norm converted by LAAQ, nothing but that norm's 4-bit input) plus one chunk of logits in flight.

Same value as ``transformers``' ForCausalLMLoss (labels shifted by one, ``ignore_index`` skipped,
mean over counted tokens) up to the order of the fp32 sum; gradients likewise.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from agoq_core.laaq.functions import NormSource, _Like, find_source

__all__ = ["chunked_linear_cross_entropy"]


class _ChunkedLinearCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk: int, ignore_index: int, src: NormSource | None, view):
        h2 = hidden.reshape(-1, hidden.shape[-1])
        n = h2.shape[0]
        count = (targets != ignore_index).sum()
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for lo in range(0, n, chunk):
            logits = F.linear(h2[lo:lo + chunk], weight, bias).float()
            total += F.cross_entropy(logits, targets[lo:lo + chunk], ignore_index=ignore_index, reduction="sum")
            del logits
        ctx.chunk, ctx.ignore_index, ctx.src, ctx.view = chunk, ignore_index, src, view
        ctx.hidden_shape = hidden.shape
        if src is not None:
            src.add_consumer()
            ctx.save_for_backward(weight, bias, targets, count)
            ctx.kept_hidden = False
        else:
            ctx.save_for_backward(weight, bias, targets, count, hidden)
            ctx.kept_hidden = True
        return total / count.clamp(min=1)

    @staticmethod
    def backward(ctx, grad_loss):
        saved = ctx.saved_tensors
        weight, bias, targets, count = saved[:4]
        if ctx.kept_hidden:
            hidden = saved[4]
        else:
            hidden = ctx.src.output(_Like(ctx.view) if ctx.view is not None else None)
        h2 = hidden.reshape(-1, hidden.shape[-1])
        n = h2.shape[0]
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        dh = torch.empty_like(h2) if need_h else None
        dw = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        db = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_b and bias is not None \
            else None
        scale = grad_loss.float() / count.clamp(min=1)
        for lo in range(0, n, ctx.chunk):
            hc, tc = h2[lo:lo + ctx.chunk], targets[lo:lo + ctx.chunk]
            g = torch.softmax(F.linear(hc, weight, bias).float(), dim=-1)
            valid = (tc != ctx.ignore_index).to(torch.float32)
            # softmax - onehot(target), without a host sync: ignored rows get -0 here and x0 below
            g.scatter_add_(1, tc.clamp(min=0)[:, None], -valid[:, None])
            g.mul_((scale * valid)[:, None])
            g16 = g.to(hidden.dtype)
            del g
            if need_h:
                dh[lo:lo + ctx.chunk] = g16.matmul(weight)
            if need_w:  # 16-bit GEMM per chunk (fp32 accumulate inside), summed over chunks in fp32
                dw += g16.t().matmul(hc)
            if db is not None:
                db += g16.float().sum(0)
        if ctx.src is not None:
            ctx.src.consumer_done()
        return (dh.view(ctx.hidden_shape) if need_h else None,
                dw.to(weight.dtype) if need_w else None,
                db.to(bias.dtype) if db is not None else None,
                None, None, None, None, None)


def chunked_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                                 bias: torch.Tensor | None = None, chunk: int = 4096, ignore_index: int = -100,
                                 shift: bool = True) -> torch.Tensor:
    """Mean cross-entropy of ``hidden @ weight.T (+ bias)`` against ``labels``, ``chunk`` tokens at a time.

    ``hidden``: [..., T, H]; ``labels``: [..., T] (shifted by one inside, as HF causal LMs do, unless
    ``shift=False``). Returns a 0-dim fp32 tensor.
    """
    if hidden.shape[:-1] != labels.shape:
        raise ValueError(f"chunked_linear_cross_entropy: hidden {tuple(hidden.shape)} needs labels of shape "
                         f"{tuple(hidden.shape[:-1])}, got {tuple(labels.shape)}")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"chunked_linear_cross_entropy: weight must be [vocab, {hidden.shape[-1]}], "
                         f"got {tuple(weight.shape)}")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    if shift:
        labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    targets = labels.reshape(-1).to(hidden.device)
    src, view = find_source(hidden) if torch.is_grad_enabled() else (None, None)
    return _ChunkedLinearCE.apply(hidden, weight, bias, targets, chunk, ignore_index, src, view)
