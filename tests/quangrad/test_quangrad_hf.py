"""QuanGrad inside HF Trainer: a real 2-process gloo run (Trainer builds DDP), the comm hook registered
by agoq_core.quangrad.hf.install. Oracle: the run whose buckets all fall below the threshold (the
vendor fp32 all-reduce, i.e. plain DDP): the same first loss, later losses within the FP8 wire error,
identical parameters on both ranks. Two 2-process runs: ~1 min of CPU."""
from __future__ import annotations

import pytest
import torch

from tests.quangrad.qg_dist import run_ranks
from tests.quangrad.qg_trainer import trainer_run


@pytest.mark.slow
def test_trainer_ddp_with_the_quangrad_hook():
    default = run_ranks(trainer_run, 2, None, True)     # 1 MiB threshold: this tiny model compresses nothing
    compressed = run_ranks(trainer_run, 2, 0, True)     # every bucket through QuanGrad
    plain = default                                      # (vendor all-reduce: plain DDP's arithmetic)
    assert default[0]["ddp"] == "DistributedDataParallel"
    assert default[0]["compressed"] == 0 and default[0]["fallback"] > 0
    assert any("nothing is compressed" in m for m in default[0]["log"]), default[0]["log"]  # visible, once
    assert sum("first step" in m for m in default[0]["log"]) == 1
    assert compressed[0]["compressed"] > 0 and compressed[0]["fallback"] == 0
    for run in (default, compressed):
        assert torch.equal(run[0]["params"], run[1]["params"])  # ranks stay bit-identical
    lp, lc = plain[0]["losses"], compressed[0]["losses"]
    assert lp[0] == lc[0] and all(abs(a - b) < 1e-2 for a, b in zip(lp, lc)), (lp, lc)
    print("\n" + compressed[0]["summary"])
