"""Ranks that selected different backends get one clear error, on every rank, wherever they start working
together: ``check_same_backend_across_ranks``, QuanGradDDP, the DDP comm hook, the QuanGrad collectives and
``agoq train``'s runtime. Two real gloo processes; rank 1 selects the test plugin's ``dummy`` backend."""
from __future__ import annotations

import os
import pickle
import socket
import tempfile

import pytest
import torch.multiprocessing as mp

from tests.backend.rank_workers import mismatched_backends

WHERE = ("check", "QuanGradDDP", "register_comm_hook", "all_reduce_", "reduce_scatter", "agoq train")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def results():
    with tempfile.TemporaryDirectory() as outdir:
        mp.start_processes(mismatched_backends, args=(2, _free_port(), outdir), nprocs=2, start_method="spawn",
                           join=True)
        out = []
        for r in range(2):
            with open(os.path.join(outdir, f"rank{r}.pkl"), "rb") as f:
                status, value = pickle.load(f)
            if status == "error":
                raise RuntimeError(value)
            out.append(value)
        return out


@pytest.mark.parametrize("where", WHERE)
def test_every_rank_raises_the_same_clear_error(results, where):
    r0, r1 = results[0][where], results[1][where]
    assert r0 is not None and r0 == r1, f"{where}: rank 0 said {r0!r}, rank 1 said {r1!r}"
    assert "rank 0: reference (cpu)" in r0 and "rank 1: dummy (cpu)" in r0
    assert "AGOQ_BACKEND" in r0


def test_ranks_stay_in_step_and_a_shared_backend_works(results):
    assert [r["explicit_same_backend_sum"] for r in results] == [3.0, 3.0]
    assert all(r["group_destroyed"] for r in results)  # agoq train's runtime cleans up after the error
