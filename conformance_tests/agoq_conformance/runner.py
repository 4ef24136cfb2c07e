"""Run the golden cases against one backend and produce a JSON-able report."""
from __future__ import annotations

import fnmatch
import hashlib
import time
from typing import Any, Callable, Iterable

import torch

import agoq_core
from agoq_core.api import accumulate_, reduce_requantize
from agoq_core.backend import get_backend
from agoq_core.errors import CapabilityError
from agoq_core.formats.spec import get_format
from agoq_core.formats.tensor import QuantizedTensor
from agoq_conformance.golden import golden_sha256, load_golden
from agoq_conformance.report import REPORT_SCHEMA, environment

__all__ = ["run_case", "run_suite", "case_ids", "default_device", "SuiteContext", "summarize"]

_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
_INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16,
             torch.uint8: torch.uint8}
_CANON_NAN = {torch.float32: 0x7FC00000, torch.bfloat16: 0x7FC0, torch.float16: 0x7E00}


def default_device(backend) -> torch.device:
    types = sorted(t for t in backend.capabilities().device_types if t != "*")
    return torch.device(types[0] if types else "cpu")


def _canonical_bits(t: torch.Tensor) -> torch.Tensor:
    """Integer view with every NaN replaced by the canonical quiet NaN (payloads are not part of the
    contract: a NaN scale only has to be a NaN)."""
    t = t.detach().cpu().contiguous()
    bits = t.view(_INT_VIEW[t.dtype]).clone()
    if t.dtype in _CANON_NAN:
        bits[torch.isnan(t)] = _CANON_NAN[t.dtype] if t.dtype != torch.float32 else torch.tensor(
            _CANON_NAN[t.dtype], dtype=torch.int64).to(torch.int32)
    return bits


def _diff(got: torch.Tensor, want: torch.Tensor) -> tuple[int, str]:
    if got.dtype != want.dtype or got.numel() != want.numel():
        return max(got.numel(), want.numel(), 1), (
            f"dtype/size mismatch: got {got.dtype}[{got.numel()}], want {want.dtype}[{want.numel()}]")
    a, b = _canonical_bits(got).reshape(-1), _canonical_bits(want).reshape(-1)
    bad = (a != b).nonzero().reshape(-1)
    if bad.numel() == 0:
        return 0, ""
    i = int(bad[0])
    gv, wv = got.reshape(-1)[i].item(), want.reshape(-1)[i].item()
    return int(bad.numel()), f"first at [{i}]: got {gv!r} (bits {int(a[i]):#x}), want {wv!r} (bits {int(b[i]):#x})"


def _hash(outputs: Iterable[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in outputs:
        h.update(str(t.dtype).encode())
        h.update(_canonical_bits(t).numpy().tobytes())
    return h.hexdigest()


def _execute(case: dict, tensors: dict, be, device: torch.device) -> list[torch.Tensor]:
    spec = get_format(case["fmt"], case["block"])
    op = case["op"]
    if op == "quantize":
        x = tensors[case["input"]].to(device)
        q = agoq_core.quantize(x, spec, backend=be)
        return [q.codes, q.scales]
    if op == "dequantize":
        k = case["input"]
        q = QuantizedTensor(tensors[f"{k}/codes"].to(device), tensors[f"{k}/scales"].to(device),
                            torch.Size([case["numel"]]), torch.float32, spec)
        return [agoq_core.dequantize(q, _DTYPES[case["out_dtype"]], backend=be)]
    if op == "accumulate":
        k = case["input"]
        q = QuantizedTensor(tensors[f"{k}/codes0"].clone().to(device), tensors[f"{k}/scales0"].clone().to(device),
                            torch.Size([case["numel"]]), torch.float32, spec)
        accumulate_(q, tensors[f"{k}/g"].to(device), backend=be)
        return [q.codes, q.scales]
    if op == "reduce_requantize":
        k = case["input"]
        out = reduce_requantize(tensors[f"{k}/codes_in"].to(device), tensors[f"{k}/scales_in"].to(device), spec,
                                case["numel"], backend=be)
        return [out.codes, out.scales]
    if op in ("protocol_all_reduce", "protocol_reduce_scatter"):
        from agoq_core.quangrad.protocol import simulate_all_reduce, simulate_reduce_scatter

        ranks = list(tensors[case["input"]].to(device).unbind(0))
        if op == "protocol_all_reduce":
            ar = simulate_all_reduce(ranks, spec, backend=be)
            return [torch.stack([p.all_to_all for p in ar.payloads]), torch.stack([p.all_gather for p in ar.payloads]),
                    torch.stack(ar.results)]
        rs = simulate_reduce_scatter(ranks, spec, backend=be)
        return [torch.stack(rs.payloads), torch.stack(rs.shards)]
    raise ValueError(f"unknown conformance op {op!r}")


# ops a case needs from the backend (protocol cases exercise the whole QuanGrad compute path)
_NEEDS = {"protocol_all_reduce": ("quantize", "dequantize", "reduce_requantize"),
          "protocol_reduce_scatter": ("quantize", "dequantize")}


def _unsupported(case: dict, be) -> str | None:
    caps = be.capabilities()
    for op in _NEEDS.get(case["op"], (case["op"],)):
        if op not in caps.ops:
            return f"backend does not claim op {op!r}"
    if case["fmt"] not in caps.formats:
        return f"backend does not claim format {case['fmt']!r}"
    if case["block"] > caps.max_block:
        return f"block {case['block']} > backend max_block {caps.max_block}"
    return None


def run_case(case: dict, tensors: dict, be, device: torch.device, deviations: dict[str, str]) -> dict:
    """One case -> result record with verdict pass/fail/xfail/xpass/skip/error."""
    rec: dict[str, Any] = {"id": case["id"], "op": case["op"], "fmt": case["fmt"], "block": case["block"],
                           "level": "bit_exact"}
    reason = _unsupported(case, be)
    if reason:
        rec.update(verdict="skip", detail=reason, output_sha256=None, mismatches=None)
        return rec
    deviation = next((r for pat, r in deviations.items() if fnmatch.fnmatch(case["id"], pat)), None)
    t0 = time.perf_counter()
    try:
        got = _execute(case, tensors, be, device)
        be.synchronize(device)
    except CapabilityError as exc:
        rec.update(verdict="skip", detail=str(exc), output_sha256=None, mismatches=None)
        return rec
    except Exception as exc:  # a crash is a failing case, reported with its error
        rec.update(verdict="xfail" if deviation else "error", detail=f"{type(exc).__name__}: {exc}",
                   output_sha256=None, mismatches=None, seconds=time.perf_counter() - t0)
        if deviation:
            rec["deviation"] = deviation
        return rec
    want = [tensors[k] for k in case["expect"]]
    total, details = 0, []
    for name, g, w in zip(("out0", "out1", "out2"), got, want):
        n, d = _diff(g, w)
        total += n
        if d:
            details.append(f"{name}: {n} mismatches, {d}")
    ok = total == 0
    if deviation:
        verdict = "xpass" if ok else "xfail"  # strict: an unexpected pass is a failure
        rec["deviation"] = deviation
    else:
        verdict = "pass" if ok else "fail"
    rec.update(verdict=verdict, mismatches=total, detail="; ".join(details), output_sha256=_hash(got),
               numel=int(want[0].numel()), seconds=round(time.perf_counter() - t0, 6))
    return rec


def case_ids() -> list[str]:
    return [c["id"] for c in load_golden()["cases"]]


class SuiteContext:
    """The backend, device, golden tensors and declared deviations of one conformance run."""

    def __init__(self, be, device: torch.device):
        self.backend = be
        self.device = device
        golden = load_golden()
        self.golden = golden
        self.tensors = golden["tensors"]
        self.deviations = dict(be.known_deviations())
        self.started = time.time()

    @classmethod
    def create(cls, backend: str | None = None, device: str | None = None) -> "SuiteContext":
        be = get_backend(backend)
        return cls(be, torch.device(device) if device else default_device(be))

    def run(self, case: dict) -> dict:
        return run_case(case, self.tensors, self.backend, self.device, self.deviations)

    def run_legacy(self, case: dict, version: int) -> dict:
        """A decode case of the kept golden set of spec ``version`` (golden.legacy_decode_cases)."""
        from agoq_conformance.golden import load_legacy_golden

        return run_case(case, load_legacy_golden(version)["tensors"], self.backend, self.device, self.deviations)


def summarize(ctx: SuiteContext, results: list[dict], *, select: str | None = None, command: str = "") -> dict:
    """Assemble the JSON report for ``results`` produced in ``ctx``."""
    summary: dict[str, int] = {}
    for r in results:
        summary[r["verdict"]] = summary.get(r["verdict"], 0) + 1
    g = ctx.golden
    return {
        "schema": REPORT_SCHEMA,
        "suite": "agoq-conformance",
        "golden": {"file": "golden_v%d.pt" % g["spec_version"], "spec_version": g["spec_version"],
                   "sha256": golden_sha256(), "cases": len(g["cases"])},
        "run": {"backend": ctx.backend.name, "device": str(ctx.device), "select": select, "command": command,
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ctx.started)),
                "seconds": round(time.time() - ctx.started, 3)},
        "environment": environment(ctx.device),
        "capabilities": ctx.backend.capabilities().to_dict(),
        "deviations": ctx.deviations,
        "summary": summary,
        "passed": bool(results) and all(r["verdict"] in ("pass", "xfail", "skip") for r in results),
        "cases": results,
    }


def run_suite(backend: str | None = None, *, device: str | None = None, select: str | None = None,
              progress: Callable[[int, int, dict], None] | None = None, command: str = "") -> dict:
    """Run every golden case (or those matching the fnmatch pattern ``select``) on ``backend``."""
    ctx = SuiteContext.create(backend, device)
    cases = [c for c in ctx.golden["cases"] if select is None or fnmatch.fnmatch(c["id"], select)]
    from agoq_conformance.golden import legacy_decode_cases

    legacy = [(c, v) for c, v in legacy_decode_cases() if select is None or fnmatch.fnmatch(c["id"], select)]
    from agoq_conformance.fused_gemm import fusion_cases, run_fusion_case

    from agoq_conformance.capability import capability_cases, run_capability_case

    fused = [c for c in fusion_cases() if select is None or fnmatch.fnmatch(c.id, select)]
    caps = [c for c in capability_cases() if select is None or fnmatch.fnmatch(c, select)]
    if not cases and not legacy and not fused and not caps:
        raise ValueError(f"no conformance case matches {select!r}")
    results = []
    total = len(cases) + len(legacy) + len(fused) + len(caps)
    for i, case in enumerate(cases):
        results.append(ctx.run(case))
        if progress:
            progress(i + 1, total, results[-1])
    for i, (case, version) in enumerate(legacy):  # older versions' codes decode as they always did
        results.append(ctx.run_legacy(case, version))
        if progress:
            progress(len(cases) + i + 1, total, results[-1])
    done = len(cases) + len(legacy)
    for j, fcase in enumerate(fused):  # optional capabilities: skipped unless the backend claims them
        results.append(run_fusion_case(fcase, ctx.backend, ctx.device))
        if progress:
            progress(done + j + 1, total, results[-1])
    for k, cid in enumerate(caps):  # the core's own paths under a no-float64 mode (Ascend has no fp64)
        results.append(run_capability_case(cid, ctx.backend, ctx.device))
        if progress:
            progress(done + len(fused) + k + 1, total, results[-1])
    return summarize(ctx, results, select=select, command=command)
