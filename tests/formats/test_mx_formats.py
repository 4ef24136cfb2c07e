"""OCP MX (mxfp4, mxfp8) and NVFP4: the reference codecs against torchao's references and against an
independent numpy oracle written from docs/formats.md §9.

Documented differences from torchao (checked here, not hidden): torchao emits a negative-zero code for a
negative value that rounds to 0 (E2M1 0x8, E4M3 0x80) where our formats have no -0 code; torchao takes NaN
into the absmax (the whole block's scale becomes NaN, like ours) but also into NVFP4's tensor scale (every
block NaN; ours: only the non-finite block). Codes are compared with -0 mapped to +0.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import agoq_core
from agoq_core.api import accumulate_
from agoq_core.errors import FormatError
from agoq_core.formats import mx
from agoq_core.formats import reference as ref
from agoq_core.formats.packing import unpack_codes
from agoq_core.formats.spec import get_format, list_formats, microscaling_formats

torchao_mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
torchao_nvfp4 = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")


def _inputs(shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * 3.0
    flat = x.view(-1)
    flat[::11] /= torch.rand(flat[::11].numel(), generator=g).clamp_min(1e-3)  # heavy tail
    flat[5::97] = 0.0
    flat[7::131] *= 2.0 ** -20  # tiny values next to big ones
    return x.to(dtype)


def _no_neg_zero(codes: torch.Tensor, bits: int) -> torch.Tensor:
    sign = 1 << (bits - 1)
    return torch.where(codes == sign, 0, codes)


@pytest.mark.parametrize("name,elem", [("mxfp4", "float4_e2m1fn_x2"), ("mxfp8", "float8_e4m3fn")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mx_matches_torchao(name, elem, dtype):
    spec = get_format(name)
    x = _inputs((48, 320), seed=1, dtype=dtype)
    codes, scales = ref.quantize_blocks(x, spec)
    se, data = torchao_mx.to_mx(x, getattr(torch, elem), 32)  # default ScaleCalculationMode.FLOOR = OCP
    assert torch.equal(mx.mx_scales_to_e8m0(scales), se.view(torch.uint8).reshape(-1))
    want = unpack_codes(data.view(torch.uint8).reshape(-1), spec)
    got = unpack_codes(codes, spec)
    assert torch.equal(got, _no_neg_zero(want, spec.bits))
    # values too: torchao's dequantize equals ours (bf16 output rounds once in both)
    ours = agoq_core.dequantize(agoq_core.quantize(x, name), torch.float32)
    theirs = torchao_mx.to_dtype(data, se, getattr(torch, elem), 32, torch.float32)
    assert torch.equal(ours.reshape(-1), theirs.reshape(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nvfp4_matches_torchao(dtype):
    spec = get_format("nvfp4")
    x = _inputs((40, 256), seed=2, dtype=dtype)
    codes, scales = ref.quantize_blocks(x, spec)
    s = torchao_nvfp4.per_tensor_amax_to_scale(x.float().abs().amax())
    sb, data = torchao_nvfp4.nvfp4_quantize(x, 16, s)
    assert torch.equal(mx.nvfp4_tensor_scale(x), s)
    assert torch.equal(scales, (s * sb.to(torch.float32)).reshape(-1))  # effective scale = RN(S * s_b)
    assert torch.equal(unpack_codes(codes, spec), _no_neg_zero(unpack_codes(data.view(torch.uint8).reshape(-1),
                                                                           spec), 4))
    c2, sb2, s2 = mx.nvfp4_quantize_compact(x)
    assert torch.equal(c2, codes) and torch.equal(sb2, sb.view(torch.uint8).reshape(-1)) and torch.equal(s2, s)
    t = torchao_nvfp4.NVFP4Tensor(data, sb, 16, dtype, per_tensor_scale=s)
    assert torch.equal(agoq_core.dequantize(agoq_core.quantize(x, "nvfp4"), dtype), t.dequantize(dtype))


# ---- independent numpy oracle (docs/formats.md §9), exact rationals via float64 ------------------------------
_E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
_E4M3 = np.array(sorted({(1 + m / 8) * 2.0 ** (e - 7) for e in range(1, 16) for m in range(8)} |
                        {m / 8 * 2.0 ** -6 for m in range(8)}))
_E4M3 = _E4M3[_E4M3 <= 448]


def _rne(mag, grid):
    """Nearest grid value, ties to the even index (= even mantissa for these grids), saturating."""
    mag = np.minimum(mag, grid[-1])
    i = np.clip(np.searchsorted(grid, mag), 1, len(grid) - 1)
    lo, hi = grid[i - 1], grid[i]
    pick_hi = (mag - lo > hi - mag) | ((mag - lo == hi - mag) & (i % 2 == 0))
    return np.where(mag <= grid[0], grid[0], np.where(pick_hi, hi, lo))


def _oracle_mx(x32: np.ndarray, kind: str, emax: int, block: int = 32):
    xb = x32.astype(np.float64).reshape(-1, block)
    xb[np.abs(xb) < 2.0 ** -126] = 0
    amax = np.abs(xb).max(axis=1)
    e = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))) - emax, 0)
    e = np.maximum(e, -126)
    scale = np.where(amax > 0, 2.0 ** e, 0.0)
    v = xb / np.where(scale > 0, scale, 1)[:, None]
    grid = _E2M1 if kind == "fp4" else _E4M3
    vals = np.sign(v) * _rne(np.abs(v), grid)
    return vals * scale[:, None], scale


@pytest.mark.parametrize("name,kind,emax", [("mxfp4", "fp4", 2), ("mxfp8", "fp8", 8)])
def test_mx_against_numpy_oracle(name, kind, emax):
    x = _inputs((64, 96), seed=3)
    # exact ties: midpoints of the element grid times a power-of-two scale, and the saturation band
    x[0, :8] = torch.tensor([6.0, 5.0, 0.25, 0.75, 2.5, 3.5, -5.0, 1.25]) * 4  # amax 24: scale 2**2
    x[1, :4] = torch.tensor([7.9, -7.5, 1e-30, -1e-30])  # 7.9 > 6 * 2**0: saturates
    got = agoq_core.dequantize(agoq_core.quantize(x, name), torch.float32).numpy().astype(np.float64)
    want, scale = _oracle_mx(x.numpy(), kind, emax)
    np.testing.assert_array_equal(got.reshape(-1), want.reshape(-1))
    np.testing.assert_array_equal(ref.quantize_blocks(x, get_format(name))[1].numpy(), scale.astype(np.float32))


def test_special_blocks():
    spec = get_format("mxfp8")
    x = torch.zeros(4 * 32)
    x[32:64] = torch.randn(32)
    x[40] = float("inf")
    x[64:96] = 2.0 ** -125  # amax 2**-125: exponent clamps at -126
    x[96:] = torch.randn(32)
    codes, scales = ref.quantize_blocks(x, spec)
    assert scales[0] == 0 and torch.isnan(scales[1]) and scales[2] == 2.0 ** -126
    assert torch.all(codes[:64] == 0)
    e8 = mx.mx_scales_to_e8m0(scales)
    assert e8[0] == 0 and e8[1] == 0xFF and e8[2] == 1
    assert torch.equal(mx.e8m0_to_mx_scales(e8).nan_to_num(7.0), scales.nan_to_num(7.0))
    # nvfp4: an all-zero tensor flushes (scale 0), a ragged tail is padded with +0
    q = agoq_core.quantize(torch.zeros(40), "nvfp4")
    assert torch.all(q.scales == 0) and torch.all(q.codes == 0)
    y = _inputs((77,), seed=4)
    q = agoq_core.quantize(y, "nvfp4")
    assert q.scales.numel() == 5 and q.codes.numel() == 39


def test_registry_and_config_errors():
    assert microscaling_formats() == ["mxfp4", "mxfp8", "nvfp4"]
    assert "mxfp4" not in [s.name for s in list_formats()]  # the default listing: block-absmax formats only
    assert get_format("mxfp4", default_block=128).block == 32
    assert get_format("int4", default_block=64).block == 64
    with pytest.raises(FormatError, match="fixed block of 32"):
        get_format("mxfp4", 128)
    assert get_format("nvfp4").compact_bytes(32) == 16 + 2 + 4
    assert get_format("mxfp4").compact_bytes(64) == 32 + 2
    with pytest.raises(FormatError, match="per-tensor scale"):
        accumulate_(agoq_core.quantize(torch.randn(64), "nvfp4"), torch.randn(64))
    from agoq_core.laaq.config import LAAQConfig
    from agoq_core.quangrad.config import QuanGradConfig

    assert LAAQConfig.uniform("mxfp4").plan(0)["mlp_act_input"].block == 32
    assert QuanGradConfig(fmt="mxfp8").spec.block == 32


def test_scale_steps_copy_nothing_from_the_host(monkeypatch):
    """NVFP4's tensor-scale step and the integer formats' block scales divide by fp32 constants made on the data's
    device (torch.full), never by torch.tensor: on a GPU that copies from pageable host memory, a host-device sync
    in every NVFP4 quantize (the Triton launchers call this step too). Same bits either way."""
    a = torch.tensor([0.0, 1e-30, 3.0, 2688.0, 1e30])
    x = torch.randn(4, 64)
    want_s = [mx.nvfp4_tensor_scale_from_absmax(v) for v in a]
    want_q = ref.quantize_blocks(x.flatten(), get_format("int4"))

    def no_host_copy(*args, **kwargs):
        raise AssertionError("torch.tensor called: a host copy (a sync on a GPU)")

    monkeypatch.setattr(torch, "tensor", no_host_copy)
    for v, w in zip(a, want_s):
        got = mx.nvfp4_tensor_scale_from_absmax(v)
        assert got.dtype == torch.float32 and torch.equal(got.view(torch.int32), w.view(torch.int32))
    got_q = ref.quantize_blocks(x.flatten(), get_format("int4"))
    assert all(torch.equal(g, w) for g, w in zip(got_q, want_q))
