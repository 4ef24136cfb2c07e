"""``agoq backends``: every installed backend, whether it can run here, and which one is selected."""
from __future__ import annotations

import argparse
import json
import os
import sys


def _run(args: argparse.Namespace) -> int:
    from agoq_core.backend import list_backends
    from agoq_core.backend.manager import ENV_VAR

    info = list_backends()
    sel = info["selected"]
    bad = sel["error"] is not None or bool(info["conflicts"])
    if args.json:
        print(json.dumps(info, indent=2))
        return 2 if bad else 0
    rows = [("name", "distribution", "device", "available", "reason")]
    for b in info["backends"]:
        mark = "*" if b["name"] == sel["name"] else " "
        rows.append((mark + b["name"], b["distribution"], b["device_type"], "yes" if b["available"] else "no",
                     b["reason"] + (f" [fix: {b['install_hint']}]" if not b["available"] and b["install_hint"] else "")))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4])
    env = os.environ.get(ENV_VAR)
    for c in info["conflicts"]:
        print(f"\nCONFLICT: {c['error']}", file=sys.stderr)
    if sel["error"]:
        print(f"\nselection FAILED ({ENV_VAR}={env!r}): {sel['error']}", file=sys.stderr)
        return 2
    print(f"\nselected: {sel['name']} ({sel['how']}: {sel['reason']})")
    return 2 if info["conflicts"] else 0


def register(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_run)
