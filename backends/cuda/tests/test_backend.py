"""The Backend object through the public API: truthful capabilities and clear errors."""
from __future__ import annotations

import pytest
import torch

import agoq_core
from agoq_core.api import accumulate_, reduce_requantize
from agoq_core.errors import CapabilityError
from agoq_core.formats import reference as ref
from agoq_core.formats.spec import get_format, list_formats
from agoq_cuda import launch
from agoq_triton_kernels.layout import MAX_BLOCK
from cuda_inputs import assert_bits_equal


def test_capabilities_tell_the_truth(backend, device):
    caps = backend.capabilities()
    assert caps.formats == {s.name for s in list_formats(microscaling=True)}
    assert caps.ops == {"quantize", "dequantize", "accumulate", "reduce_requantize",
                        "gemm_quant_epilogue", "gemm_dequant_prologue",   # fused GEMMs: tests/fusion
                        "rmsnorm_quant",                                  # tests/test_fused_norm.py
                        "silu_mul_quant", "silu_mul_backward"}            # tests/test_fused_swiglu.py
    assert caps.collectives == {"all_to_all", "all_gather"}
    assert caps.device_types == {device.type}
    assert caps.max_block == MAX_BLOCK
    assert backend.dist_backend == ("gloo" if device.type == "cpu" else "nccl")
    assert backend.known_deviations() == {}
    assert backend.capabilities() is caps and caps == backend._capabilities()  # built once, the same answer


@pytest.mark.parametrize("fmt", ["int6", "nf4", "fp8_e5m2"])
def test_public_verbs_on_the_cuda_backend(fmt, device):
    g = torch.Generator().manual_seed(9)
    x = (torch.randn(3, 5, 77, generator=g) * 4).to(torch.bfloat16)
    q = agoq_core.quantize(x.to(device), fmt, backend="cuda")
    want_c, want_s = ref.quantize_blocks(x, get_format(fmt))
    assert_bits_equal(q.codes, want_c, "codes")
    assert_bits_equal(q.scales, want_s, "scales")
    y = agoq_core.dequantize(q, backend="cuda")
    assert y.shape == x.shape and y.dtype == torch.bfloat16
    assert_bits_equal(y.reshape(-1), ref.dequantize_blocks(want_c, want_s, get_format(fmt), x.numel(), torch.bfloat16),
                      "dequantize")
    grad = torch.randn(x.shape, generator=g)
    accumulate_(q, grad.to(device), backend="cuda")
    acc_c, acc_s = ref.accumulate(want_c, want_s, get_format(fmt), x.numel(), grad)
    assert_bits_equal(q.codes, acc_c, "accumulate codes")
    out = reduce_requantize(torch.stack([q.codes, q.codes]), torch.stack([q.scales, q.scales]), fmt, x.numel(),
                            backend="cuda")
    red_c, red_s = ref.reduce_requantize(torch.stack([acc_c, acc_c]), torch.stack([acc_s, acc_s]), get_format(fmt),
                                         x.numel())
    assert_bits_equal(out.codes, red_c, "reduce codes")
    assert_bits_equal(out.scales, red_s, "reduce scales")


def test_block_above_the_kernel_limit_is_a_capability_error(device):
    with pytest.raises(CapabilityError, match=f"blocks up to {MAX_BLOCK}"):
        agoq_core.quantize(torch.ones(10, device=device), "int8", block=MAX_BLOCK + 8, backend="cuda")


def test_tensor_on_another_device_is_refused(device):
    other = "meta" if device.type == "cpu" else "cpu"
    with pytest.raises(CapabilityError, match="serves"):
        agoq_core.quantize(torch.ones(10, device=other), "int8", backend="cuda")


def test_launcher_checks_its_buffers(device):
    spec = get_format("int5")
    x = torch.ones(100, device=device)
    codes = torch.empty(spec.code_bytes(100), dtype=torch.uint8, device=device)
    scales = torch.empty(spec.num_blocks(100), device=device)
    with pytest.raises(ValueError, match=r"need 65 code bytes and 1 scales, got 64"):
        launch.quantize(x, spec, codes[:-1], scales)
    with pytest.raises(TypeError, match="want uint8 codes"):
        launch.quantize(x, spec, codes.view(torch.int8), scales)
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        launch.quantize(x.to(torch.int32), spec, codes, scales)
    with pytest.raises(ValueError, match="want codes\\[W, B\\]"):
        launch.reduce_requantize(codes, scales, spec, 100, codes, scales)
    with pytest.raises(ValueError, match="larger than the kernels' maximum"):
        launch.quantize(x, spec.with_block(MAX_BLOCK + 8), codes, scales)


def test_empty_tensor_round_trip(device):
    q = agoq_core.quantize(torch.empty(0, 4, device=device), "int4", backend="cuda")
    assert q.codes.numel() == 0 and q.scales.numel() == 0
    assert agoq_core.dequantize(q, backend="cuda").shape == (0, 4)
