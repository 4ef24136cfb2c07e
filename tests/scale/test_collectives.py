"""Alpha-beta collective formulas: known answers, placement on a cluster, monotonicity, bad input."""
from __future__ import annotations

import itertools
import math

import pytest

from agoq_core.scale import ScaleError
from agoq_core.scale.collectives import (Group, all_gather, all_to_all, collective_time, quangrad_allreduce_time,
                                         quangrad_two_hop_time,
                                         reduce_scatter, ring_allreduce, tree_allreduce)
from agoq_core.scale.network import Link, NetworkProfile

A, B, N = 1e-5, 1e-9, 8e6  # 10 us per step, 1 GB/s, 8 MB


@pytest.mark.parametrize("fn,p,expected", [
    # written out from the textbook step counts, not from the code
    (ring_allreduce, 4, 2 * 3 * A + 2 * 3 / 4 * N * B),      # 6 steps, 2(p-1)/p of the data
    (ring_allreduce, 8, 14 * A + 1.75 * N * B),
    (tree_allreduce, 4, 2 * 2 * A + 1.5 * N * B),            # 2 log2(4) steps
    (tree_allreduce, 5, 2 * 3 * A + 1.6 * N * B),            # ceil(log2 5) = 3
    (reduce_scatter, 4, 3 * A + 0.75 * N * B),
    (all_gather, 4, 3 * A + 0.75 * N * B),
    (all_to_all, 4, 3 * A + 0.75 * N * B),
    (all_to_all, 2, A + 0.5 * N * B),
])
def test_known_answers(fn, p, expected):
    assert fn(N, p, A, B) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("fn", [ring_allreduce, tree_allreduce, reduce_scatter, all_gather, all_to_all])
def test_one_rank_costs_nothing(fn):
    assert fn(N, 1, A, B) == 0.0


def _net(intra_bw=100e9, inter_bw=10e9, nics=4, ia=1e-6, ea=1e-5):
    return NetworkProfile(name="t", intra=Link(name="i", line_rate=intra_bw, alpha=ia, efficiency=1.0),
                          inter=Link(name="e", line_rate=inter_bw, alpha=ea, efficiency=1.0), nics_per_node=nics)


def test_hierarchical_known_answer():
    # 2 nodes x 4 GPUs, one NIC per GPU: intra reduce-scatter + inter all-reduce of a quarter + intra all-gather
    g = Group(size=8, per_node=4, network=_net())
    rs = 3 * 1e-6 + 0.75 * N / 100e9
    inter = 2 * 1 * 1e-5 + 2 * 0.5 * (N / 4) / 10e9
    hier = rs + inter + rs
    flat_ring = 14 * 1e-5 + 1.75 * N / (4 * 10e9)   # 4 channels, one per NIC: a node's NICs carry a hop
    assert collective_time("all_reduce", N, g, algorithm="hierarchical") == pytest.approx(hier, rel=1e-12)
    assert collective_time("all_reduce", N, g, algorithm="ring") == pytest.approx(flat_ring, rel=1e-12)
    assert collective_time("all_reduce", N, g) == pytest.approx(min(hier, flat_ring, collective_time(
        "all_reduce", N, g, algorithm="tree")), rel=1e-12)


def test_nic_sharing():
    # one NIC per node shared by 8 concurrent groups: each gets 1/8 of it
    g = Group(size=2, per_node=1, network=_net(nics=1), concurrent=8)
    assert collective_time("all_gather", N, g) == pytest.approx(1e-5 + 0.5 * N / (10e9 / 8), rel=1e-12)


def test_all_to_all_across_nodes_goes_through_the_nics():
    g = Group(size=8, per_node=4, network=_net())
    intra = 3 / 8 * N / 100e9
    inter = 4 / 8 * N / 10e9   # half of each rank's data goes to the other node, on its own NIC
    assert collective_time("all_to_all", N, g) == pytest.approx(7 * 1e-5 + max(intra, inter), rel=1e-12)
    # an all-gather's ring crosses the node boundary once: 4x less NIC time than the all-to-all here
    assert collective_time("all_gather", N, g) == pytest.approx(7 * 1e-5 + 7 / 8 * N / 40e9, rel=1e-12)


def test_intra_node_group_uses_the_intra_link():
    g = Group(size=8, per_node=8, network=_net())
    assert collective_time("reduce_scatter", N, g) == pytest.approx(7 * 1e-6 + 7 / 8 * N / 100e9, rel=1e-12)


def test_quangrad_allreduce_is_a2a_codec_ag():
    g = Group(size=8, per_node=1, network=_net(nics=1))
    numel = 2**24
    t = quangrad_allreduce_time(numel, g, codec_seconds=1e-3)
    n8 = numel * (1 + 4 / 256)
    assert t.all_to_all == pytest.approx(7 * 1e-5 + 7 / 8 * n8 / 10e9, rel=1e-12)
    assert t.all_gather == pytest.approx(t.all_to_all, rel=1e-12)
    assert t.total == pytest.approx(t.all_to_all + 1e-3 + t.all_gather)
    # a quarter of the fp32 all-reduce's bytes (plus scales): ~4x faster on large messages, bandwidth-bound
    fp32 = collective_time("all_reduce", 4 * numel, g, algorithm="ring")
    assert 3.8 < fp32 / (t.all_to_all + t.all_gather) < 4.0


OPS = ["all_reduce", "reduce_scatter", "all_gather", "all_to_all"]


@pytest.mark.parametrize("op", OPS)
def test_monotonic_in_bandwidth_and_bytes(op):
    sizes = [0, 1, 2**10, 2**20, 2**27, 2**31]
    for size, nodes, per_node, conc in itertools.product(sizes, (1, 2, 8, 512), (1, 4, 8), (1, 8)):
        if nodes * per_node < 2:
            continue
        for bw in (1e9, 25e9, 100e9):
            slow = Group(size=nodes * per_node, per_node=per_node, network=_net(inter_bw=bw, intra_bw=4 * bw),
                         concurrent=conc)
            fast = Group(size=nodes * per_node, per_node=per_node,
                         network=_net(inter_bw=2 * bw, intra_bw=8 * bw), concurrent=conc)
            t = collective_time(op, size, slow)
            assert collective_time(op, size, fast) <= t, (op, size, nodes, per_node, bw)
            assert collective_time(op, 2 * size + 1, slow) >= t, (op, size, nodes, per_node, bw)
            assert t >= 0 and math.isfinite(t)


def test_more_ranks_never_fewer_steps():
    for fn in (ring_allreduce, tree_allreduce, reduce_scatter, all_gather, all_to_all):
        ts = [fn(1024, p, A, 0.0) for p in (2, 3, 4, 8, 64, 4096)]
        assert ts == sorted(ts)


@pytest.mark.parametrize("call,msg", [
    (lambda: ring_allreduce(-1, 4, A, B), "nbytes must be >= 0"),
    (lambda: ring_allreduce(1, 0, A, B), "p >= 1"),
    (lambda: ring_allreduce(1, 4, -1, B), "alpha and beta must be >= 0"),
    (lambda: Group(size=6, per_node=4, network=_net()), "size must be a multiple of per_node"),
    (lambda: collective_time("broadcast", 1, Group(size=2, per_node=1, network=_net())), "unknown collective"),
    (lambda: collective_time("all_reduce", 1, Group(size=4, per_node=4, network=_net()), algorithm="hierarchical"),
     "not available here"),
    (lambda: Link(name="x", line_rate=0, alpha=0), "line_rate must be > 0"),
])
def test_bad_input(call, msg):
    with pytest.raises(ScaleError, match=msg):
        call()


def test_two_hop_quangrad_known_answer():
    net = _net()  # 100 GB/s intra (1 us), 10 GB/s per NIC x 4 per node (10 us)
    g = Group(size=8, per_node=4, network=net)
    numel = 2**24
    n8 = numel * (1 + 4 / 256)
    t = quangrad_two_hop_time(numel, g)
    intra = 3 * 1e-6 + 0.75 * n8 / 100e9            # a2a (and ag) among 4 GPUs of a node
    inter = 1 * 1e-5 + 0.5 * (n8 / 4) / 10e9         # a2a (and ag) of the quarter across 2 nodes
    assert t.all_to_all == pytest.approx(intra + inter, rel=1e-12)
    assert t.all_gather == pytest.approx(intra + inter, rel=1e-12)
    # fewer NIC bytes than the flat version
    assert t.total < quangrad_allreduce_time(numel, g).total
