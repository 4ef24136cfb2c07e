"""The microscaling formats' golden cases (agoq_conformance.golden_mx) against the selected backend, bit for
bit. A backend that does not claim a format (agoq-ascend today) reports the case as skipped."""
from __future__ import annotations

import pytest

from agoq_conformance.golden_mx import load_golden_mx
from agoq_conformance.runner import run_case

_GOLDEN = load_golden_mx()
_CASES = _GOLDEN["cases"]


@pytest.mark.parametrize("case", _CASES, ids=[c["id"] for c in _CASES])
def test_mx_case(case, agoq_ctx, pytestconfig):
    rec = run_case(case, _GOLDEN["tensors"], agoq_ctx.backend, agoq_ctx.device, agoq_ctx.deviations)
    pytestconfig._agoq_results.append(rec)
    if rec["verdict"] == "skip":
        pytest.skip(rec["detail"])
    if rec["verdict"] == "xfail":
        pytest.xfail(f"declared deviation: {rec['deviation']}")
    assert rec["verdict"] == "pass", rec["detail"]
