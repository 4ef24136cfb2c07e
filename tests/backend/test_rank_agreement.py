"""Ranks that selected different backends get one clear error, on every rank, wherever they start working
together: ``check_same_backend_across_ranks``, QuanGradDDP, the DDP comm hook, the QuanGrad collectives, the
FSDP2 reduce-scatter's ``enable`` and ``agoq train``'s runtime. Two real gloo processes; rank 1 selects the test plugin's ``dummy`` backend."""
from __future__ import annotations

import pytest

from tests.backend.rank_workers import mismatched_backends
from tests.quangrad.qg_dist import run_ranks

WHERE = ("check", "QuanGradDDP", "register_comm_hook", "all_reduce_", "reduce_scatter", "fsdp.enable", "agoq train")


@pytest.fixture(scope="module")
def results():
    return run_ranks(mismatched_backends, 2)


@pytest.mark.parametrize("where", WHERE)
def test_every_rank_raises_the_same_clear_error(results, where):
    if where not in results[0]:
        pytest.skip(f"{where}: not available with this torch")
    r0, r1 = results[0][where], results[1][where]
    assert r0 is not None and r0 == r1, f"{where}: rank 0 said {r0!r}, rank 1 said {r1!r}"
    assert "rank 0: reference (cpu)" in r0 and "rank 1: dummy (cpu)" in r0
    assert "AGOQ_BACKEND" in r0


def test_ranks_stay_in_step_and_a_shared_backend_works(results):
    assert [r["explicit_same_backend_sum"] for r in results] == [3.0, 3.0]
    assert all(r["group_destroyed"] for r in results)  # agoq train's runtime cleans up after the error
