"""Property-based tests of QuanGrad's all-reduce protocol against the spec oracle
(tests/property/spec_oracle.all_reduce, written from docs/quangrad.md's wire protocol): random world
sizes, sizes, dtypes, formats, blocks, special values and rank orders.

Properties: every all-to-all payload byte equals the oracle's; every rank ends with the same tensor,
equal to the oracle's rank-order fp32 sum requantized; the sum's order is the rank order (permuting
the ranks gives the oracle's result for the permuted order, and the same payloads, permuted)."""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agoq_core.quangrad import simulate_all_reduce
from agoq_core.quangrad.config import GRADIENT_FORMATS, resolve_spec

from . import spec_oracle as O
from .conftest import PROFILE

# the absmax-scaled gradient formats of docs/formats.md §1-§4 (the MX formats of §9 have their own tests)
ABSMAX_FORMATS = sorted(f for f in GRADIENT_FORMATS if f in O.BITS)
SPECIALS = [0.0, -0.0, 1e-40, -1e-30, 3.0e38, -3.0e38, 1e4, float("nan"), float("inf")]


@st.composite
def rank_inputs(draw):
    w = draw(st.integers(2, 4))
    n = draw(st.integers(1, 700))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    ranks = []
    for _ in range(w):
        rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
        x = (rng.standard_normal(n) * 10.0 ** draw(st.integers(-6, 2))).astype(np.float32)
        for _ in range(draw(st.integers(0, 2))):
            x[draw(st.integers(0, n - 1))] = draw(st.sampled_from(SPECIALS))
        ranks.append(torch.from_numpy(x).to(dtype))
    return ranks


def _check(ranks, fmt, block):
    spec = resolve_spec(fmt, block)
    sim = simulate_all_reduce(ranks, spec)
    sends, want32 = O.all_reduce([r.float().numpy() for r in ranks], spec.name, spec.block)
    for r, p in enumerate(sim.payloads):
        assert p.all_to_all.numpy().tobytes() == sends[r], (fmt, spec.block, r)
    want = torch.from_numpy(want32).to(ranks[0].dtype)
    for res in sim.results:
        assert res.dtype == ranks[0].dtype
        same = (res.float().isnan() & want.float().isnan()) | (res.float() == want.float())
        assert bool(same.all()), (fmt, spec.block)
        assert torch.equal(res.view(torch.int16 if res.dtype == torch.bfloat16 else torch.int32),
                           sim.results[0].view(torch.int16 if res.dtype == torch.bfloat16 else torch.int32))
    return sim


@settings(PROFILE)
@given(ranks=rank_inputs(), fmt=st.sampled_from(ABSMAX_FORMATS), block=st.sampled_from([None, 32, 64]),
       order=st.randoms(use_true_random=False))
def test_all_reduce_matches_the_wire_protocol_in_any_rank_order(ranks, fmt, block, order):
    _check(ranks, fmt, block)
    perm = list(range(len(ranks)))
    order.shuffle(perm)
    _check([ranks[i] for i in perm], fmt, block)  # the oracle folds in the permuted rank order
