"""Bad input gets a clear error (or documented behaviour), never a wrong answer."""
from __future__ import annotations

import pytest
import torch

import agoq_core
from agoq_core.errors import FormatError
from agoq_core.formats.spec import get_format


def test_unknown_format_lists_known_ones():
    with pytest.raises(FormatError, match="unknown format 'int3'.*int4"):
        agoq_core.quantize(torch.randn(8), "int3")


@pytest.mark.parametrize("block", [0, -8, 12, 7, 2**21, 8.0, True, "128"])
def test_bad_block_sizes(block):
    with pytest.raises(FormatError, match="block"):
        agoq_core.quantize(torch.randn(64), "int4", block=block)


@pytest.mark.parametrize("block, hint", [(-8, "Try block=8 (defaults"), (0, "Try block=8 (defaults"),
                                         (5, "Try block=8 (defaults"), (12, "Try block=8 or 16 (defaults")])
def test_block_hint_is_always_a_valid_block(block, hint):
    """The hint never suggests 0 or a negative block (issue 15 §9: block=-8 suggested 0)."""
    with pytest.raises(FormatError) as exc:
        agoq_core.quantize(torch.randn(64), "int4", block=block)
    assert hint in str(exc.value), str(exc.value)


def test_block_error_suggests_valid_sizes():
    with pytest.raises(FormatError, match="block=12 is not a positive multiple of 8.*block=8.*16"):
        get_format("int5", 12)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int8, torch.bool, torch.float8_e4m3fn, torch.complex64])
def test_non_float_inputs_rejected(dtype):
    x = torch.zeros(16, dtype=dtype)
    with pytest.raises(FormatError, match="must be float32, bfloat16, float16 or float64"):
        agoq_core.quantize(x, "int8")


def test_non_tensor_rejected():
    with pytest.raises(TypeError, match="torch.Tensor"):
        agoq_core.quantize([1.0, 2.0], "int8")


def test_corrupt_quantized_tensor_rejected():
    q = agoq_core.quantize(torch.randn(300), "int4")
    with pytest.raises(FormatError, match="codes must be a flat uint8 tensor of 150 bytes"):
        agoq_core.QuantizedTensor(q.codes[:-1], q.scales, q.shape, q.dtype, q.spec)
    with pytest.raises(FormatError, match="scales must be a flat float32 tensor of 3 blocks"):
        agoq_core.QuantizedTensor(q.codes, q.scales.double(), q.shape, q.dtype, q.spec)


def test_dequantize_rejects_bad_dtype_and_non_quantized():
    q = agoq_core.quantize(torch.randn(16), "int8")
    with pytest.raises(FormatError, match="float dtype"):
        agoq_core.dequantize(q, torch.int32)
    with pytest.raises(TypeError, match="QuantizedTensor"):
        agoq_core.dequantize(torch.randn(3))


def test_float64_input_is_rounded_to_fp32_first():
    x = torch.randn(256, dtype=torch.float64)
    q = agoq_core.quantize(x, "int8")
    assert torch.equal(q.codes, agoq_core.quantize(x.float(), "int8").codes)
    assert agoq_core.dequantize(q).dtype == torch.float64
