"""benchmarks/mem_peak.py: the live set at a memory peak and at an OOM, replayed from the allocator's trace.

The traces are written in the format of ``torch.cuda.memory._snapshot()["device_traces"]`` (alloc /
free_requested / free_completed / oom events with addr, size and Python frames); the expected answers come from
a brute-force replay written here, not from the module."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "mem_peak.py"


@pytest.fixture(scope="module")
def mp():
    spec = importlib.util.spec_from_file_location("mem_peak", _PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("mem_peak", mod)
    spec.loader.exec_module(mod)
    return mod


def _frames(*where):
    return [{"filename": f, "line": line, "name": name} for f, line, name in where]


LLAMA = ("/site/transformers/models/llama/modeling_llama.py", 120, "forward")
LAAQ = ("/repo/agoq_core/laaq/modules.py", 40, "save_codes")
LINEAR = ("/site/torch/nn/modules/linear.py", 125, "forward")


def test_peak_and_oom_views(mp):
    ev = [
        {"action": "alloc", "addr": 1, "size": 100, "frames": _frames(LINEAR, LLAMA)},
        {"action": "alloc", "addr": 2, "size": 50, "frames": _frames(LAAQ)},
        {"action": "free_requested", "addr": 1, "size": 100},  # stays allocated until free_completed
        {"action": "alloc", "addr": 3, "size": 10, "frames": []},
        {"action": "free_completed", "addr": 1, "size": 100},
        {"action": "free_completed", "addr": 77, "size": 30},  # a block from before the recording
        {"action": "oom", "size": 500},
    ]
    rep = mp.breakdown({"device_traces": [ev]}, base_bytes=1000)
    assert rep["recorded_peak_bytes"] == 1160 and rep["events"] == 7
    peak = rep["peak"]
    assert peak["event"] == 3 and peak["allocated_bytes"] == 1160 and peak["recorded_live_bytes"] == 160
    assert [(g["where"], g["bytes"]) for g in peak["groups"]] == [
        ("modeling_llama.py:120 forward <- linear.py:125 forward", 100),
        ("modules.py:40 save_codes", 50),
        ("(no Python frame: the autograd engine or C++)", 10),
    ]
    (oom,) = rep["ooms"]
    assert oom["allocated_bytes"] == 1000 + 50 + 10 - 30 and oom["base_freed_before_bytes"] == 30
    assert oom["requested_bytes"] == 500 and sum(g["bytes"] for g in oom["groups"]) == 60
    text = mp.format_report(rep, gib=1)
    assert "oom 1: 1030.00 GiB allocated" in text and "asked for 500.00" in text


def test_compiled_frames_are_marked(mp):
    gen = ("/tmp/torchinductor_root/ab/cabc.py", 300, "call")
    ev = [{"action": "alloc", "addr": 1, "size": 8, "frames": _frames(gen, LINEAR, LLAMA)}]
    (g,) = mp.breakdown({"device_traces": [ev]}, 0)["peak"]["groups"]
    assert g["where"] == "[compiled] modeling_llama.py:120 forward"


def test_bad_input(mp):
    with pytest.raises(ValueError, match="no trace for device 1"):
        mp.breakdown({"device_traces": [[]]}, 0, device=1)
    with pytest.raises(ValueError, match="base_bytes"):
        mp.breakdown({"device_traces": [[]]}, -1)
    rep = mp.breakdown({"device_traces": [[]]}, 5)  # nothing recorded: no peak above the base, no OOM
    assert rep["peak"] is None and rep["ooms"] == [] and rep["recorded_peak_bytes"] == 5
    with pytest.raises(RuntimeError, match="before start"):
        mp.Recorder().stop()


_sizes = st.integers(1, 1000)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), _sizes, st.integers(0, 3)), min_size=1, max_size=60), st.integers(0, 500))
def test_replay_matches_brute_force(mp, ops, base):
    """Random alloc/free sequences: the peak, its position and its live groups agree with a replay that
    recomputes everything from the start at each event."""
    ev, live, addr = [], [], 0
    names = ["a.py", "b.py", "c.py", "d.py"]
    for is_alloc, size, who in ops:
        if is_alloc or not live:
            addr += 1
            ev.append({"action": "alloc", "addr": addr, "size": size,
                       "frames": _frames((f"/repo/agoq_core/{names[who]}", who, "f"))})
            live.append((addr, size))
        else:
            a, s = live.pop(who % len(live))
            ev.append({"action": "free_completed", "addr": a, "size": s})

    def state_after(k):  # allocated total and live blocks after events[0..k]
        blocks = {}
        for e in ev[:k + 1]:
            if e["action"] == "alloc":
                blocks[e["addr"]] = e
            else:
                blocks.pop(e["addr"])
        return base + sum(e["size"] for e in blocks.values()), blocks

    totals = [state_after(k)[0] for k in range(len(ev))]
    rep = mp.breakdown({"device_traces": [ev]}, base)
    assert rep["recorded_peak_bytes"] == max([base] + totals)
    if max(totals) <= base:
        assert rep["peak"] is None
        return
    k = totals.index(max(totals))  # the first event reaching the maximum
    assert rep["peak"]["event"] == k
    _, blocks = state_after(k)
    want = {}
    for e in blocks.values():
        where = mp._where(e["frames"])
        want[where] = want.get(where, 0) + e["size"]
    assert {g["where"]: g["bytes"] for g in rep["peak"]["groups"]} == want


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the allocator's history is CUDA's")
def test_recorder_on_cuda_matches_max_memory_allocated(mp):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    keep = torch.empty(1 << 20, device="cuda")
    rec = mp.Recorder(torch.cuda.current_device())
    rec.start()
    a = torch.empty(3 << 20, device="cuda")
    b = torch.empty(5 << 20, device="cuda")
    del a
    c = torch.empty(1 << 20, device="cuda")
    rep = rec.stop()
    assert rep["recorded_peak_bytes"] == torch.cuda.max_memory_allocated()
    assert rep["peak"]["recorded_live_bytes"] == (3 << 22) + (5 << 22)
    del b, c, keep
