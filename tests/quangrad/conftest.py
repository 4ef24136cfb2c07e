"""Session fixtures: one spawned gloo job per world size runs every distributed part the QuanGrad
tests check (spawning costs ~10 s of imports per job on 2 CPU cores, so they are shared)."""
from __future__ import annotations

import pytest

from .qg_dist import run_ranks


@pytest.fixture(scope="session")
def qg_w2():
    from .qg_workers import session

    return run_ranks(session, 2, ("collectives", "wrapper", "ddp_hook", "llama"))


@pytest.fixture(scope="session")
def qg_w4():
    from .qg_workers import session

    return run_ranks(session, 4, ("collectives", "error_table", "wrapper_w4"))
