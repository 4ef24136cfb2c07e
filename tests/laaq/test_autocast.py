"""LAAQ under mixed precision: torch.autocast (bf16, fp16 + GradScaler), HF Trainer(bf16=True),
Accelerate(mixed_precision="bf16"). Backward runs outside the autocast region, as Trainer and
Accelerate do: every LAAQ autograd function re-enters forward's autocast state itself.

Oracle: the same model without LAAQ under the same autocast. The forward is unchanged (loss equal);
with nothing quantized (LAAQConfig.native()) the gradients equal PyTorch's up to fp32 summation order;
with the default policy they stay within the per-layer-type error of docs/laaq.md."""
from __future__ import annotations

import pytest
import torch

from agoq_core.laaq import LAAQConfig, apply, remove
from tests.laaq.conftest import NF4_REL_L2, pooled_errors, rel_err, small_batch, small_model


def _amp_grads(model, ids, dtype, scaler=None):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=dtype):
        loss = model(input_ids=ids, labels=ids).loss
    (scaler.scale(loss) if scaler is not None else loss).backward()  # outside autocast
    g = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), g


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_native_policy_matches_pytorch(dtype):
    model = small_model("qwen2")  # q/k/v biases and a tied head too
    ids = small_batch()
    l0, g0 = _amp_grads(model, ids, dtype)
    apply(model, LAAQConfig.native())
    l1, g1 = _amp_grads(model, ids, dtype)
    remove(model)
    assert torch.equal(l0, l1)
    assert {n: g.dtype for n, g in g1.items()} == {n: g.dtype for n, g in g0.items()}
    errs = {n: rel_err(g0[n], g1[n]) for n in g0}
    assert max(errs.values()) < 1e-6, errs  # fp32 sums of the norm-weight gradient, re-ordered


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_default_policy_within_documented_error(dtype):
    model = small_model("llama")
    ids = small_batch()
    l0, g0 = _amp_grads(model, ids, dtype)
    apply(model)
    l1, g1 = _amp_grads(model, ids, dtype)
    remove(model)
    assert torch.equal(l0, l1)
    errs = pooled_errors(g0, g1)
    assert max(errs.values()) <= NF4_REL_L2, errs


def test_fp16_autocast_with_grad_scaler_steps_like_plain():
    ids = small_batch()
    losses = []
    for laaq in (False, True):
        model = small_model("llama")
        if laaq:
            apply(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12)
        run = []
        for _ in range(3):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(input_ids=ids, labels=ids).loss
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            run.append(loss.item())
        losses.append(run)
    assert losses[0][0] == losses[1][0]
    assert all(abs(a - b) < 2e-2 for a, b in zip(*losses)), losses  # Adam steps on 4-bit-error gradients
    assert losses[1][-1] < losses[1][0]


def _trainer_losses(tmp_path, laaq: bool, **args):
    from transformers import Trainer, TrainingArguments

    model = small_model("llama")
    if laaq:
        apply(model)
    data = [{"input_ids": small_batch(b=1, seed=i)[0], "labels": small_batch(b=1, seed=i)[0]} for i in range(8)]
    targs = TrainingArguments(output_dir=str(tmp_path / ("laaq" if laaq else "plain")), use_cpu=True,
                              per_device_train_batch_size=2, max_steps=3, learning_rate=1e-3, logging_steps=1,
                              report_to=[], save_strategy="no", seed=0, data_seed=0, **args)
    tr = Trainer(model=model, args=targs, train_dataset=data)
    tr.train()
    return [h["loss"] for h in tr.state.log_history if "loss" in h], model


def test_hf_trainer_bf16(tmp_path):
    plain, _ = _trainer_losses(tmp_path, False, bf16=True)
    laaq, model = _trainer_losses(tmp_path, True, bf16=True)
    assert len(plain) == len(laaq) == 3
    assert plain[0] == laaq[0]  # same forward on the same first batch
    assert all(abs(a - b) < 2e-2 for a, b in zip(plain, laaq)), (plain, laaq)
    remove(model)


def test_accelerate_bf16():
    from accelerate import Accelerator

    ids = small_batch()
    out = []
    for laaq in (False, True):
        acc = Accelerator(mixed_precision="bf16", cpu=True)
        model = small_model("llama")
        if laaq:
            apply(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model, opt = acc.prepare(model, opt)
        loss = model(input_ids=ids, labels=ids).loss  # accelerate's forward runs under its autocast
        acc.backward(loss)
        out.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
        opt.step()
        acc.free_memory()
    (l0, g0), (l1, g1) = out
    assert torch.equal(l0, l1)
    errs = pooled_errors(g0, g1)
    assert max(errs.values()) <= NF4_REL_L2, errs
