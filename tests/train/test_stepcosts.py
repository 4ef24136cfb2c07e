"""agoq_core.train.stepcosts: GC and allocator costs counted over timed steps only; managed GC as torchtitan's gc_freq."""
from __future__ import annotations

import gc
import json

import pytest
import torch

from agoq_core.cli.main import main
from agoq_core.train.config import ConfigError, TrainConfig
from agoq_core.train.report import render_table
from agoq_core.train.stepcosts import ManagedGC, StepCosts


def test_collections_are_counted_in_timed_steps_only():
    gc.disable()  # only the explicit collections below run
    try:
        _counted()
    finally:
        gc.enable()


def _counted():
    with StepCosts(torch.device("cpu")) as c:
        c.begin(False)
        gc.collect()
        assert c.end() == {}
        c.begin(True)
        gc.collect()       # a full collection (generation 2)
        gc.collect(0)
        rec = c.end()
        gc.collect()       # after end(): not this step's
    assert c._on_gc not in gc.callbacks
    assert c.collections == [1, 0, 1] and c.steps == 1
    assert rec["gc_ms"] > 0 and rec["gc_ms"] == pytest.approx(c.gc_seconds * 1e3)
    s = c.summary()
    assert s["timed_steps"] == 1 and s["gc_collections"] == [1, 0, 1]
    assert "device_allocs" not in s  # no device allocator on CPU


def test_managed_gc_disables_collects_every_n_and_restores(monkeypatch):
    calls = []
    real = gc.collect
    monkeypatch.setattr(gc, "collect", lambda gen=2: calls.append(gen) or real(gen))
    assert gc.isenabled()
    with ManagedGC(3) as m:
        assert not gc.isenabled() and calls == [1]
        for step in range(7):
            m.before_step(step)
    assert gc.isenabled()
    assert calls == [1, 1, 1]  # entry, before steps 3 and 6
    calls.clear()
    with ManagedGC(0) as m:  # 0: Python's automatic collection, untouched
        assert gc.isenabled()
        for step in range(5):
            m.before_step(step)
    assert calls == [] and gc.isenabled()


def test_managed_gc_keeps_a_disabled_collector_disabled():
    gc.disable()
    try:
        with ManagedGC(2):
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_bad_gc_every(bad):
    with pytest.raises(ValueError, match="gc_every must be an integer >= 0"):
        ManagedGC(bad)
    with pytest.raises(ConfigError, match="gc_every must be an integer >= 0"):
        TrainConfig(gc_every=bad)


def test_train_reports_step_costs_with_managed_gc(tmp_path, capsys):
    rc = main(["train", "--steps", "4", "--eval-every", "0", "--seq-len", "32", "--eval-tokens", "128", "--no-progress",
               "--no-plot", "--gc-every", "2", "--out-dir", str(tmp_path), "--run-name", "r", "--json"])
    assert rc == 0
    s = json.loads(capsys.readouterr().out)
    assert gc.isenabled()
    recs = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    for arm in s["arms"]:
        steps = [r for r in recs if r["kind"] == "step" and r["arm"] == arm["name"]]
        assert "gc_ms" not in steps[0]                      # step 1 is not timed
        assert all(r["gc_ms"] >= 0 for r in steps[1:])
        c = arm["step_costs"]
        assert c["timed_steps"] == 3
        # automatic collection is off: only the managed young-generation collection before step 3 (0-based 2)
        assert c["gc_collections"][0] == 0 and c["gc_collections"][2] == 0 and c["gc_collections"][1] == 1
        assert c["gc_ms"] == pytest.approx(sum(r["gc_ms"] for r in steps[1:]))
    assert "per timed step (Python GC; device allocator calls): baseline GC" in render_table(s)
