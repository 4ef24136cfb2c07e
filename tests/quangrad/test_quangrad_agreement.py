"""Ranks that disagree get the same clear error on every rank, never a wrong sum or a hang (issue 15 §3),
and a rank failing mid-collective does not leave the others waiting past the process-group timeout.

Real gloo groups of 2 spawned processes."""
from __future__ import annotations

import pytest
import torch

from agoq_core.quangrad import QuanGradDDP, optimizer_factory

from . import qg_agree_workers as W
from .qg_dist import run_ranks

pytestmark = pytest.mark.dist

FAULT_TIMEOUT_S = 4.0


@pytest.fixture(scope="module")
def mism():
    # a short process-group timeout: before the fix the empty-tensor case hung in the all-to-all
    return run_ranks(W.mismatches, 2, timeout_s=20)


@pytest.mark.parametrize("case, field, values", [
    ("size", "numel", ("100", "200")),
    ("fmt", "fmt", ("'fp8_e4m3'", "'int8'")),
    ("block", "block", ("32", "64")),
    ("dtype", "dtype", ("'float32'", "'bfloat16'")),
    ("empty_one", "numel", ("0", "10")),
    ("rs_size", "numel", ("64", "128")),
    ("hook_fmt", "fmt", ("'fp8_e4m3'", "'fp8_e5m2'")),
])
def test_mismatch_raises_the_same_error_on_every_rank(mism, case, field, values):
    errs = [r[case] for r in mism]
    assert errs[0][0] == "RankMismatchError", errs[0]
    assert errs[0] == errs[1]  # same type and message on both ranks
    msg = errs[0][1]
    assert f"{field}: rank 0={values[0]}, rank 1={values[1]}" in msg, msg
    assert "Every rank must" in msg


def test_backend_mismatch_raises_the_same_error_on_every_rank(mism):
    # after earlier calls on the same group (a once-per-group check would let the ranks' collectives diverge)
    errs = [r["backend"] for r in mism]
    assert errs[0][0] == "BackendMismatchError" and errs[0] == errs[1]
    assert "rank 0: reference (cpu); rank 1: other (cpu)" in errs[0][1]


def test_matching_calls_still_work(mism):
    assert mism[0]["empty_all"] == ("ok", []) and mism[1]["empty_all"] == ("ok", [])
    for r in mism:
        assert r["after"] == ("ok", [3.0] * 64)  # 1 + 2, exact in fp8 (one block, amax 3)


def test_a_rank_failing_mid_collective_does_not_hang_the_others():
    res = run_ranks(W.fault, 2, FAULT_TIMEOUT_S, timeout_s=FAULT_TIMEOUT_S)
    assert res[1]["result"] == ("RuntimeError", "injected fault")
    kind, msg = res[0]["result"]
    assert kind != "ok", "rank 0 completed a collective its peer never joined"
    assert "timed out" in msg.lower() or "timeout" in msg.lower(), msg
    # documented in docs/guarantees.md: peers raise once the process group's timeout has passed
    assert FAULT_TIMEOUT_S - 0.5 <= res[0]["elapsed"] < FAULT_TIMEOUT_S + 6, res[0]["elapsed"]


# ---- QuanGradDDP wraps a model once (issue 15 §9) ------------------------------------------------------

def test_wrapping_twice_is_refused():
    model = torch.nn.Linear(4, 4)
    qg = QuanGradDDP(model, optimizer_factory("sgd", lr=0.1))
    with pytest.raises(ValueError, match="already wrapped by another QuanGradDDP.*remove_hooks"):
        QuanGradDDP(model, optimizer_factory("sgd", lr=0.1))
    with pytest.raises(ValueError, match="already a QuanGradDDP"):
        QuanGradDDP(qg, optimizer_factory("sgd", lr=0.1))
    qg.remove_hooks()
    again = QuanGradDDP(model, optimizer_factory("sgd", lr=0.1))  # allowed once the first let go
    model(torch.randn(2, 4)).sum().backward()
    assert again.step() is not None
