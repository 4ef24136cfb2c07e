"""The exact solver against exhaustive search on random small instances."""
from __future__ import annotations

import itertools
import random

import pytest

from agoq_core.planner.solver import Option, solve_rank


def brute_force(chunks, extras, states, cap, offsets=None):
    """Every assignment; feasible iff every in-flight vector fits; best = (cost, peak) lexicographic."""
    offsets = offsets or [0] * len(states)
    units = [(c, u) for c, ch in enumerate(chunks) for u in ch]
    best = None
    for combo in itertools.product(*[range(len(u)) for _, u in units]):
        per_mb = list(extras)
        cost = 0
        for (c, u), j in zip(units, combo):
            per_mb[c] += u[j].bytes
            cost += u[j].cost
        peak = max(sum(n * b for n, b in zip(a, per_mb)) + k for a, k in zip(states, offsets))
        if peak <= cap and (best is None or (cost, peak) < best):
            best = (cost, peak)
    return best


def random_instance(rng: random.Random, v: int):
    chunks = []
    for _ in range(v):
        n_units = rng.randint(0 if v > 1 else 1, 4 if v < 3 else 2)
        chunks.append([[Option(f"f{j}", rng.randint(1, 15), rng.randint(0, 40)) for j in range(rng.randint(1, 4))]
                       for _ in range(n_units)])
    extras = [rng.randint(0, 6) for _ in range(v)]
    states = [tuple(rng.randint(0, 7) for _ in range(v)) for _ in range(rng.randint(1, 4))]
    lo = [x + sum(min(o.bytes for o in u) for u in ch) for ch, x in zip(chunks, extras)]
    hi = [x + sum(max(o.bytes for o in u) for u in ch) for ch, x in zip(chunks, extras)]
    offsets = [rng.choice([0, 0, rng.randint(0, 30)]) for _ in states]
    p_lo = max(sum(n * b for n, b in zip(a, lo)) + k for a, k in zip(states, offsets))
    p_hi = max(sum(n * b for n, b in zip(a, hi)) + k for a, k in zip(states, offsets))
    return chunks, extras, states, offsets, rng.randint(max(0, p_lo - 4), p_hi + 2)


@pytest.mark.parametrize("v", [1, 2, 3])
def test_solver_equals_brute_force_on_random_instances(v):
    rng = random.Random(1234 + v)
    feasible = infeasible = 0
    for _ in range(250):
        chunks, extras, states, offsets, cap = random_instance(rng, v)
        ref = brute_force(chunks, extras, states, cap, offsets)
        sol = solve_rank(chunks, extras, states, cap, offsets)
        if ref is None:
            assert sol is None
            infeasible += 1
            continue
        feasible += 1
        assert (sol.cost, sol.peak) == ref
        # the returned assignment is what it claims, and fits
        per_mb = [x + sum(u[j].bytes for u, j in zip(ch, cj)) for ch, cj, x in zip(chunks, sol.choices, extras)]
        assert tuple(per_mb) == sol.chunk_bytes
        assert max(sum(n * b for n, b in zip(a, per_mb)) + k for a, k in zip(states, offsets)) == sol.peak <= cap
        assert sum(u[j].cost for ch, cj in zip(chunks, sol.choices) for u, j in zip(ch, cj)) == sol.cost
    assert feasible > 50 and infeasible > 5  # both branches exercised


def test_large_identical_layers_stays_fast_and_exact():
    # 32 identical layers, 4 widths: the frontier has at most C(35, 3) points; check against the
    # count-based optimum (choose how many layers take each width) computed by plain enumeration.
    opts = [Option("4", 425, 1000), Option("5", 525, 300), Option("6", 625, 80), Option("8", 825, 5)]
    n = 32
    for cap_per_mb in (425 * n, 500 * n, 610 * n + 7, 700 * n, 825 * n):
        sol = solve_rank([[opts] * n], [0], [(3,)], 3 * cap_per_mb)
        best = None
        for a in range(n + 1):
            for b in range(n + 1 - a):
                for c in range(n + 1 - a - b):
                    d = n - a - b - c
                    by = a * 425 + b * 525 + c * 625 + d * 825
                    if 3 * by <= 3 * cap_per_mb:
                        cost = a * 1000 + b * 300 + c * 80 + d * 5
                        if best is None or (cost, by) < best:
                            best = (cost, by)
        assert (sol.cost, sol.chunk_bytes[0]) == best


def test_infeasible_returns_none_and_zero_cap():
    opts = [[Option("a", 5, 1)]]
    assert solve_rank([opts], [0], [(2,)], 9) is None
    assert solve_rank([opts], [0], [(2,)], 10).peak == 10
