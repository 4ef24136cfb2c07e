"""Every call the plugin makes into torch_npu, with a fake torch_npu in sys.modules (restored after each
test): device discovery, SoC-dependent capabilities, device services, the opt-in vendor operator, and
the checks on byte collectives. Numerics behind the boundary run for real (interpreted kernels)."""
from __future__ import annotations

import sys
import types

import pytest
import torch

from ascend_fakes import FakeTorchNpu, documented_dynamic_block_quant

from agoq_core.errors import BackendUnavailableError
from agoq_core.formats import reference as ref
from agoq_core.formats.spec import get_format
from agoq_ascend import device as npu_device
from agoq_ascend import vendor
from agoq_ascend.backend import AscendBackend
from agoq_ascend.geometry import UB_BYTES_950, UB_BYTES_A2, max_block, plan_launch


@pytest.fixture
def fake_npu(monkeypatch):
    fake = FakeTorchNpu()
    monkeypatch.setitem(sys.modules, "torch_npu", fake)  # monkeypatch restores sys.modules afterwards
    return fake


def _npu_backend(fake, vendor_ops=frozenset()) -> AscendBackend:
    soc, props = npu_device.query_device(fake, 0)
    return AscendBackend(soc=soc, props=props, interpreted=False, torch_npu=fake,
                         vendor_options=vendor.VendorOptions(ops=frozenset(vendor_ops)))


def test_import_torch_npu_returns_the_module_in_sys_modules(fake_npu):
    assert npu_device.import_torch_npu() is fake_npu


def test_import_failure_becomes_a_clear_unavailable_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # "import torch_npu" raises ImportError
    with pytest.raises(BackendUnavailableError, match="import torch_npu failed.*set_env.sh"):
        npu_device.import_torch_npu()


def test_query_device_reads_soc_and_vector_cores(fake_npu):
    soc, props = npu_device.query_device(fake_npu, 1)
    assert (soc.family, soc.soc_version, soc.fp8_native) == ("A2", 223, False)
    assert props.vector_cores == 48 and props.ub_bytes == UB_BYTES_A2 and "Ascend910B3" in props.name
    names = [c[0] for c in fake_npu.npu.calls]
    assert names[:2] == ["is_available", "device_count"]
    assert ("get_device_properties", 1) in fake_npu.npu.calls and ("get_device_name", 1) in fake_npu.npu.calls
    assert "get_soc_version" in names


def test_ub_override_and_its_validation(fake_npu, monkeypatch):
    monkeypatch.setenv("AGOQ_ASCEND_UB_BYTES", str(2 * UB_BYTES_A2))
    assert npu_device.query_device(fake_npu, 0)[1].ub_bytes == 2 * UB_BYTES_A2
    monkeypatch.setenv("AGOQ_ASCEND_UB_BYTES", "lots")
    with pytest.raises(BackendUnavailableError, match="not an integer"):
        npu_device.query_device(fake_npu, 0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(available=False), "is_available\\(\\) is False"),
    (dict(vector_cores=0), "vector_core_num=0"),
    (dict(soc_version=202, name="Ascend310P3"), "not a part the agoq Triton-Ascend kernels target"),
])
def test_query_device_failures(monkeypatch, kwargs, match):
    fake = FakeTorchNpu(**kwargs)
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    with pytest.raises(Exception, match=match):
        npu_device.query_device(fake, 0)


def test_capabilities_910b_vs_950(monkeypatch):
    a2 = _npu_backend(FakeTorchNpu(soc_version=223, name="Ascend910B3"))
    a5 = _npu_backend(FakeTorchNpu(soc_version=260, name="Ascend950PR", vector_cores=64))
    ca2, ca5 = a2.capabilities(), a5.capabilities()
    assert a2.device_type == a5.device_type == "npu" and a2.dist_backend == a5.dist_backend == "hccl"
    assert ca2.device_types == frozenset({"npu"}) and {"fp8_e4m3", "fp8_e5m2"} <= ca2.formats <= ca5.formats
    assert any("no FP8 units" in n and "bytes" in n for n in ca2.notes)
    assert any("Ascend 950: FP8 units exist" in n for n in ca5.notes)
    assert not a2.soc.fp8_native and a5.soc.fp8_native
    assert (a2.props.ub_bytes, a5.props.ub_bytes) == (UB_BYTES_A2, UB_BYTES_950)
    assert ca2.max_block == max_block(a2.props) and ca5.max_block == max_block(a5.props)
    assert torch.float64 not in ca2.input_dtypes
    # the 950's larger UB and core count change the launch geometry the backend will use
    p2 = plan_launch(op="quantize", numel=1 << 24, kind="int", bits=8, block=128, device=a2.props)
    p5 = plan_launch(op="quantize", numel=1 << 24, kind="int", bits=8, block=128, device=a5.props)
    assert p5.rows > p2.rows and p5.grid == 64 and p2.grid == 48


def test_create_refuses_npu_mode_when_kernels_are_interpreted(fake_npu, interp_backend):
    # This process decorated the kernels under TRITON_INTERPRET=1 without AGOQ_ASCEND_INTERPRET: on an NPU that
    # would silently run on CPU, so it is an error with the fix.
    with pytest.raises(BackendUnavailableError, match="unset TRITON_INTERPRET"):
        AscendBackend.create()


def test_device_services_go_to_torch_npu(fake_npu):
    be = _npu_backend(fake_npu)
    dev = torch.device("cpu")  # stands in for npu:0 (only forwarded)
    be.synchronize(dev)
    assert be.max_memory_allocated(dev) == 12345
    be.reset_peak_memory_stats(dev)
    assert fake_npu.npu.calls[-3:] == [("synchronize", dev), ("max_memory_allocated", dev),
                                       ("reset_peak_memory_stats", dev)]


def test_launches_run_under_the_tensors_npu(fake_npu):
    be = _npu_backend(fake_npu)
    with be._guard(types.SimpleNamespace(device=torch.device("cuda", 1))):  # any device with an index
        pass
    assert fake_npu.npu.calls[-1] == ("device", 1)


# ---- the vendor operator (opt-in) ------------------------------------------------------------------------
def _gauss(n: int, dtype, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("n,shape", [(128 * 5, (5, 128)), (300, (1, 300))])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dynamic_block_quant_call_and_code_conversion(fake_npu, n, shape, dtype):
    be = _npu_backend(fake_npu, {"npu_dynamic_block_quant"})
    spec = get_format("int8")
    x = _gauss(n, dtype)
    codes = torch.empty(spec.code_bytes(n), dtype=torch.uint8)
    scales = torch.empty(spec.num_blocks(n))
    be.quantize_into(x, spec, codes, scales)
    assert fake_npu.op_calls == [{"shape": shape, "dtype": dtype}]
    y, s = documented_dynamic_block_quant(x.view(*shape))
    assert torch.equal(codes, (y.reshape(-1).to(torch.int16) + 128).to(torch.uint8))  # offset binary
    assert torch.equal(scales, s.reshape(-1))
    # On plain Gaussian data the documented formula happens to agree with our spec (no subnormals, no
    # zero/NaN blocks, exact divisions): evidence the conversion is the right one, not a conformance claim.
    want_c, want_s = ref.quantize_blocks(x, spec)
    assert torch.equal(codes, want_c) and torch.equal(scales, want_s)


@pytest.mark.parametrize("fmt,block,dtype", [("int8", 128, torch.float32), ("int8", 256, torch.bfloat16),
                                             ("int4", 128, torch.bfloat16)])
def test_dynamic_block_quant_is_not_used_outside_its_envelope(fake_npu, interp_backend, fmt, block, dtype):
    be = _npu_backend(fake_npu, {"npu_dynamic_block_quant"})
    spec = get_format(fmt, block)
    x = _gauss(1000, dtype, seed=1)
    codes = torch.empty(spec.code_bytes(1000), dtype=torch.uint8)
    scales = torch.empty(spec.num_blocks(1000))
    be.quantize_into(x, spec, codes, scales)  # runs the (interpreted) Triton kernel instead
    assert fake_npu.op_calls == []
    want_c, want_s = ref.quantize_blocks(x, spec)
    assert torch.equal(codes, want_c) and torch.equal(scales, want_s)


def test_vendor_ops_are_off_by_default_and_declare_deviations_when_on(fake_npu, monkeypatch):
    off = _npu_backend(fake_npu)
    assert off.known_deviations() == {}
    on = _npu_backend(fake_npu, {"npu_dynamic_block_quant"})
    dev = on.known_deviations()
    assert set(dev) == {"quantize/int8/b128/*/bf16", "quantize/int8/b128/*/f16"}
    assert all("tolerance level" in r for r in dev.values())
    monkeypatch.setenv("AGOQ_ASCEND_VENDOR_OPS", "npu_dynamic_block_quant")
    assert vendor.VendorOptions.from_env().ops == {"npu_dynamic_block_quant"}
    monkeypatch.setenv("AGOQ_ASCEND_VENDOR_OPS", "npu_quantize")
    with pytest.raises(BackendUnavailableError, match="unknown operator.*npu_dynamic_block_quant"):
        vendor.VendorOptions.from_env()


def test_vendor_ops_cannot_run_in_interpreter_mode():
    from agoq_ascend.geometry import DeviceProps
    from agoq_ascend.soc import INTERPRETER_SOC

    with pytest.raises(BackendUnavailableError, match="needs torch_npu on an NPU"):
        AscendBackend(soc=INTERPRETER_SOC, props=DeviceProps(vector_cores=3), interpreted=True,
                      vendor_options=vendor.VendorOptions(ops=frozenset({"npu_dynamic_block_quant"})))


def test_vendor_output_of_the_wrong_shape_is_an_error(monkeypatch):
    fake = FakeTorchNpu()
    fake.npu_dynamic_block_quant = lambda x, **kw: (torch.zeros(3, dtype=torch.int8), torch.zeros(1))
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    be = _npu_backend(fake, {"npu_dynamic_block_quant"})
    spec = get_format("int8")
    with pytest.raises(RuntimeError, match="expected int8\\[256\\] and float32\\[2\\]"):
        be.quantize_into(_gauss(256, torch.bfloat16), spec, torch.empty(256, dtype=torch.uint8), torch.empty(2))


# ---- byte collectives: what reaches torch.distributed (HCCL on an NPU) -----------------------------------
class _RecordingDist:
    def __init__(self, backend: str, world: int):
        self.backend, self.world, self.calls = backend, world, []

    def install(self, monkeypatch):
        import torch.distributed as dist

        monkeypatch.setattr(dist, "get_backend", lambda group=None: self.backend)
        monkeypatch.setattr(dist, "get_world_size", lambda group=None: self.world)
        monkeypatch.setattr(dist, "all_to_all_single", self._rec("all_to_all_single"))
        for name in ("all_gather_single", "all_gather_into_tensor"):
            if hasattr(dist, name):
                monkeypatch.setattr(dist, name, self._rec(name))

    def _rec(self, name):
        def fn(out, inp, group=None, async_op=False):
            self.calls.append((name, out, inp, group, async_op))
            return "work" if async_op else None
        return fn


def test_collectives_send_uint8_views_to_the_process_group(interp_backend, monkeypatch):
    rec = _RecordingDist("gloo", 4)
    rec.install(monkeypatch)
    be = interp_backend
    grads = torch.zeros(4, 64, dtype=torch.float8_e4m3fn)  # fp8: HCCL/gloo cannot take the dtype itself
    out = torch.empty_like(grads)
    assert be.all_to_all_bytes(out, grads, group="G", async_op=True) == "work"
    name, o, i, group, async_op = rec.calls[-1]
    assert name == "all_to_all_single" and o.dtype == i.dtype == torch.uint8 and o.numel() == 256
    assert o.data_ptr() == out.data_ptr() and group == "G" and async_op
    full = torch.empty(4 * 3, dtype=torch.float64)
    be.all_gather_bytes(full, torch.ones(3, dtype=torch.float64))
    name, o, i, _, _ = rec.calls[-1]
    assert o.dtype == i.dtype == torch.uint8 and (o.numel(), i.numel()) == (96, 24)


@pytest.mark.parametrize("call,match", [
    (lambda be: be.all_to_all_bytes(torch.empty(10, dtype=torch.uint8), torch.empty(10, dtype=torch.uint8)),
     "do not split evenly over 4 ranks"),
    (lambda be: be.all_to_all_bytes(torch.empty(8, dtype=torch.uint8), torch.empty(4, dtype=torch.uint8)),
     "output holds 8 bytes but input 4"),
    (lambda be: be.all_gather_bytes(torch.empty(8, dtype=torch.uint8), torch.empty(4, dtype=torch.uint8)),
     "4 ranks x 4 input bytes need 16"),
    (lambda be: be.all_gather_bytes(torch.empty(8, 2)[:, 0], torch.empty(2)), "contiguous"),
])
def test_collective_argument_errors(interp_backend, monkeypatch, call, match):
    _RecordingDist("gloo", 4).install(monkeypatch)
    with pytest.raises(ValueError, match=match):
        call(interp_backend)


def test_npu_collectives_reject_other_devices_and_non_hccl_groups(fake_npu, monkeypatch, interp_backend):
    rec = _RecordingDist("gloo", 2)
    rec.install(monkeypatch)
    be = _npu_backend(fake_npu)
    with pytest.raises(ValueError, match="is on cpu, but the ascend backend moves npu tensors over hccl"):
        be.all_to_all_bytes(torch.empty(4, dtype=torch.uint8), torch.empty(4, dtype=torch.uint8))
    rec.backend = "nccl"
    with pytest.raises(ValueError, match="process group uses 'nccl'; cpu tensors need 'gloo'"):
        interp_backend.all_to_all_bytes(torch.empty(4, dtype=torch.uint8), torch.empty(4, dtype=torch.uint8))
    assert rec.calls == []
