"""pytest entry for the conformance suite: ``pytest conformance_tests --agoq-backend NAME``.

Options:
  --agoq-backend NAME    backend to test (default: $AGOQ_BACKEND, else the auto-selected one)
  --agoq-device DEV      device to run on (default: the backend's device type)
  --agoq-report FILE     also write the JSON report (same format as `agoq conformance run`)
"""
from __future__ import annotations

import json

import pytest


def pytest_addoption(parser):
    g = parser.getgroup("agoq", "AGoQ conformance")
    g.addoption("--agoq-backend", default=None, help="backend to test (default: AGOQ_BACKEND or auto)")
    g.addoption("--agoq-device", default=None, help="device to run cases on")
    g.addoption("--agoq-report", default=None, help="write a JSON conformance report here")


def pytest_configure(config):
    config._agoq_results = []
    workers = config.getoption("numprocesses", default=None)  # pytest-xdist's -n, where installed
    if config.getoption("--agoq-report") and (workers not in (None, 0) or hasattr(config, "workerinput")):
        # each xdist worker sees only its share of the cases and would overwrite the others' report
        raise pytest.UsageError("--agoq-report needs every case in one process: run with -n 0, or write the report "
                                "with `agoq conformance run --report FILE`")


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("--agoq-report")
    results = getattr(session.config, "_agoq_results", [])
    if path and results:
        from agoq_conformance.report import REPORT_SCHEMA
        from agoq_conformance.runner import summarize

        with open(path, "w") as f:
            json.dump(summarize(session.config._agoq_ctx, results, command="pytest"), f, indent=1)


@pytest.fixture(scope="session")
def agoq_ctx(pytestconfig):
    from agoq_conformance.runner import SuiteContext

    ctx = SuiteContext.create(pytestconfig.getoption("--agoq-backend"), pytestconfig.getoption("--agoq-device"))
    pytestconfig._agoq_ctx = ctx
    return ctx
