"""What is alive at a CUDA memory peak (or at an out-of-memory), grouped by where it was allocated.

The planner predicts a step's peak as weights + gradients + optimizer state + saved activations + the
largest transient. When a measured peak disagrees with it (docs/benchmarks.md §5.12: 1.5-6% under at 128K
on an H100), this says which allocations make the difference. It records the CUDA caching allocator's
history (``torch.cuda.memory._record_memory_history``, Python stacks) over the steps of interest, replays the
allocations and frees, and reports the live set at the highest point and at each out-of-memory event:

    rec = Recorder()          # stats start from torch.cuda.memory_allocated() now
    rec.start()
    ... training step(s) ...
    report = rec.stop()       # breakdown(...) of the recorded trace
    # report["peak"]["groups"]: [{"where": "modeling_llama.py:123 forward", "bytes": ..., "count": ...}, ...]

``breakdown`` is a pure function of the snapshot dictionary that ``torch.cuda.memory._snapshot()`` returns
(its ``device_traces`` list of events), so it is tested on CPU with traces written from that format.
"""
from __future__ import annotations

import os
from collections import defaultdict

#: Stack frames from these packages name an allocation (innermost first); torch's own frames do not,
#: unless nothing else is on the stack (the autograd engine's thread runs backward without user frames).
OWN_MARKERS = ("agoq", "transformers/", "torchao/", "liger_kernel/", "benchmarks/", "peft/")


def _where(frames) -> str:
    """A short name for an allocation's origin: the innermost frame of OWN_MARKERS code (with the innermost
    frame above it when that one is torch's, e.g. ``F.linear``), else the two innermost frames."""
    frames = [f for f in (frames or []) if f.get("filename")]
    if not frames:
        return "(no Python frame: the autograd engine or C++)"

    def short(f):
        return f"{os.path.basename(f['filename'])}:{f.get('line', '?')} {f.get('name', '?')}"

    inductor = any("torchinductor" in f["filename"] for f in frames[:12])
    for i, f in enumerate(frames):
        if any(m in f["filename"] for m in OWN_MARKERS) and "/torch/" not in f["filename"]:
            inner = f" <- {short(frames[i - 1])}" if i > 0 and not inductor else ""
            return ("[compiled] " if inductor else "") + short(f) + inner
    return " <- ".join(short(f) for f in frames[:2])


def breakdown(snapshot: dict, base_bytes: int, device: int = 0, top: int = 25) -> dict:
    """Replay ``snapshot["device_traces"][device]`` from ``base_bytes`` allocated (what was live when the
    recording started: weights, gradients, optimizer state, ...) and report the live set, grouped by
    ``_where``, at the highest point and at every ``oom`` event.

    Bytes follow the allocator's "allocated" statistic: +size at ``alloc``, -size at ``free_completed``
    (a block freed with pending stream uses stays allocated until then). Blocks allocated before the
    recording are counted in ``base_bytes`` only: when they are freed during it the total goes down, but they
    do not appear in the groups. ``recorded_peak_bytes`` is then comparable with
    ``torch.cuda.max_memory_allocated()`` after a ``reset_peak_memory_stats()`` at the start."""
    traces = snapshot.get("device_traces") or []
    if device >= len(traces):
        raise ValueError(f"the snapshot has no trace for device {device} ({len(traces)} devices)")
    events = traces[device]
    if base_bytes < 0:
        raise ValueError(f"base_bytes must be >= 0, got {base_bytes}")
    cur = peak = int(base_bytes)
    peak_i, ooms = -1, []
    for i, e in enumerate(events):
        a = e.get("action")
        if a == "alloc":
            cur += int(e["size"])
            if cur > peak:
                peak, peak_i = cur, i
        elif a == "free_completed":
            cur -= int(e["size"])
        elif a == "oom":
            ooms.append(i)
    marks = sorted({peak_i, *ooms} - {-1})
    live_at, live, cur, pre_freed = {}, {}, int(base_bytes), 0
    j = 0
    for i, e in enumerate(events):
        if j >= len(marks):
            break
        a = e.get("action")
        if a == "alloc":
            live[e["addr"]] = (int(e["size"]), _where(e.get("frames")))
            cur += int(e["size"])
        elif a == "free_completed":
            cur -= int(e["size"])
            if live.pop(e["addr"], None) is None:
                pre_freed += int(e["size"])
        if i == marks[j]:
            live_at[i] = (cur, pre_freed, dict(live), e)
            j += 1

    def view(i):
        total, freed, blocks, e = live_at[i]
        groups = defaultdict(lambda: [0, 0])
        for size, where in blocks.values():
            groups[where][0] += size
            groups[where][1] += 1
        ranked = sorted(groups.items(), key=lambda kv: -kv[1][0])
        recorded = sum(s for s, _ in blocks.values())
        out = {"event": i, "allocated_bytes": total, "base_bytes": int(base_bytes),
               "base_freed_before_bytes": freed, "recorded_live_bytes": recorded,
               "groups": [{"where": w, "bytes": b, "count": c} for w, (b, c) in ranked[:top]],
               "other_groups_bytes": sum(b for _, (b, _c) in ranked[top:])}
        if e.get("action") == "oom":
            out["requested_bytes"] = int(e.get("size", 0))
        return out

    return {"events": len(events), "recorded_peak_bytes": peak,
            "peak": view(peak_i) if peak_i >= 0 else None, "ooms": [view(i) for i in ooms]}


class Recorder:
    """Record the CUDA allocator's history between ``start`` and ``stop`` (``stop`` returns ``breakdown``).
    ``max_entries`` bounds the host memory of the ring buffer; a step of a 32-layer model at 128K tokens makes
    tens of thousands of events, and the oldest are dropped past the bound (then ``truncated`` is true)."""

    def __init__(self, device: int = 0, max_entries: int = 2_000_000, top: int = 25):
        self.device, self.max_entries, self.top = int(device), max_entries, top
        self.base = None

    def start(self) -> None:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("mem_peak.Recorder needs CUDA (the caching allocator's history)")
        torch.cuda.synchronize(self.device)
        self.base = torch.cuda.memory_allocated(self.device)
        torch.cuda.memory._record_memory_history(max_entries=self.max_entries, stacks="python")

    def stop(self) -> dict:
        import torch

        if self.base is None:
            raise RuntimeError("Recorder.stop() before start()")
        torch.cuda.synchronize(self.device)
        snap = torch.cuda.memory._snapshot(self.device)
        torch.cuda.memory._record_memory_history(enabled=None)
        rep = breakdown(snap, self.base, device=self.device, top=self.top)
        rep["truncated"] = rep["events"] >= self.max_entries
        self.base = None
        return rep


def format_report(rep: dict, gib: float = 2.0 ** 30) -> str:
    """A few lines for a log: the peak's groups (and each OOM's), largest first."""
    lines = []
    for label, v in [("peak", rep.get("peak"))] + [(f"oom {k + 1}", o) for k, o in enumerate(rep.get("ooms", []))]:
        if not v:
            continue
        head = (f"{label}: {v['allocated_bytes'] / gib:.2f} GiB allocated = {v['base_bytes'] / gib:.2f} before the "
                f"recording - {v['base_freed_before_bytes'] / gib:.2f} of it freed + {v['recorded_live_bytes'] / gib:.2f} "
                f"allocated since")
        if "requested_bytes" in v:
            head += f"; asked for {v['requested_bytes'] / gib:.2f} GiB more"
        lines.append(head)
        lines += [f"  {g['bytes'] / gib:7.2f} GiB  {g['count']:5d} x  {g['where']}" for g in v["groups"]]
    return "\n".join(lines)
