"""Registration, automatic selection and the compile machinery of the cpu backend."""
from __future__ import annotations

import pytest
import torch

from agoq_core.backend import Availability, get_backend, manager
from agoq_core.formats.spec import get_format


def test_registered_through_the_entry_point():
    info = manager.registry().infos["cpu"]
    assert info.distribution == "agoq-cpu" and info.accelerator is False
    assert manager.probe(info).ok


def test_auto_selected_without_an_accelerator():
    sel = manager.selection()
    assert (sel.name, sel.how) == ("cpu", "auto")
    assert "no accelerator backend" in sel.reason and "cpu backend" in sel.reason
    assert get_backend().name == "cpu"


def test_reference_when_the_cpu_probe_fails(monkeypatch):
    info = manager.registry().infos["cpu"]
    monkeypatch.setitem(manager.registry().infos, "cpu",
                        type(info)(name="cpu", device_type="cpu", accelerator=False, load=info.load,
                                   probe=lambda: Availability(False, "no CPU today")))
    sel = manager.selection()
    assert sel.name == "reference" and "no CPU today" in sel.reason


def test_reference_when_cpu_is_not_installed(monkeypatch):
    infos = dict(manager.registry().infos)
    del infos["cpu"]
    monkeypatch.setattr(manager.registry(), "infos", infos)
    sel = manager.selection()
    assert sel.name == "reference" and "agoq-cpu is not installed" in sel.reason


def test_env_still_selects_the_reference(monkeypatch):
    monkeypatch.setenv("AGOQ_BACKEND", "reference")
    assert get_backend().name == "reference" and manager.selection().how == "env"


def test_serves_only_cpu_tensors():
    from agoq_core.errors import CapabilityError

    import agoq_core

    with pytest.raises(CapabilityError, match=r"serves \['cpu'\] tensors, got a tensor on meta"):
        agoq_core.quantize(torch.empty(256, device="meta"), "int4", backend="cpu")


def test_numerics_flags_are_pinned():
    """Inductor options that would change bits (FMA contraction, unsafe math) are pinned per graph."""
    from agoq_cpu.compiled import EXACT_OPTIONS
    from torch._inductor import config

    with config.patch(EXACT_OPTIONS):
        from torch._inductor.cpp_builder import _get_ffast_math_flags

        flags = _get_ffast_math_flags()
    assert "ffp-contract=off" in flags and "fno-unsafe-math-optimizations" in flags


def test_no_compiler_runs_eagerly_and_says_why(monkeypatch, capsys):
    from agoq_cpu.backend import CpuBackend

    monkeypatch.delenv("AGOQ_CPU_COMPILE", raising=False)  # tests/conftest.py sets it for core tests
    monkeypatch.setenv("CXX", "no-such-compiler-xyz")
    be = CpuBackend()
    assert not be.compiler.compile
    assert "no C++ compiler" in capsys.readouterr().err
    assert "no C++ compiler" in be.capabilities().notes[0]


def test_compiles_once_per_variant_and_reports_it(capfd):
    """A new tensor size reuses the graph (dynamic block count); the compile time is shown once."""
    from agoq_cpu.backend import CpuBackend

    be = CpuBackend(compile=True)
    spec = get_format("int8", 64)
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for nblocks in (5, 40, 9):
        x = torch.randn(nblocks * 64 + 3)
        codes = torch.empty(spec.code_bytes(x.numel()), dtype=torch.uint8)
        be.quantize_into(x, spec, codes, torch.empty(spec.num_blocks(x.numel())))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - frames == 1
    err = capfd.readouterr().err
    assert err.count("agoq-cpu: compiling the int8 quantize (float32) codec") == 1 and " s (total " in err
    assert len(be.compiler.compiled) == 1 and be.compiler.compile_seconds > 0
