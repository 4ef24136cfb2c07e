"""LAAQ with HF gradient checkpointing. Policy: a decoder layer HF runs under checkpointing runs
plain (checkpointing keeps only its input; LAAQ inside would quantize what is recomputed anyway);
the other layers run LAAQ. Decided at every forward, so enabling checkpointing after ``apply`` (or
TrainingArguments(gradient_checkpointing=True)) is never silently combined, and a user may checkpoint
some layers and LAAQ the others."""
from __future__ import annotations

import logging

import pytest
import torch

from agoq_core.laaq import LAAQConfig, SavedBytesMeter, apply, remove
from tests.laaq.conftest import NF4_REL_L2, grads, pooled_errors, small_batch, small_model


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpointing_enabled_after_apply_runs_plain_in_checkpointed_layers(reentrant, caplog):
    ids = small_batch()
    ref = small_model("llama")
    ref.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    ref.train()
    l0, g0 = grads(ref, ids)
    model = small_model("llama")
    apply(model, LAAQConfig(convert_final_norm=False))  # (the final norm + head sit outside the layers)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model.train()
    with caplog.at_level(logging.WARNING, logger="agoq.laaq"):
        l1, g1 = grads(model, ids)
        grads(model, ids)
    assert sum("gradient checkpointing is on" in r.message for r in caplog.records) == 1  # logged once
    assert torch.equal(l0, l1)
    assert [n for n in g0 if not torch.equal(g0[n], g1[n])] == []  # exactly PyTorch's checkpointed gradients
    remove(model)


def test_checkpoint_some_layers_laaq_the_others():
    ids = small_batch(b=2, s=64)
    plain = small_model("llama")
    plain.train()
    l0, g0 = grads(plain, ids)

    def saved(m):
        meter = SavedBytesMeter(m)
        with meter:
            out = m(input_ids=ids, labels=ids)
        r = meter.result()
        del out
        return r

    laaq_all = small_model("llama")
    apply(laaq_all)
    laaq_all.train()
    b_laaq = saved(laaq_all).layers_total
    mixed = small_model("llama")
    apply(mixed)
    mixed.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mixed.model.layers[1].gradient_checkpointing = False  # layer 0 checkpointed, layer 1 LAAQ
    mixed.train()
    r = saved(mixed)
    l1, g1 = grads(mixed, ids)
    assert torch.equal(l0, l1)
    assert max(pooled_errors(g0, g1).values()) <= NF4_REL_L2
    assert r.layer_total(0) < saved(laaq_all).layer_total(0) and r.layers_total < b_laaq
    remove(mixed)


def test_trainer_gradient_checkpointing_after_apply(tmp_path):
    from transformers import Trainer, TrainingArguments

    runs = []
    for laaq in (False, True):
        model = small_model("llama")
        if laaq:
            apply(model)
        data = [{"input_ids": small_batch(b=1, seed=i)[0], "labels": small_batch(b=1, seed=i)[0]} for i in range(4)]
        args = TrainingArguments(output_dir=str(tmp_path / str(laaq)), use_cpu=True, per_device_train_batch_size=2,
                                 max_steps=2, learning_rate=1e-3, logging_steps=1, report_to=[], save_strategy="no",
                                 gradient_checkpointing=True, seed=0)
        tr = Trainer(model=model, args=args, train_dataset=data)
        tr.train()
        runs.append([h["loss"] for h in tr.state.log_history if "loss" in h])
        assert model.model.layers[0].gradient_checkpointing
    assert runs[0][0] == runs[1][0] and len(runs[1]) == 2
    assert all(abs(a - b) < 1e-2 for a, b in zip(*runs)), runs  # only the final norm + head run LAAQ
