"""Issue 20 items at the backend boundary: SoC classification, create()'s LOCAL_RANK warning, opt-in vendor ops
that the installed torch_npu lacks, the start-up self-test, and the no-FP8 capability driving the defaults."""
from __future__ import annotations

import logging
import sys

import pytest
import torch

from ascend_fakes import FakeTorchNpu

from agoq_core.backend.types import Capabilities
from agoq_core.errors import BackendUnavailableError
from agoq_core.formats.policy import default_gradient_format, hardware_candidates
from agoq_ascend import backend as B
from agoq_ascend import selftest, vendor
from agoq_ascend.soc import UnsupportedSocError, classify


# ---- soc.py: the name is a fallback only when the SoC number is missing ----------------------------------------
def test_soc_number_decides_and_the_name_is_only_a_fallback():
    assert classify(223, "Ascend910B3").family == "A2"
    assert classify(None, "Ascend910B3").family == "A2" and classify(-1, "Ascend910_9391").family == "A3"
    with pytest.raises(UnsupportedSocError, match="soc_version 104"):
        classify(104, "Ascend910B")  # SoC 104: the old 910 family, whatever the name says
    with pytest.raises(UnsupportedSocError):
        classify(202, "Ascend910B4")


# ---- create(): LOCAL_RANK, vendor ops, self-test --------------------------------------------------------------
@pytest.fixture
def npu_create(monkeypatch):
    """AscendBackend.create() down its NPU branch with a fake torch_npu (the kernels are interpreted here, so
    is_interpreted is patched to False) and the self-test recorded instead of run on an 'npu' device."""
    fake = FakeTorchNpu()
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    monkeypatch.setattr(B, "is_interpreted", lambda: False)
    calls = []
    monkeypatch.setattr(selftest, "run_self_test", lambda be, dev: calls.append((be, dev)))
    return fake, calls


def test_create_warns_when_local_rank_is_not_the_current_device(npu_create, monkeypatch, caplog):
    fake, calls = npu_create
    monkeypatch.setenv("LOCAL_RANK", "3")
    with caplog.at_level(logging.WARNING, logger="agoq.ascend"):
        be = B.AscendBackend.create()
    cur = fake.npu.current_device()
    assert f"LOCAL_RANK=3 but the current NPU is {cur}" in caplog.text and "set_device" in caplog.text
    assert calls and calls[0][0] is be and calls[0][1] == f"npu:{cur}"  # the self-test ran at create()
    caplog.clear()
    monkeypatch.setenv("LOCAL_RANK", str(cur))
    with caplog.at_level(logging.WARNING, logger="agoq.ascend"):
        B.AscendBackend.create()
    assert "LOCAL_RANK" not in caplog.text


def test_self_test_can_be_switched_off(npu_create, monkeypatch):
    _, calls = npu_create
    monkeypatch.setenv("AGOQ_ASCEND_SELF_TEST", "0")
    B.AscendBackend.create()
    assert not calls


def test_opt_in_vendor_op_missing_from_torch_npu_is_refused_at_create(npu_create, monkeypatch):
    fake, _ = npu_create
    monkeypatch.setenv("AGOQ_ASCEND_VENDOR_OPS", "npu_dynamic_block_quant")
    B.AscendBackend.create()  # the fake has it
    monkeypatch.delattr(type(fake), "npu_dynamic_block_quant")
    with pytest.raises(BackendUnavailableError, match="npu_dynamic_block_quant, which torch_npu .* does not have"):
        B.AscendBackend.create()
    with pytest.raises(BackendUnavailableError):
        vendor.check_available(fake, vendor.VendorOptions(ops=frozenset({"npu_dynamic_block_quant"})))


def test_self_test_passes_on_correct_kernels_and_refuses_wrong_ones(interp_backend, monkeypatch):
    from agoq_triton_kernels.testing import inexact_division

    selftest.run_self_test(interp_backend, torch.device("cpu"))  # the real kernels, in the interpreter
    with inexact_division("alternate"):  # and with a division that is not correctly rounded
        selftest.run_self_test(interp_backend, torch.device("cpu"))
    real = interp_backend.quantize_into

    def one_bit_off(x, spec, codes, scales):  # a device whose arithmetic is off in one code
        real(x, spec, codes, scales)
        if spec.name == "int8":
            codes[5] ^= 1

    monkeypatch.setattr(interp_backend, "quantize_into", one_bit_off)
    with pytest.raises(BackendUnavailableError, match=r"failed the start-up self-test.*int8 quantize: 1 code bytes "
                                                      r"differ.*AGOQ_ASCEND_SELF_TEST=0"):
        selftest.run_self_test(interp_backend, torch.device("cpu"))


# ---- item 8: no FP8 units as a structured capability, driving the defaults ---------------------------------
def test_a2_declares_no_low_precision_float_units_and_950_does(interp_backend):
    assert interp_backend.capabilities().native_float_formats == frozenset()
    assert interp_backend.capabilities().to_dict()["native_float_formats"] == []


def test_defaults_pick_integer_formats_without_fp8_units_with_the_reason(interp_backend):
    caps = interp_backend.capabilities()
    fmt, why = default_gradient_format(caps)
    assert fmt == "int8" and "no FP8 units" in why and "fmt='fp8_e4m3'" in why
    cands, why = hardware_candidates(caps, ("int4", "int5", "int6", "int8", "fp4_e2m1", "nf4"))
    assert cands == ("int4", "int5", "int6", "int8", "nf4") and "fp4_e2m1" in why
    unrestricted = Capabilities(formats=frozenset({"int8"}), device_types=frozenset({"cpu"}))
    assert default_gradient_format(unrestricted) == ("fp8_e4m3", None)
    assert hardware_candidates(unrestricted, ("fp4_e2m1",)) == (("fp4_e2m1",), None)


def test_quangrad_default_format_follows_the_device(interp_backend, caplog):
    from agoq_core.quangrad import QuanGradConfig, QuanGradDDP

    model = torch.nn.Linear(16, 4)
    with caplog.at_level(logging.WARNING, logger="agoq"):
        qg = QuanGradDDP(model, lambda ps: torch.optim.SGD(ps, lr=0.1), config=QuanGradConfig(backend=interp_backend))
    assert qg.config.fmt == "int8" and "no FP8 units" in caplog.text
    explicit = QuanGradDDP(torch.nn.Linear(16, 4), lambda ps: torch.optim.SGD(ps, lr=0.1),
                           config=QuanGradConfig(backend=interp_backend, fmt="fp8_e4m3"))
    assert explicit.config.fmt == "fp8_e4m3"  # an explicit choice is kept (codes made with integer logic)
    ref_qg = QuanGradDDP(torch.nn.Linear(16, 4), lambda ps: torch.optim.SGD(ps, lr=0.1),
                         config=QuanGradConfig(backend="reference"))
    assert ref_qg.config.fmt == "fp8_e4m3"


def test_fp8_cast_baseline_is_refused_without_fp8_units(interp_backend, monkeypatch):
    from agoq_core.errors import CapabilityError
    from agoq_core.quangrad import QuanGradConfig, QuanGradDDP
    from agoq_core.train import agoq_arm
    from agoq_core.train.config import TrainConfig

    with pytest.raises(CapabilityError, match="no FP8 units.*naive FP8 all-reduce baseline cannot run"):
        QuanGradDDP(torch.nn.Linear(8, 2), lambda ps: torch.optim.SGD(ps, lr=0.1),
                    config=QuanGradConfig(backend=interp_backend, collective="naive_fp8", fmt="fp8_e4m3"))
    import agoq_core.backend as core_backend

    monkeypatch.setattr(core_backend, "get_backend", lambda *a, **k: interp_backend)
    with pytest.raises(agoq_arm.ArmUnavailable, match="no FP8 units"):
        agoq_arm.check_recipe("naive-fp8-allreduce", TrainConfig(nproc=2))


def test_agoq_plan_default_candidates_follow_the_device(interp_backend, monkeypatch, capsys, request):
    import json

    from agoq_core.cli.main import main
    from agoq_core.planner import fidelity

    monkeypatch.setenv("AGOQ_BACKEND", "ascend")
    monkeypatch.setenv("AGOQ_ASCEND_INTERPRET", "1")  # the interpreter backend (an emulated A2: no FP8/FP4 units)
    # The plan measures each format's error with the selected backend's codecs; in the Triton interpreter 2^16
    # elements per sample took ~95 s of CI. What is tested here is the candidate list: 2^10 elements suffice,
    # and the per-process cache is emptied around it so no other test sees the small-sample table.
    monkeypatch.setattr(fidelity, "_SAMPLE_NUMEL", 1 << 10)
    fidelity._measure_default.cache_clear()
    request.addfinalizer(fidelity._measure_default.cache_clear)
    args = ["plan", "--stages", "2", "--microbatches", "4", "--schedule", "1f1b", "--model", "tiny", "--seq-len", "64",
            "--activations", "formula", "--json"]
    assert main(args) == 0
    out = capsys.readouterr()
    assert "no units for fp4_e2m1" in out.err
    assert "fp4_e2m1" not in json.dumps(json.loads(out.out).get("stages_plan"))
    assert main(args + ["--candidates", "int4,fp4_e2m1"]) == 0  # named explicitly: kept, no message
    assert "no units" not in capsys.readouterr().err


def test_capabilities_are_built_once_and_follow_the_vendor_options(npu_create):
    be = B.AscendBackend.create()
    caps = be.capabilities()
    assert be.capabilities() is caps  # asked before every codec call: not rebuilt
    assert not any("vendor operators" in n for n in caps.notes)
    be.vendor_options = vendor.VendorOptions(ops=frozenset({"npu_dynamic_block_quant"}))
    again = be.capabilities()
    assert again is not caps and any("vendor operators on (tolerance level): npu_dynamic_block_quant" in n
                                     for n in again.notes)
    assert again.ops == caps.ops and again.formats == caps.formats
