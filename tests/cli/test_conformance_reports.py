"""`agoq conformance compare` validates what it reads and `run` checks its --report path first
(issue 15 §5, §6, §9). Exit codes: 0 agree, 1 disagree, 2 invalid input."""
from __future__ import annotations

import copy
import json
import os

import pytest

from agoq_conformance.golden import golden_sha256
from agoq_conformance.report import REPORT_SCHEMA
from agoq_core.cli.main import main
from agoq_core.formats.spec import SPEC_VERSION


def _report(n=3, backend="reference"):
    return {"schema": REPORT_SCHEMA, "suite": "agoq-conformance",
            "golden": {"file": f"golden_v{SPEC_VERSION}.pt", "spec_version": SPEC_VERSION,
                       "sha256": golden_sha256(), "cases": n},
            "run": {"backend": backend, "device": "cpu"}, "summary": {"pass": n}, "passed": True,
            "cases": [{"id": f"quantize/int4/b32/gauss/f{i}", "op": "quantize", "verdict": "pass",
                       "output_sha256": f"{i:064x}"} for i in range(n)]}


def _compare(tmp_path, a, b, *extra, capsys=None):
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    for p, r in ((pa, a), (pb, b)):
        if isinstance(r, bytes):
            p.write_bytes(r)
        elif r is not None:
            p.write_text(json.dumps(r))
    return main(["conformance", "compare", str(pa), str(pb), *extra])


def test_agree_and_disagree(tmp_path, capsys):
    assert _compare(tmp_path, _report(), _report()) == 0
    b = _report()
    b["cases"][1]["output_sha256"] = "f" * 64
    assert _compare(tmp_path, _report(), b) == 1
    assert "1 case(s) differ" in capsys.readouterr().err


@pytest.mark.parametrize("mutate, needle", [
    (lambda r: r.update(schema=99), "schema 99"),
    (lambda r: r.update(suite="other-suite"), "suite 'other-suite'"),
    (lambda r: r.update(cases=[]), "no cases"),
    (lambda r: r["cases"].append(dict(r["cases"][0], output_sha256="e" * 64)), "duplicate case id"),
    (lambda r: r["cases"][0].update(verdict="maybe"), "unknown verdict 'maybe'"),
    (lambda r: r.pop("golden"), "no golden set record"),
    (lambda r: r.update(run="x"), "no run record"),
])
def test_invalid_reports_exit_2(tmp_path, capsys, mutate, needle):
    bad = _report()
    mutate(bad)
    # the tampered report on either side: invalid input, never "agree"
    assert _compare(tmp_path, _report(), bad) == 2
    assert needle in capsys.readouterr().err
    assert _compare(tmp_path, bad, copy.deepcopy(bad)) == 2


def test_two_empty_reports_do_not_agree(tmp_path, capsys):
    assert _compare(tmp_path, _report(0), _report(0)) == 2
    assert "no cases" in capsys.readouterr().err


def test_other_golden_version_is_refused(tmp_path, capsys):
    old = _report()
    old["golden"].update(spec_version=SPEC_VERSION - 1, file=f"golden_v{SPEC_VERSION - 1}.pt")
    assert _compare(tmp_path, old, _report()) == 2
    err = capsys.readouterr().err
    assert f"different golden set versions (spec version {SPEC_VERSION - 1} vs {SPEC_VERSION})" in err
    assert "re-run the older one" in err
    other = _report()
    other["golden"]["sha256"] = "0" * 64
    assert _compare(tmp_path, other, _report()) == 2


@pytest.mark.parametrize("content, needle", [
    (None, "cannot read the report"),                                # missing
    (b'{"schema": 1, "suite": "agoq-conf', "not valid JSON (truncated or garbled?"),
    (b"\xff\xfe garbage", "not a UTF-8 JSON report"),
    (b"[1, 2]", "a report is a JSON object"),
])
def test_unreadable_files_exit_2_without_traceback(tmp_path, capsys, content, needle):
    assert _compare(tmp_path, _report(), content) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_max_lines_counts_the_remainder(tmp_path, capsys):
    b = _report(5)
    for c in b["cases"]:
        c["output_sha256"] = "d" * 64
    assert _compare(tmp_path, _report(5), b, "--max-lines", "2") == 1
    err = capsys.readouterr().err
    assert "5 case(s) differ" in err and err.count("outputs differ") == 2 and "... and 3 more" in err
    assert _compare(tmp_path, _report(5), b, "--max-lines", "0") == 1
    err = capsys.readouterr().err
    assert err.count("outputs differ") == 0 and "... and 5 more" in err
    with pytest.raises(SystemExit) as exc:
        _compare(tmp_path, _report(5), b, "--max-lines", "-1")
    assert exc.value.code == 2 and "must be >= 0" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["missing_dir", "directory", "readonly"])
def test_run_checks_the_report_path_before_running(tmp_path, capsys, monkeypatch, where):
    import agoq_conformance.runner as runner

    def must_not_run(*a, **k):
        raise AssertionError("the suite ran before the report path was checked")

    monkeypatch.setattr(runner, "run_suite", must_not_run)
    if where == "missing_dir":
        path = tmp_path / "nope" / "r.json"
    elif where == "directory":
        path = tmp_path
    else:
        d = tmp_path / "ro"
        d.mkdir()
        d.chmod(0o500)
        path = d / "r.json"
        if os.access(d, os.W_OK):  # root ignores permission bits; nobody can create files in /proc
            path = "/proc/agoq-report.json"
    assert main(["conformance", "run", "--backend", "reference", "--report", str(path), "-q"]) == 2
    err = capsys.readouterr().err
    assert f"cannot write the report to {path}" in err


def test_run_writes_the_report_atomically(tmp_path, monkeypatch):
    import agoq_conformance.runner as runner

    monkeypatch.setattr(runner, "run_suite", lambda *a, **k: _report())
    path = tmp_path / "r.json"
    path.write_text("old")
    assert main(["conformance", "run", "--backend", "reference", "--report", str(path), "-q"]) == 0
    assert json.loads(path.read_text())["cases"][0]["verdict"] == "pass"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary left behind


def test_pytest_report_refuses_xdist_workers_and_writes_from_one_process(tmp_path):
    """Under pytest-xdist every worker would write its share of the cases over the others' report: refused."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    suite = str(root / "conformance_tests" / "test_conformance_mx.py")
    out = tmp_path / "r.json"
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", suite, "--agoq-backend", "reference",
            "--agoq-report", str(out)]
    p = subprocess.run(base + ["-n", "2"], capture_output=True, text=True, cwd=root, timeout=300)
    assert p.returncode != 0 and "--agoq-report needs every case in one process" in p.stderr + p.stdout
    assert not out.exists()
    p = subprocess.run(base + ["-n", "0"], capture_output=True, text=True, cwd=root, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:]
    report = json.loads(out.read_text())
    assert report["passed"] and report["summary"]["pass"] == len(report["cases"]) > 0
