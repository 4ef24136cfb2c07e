"""Eligibility reasons and argument errors of the fused GEMMs: what was asked, what was found, the fix."""
from __future__ import annotations

import pytest
import torch

from agoq_core.formats.spec import get_format
from agoq_cuda.fusion import gemm_quant_epilogue, launch
from agoq_cuda.fusion.launch import TileConfig, epilogue_unsupported, prologue_unsupported

INT4 = get_format("int4")


def _xw(device, m=8, k=64, n=256, dtype=torch.bfloat16):
    return torch.zeros(m, k, dtype=dtype, device=device), torch.zeros(n, k, dtype=dtype, device=device)


def test_eligible_llama_like_call_has_no_reason(device):
    x, w = _xw(device)
    assert epilogue_unsupported(x, w, None, INT4) is None
    assert prologue_unsupported(torch.zeros(8, 32, dtype=torch.float16, device=device), INT4, 256) is None


@pytest.mark.parametrize("case, match", [
    ("fp32", "bfloat16 or float16"),
    ("mixed", "but x is"),
    ("n_not_multiple", "not a multiple of the block 128"),
    ("block_96", "not a power of two"),
    ("block_512", "not a power of two <= 256"),
    ("shape", "do not form a linear"),
    ("bias_shape", "bias has shape"),
    ("device", "fused kernels run on"),
])
def test_epilogue_reasons(case, match, device):
    x, w = _xw(device)
    b, spec = None, INT4
    if case == "fp32":
        x, w = x.float(), w.float()
    elif case == "mixed":
        w = w.half()
    elif case == "n_not_multiple":
        w = w[:200]
    elif case == "block_96":
        spec = get_format("int4", 96)
        w = torch.zeros(192, 64, dtype=torch.bfloat16, device=device)
    elif case == "block_512":
        spec = get_format("int4", 512)
        w = torch.zeros(512, 64, dtype=torch.bfloat16, device=device)
    elif case == "shape":
        w = w[:, :32]
    elif case == "bias_shape":
        b = torch.zeros(3, dtype=x.dtype, device=device)
    elif case == "device":
        x = x.to("meta")
    reason = epilogue_unsupported(x, w, b, spec)
    assert reason is not None and match in reason
    with pytest.raises(ValueError, match="cannot fuse"):
        y = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=device)
        launch.gemm_quant_epilogue_into(x, w, b, spec, y, torch.empty(0, dtype=torch.uint8),
                                        torch.empty(0), config=None)


def test_prologue_reasons(device, monkeypatch):
    g = torch.zeros(8, 32, dtype=torch.bfloat16, device=device)
    assert "bfloat16 or float16" in prologue_unsupported(g.float(), INT4, 256)
    assert "not a multiple of the block" in prologue_unsupported(g, INT4, 200)
    assert "empty" in prologue_unsupported(g, INT4, 0)
    monkeypatch.setattr(launch, "_MAX_INDEX", 1000)
    assert "2**31" in prologue_unsupported(g, INT4, 256)


def test_buffers_are_checked(device):
    x, w = _xw(device)
    y = torch.empty(8, 256, dtype=torch.bfloat16, device=device)
    codes = torch.empty(INT4.code_bytes(8 * 256), dtype=torch.uint8, device=device)
    scales = torch.empty(INT4.num_blocks(8 * 256), dtype=torch.float32, device=device)
    with pytest.raises(ValueError, match="need 1024 code bytes and 16 scales, got 1023"):
        launch.gemm_quant_epilogue_into(x, w, None, INT4, y, codes[:-1], scales)
    with pytest.raises(TypeError, match="uint8 codes"):
        launch.gemm_quant_epilogue_into(x, w, None, INT4, y, codes.view(torch.int8), scales)
    with pytest.raises(ValueError, match=r"out must be a contiguous torch.bfloat16 tensor of shape \(8, 256\)"):
        launch.gemm_quant_epilogue_into(x, w, None, INT4, y.t().contiguous().t()[:, :128], codes, scales)
    with pytest.raises(ValueError, match="2-D"):
        launch.gemm_quant_epilogue_into(x[None], w, None, INT4, y, codes, scales)
    out = torch.empty(256, 64, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match=r"out must be a contiguous torch.bfloat16 tensor of shape \(256, 128\)"):
        launch.gemm_dequant_prologue_into(torch.zeros(8, 256, dtype=torch.bfloat16, device=device), codes[:512],
                                          scales[:8], INT4, 128, out)


def test_convenience_function_reports_the_reason(device):
    x, w = _xw(device, n=200)
    with pytest.raises(ValueError, match="N \\(output features\\)=200 is not a multiple of the block 128"):
        gemm_quant_epilogue(x, w, fmt="int4")


@pytest.mark.parametrize("kw", [dict(block_m=24), dict(block_k=8), dict(block_n=True), dict(group_m=0)])
def test_tile_config_validation(kw):
    base = dict(block_m=64, block_n=128, block_k=32)
    base.update(kw)
    with pytest.raises(ValueError, match="TileConfig"):
        TileConfig(**base)
