"""Exact choice of one option per decision unit under a rank's in-flight memory constraints.

One rank holds ``v`` chunks (virtual stages). Chunk ``c`` is a list of decision units (a layer, or a
group of layers that must share a format); each unit picks one option ``(bytes, cost)``. A micro-batch
in flight on chunk ``c`` costs ``x_c + sum of its units' bytes``. The schedule gives the in-flight
vectors ``a`` (micro-batches per chunk) the rank passes through; memory must hold

    for every a:  sum_c a_c * (x_c + B_c) + k_a <= cap

(``k_a`` is memory at that moment that no format changes, e.g. pipeline send buffers) and the summed cost (expected quantization error) is minimised. This is a multiple-choice knapsack
with one constraint per in-flight vector. It is solved exactly:

1. per chunk, a dynamic programme over its units keeps the Pareto frontier of (bytes, cost): for
   every reachable byte total only the cheapest assignment, then only totals whose cost strictly
   drops as bytes grow. Costs are integers, so ties are exact and nothing is lost to rounding;
2. across chunks, every frontier point of chunks 1..v-1 is tried (cheapest first, branch and bound
   on cost, pruned when the others could no longer fit at their smallest), and chunk 0 takes the
   cheapest frontier point that fits what is left (binary search). With one chunk this is a single
   binary search.

Among equally cheap solutions the one with the lower peak is kept. No bytes are rounded: a
returned solution never exceeds ``cap`` (checked again before returning).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence

from agoq_core.planner.errors import PlannerError

__all__ = ["Option", "Solution", "solve_rank", "peak_bytes"]

#: Nodes the cross-chunk search may visit before it gives up with advice (v >= 3 with many layers).
MAX_SEARCH_NODES = 2_000_000


@dataclass(frozen=True, slots=True)
class Option:
    name: str
    bytes: int
    cost: int


@dataclass(frozen=True, slots=True)
class Solution:
    choices: tuple[tuple[int, ...], ...]
    """Per chunk, per unit: the index of the chosen option."""
    cost: int
    chunk_bytes: tuple[int, ...]
    """Per chunk: x_c + sum of chosen bytes (bytes per in-flight micro-batch)."""
    peak: int
    binding_state: tuple[int, ...]
    """The in-flight vector at which the peak is reached."""


def peak_bytes(chunk_bytes: Sequence[int], states: Sequence[Sequence[int]],
               offsets: Sequence[int] | None = None) -> tuple[int, tuple[int, ...]]:
    """Largest ``sum_c a_c * chunk_bytes_c + k_a`` over the states, and the state that reaches it."""
    best, arg = -1, ()
    for i, a in enumerate(states):
        v = sum(n * b for n, b in zip(a, chunk_bytes)) + (offsets[i] if offsets else 0)
        if v > best:
            best, arg = v, tuple(a)
    return best, arg


def _frontier(units: Sequence[Sequence[Option]], ub: int) -> tuple[list[int], list[int], list[tuple[int, ...]]]:
    """Pareto frontier of one chunk: bytes ascending, cost strictly descending, with choices."""
    suffix_min = [0] * (len(units) + 1)
    for i in range(len(units) - 1, -1, -1):
        suffix_min[i] = suffix_min[i + 1] + min(o.bytes for o in units[i])
    layers: list[dict[int, tuple[int, int]]] = []  # per unit: new bytes -> (previous bytes, option)
    cur: dict[int, int] = {0: 0}  # bytes -> cost
    for i, opts in enumerate(units):
        # cheapest option of each distinct size (first wins a tie, so option order breaks ties)
        by_size: dict[int, int] = {}
        for j, o in enumerate(opts):
            if o.bytes not in by_size or o.cost < opts[by_size[o.bytes]].cost:
                by_size[o.bytes] = j
        new: dict[int, int] = {}
        back: dict[int, tuple[int, int]] = {}
        limit = ub - suffix_min[i + 1]
        for b in sorted(cur):
            c = cur[b]
            for size, j in by_size.items():
                nb = b + size
                if nb > limit:
                    continue
                nc = c + opts[j].cost
                if nb not in new or nc < new[nb]:
                    new[nb], back[nb] = nc, (b, j)
        cur, best = {}, None
        for nb in sorted(new):
            if best is None or new[nb] < best:
                cur[nb], best = new[nb], new[nb]
        layers.append({b: back[b] for b in cur})
    bs = sorted(cur)
    choices = []
    for b in bs:
        ch, x = [], b
        for i in range(len(units) - 1, -1, -1):
            x, j = layers[i][x]
            ch.append(j)
        choices.append(tuple(reversed(ch)))
    return bs, [cur[b] for b in bs], choices


def solve_rank(chunks: Sequence[Sequence[Sequence[Option]]], extras: Sequence[int],
               states: Sequence[Sequence[int]], cap: int, offsets: Sequence[int] | None = None) -> Solution | None:
    """Cheapest feasible choice for one rank, or None when even the smallest options do not fit.

    ``offsets[i]`` is format-independent memory held at state ``i`` (default 0)."""
    v = len(chunks)
    if len(extras) != v or any(len(a) != v for a in states):
        raise PlannerError(f"solve_rank: {v} chunks but {len(extras)} extras and states of lengths "
                           f"{sorted({len(a) for a in states})}")
    offsets = list(offsets) if offsets is not None else [0] * len(states)
    if len(offsets) != len(states):
        raise PlannerError(f"solve_rank: {len(states)} states but {len(offsets)} offsets")
    if any(len(u) == 0 for ch in chunks for u in ch):
        raise PlannerError("solve_rank: a unit has no options")
    states = [tuple(a) for a in states]
    offs = offsets
    caps = [cap - k for k in offs]
    if not any(any(a) for a in states):  # nothing ever in flight (cannot happen for a real schedule)
        if any(c < 0 for c in caps):
            return None
        choices = tuple(tuple(min(range(len(u)), key=lambda j: u[j].cost) for u in ch) for ch in chunks)
        cost = sum(u[j].cost for ch, cj in zip(chunks, choices) for u, j in zip(ch, cj))
        cb = tuple(x + sum(u[j].bytes for u, j in zip(ch, cj)) for ch, cj, x in zip(chunks, choices, extras))
        peak, arg = peak_bytes(cb, states, offs) if states else (0, ())
        return Solution(choices, cost, cb, peak, arg)
    min_b = [x + sum(min(o.bytes for o in u) for u in ch) for ch, x in zip(chunks, extras)]
    if any(sum(n * b for n, b in zip(a, min_b)) > c for a, c in zip(states, caps)):
        return None
    # Upper bound of each chunk's unit bytes with the other chunks at their smallest.
    ubs = []
    for c in range(v):
        ub = None
        for a, cs in zip(states, caps):
            if a[c] == 0:
                continue
            rest = sum(a[k] * min_b[k] for k in range(v) if k != c)
            room = (cs - rest) // a[c] - extras[c]
            ub = room if ub is None else min(ub, room)
        ubs.append(ub if ub is not None else sum(max(o.bytes for o in u) for u in chunks[c]))
    fronts = [_frontier(chunks[c], ubs[c]) for c in range(v)]

    best: list = [None]  # (cost, peak, picks)
    nodes = [0]
    min_cost_rest = [0] * (v + 1)  # cheapest cost of chunks k..v-1 (ignoring the constraints)
    for k in range(v - 1, 0, -1):
        min_cost_rest[k] = min_cost_rest[k + 1] + fronts[k][1][-1]
    b0, c0, _ = fronts[0]
    floor0 = c0[-1]

    def leaf(picks: list[int], cost_rest: int, resid: list[int]) -> None:
        bound = None
        for a, r in zip(states, resid):
            if a[0] == 0:
                if r < 0:
                    return
                continue
            lim = r // a[0] - extras[0]
            bound = lim if bound is None else min(bound, lim)
        if bound is None:
            i = len(b0) - 1
        else:
            i = bisect.bisect_right(b0, bound) - 1
            if i < 0:
                return
        cost = cost_rest + c0[i]
        cb = [extras[0] + b0[i]] + [extras[k] + fronts[k][0][picks[k - 1]] for k in range(1, v)]
        peak = peak_bytes(cb, states, offs)[0]
        cand = (cost, peak, [i] + picks)
        if best[0] is None or cand[:2] < best[0][:2]:
            best[0] = cand

    def search(k: int, picks: list[int], cost: int, resid: list[int]) -> None:
        nodes[0] += 1
        if nodes[0] > MAX_SEARCH_NODES:
            raise PlannerError(
                f"the exact search over {v} chunks visited more than {MAX_SEARCH_NODES} combinations; "
                f"plan with granularity='chunk' (one format per chunk) or fewer chunks")
        if k == v:
            leaf(picks, cost, resid)
            return
        bs, cs, _ = fronts[k]
        for i in range(len(bs) - 1, -1, -1):  # cheapest (largest) first
            lb = cost + cs[i] + min_cost_rest[k + 1] + floor0
            if best[0] is not None and lb > best[0][0]:
                break  # cs grows as i falls: every later point is worse
            per_mb = extras[k] + bs[i]
            nres = [r - a[k] * per_mb for a, r in zip(states, resid)]
            # the chunks not yet placed (k+1.., and 0) at their smallest must still fit
            if any(r - sum(a[j] * min_b[j] for j in list(range(k + 1, v)) + [0]) < 0
                   for a, r in zip(states, nres)):
                continue
            search(k + 1, picks + [i], cost + cs[i], nres)

    search(1, [], 0, list(caps))
    if best[0] is None:
        return None
    _, _, picks = best[0]
    choices = tuple(fronts[c][2][picks[c]] for c in range(v))
    cb = tuple(extras[c] + fronts[c][0][picks[c]] for c in range(v))
    peak, arg = peak_bytes(cb, states, offs)
    if peak > cap:  # pragma: no cover - guarded by construction; kept as a hard check
        raise AssertionError(f"solver produced peak {peak} > cap {cap}")
    cost = sum(chunks[c][u][j].cost for c in range(v) for u, j in enumerate(choices[c]))
    return Solution(choices=choices, cost=cost, chunk_bytes=cb, peak=peak, binding_state=arg)
