"""``agoq conformance run|compare``: bit-exact conformance reports that compare across machines."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile

from agoq_core.cli.argtypes import non_negative_int


def _need_suite():
    try:
        import agoq_conformance  # noqa: F401
    except ImportError:
        print("agoq conformance: the suite is not installed; pip install -e conformance_tests "
              "(distribution agoq-conformance)", file=sys.stderr)
        raise SystemExit(2)


def _writable(path: str) -> str | None:
    """Why ``path`` cannot take the report, or None. Checked before the suite runs (minutes)."""
    if os.path.isdir(path):
        return "it is a directory"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        return f"directory {parent} does not exist"
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return "the file is not writable"
    try:  # os.access does not see read-only mounts or ACLs: try for real
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".agoq-report-", delete=True):
            pass
    except OSError as exc:
        return f"cannot create files in {parent} ({exc.strerror or exc})"
    return None


def _write_atomic(path: str, data: dict) -> None:
    """Write then rename: a reader never sees half a report, an interrupted write leaves the old one."""
    parent = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=".agoq-report-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _run(args: argparse.Namespace) -> int:
    _need_suite()
    why = _writable(args.report)
    if why is not None:
        print(f"agoq conformance run: cannot write the report to {args.report}: {why}; choose a writable "
              "--report path (checked before running the suite)", file=sys.stderr)
        return 2
    from agoq_conformance.runner import run_suite

    try:
        from tqdm import tqdm
        bar = tqdm(total=None, unit="case", disable=args.quiet or not sys.stderr.isatty())
    except ImportError:  # progress is a nicety, not a dependency
        bar = None

    def progress(i: int, n: int, rec: dict) -> None:
        if bar is not None:
            bar.total = n
            bar.update(1)
        if rec["verdict"] in ("fail", "error", "xpass") and not args.quiet:
            print(f"  {rec['verdict'].upper()} {rec['id']}: {rec.get('detail', '')}", file=sys.stderr)

    report = run_suite(args.backend, device=args.device, select=args.select, progress=progress,
                       command=" ".join(["agoq", "conformance"] + sys.argv[2:]))
    if bar is not None:
        bar.close()
    _write_atomic(args.report, report)
    s = report["summary"]
    print(f"agoq conformance: backend={report['run']['backend']} device={report['run']['device']} "
          f"golden={report['golden']['sha256'][:12]} " + " ".join(f"{k}={v}" for k, v in sorted(s.items())))
    print(f"report written to {args.report}")
    return 0 if report["passed"] else 1


def _compare(args: argparse.Namespace) -> int:
    """Exit codes: 0 agree, 1 disagree, 2 invalid input (unreadable, not a report, not comparable)."""
    _need_suite()
    from agoq_conformance.report import ReportError, compare_reports, load_report

    try:
        reports = [load_report(args.a), load_report(args.b)]
        agree, diffs = compare_reports(*reports, ignore_skips=args.ignore_skips)
    except ReportError as exc:
        print(f"agoq conformance compare: invalid input: {exc}", file=sys.stderr)
        return 2
    ra, rb = (r["run"] for r in reports)
    label = f"{ra['backend']}@{ra.get('device')} vs {rb['backend']}@{rb.get('device')}"
    if agree:
        print(f"agree: {label}, {len(reports[0]['cases'])} cases, identical verdicts and output hashes")
        return 0
    print(f"DISAGREE: {label}: {len(diffs)} case(s) differ", file=sys.stderr)
    for d in diffs[: args.max_lines]:
        print(f"  {d}", file=sys.stderr)
    if len(diffs) > args.max_lines:
        print(f"  ... and {len(diffs) - args.max_lines} more", file=sys.stderr)
    return 1


def register(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="conformance_command", metavar="ACTION", required=True)
    r = sub.add_parser("run", help="run the suite against a backend and write a JSON report")
    r.add_argument("--backend", default=None, help="backend name (default: AGOQ_BACKEND or auto-selected)")
    r.add_argument("--device", default=None, help="device (default: the backend's device type)")
    r.add_argument("--report", required=True, help="where to write the JSON report")
    r.add_argument("--select", default=None, help="only cases whose id matches this glob, e.g. 'quantize/int4/*'")
    r.add_argument("-q", "--quiet", action="store_true")
    r.set_defaults(func=_run)
    c = sub.add_parser("compare", help="exit 0 if two reports agree case by case, 1 if they disagree, 2 if "
                                       "either is invalid or they are not comparable")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--ignore-skips", action="store_true", help="cases skipped on either side do not count")
    c.add_argument("--max-lines", type=non_negative_int, default=50,
                   help="print at most this many differences (0: only the count)")
    c.set_defaults(func=_compare)
