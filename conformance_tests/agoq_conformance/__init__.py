"""AGoQ conformance suite: golden vectors from the reference backend, per-case verdicts, JSON
reports that compare across machines (``agoq conformance run`` / ``agoq conformance compare``)."""
from agoq_conformance.golden import GOLDEN_PATH, golden_sha256, load_golden
from agoq_conformance.report import compare_reports
from agoq_conformance.runner import run_suite

__all__ = ["GOLDEN_PATH", "golden_sha256", "load_golden", "run_suite", "compare_reports"]
