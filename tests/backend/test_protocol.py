"""The Backend protocol: every optional op the core may call is declared (one small protocol each),
BackendBase's defaults raise a clear CapabilityError naming the backend, the manager refuses a backend that
claims an op it does not implement, and the device type is stated once (BackendInfo) and given to the
loaded object."""
from __future__ import annotations

import dataclasses
import inspect

import pytest

from agoq_core.backend import (
    OPTIONAL_OPS, Availability, BackendBase, BackendInfo, Capabilities, SupportsGemmDequantPrologue,
    SupportsGemmQuantEpilogue, get_backend, manager,
)
from agoq_core.backend.types import OPS
from agoq_core.backend.reference import ReferenceBackend
from agoq_core.errors import CapabilityError, PluginError


class _Minimal(BackendBase):
    """Claims only the required codecs."""

    name = "minimal"

    def capabilities(self) -> Capabilities:
        return Capabilities(formats=frozenset({"int8"}), device_types=frozenset({"cpu"}))


def test_every_claimable_op_is_quantize_dequantize_or_a_declared_protocol():
    assert set(OPS) == {"quantize", "dequantize"} | set(OPTIONAL_OPS)


def test_optional_protocols_match_the_core_call_sites():
    """The core's calls (laaq/fusion.py, api.py) use exactly these names and parameters."""
    def params(proto, meth):
        return list(inspect.signature(getattr(proto, meth)).parameters)[1:]

    assert params(SupportsGemmQuantEpilogue, "gemm_quant_epilogue_unsupported") == ["x", "weight", "bias", "spec"]
    assert params(SupportsGemmQuantEpilogue, "gemm_quant_epilogue_into") == [
        "x", "weight", "bias", "spec", "out", "codes", "scales"]
    assert params(SupportsGemmDequantPrologue, "gemm_dequant_prologue_unsupported") == ["grad", "spec", "k", "mul"]
    assert params(SupportsGemmDequantPrologue, "gemm_dequant_prologue_into") == [
        "grad", "codes", "scales", "spec", "k", "out", "mul"]
    for proto in OPTIONAL_OPS.values():  # BackendBase's defaults take the same parameters
        for meth in [n for n in vars(proto) if not n.startswith("_") and callable(getattr(proto, n))]:
            assert params(proto, meth) == list(inspect.signature(getattr(BackendBase, meth)).parameters)[1:], meth


@pytest.mark.parametrize("op, call", [
    ("accumulate", lambda be: be.accumulate_(None, None, None, None)),
    ("reduce_requantize", lambda be: be.reduce_requantize_into(None, None, None, 0, None, None)),
    ("gemm_quant_epilogue", lambda be: be.gemm_quant_epilogue_unsupported(None, None, None, None)),
    ("gemm_quant_epilogue", lambda be: be.gemm_quant_epilogue_into(None, None, None, None, None, None, None)),
    ("gemm_dequant_prologue", lambda be: be.gemm_dequant_prologue_unsupported(None, None, 1)),
    ("gemm_dequant_prologue", lambda be: be.gemm_dequant_prologue_into(None, None, None, None, 1, None)),
])
def test_unimplemented_optional_ops_raise_not_supported_by_backend(op, call):
    with pytest.raises(CapabilityError, match=f"'{op}' is not supported by backend 'minimal'.*AGOQ_BACKEND"):
        call(_Minimal())


def test_reference_declares_what_it_implements():
    from agoq_core.backend.protocol import unimplemented_ops

    be = get_backend("reference")
    assert isinstance(be, OPTIONAL_OPS["accumulate"]) and isinstance(be, OPTIONAL_OPS["reduce_requantize"])
    assert unimplemented_ops(be, be.capabilities().ops) == {}
    assert unimplemented_ops(be, {"gemm_quant_epilogue"}) == {
        "gemm_quant_epilogue": ["gemm_quant_epilogue_into", "gemm_quant_epilogue_unsupported"]}


def _load(monkeypatch, cls, device_type: str = "cpu"):
    """Register ``cls`` as an installed backend named cls.name and load it through the manager."""
    info = BackendInfo(name=cls.name, device_type=device_type, probe=lambda: Availability(True, "test"), load=cls,
                       accelerator=False, distribution="tests")
    monkeypatch.setitem(manager.registry().infos, info.name, info)
    return get_backend(cls.name)


def test_a_claim_without_implementation_is_refused_at_load(monkeypatch):
    class Liar(_Minimal):
        name = "liar"

        def capabilities(self):
            return dataclasses.replace(super().capabilities(), ops=frozenset({"quantize", "dequantize",
                                                                             "gemm_dequant_prologue"}))

    with pytest.raises(PluginError, match="claims ops it does not implement: 'gemm_dequant_prologue' needs "
                                          "gemm_dequant_prologue_into, gemm_dequant_prologue_unsupported"):
        _load(monkeypatch, Liar)


def test_device_type_comes_from_backend_info(monkeypatch):
    class Elsewhere(_Minimal):
        name = "elsewhere"

    assert Elsewhere.device_type is None and _load(monkeypatch, Elsewhere, "meta").device_type == "meta"
    assert get_backend("reference").device_type == "cpu"  # ReferenceBackend itself states none
    assert ReferenceBackend.device_type is None


def test_a_second_conflicting_device_type_is_refused(monkeypatch):
    class Conflicting(_Minimal):
        name = "conflicting"
        device_type = "cuda"

    with pytest.raises(PluginError, match="BackendInfo says device_type='cpu' but the loaded Conflicting says "
                                          "'cuda'; state the device type once"):
        _load(monkeypatch, Conflicting)


def test_dummy_plugin_gets_its_device_type_from_its_record(monkeypatch):
    monkeypatch.setenv("AGOQ_DUMMY_AVAILABLE", "1")
    be = get_backend("dummy")
    assert be.name == "dummy" and be.device_type == "cpu" and type(be).device_type is None


def test_backend_info_has_no_priority():
    assert "priority" not in {f.name for f in dataclasses.fields(BackendInfo)}
    with pytest.raises(TypeError):
        BackendInfo(name="x", device_type="cpu", probe=lambda: None, load=lambda: None, priority=1)
