"""Backend discovery and selection, end to end through real entry points.

Needs the test-only plugin tests/plugins/dummy_backend installed (``.ci/run`` installs it):
``pip install -e tests/plugins/dummy_backend``.
"""
from __future__ import annotations

import importlib.metadata as md

import pytest
import torch

import agoq_core
from agoq_core.backend import get_backend, list_backends, manager
from agoq_core.errors import (
    AmbiguousBackendError,
    BackendNotFoundError,
    BackendUnavailableError,
    CapabilityError,
    PluginError,
)


@pytest.fixture(scope="module", autouse=True)
def _dummy_installed():
    try:
        md.distribution("agoq-dummy-backend")
    except md.PackageNotFoundError:
        pytest.fail("test plugin not installed: pip install -e tests/plugins/dummy_backend (see .ci/run)")


def _cpu_installed() -> bool:
    return "cpu" in manager.registry().infos


def test_cpu_or_reference_is_selected_when_no_accelerator_is_available():
    sel = manager.selection()
    want = "cpu" if _cpu_installed() else "reference"  # agoq-cpu's auto-selection: backends/cpu/tests
    assert sel.name == want and sel.how == "auto"
    assert "no accelerator backend" in sel.reason
    assert get_backend().name == want


def test_entry_point_plugin_is_discovered_with_its_distribution():
    rows = {r["name"]: r for r in list_backends()["backends"]}
    assert rows["dummy"]["distribution"] == "agoq-dummy-backend"
    assert rows["dummy"]["available"] is False and "AGOQ_DUMMY_AVAILABLE" in rows["dummy"]["reason"]


def test_broken_plugin_is_reported_by_name_and_does_not_break_others():
    rows = {r["name"]: r for r in list_backends()["backends"]}
    assert "broken on purpose" in rows["broken"]["reason"]
    assert get_backend().name == ("cpu" if _cpu_installed() else "reference")
    with pytest.raises(BackendNotFoundError, match="installed but failed to load.*broken on purpose"):
        manager.reset()
        import os
        os.environ["AGOQ_BACKEND"] = "broken"
        try:
            manager.selection()
        finally:
            del os.environ["AGOQ_BACKEND"]


def test_unknown_env_backend_fails_and_lists_installed(monkeypatch):
    monkeypatch.setenv("AGOQ_BACKEND", "nope")
    with pytest.raises(BackendNotFoundError, match=r"(?s)AGOQ_BACKEND='nope'.*reference \(from agoq\).*dummy"):
        get_backend()


def test_env_backend_unavailable_gives_reason_and_fix(monkeypatch):
    monkeypatch.setenv("AGOQ_BACKEND", "dummy")
    with pytest.raises(BackendUnavailableError, match="(?s)AGOQ_DUMMY_AVAILABLE is not 1.*Fix: export AGOQ_DUMMY_AVAILABLE=1"):
        get_backend()


def test_env_backend_wins_and_never_falls_back(monkeypatch):
    monkeypatch.setenv("AGOQ_BACKEND", "dummy")
    monkeypatch.setenv("AGOQ_DUMMY_AVAILABLE", "1")
    assert manager.selection().how == "env"
    assert get_backend().capabilities().formats == frozenset({"int8"})
    # the dummy claims only int8: other formats fail loudly instead of routing to reference
    with pytest.raises(CapabilityError, match="does not support format 'int4'"):
        agoq_core.quantize(torch.randn(16), "int4")


def test_single_available_accelerator_is_auto_selected(monkeypatch):
    monkeypatch.setenv("AGOQ_DUMMY_AVAILABLE", "1")
    sel = manager.selection()
    assert (sel.name, sel.how) == ("dummy", "auto")


def test_two_available_accelerators_is_an_error(monkeypatch):
    monkeypatch.setenv("AGOQ_DUMMY_AVAILABLE", "1")
    monkeypatch.setenv("AGOQ_DUMMY2_AVAILABLE", "1")
    with pytest.raises(AmbiguousBackendError, match="dummy .*dummy2 .*Set AGOQ_BACKEND"):
        manager.selection()


def test_capability_checks_device_and_dtype(monkeypatch):
    monkeypatch.setenv("AGOQ_DUMMY_AVAILABLE", "1")
    be = get_backend("dummy")
    with pytest.raises(CapabilityError, match="takes .*float32.* inputs, got torch.bfloat16"):
        agoq_core.quantize(torch.randn(16, dtype=torch.bfloat16), "int8", backend=be)
    with pytest.raises(CapabilityError, match=r"serves \['cpu'\] tensors, got a tensor on meta"):
        agoq_core.quantize(torch.empty(16, device="meta"), "int8", backend=be)
    with pytest.raises(CapabilityError, match="'accumulate' is not supported by backend 'dummy'"):
        q = agoq_core.quantize(torch.randn(16), "int8", backend=be)
        from agoq_core.api import accumulate_
        accumulate_(q, torch.randn(16), backend=be)


def test_backend_info_validates_names():
    from agoq_core.backend import BackendInfo

    with pytest.raises(PluginError, match="invalid"):
        BackendInfo(name="Bad Name", device_type="cpu", probe=lambda: None, load=lambda: None)


def test_probe_exceptions_are_contained():
    from agoq_core.backend import BackendInfo

    def boom():
        raise RuntimeError("driver exploded")

    info = BackendInfo(name="x", device_type="cpu", probe=boom, load=lambda: None)
    av = manager.probe(info)
    assert not av.ok and "driver exploded" in av.reason
