"""Memory-budget policy: the exact solver against brute force, never over budget, clear infeasibility."""
from __future__ import annotations

import itertools
import random

import pytest

from agoq_core.planner.budget import (DEFAULT_OPTIONS, LayerOption, layer_options, parse_option, plan_budget,
                                      solve_budget)
from agoq_core.planner.errors import BudgetError, PlannerError
from agoq_core.planner.explain import parse_bytes
from agoq_core.planner.memory import ActivationCostTable
from agoq_core.planner.model import model_shape
from agoq_core.scale.memory import hf_plain_layer_bytes

GiB = 1 << 30


def _brute(units, cap, floor):
    best = None
    for ch in itertools.product(*[range(len(u)) for u in units]):
        picked = [u[j] for u, j in zip(units, ch)]
        peak = sum(o.saved_bytes for o in picked) + max([floor] + [o.transient_bytes for o in picked])
        if peak > cap:
            continue
        t = sum(round(o.time_s * 1e9) for o in picked)
        if best is None or (t, peak) < best:
            best = (t, peak)
    return best


@pytest.mark.parametrize("seed", range(60))
def test_solver_exact_against_brute_force(seed):
    rng = random.Random(seed)
    n_units, n_opts = rng.randint(1, 5), rng.randint(1, 4)
    units = []
    for _ in range(n_units):
        k = rng.randint(1, n_opts)
        # options that trade bytes for time, with ties in bytes, time and transient on purpose
        units.append([LayerOption(f"o{j}", rng.choice([0, 5, 10, 20, 40, 40, 80]), rng.choice([0, 10, 30, 60]),
                                  rng.choice([1, 2, 2, 5, 9]) * 1e-3) for j in range(k)])
    floor = rng.choice([0, 0, 15, 50])
    total_max = sum(max(o.saved_bytes for o in u) for u in units) + 60
    for cap in sorted({rng.randint(0, total_max) for _ in range(6)} | {total_max}):
        want = _brute(units, cap, floor)
        got = solve_budget(units, cap, floor_transient=floor)
        if want is None:
            assert got is None, (cap, got)
            continue
        assert got is not None, cap
        peak = got.saved + got.transient
        assert peak <= cap
        picked = [u[j] for u, j in zip(units, got.choices)]
        assert got.saved == sum(o.saved_bytes for o in picked)
        assert got.transient == max([floor] + [o.transient_bytes for o in picked])
        assert (got.time_ns, peak) == want


def test_option_bytes_are_the_planners_accounting():
    shape = model_shape("llama2-7b")
    T = 8192
    opts = {o.name: o for o in layer_options(shape, seq_len=T, options=DEFAULT_OPTIONS)}
    table = ActivationCostTable.from_formula(shape, tokens=T, formats=["nf4", "int5", "int6", "int8"], seq_len=T)
    assert opts["bf16"].saved_bytes == hf_plain_layer_bytes(shape, T)
    for f in ("nf4", "int5", "int6", "int8"):
        assert opts[f"laaq:{f}"].saved_bytes == table.bytes_for(f)
    assert opts["ckpt"].saved_bytes == 2 * T * shape.hidden
    assert opts["qckpt:nf4"].saved_bytes < opts["qckpt:int8"].saved_bytes < opts["ckpt"].saved_bytes
    # recomputation costs time; a recomputed layer's transient is the whole layer
    assert opts["ckpt"].time_s > opts["laaq:nf4"].time_s > opts["bf16"].time_s
    assert opts["ckpt"].transient_bytes > opts["bf16"].saved_bytes


@pytest.mark.parametrize("seq", [8192, 32768, 65536])
def test_never_over_budget_and_more_memory_is_never_slower(seq):
    prev = None
    for gib in (48, 64, 80, 100, 120, 141):
        try:
            p = plan_budget("llama2-7b", budget=gib * GiB, seq_len=seq)
        except BudgetError:
            assert prev is None  # once something fits, every larger budget fits
            continue
        assert p.peak_bytes <= p.usable_bytes <= gib * GiB
        assert len(p.choices) == 32
        if prev is not None:
            assert p.step_time_s <= prev.step_time_s + 1e-12
        prev = p
    assert prev is not None


def test_large_budget_keeps_bf16_and_small_budget_recomputes():
    big = plan_budget("llama2-7b", budget="1000GiB", seq_len=8192)
    assert set(big.choices) == {"bf16"}
    small = plan_budget("llama2-7b", budget="80GiB", seq_len=65536)
    assert small.layers_with("ckpt") or small.layers_with("qckpt")


def test_infeasible_budget_names_the_minimum():
    with pytest.raises(BudgetError, match="need a budget of at least") as ei:
        plan_budget("llama2-7b", budget="30GiB", seq_len=32768)
    msg = str(ei.value)
    need = parse_bytes(msg.split("at least ")[1].split(",")[0].replace(" ", ""))
    plan_budget("llama2-7b", budget=need + (1 << 21), seq_len=32768)  # the stated minimum does fit
    with pytest.raises(BudgetError):
        plan_budget("llama2-7b", budget=need - (1 << 24), seq_len=32768)


def test_bad_input():
    with pytest.raises(PlannerError, match="unknown budget option"):
        parse_option("offload")
    with pytest.raises(PlannerError, match="needs a format"):
        parse_option("laaq")
    with pytest.raises(PlannerError, match="unknown format"):
        parse_option("qckpt:int3")
    with pytest.raises(PlannerError, match="cannot read"):
        plan_budget("llama2-7b", budget="eighty", seq_len=1024)
    with pytest.raises(PlannerError, match="seq_len"):
        plan_budget("llama2-7b", budget="80GiB", seq_len=0)


def test_cli_budget(capsys):
    from agoq_core.cli.main import main

    assert main(["plan", "--budget", "80GiB", "--model", "llama2-7b", "--seq-len", "32768"]) == 0
    out = capsys.readouterr().out
    assert "memory-budget policy" in out and "predicted peak" in out and "tokens/s" in out
    assert main(["plan", "--budget", "20GiB", "--model", "llama2-7b", "--seq-len", "32768"]) != 0
    assert "need a budget of at least" in capsys.readouterr().err
