"""Report environment capture and cross-report comparison."""
from __future__ import annotations

import importlib.metadata as md
import os
import platform
import subprocess
import sys
from typing import Any

import torch

__all__ = ["REPORT_SCHEMA", "environment", "compare_reports"]

REPORT_SCHEMA = 1


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
    """
    diffs: list[str] = []
    ga, gb = a.get("golden", {}), b.get("golden", {})
    if ga.get("sha256") != gb.get("sha256"):
        diffs.append(f"different golden sets: {ga.get('sha256')} vs {gb.get('sha256')}")
        return False, diffs
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
