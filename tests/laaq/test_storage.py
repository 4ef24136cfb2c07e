"""storage: chunked codec calls give the same bits as one call; native storage; meta; listeners."""
from __future__ import annotations

import pytest
import torch

import agoq_core
from agoq_core.formats import reference as ref
from agoq_core.formats.spec import get_format
from agoq_core.formats.tensor import QuantizedTensor
from agoq_core.laaq import storage


@pytest.mark.parametrize("fmt", ["int4", "nf4", "fp4_e2m1", "int5", "int6", "int8"])
@pytest.mark.parametrize("numel", [1, 127, 1000, 4099])
def test_chunked_codec_is_bit_exact(monkeypatch, fmt, numel):
    spec = get_format(fmt)
    monkeypatch.setattr(storage, "_CHUNK", 256)  # many chunks, ragged last block
    g = torch.Generator().manual_seed(numel)
    x = (torch.randn(numel, generator=g) * 3).to(torch.bfloat16).reshape(-1, 1)
    x[0] = 0.0
    q = storage.store(x, spec, role="norm_input", layer=0)
    codes, scales = ref.quantize_blocks(x.reshape(-1), spec)  # the oracle, in one piece
    assert torch.equal(q.codes, codes) and torch.equal(q.scales, scales)
    back = storage.load(q)
    assert back.dtype == torch.bfloat16 and back.shape == x.shape
    assert torch.equal(back.reshape(-1), ref.dequantize_blocks(codes, scales, spec, numel, torch.bfloat16))
    assert torch.equal(agoq_core.dequantize(q), back)


def test_non_contiguous_input_is_stored_in_logical_order():
    x = torch.randn(8, 40).t()  # a transposed view
    q = storage.store(x, get_format("int8"), role="attention_core", layer=None)
    assert q.shape == x.shape
    ref_codes, _ = ref.quantize_blocks(x.contiguous().reshape(-1), get_format("int8"))
    assert torch.equal(q.codes, ref_codes)


def test_native_storage_is_the_tensor_itself():
    x = torch.randn(5, 7, requires_grad=True)
    s = storage.store(x, None, role="norm_input", layer=1)
    assert isinstance(s, torch.Tensor) and not s.requires_grad
    assert s.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert storage.stored_nbytes(s) == 35 * 4
    assert storage.load(s) is s and storage.load(s, torch.float64).dtype == torch.float64


def test_meta_storage_has_the_real_sizes_without_running_a_codec():
    spec = get_format("nf4")
    q = storage.store(torch.empty(3, 1000, device="meta"), spec, role="mlp_act_input", layer=0)
    assert isinstance(q, QuantizedTensor) and q.device.type == "meta"
    assert q.nbytes == spec.storage_bytes(3000)
    assert storage.load(q).device.type == "meta"


def test_empty_tensor():
    q = storage.store(torch.empty(0, 4), get_format("int4"), role="norm_input", layer=0)
    assert q.nbytes == 0 and storage.load(q).shape == (0, 4)


def test_listeners_hear_every_store():
    heard = []
    fn = lambda role, layer, s: heard.append((role, layer, storage.stored_nbytes(s)))  # noqa: E731
    storage.add_listener(fn)
    try:
        storage.store(torch.randn(256), get_format("int4"), role="norm_input", layer=3)
        storage.store(torch.randn(10), None, role="attn_out_input", layer=None)
    finally:
        storage.remove_listener(fn)
    storage.store(torch.randn(4), None, role="norm_input", layer=0)  # not heard any more
    assert heard == [("norm_input", 3, 128 + 2 * 4), ("attn_out_input", None, 40)]


def test_unsupported_backend_capability_is_an_error():
    with pytest.raises(agoq_core.BackendError):
        storage.store(torch.randn(16), get_format("int4"), role="norm_input", layer=0, backend="no-such-backend")
