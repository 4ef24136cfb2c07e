"""Report environment capture and cross-report comparison."""
from __future__ import annotations

import importlib.metadata as md
import json
import os
import platform
import subprocess
import sys
from typing import Any

import torch

__all__ = ["REPORT_SCHEMA", "SUITE", "VERDICTS", "ReportError", "load_report", "validate_report", "environment",
           "compare_reports"]

REPORT_SCHEMA = 1
SUITE = "agoq-conformance"
VERDICTS = frozenset({"pass", "fail", "error", "skip", "xfail", "xpass"})


class ReportError(ValueError):
    """A report file that cannot be read, is not a conformance report, or cannot be compared with
    another one (``agoq conformance compare`` exits 2 on it, 1 only for a real disagreement)."""


def load_report(path: str | os.PathLike) -> dict:
    """Read and validate one report file; every problem is a ``ReportError`` naming the file."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ReportError(f"{path}: cannot read the report ({exc.strerror or exc})") from None
    try:
        rep = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ReportError(f"{path}: not a UTF-8 JSON report ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}: not valid JSON (truncated or garbled? {exc.msg} at line {exc.lineno}, "
                          f"column {exc.colno}); re-run 'agoq conformance run' to write it again") from None
    validate_report(rep, str(path))
    return rep


def validate_report(rep: Any, where: str = "report") -> None:
    """Check a report's structure: schema, suite, golden/spec versions, a non-empty case list with
    unique ids and known verdicts. Raises ``ReportError`` with every problem found."""
    if not isinstance(rep, dict):
        raise ReportError(f"{where}: a report is a JSON object, got {type(rep).__name__}")
    problems = []
    if rep.get("schema") != REPORT_SCHEMA:
        problems.append(f"schema {rep.get('schema')!r} (this agoq reads schema {REPORT_SCHEMA})")
    if rep.get("suite") != SUITE:
        problems.append(f"suite {rep.get('suite')!r} (expected {SUITE!r})")
    g = rep.get("golden")
    if not isinstance(g, dict) or not isinstance(g.get("spec_version"), int) or not isinstance(g.get("sha256"), str):
        problems.append("no golden set record (golden.spec_version, golden.sha256)")
    run = rep.get("run")
    if not isinstance(run, dict) or not isinstance(run.get("backend"), str):
        problems.append("no run record (run.backend, run.device)")
    cases = rep.get("cases")
    if not isinstance(cases, list) or not cases:
        problems.append("no cases (an empty or missing case list proves nothing)")
    else:
        seen: dict[str, int] = {}
        for i, c in enumerate(cases):
            if not isinstance(c, dict) or not isinstance(c.get("id"), str):
                problems.append(f"case #{i} has no id")
                continue
            if c.get("verdict") not in VERDICTS:
                problems.append(f"case {c['id']!r}: unknown verdict {c.get('verdict')!r}")
            seen[c["id"]] = seen.get(c["id"], 0) + 1
        dups = sorted(k for k, v in seen.items() if v > 1)
        if dups:
            problems.append(f"{len(dups)} duplicate case id(s), e.g. {dups[:3]} (a tampered or merged report)")
    if problems:
        shown = problems[:5] + ([f"... and {len(problems) - 5} more"] if len(problems) > 5 else [])
        raise ReportError(f"{where}: not a valid conformance report: " + "; ".join(shown))


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "torch": torch.__version__,
        "packages": {d: _version(d) for d in ("agoq", "agoq-cuda", "agoq-ascend", "agoq-triton-kernels",
                                              "agoq-conformance", "triton", "triton-ascend", "torch-npu")},
        "env": {k: os.environ.get(k) for k in ("AGOQ_BACKEND", "TRITON_INTERPRET", "TORCH_DEVICE_BACKEND_AUTOLOAD",
                                               "CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES")},
    }
    if device.type != "cpu":
        try:
            mod = torch.get_device_module(device.type)
            env["device_name"] = mod.get_device_name(device)
        except Exception as exc:  # informational only
            env["device_name"] = f"unknown ({exc})"
    try:
        env["git_sha"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                        timeout=5, cwd=os.path.dirname(__file__)).stdout.strip() or None
    except Exception:
        env["git_sha"] = None
    return env


def compare_reports(a: dict, b: dict, *, ignore_skips: bool = False) -> tuple[bool, list[str]]:
    """Do two reports (e.g. from two machines) agree case by case?

    Agreement: same golden set, same case ids, same verdict, and — where both produced output — the same
    output hash. Optional-capability cases (fused GEMMs, level ``bit_exact+sqnr``, compared by verdict
    because GEMM rounding is device-specific) count only where both reports ran them: a backend that
    does not claim a fused GEMM is not in disagreement with one that does.
    Returns (agree, list of human-readable differences).
    Reports of different golden sets (spec version or sha256) are not comparable: ``ReportError``.
    """
    diffs: list[str] = []
    validate_report(a, "report A")
    validate_report(b, "report B")
    ga, gb = a["golden"], b["golden"]
    if ga["spec_version"] != gb["spec_version"]:
        raise ReportError(f"the reports use different golden set versions (spec version {ga['spec_version']} vs "
                          f"{gb['spec_version']}): re-run the older one with this agoq to compare them")
    if ga["sha256"] != gb["sha256"]:
        raise ReportError(f"the reports use different golden sets of spec version {ga['spec_version']} "
                          f"(sha256 {ga['sha256'][:12]} vs {gb['sha256'][:12]}): re-run both with one agoq-conformance")
    ca = {c["id"]: c for c in a.get("cases", [])}
    cb = {c["id"]: c for c in b.get("cases", [])}
    na, nb = a.get("run", {}).get("backend", "A"), b.get("run", {}).get("backend", "B")
    for cid in sorted(set(ca) | set(cb)):
        x, y = ca.get(cid), cb.get(cid)
        optional = any(r is not None and r.get("level", "bit_exact") != "bit_exact" for r in (x, y))
        if optional and (x is None or y is None or "skip" in (x["verdict"], y["verdict"])):
            continue
        if x is None or y is None:
            diffs.append(f"{cid}: only in {'B (' + nb + ')' if x is None else 'A (' + na + ')'}")
            continue
        if ignore_skips and "skip" in (x["verdict"], y["verdict"]):
            continue
        if x["verdict"] != y["verdict"]:
            diffs.append(f"{cid}: verdict {x['verdict']} ({na}) vs {y['verdict']} ({nb})")
        elif x.get("output_sha256") != y.get("output_sha256"):
            diffs.append(f"{cid}: outputs differ ({na} {str(x.get('output_sha256'))[:12]} vs "
                         f"{nb} {str(y.get('output_sha256'))[:12]})")
    return not diffs, diffs
