"""QuanGrad's protocol and 8-bit storage through every other backend that can run here (the cuda
plugin's Triton kernels under TRITON_INTERPRET=1 in CI): bit-identical to the reference backend."""
from __future__ import annotations

import pytest
import torch

from agoq_core.backend import get_backend
from agoq_core.quangrad import simulate_all_reduce, simulate_reduce_scatter
from agoq_core.quangrad.config import resolve_spec
from agoq_core.quangrad.layout import plan_buckets
from agoq_core.quangrad.storage import GradStorage

from . import qg_ref
from .qg_workers import FMTS, rank_input


def _backend_or_skip(name):
    from agoq_core import list_backends

    rows = {r["name"]: r for r in list_backends()["backends"]}
    if name not in rows:
        pytest.skip(f"backend {name!r} is not installed")
    if not rows[name]["available"] or rows[name]["device_type"] != "cpu":
        pytest.skip(f"backend {name!r} cannot run on this CPU machine: {rows[name]['reason'].splitlines()[0]}")
    return get_backend(name)


@pytest.mark.parametrize("name", ["cuda", "ascend"])
def test_protocol_and_storage_match_the_reference_backend(name):
    be = _backend_or_skip(name)
    ts = [rank_input(31, r, 3000) for r in range(3)]
    for fmt in FMTS:
        a, b = simulate_all_reduce(ts, fmt, backend=be), simulate_all_reduce(ts, fmt, backend="reference")
        for x, y in zip(a.payloads, b.payloads):
            assert torch.equal(x.all_to_all, y.all_to_all) and torch.equal(x.all_gather, y.all_gather), fmt
        assert qg_ref.bits_equal(a.results[0], b.results[0])
        ra, rb = simulate_reduce_scatter(ts, fmt, backend=be), simulate_reduce_scatter(ts, fmt, backend="reference")
        assert all(qg_ref.bits_equal(x, y) for x, y in zip(ra.shards, rb.shards))
    # per-parameter accumulation into views of the bucket (non-zero storage offsets)
    named = [("a", torch.zeros(37, 61)), ("b", torch.zeros(61)), ("c", torch.zeros(300))]
    lay = plan_buckets(named, world_size=2, spec=resolve_spec("fp8_e4m3", None), cap_numel=10**6)
    s1 = GradStorage(lay, torch.device("cpu"), be)
    s2 = GradStorage(lay, torch.device("cpu"), get_backend("reference"))
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        for i, (_, p) in enumerate(named):
            gi = torch.randn(p.shape, generator=g).to(torch.bfloat16)
            s1.fold_(i, gi)
            s2.fold_(i, gi)
    assert all(torch.equal(x, y) for x, y in zip(s1.codes, s2.codes))
    assert all(qg_ref.bits_equal(x, y) for x, y in zip(s1.scales, s2.scales))
