"""Alpha-beta times of the collectives AGoQ and its baselines use.

Flat formulas (one link kind, ``p`` ranks, ``alpha`` s per step, ``beta`` s per byte), with the
standard step counts (Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication
Operations in MPICH", IJHPCA 2005; Patarasuk & Yuan 2009 for the ring):

=====================  ====================================  ======================================
collective             time                                  ``nbytes`` is
=====================  ====================================  ======================================
ring all-reduce        2(p-1) a + 2(p-1)/p n b               the buffer each rank holds
tree all-reduce        2 ceil(log2 p) a + 2(p-1)/p n b       (double binary tree, pipelined: NCCL's
                                                              tree reaches ring bandwidth)
reduce-scatter (ring)  (p-1) a + (p-1)/p n b                 the full (unsharded) buffer
all-gather (ring)      (p-1) a + (p-1)/p n b                 the full (gathered) buffer
all-to-all (pairwise)  (p-1) a + (p-1)/p n b                 each rank's send buffer
=====================  ====================================  ======================================

:func:`collective_time` places a group on a cluster: ranks inside one node use the intra-node link;
a group spanning nodes is limited by the inter-node bandwidth its GPUs get when the other GPUs of
their node communicate at the same time (``concurrent`` groups sharing the node's NICs). Ring-based
collectives cross a node boundary once per channel, so a node's NICs together carry one hop's
bytes (``Group.inter_alpha_beta``); a pairwise all-to-all sends everything bound for other nodes
through the NICs. For all-reduce it takes the fastest of ring, tree and the hierarchical (2-D)
algorithm — intra-node reduce-scatter, inter-node all-reduce of the shard, intra-node all-gather —
as NCCL's tuner would.

:func:`quangrad_allreduce_time` is QuanGrad's precision-preserving all-reduce: all-to-all of the
8-bit gradient + FP32 dequantize-sum-requantize + all-gather of the 8-bit result.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from agoq_core.scale.errors import ScaleError
from agoq_core.scale.network import NetworkProfile

__all__ = ["ring_allreduce", "tree_allreduce", "reduce_scatter", "all_gather", "all_to_all", "COLLECTIVES",
           "Group", "collective_time", "quangrad_allreduce_time", "quangrad_two_hop_time", "QuanGradTime"]

Op = Literal["all_reduce", "reduce_scatter", "all_gather", "all_to_all"]


def _check(nbytes: float, p: int, alpha: float, beta: float) -> None:
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ScaleError(f"a collective needs p >= 1 ranks (an int), got {p!r}")
    if not nbytes >= 0:
        raise ScaleError(f"nbytes must be >= 0, got {nbytes!r}")
    if not (alpha >= 0 and beta >= 0):
        raise ScaleError(f"alpha and beta must be >= 0, got alpha={alpha!r}, beta={beta!r}")


def ring_allreduce(nbytes: float, p: int, alpha: float, beta: float) -> float:
    _check(nbytes, p, alpha, beta)
    return 0.0 if p == 1 else 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta


def tree_allreduce(nbytes: float, p: int, alpha: float, beta: float) -> float:
    _check(nbytes, p, alpha, beta)
    return 0.0 if p == 1 else 2 * math.ceil(math.log2(p)) * alpha + 2 * (p - 1) / p * nbytes * beta


def reduce_scatter(nbytes: float, p: int, alpha: float, beta: float) -> float:
    _check(nbytes, p, alpha, beta)
    return 0.0 if p == 1 else (p - 1) * alpha + (p - 1) / p * nbytes * beta


def all_gather(nbytes: float, p: int, alpha: float, beta: float) -> float:
    _check(nbytes, p, alpha, beta)
    return 0.0 if p == 1 else (p - 1) * alpha + (p - 1) / p * nbytes * beta


def all_to_all(nbytes: float, p: int, alpha: float, beta: float) -> float:
    _check(nbytes, p, alpha, beta)
    return 0.0 if p == 1 else (p - 1) * alpha + (p - 1) / p * nbytes * beta


#: op -> (alpha steps, beta bytes factor) as functions of p: time = steps * alpha + factor * n * beta.
COLLECTIVES = {
    "ring_allreduce": (lambda p: 2 * (p - 1), lambda p: 2 * (p - 1) / p),
    "tree_allreduce": (lambda p: 2 * math.ceil(math.log2(p)) if p > 1 else 0, lambda p: 2 * (p - 1) / p),
    "reduce_scatter": (lambda p: p - 1, lambda p: (p - 1) / p),
    "all_gather": (lambda p: p - 1, lambda p: (p - 1) / p),
    "all_to_all": (lambda p: p - 1, lambda p: (p - 1) / p),
}


@dataclass(frozen=True, kw_only=True)
class Group:
    """A process group placed on a cluster."""

    size: int
    """Ranks in the group."""
    per_node: int
    """Ranks of the group on each node (the group spans ``size / per_node`` nodes)."""
    network: NetworkProfile
    concurrent: int = 1
    """Groups of this shape communicating at the same time on each node (e.g. one DP group per TP
    rank: TP=8 gives 8 DP groups whose inter-node traffic shares the node's NICs)."""

    def __post_init__(self) -> None:
        for f in ("size", "per_node", "concurrent"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ScaleError(f"Group.{f} must be an int >= 1, got {v!r}")
        if self.per_node > self.size or self.size % self.per_node:
            raise ScaleError(f"Group: {self.size} ranks cannot be placed {self.per_node} per node "
                             f"(size must be a multiple of per_node)")

    @property
    def nodes(self) -> int:
        return self.size // self.per_node

    @property
    def intra_alpha_beta(self) -> tuple[float, float]:
        return self.network.intra.alpha, self.network.intra.beta

    @property
    def nic_bandwidth_per_gpu(self) -> float:
        """Inter-node bytes/s one GPU of the group gets while all GPUs of its node (this group's and the
        concurrent groups') send across nodes."""
        return self.network.inter_bandwidth_per_gpu(self.per_node * self.concurrent)

    @property
    def inter_alpha_beta(self) -> tuple[float, float]:
        """Alpha-beta of ring-based collectives (all-reduce, reduce-scatter, all-gather) across nodes.

        A ring crosses each node boundary once per channel: only 1 of the ``per_node`` hops inside a node
        goes through a NIC, and NCCL runs one channel per NIC, so the bytes that leave a node per ring
        step are carried by all the group's NICs of that node together: the bandwidth is
        ``per_node x`` the per-GPU NIC share (capped by the intra-node link). Steps wait for the
        slowest hop: the inter-node alpha."""
        bw = min(self.per_node * self.nic_bandwidth_per_gpu, self.network.intra.bandwidth)
        return self.network.inter.alpha, 1.0 / bw


def collective_time(op: Op, nbytes: float, group: Group, *, algorithm: str = "auto") -> float:
    """Seconds for ``op`` on ``nbytes`` (see the module table for what ``nbytes`` is)."""
    p = group.size
    if p == 1:
        return 0.0
    a, b = group.intra_alpha_beta if group.nodes == 1 else group.inter_alpha_beta
    if op == "all_to_all" and group.nodes > 1:
        return _all_to_all_across_nodes(nbytes, group)
    if op != "all_reduce":
        return _flat(op, nbytes, p, a, b)
    times = {"ring": ring_allreduce(nbytes, p, a, b), "tree": tree_allreduce(nbytes, p, a, b)}
    if group.nodes > 1 and group.per_node > 1:
        times["hierarchical"] = _hierarchical_allreduce(nbytes, group)
    if algorithm == "auto":
        return min(times.values())
    if algorithm not in times:
        raise ScaleError(f"all-reduce algorithm {algorithm!r} is not available here; choose auto or one of "
                         f"{', '.join(times)}")
    return times[algorithm]


def _flat(op: str, nbytes: float, p: int, a: float, b: float) -> float:
    f = {"reduce_scatter": reduce_scatter, "all_gather": all_gather, "all_to_all": all_to_all,
         "all_reduce": ring_allreduce}.get(op)
    if f is None:
        raise ScaleError(f"unknown collective {op!r}; known: all_reduce, reduce_scatter, all_gather, all_to_all")
    return f(nbytes, p, a, b)


def _all_to_all_across_nodes(nbytes: float, group: Group) -> float:
    """Pairwise exchange: every rank sends its (p-1)/p share directly to each peer; what goes to the
    ``p - per_node`` ranks on other nodes leaves through the GPU's NIC share, the rest over the
    intra-node link at the same time. No ring trick: all of it crosses the NIC."""
    p, g = group.size, group.per_node
    ia, ib = group.intra_alpha_beta
    intra = (g - 1) / p * nbytes * ib
    inter = (p - g) / p * nbytes / group.nic_bandwidth_per_gpu
    return (p - 1) * max(ia, group.network.inter.alpha) + max(intra, inter)


def _hierarchical_allreduce(nbytes: float, group: Group) -> float:
    """Intra-node reduce-scatter, inter-node all-reduce of each GPU's 1/g shard (every GPU of the
    node on its share of the NICs at once), intra-node all-gather."""
    g, nodes = group.per_node, group.nodes
    ia, ib = group.intra_alpha_beta
    ea = group.network.inter.alpha
    eb = 1.0 / group.nic_bandwidth_per_gpu
    shard = nbytes / g
    inter = min(ring_allreduce(shard, nodes, ea, eb), tree_allreduce(shard, nodes, ea, eb))
    return reduce_scatter(nbytes, g, ia, ib) + inter + all_gather(nbytes, g, ia, ib)


@dataclass(frozen=True)
class QuanGradTime:
    all_to_all: float
    codec: float
    all_gather: float

    @property
    def total(self) -> float:
        return self.all_to_all + self.codec + self.all_gather


def quangrad_allreduce_time(numel: int, group: Group, *, codec_seconds: float = 0.0,
                            payload_bytes_per_element: float = 1.0 + 4.0 / 256) -> QuanGradTime:
    """QuanGrad's all-reduce of ``numel`` gradient elements: all-to-all of the 8-bit gradient (plus
    its fp32 block scales: 4 B per 256 elements by default), ``codec_seconds`` of
    dequantize-sum-requantize work (see ``agoq_core.scale.compute.quangrad_codec_seconds``), and
    all-gather of the 8-bit result."""
    n8 = numel * payload_bytes_per_element
    return QuanGradTime(all_to_all=collective_time("all_to_all", n8, group), codec=codec_seconds,
                        all_gather=collective_time("all_gather", n8, group))


def quangrad_two_hop_time(numel: int, group: Group, *, codec_seconds_of=None,
                          payload_bytes_per_element: float = 1.0 + 4.0 / 256) -> QuanGradTime:
    """A *hierarchical* QuanGrad (ZeRO++ qgZ's 2-hop layout; NOT implemented in this project, modelled to
    show what it would change): all-to-all of the 8-bit gradient inside each node and FP32 sum, then
    all-to-all of each GPU's 1/g shard across nodes and FP32 sum, then all-gather across nodes and inside
    the node. Every GPU sends ~2/g of the 8-bit gradient through the NICs instead of ~2x all of it.
    ``codec_seconds_of(numel, ranks)`` prices each dequantize-sum-requantize (default: free)."""
    g, nodes = group.per_node, group.nodes
    if nodes == 1 or g == 1:
        codec = codec_seconds_of(numel, group.size) if codec_seconds_of else 0.0
        return quangrad_allreduce_time(numel, group, codec_seconds=codec,
                                       payload_bytes_per_element=payload_bytes_per_element)
    n8 = numel * payload_bytes_per_element
    intra = Group(size=g, per_node=g, network=group.network)
    inter = Group(size=nodes, per_node=1, network=group.network, concurrent=g * group.concurrent)
    codec = 0.0
    if codec_seconds_of:
        codec = codec_seconds_of(numel, g) + codec_seconds_of(numel // g, nodes)
    a2a = collective_time("all_to_all", n8, intra) + collective_time("all_to_all", n8 / g, inter)
    ag = collective_time("all_gather", n8 / g, inter) + collective_time("all_gather", n8, intra)
    return QuanGradTime(all_to_all=a2a, codec=codec, all_gather=ag)
