"""Rank worker: HF Trainer on 2 gloo processes (DDP built by Trainer) with QuanGrad's comm hook."""
from __future__ import annotations

import logging
import os
import tempfile

import torch


def trainer_run(rank: int, world: int, min_compress_bytes: int | None, hook: bool) -> dict:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    from transformers import Trainer, TrainingArguments

    from agoq_core.quangrad import hf
    from tests.laaq.conftest import small_batch, small_model

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, r):
            records.append(r.getMessage())

    logging.getLogger("agoq").addHandler(Keep())
    model = small_model("llama")
    data = [{"input_ids": small_batch(b=1, seed=i)[0], "labels": small_batch(b=1, seed=i)[0]} for i in range(8)]
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, use_cpu=True, ddp_backend="gloo", per_device_train_batch_size=1,
                                 max_steps=3, learning_rate=1e-3, logging_steps=1, report_to=[], save_strategy="no",
                                 seed=0, data_seed=0, dataloader_num_workers=0)
        tr = Trainer(model=model, args=args, train_dataset=data)
        handle = hf.install(tr, min_compress_bytes=min_compress_bytes) if hook else None
        tr.train()
    st = handle.state if handle is not None else None
    return {"losses": [h["loss"] for h in tr.state.log_history if "loss" in h],
            "params": torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
            "ddp": type(tr.model_wrapped).__name__,
            "compressed": st.compressed_buckets if st else None, "fallback": st.fallback_buckets if st else None,
            "summary": st.summary() if st else "", "log": records}
