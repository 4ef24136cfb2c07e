"""Inputs for the bit-exact kernel tests: every value class the contract treats specially."""
from __future__ import annotations

import torch

from agoq_core.formats import reference as ref
from agoq_core.formats.spec import FormatSpec

__all__ = ["special_blocks", "assert_bits_equal", "poisoned_q", "assert_roundtrip_bitexact"]


def _tie_block(spec: FormatSpec, block: int, s: float) -> torch.Tensor:
    """First element qmax * s (so the scale is exactly s, a power of two), then the midpoints between
    neighbouring code values times s, and +-1 ulp around them: true ties of the encoder."""
    table = ref.decode_table(spec)
    lv = torch.unique(table[torch.isfinite(table)])
    mids = ((lv[:-1].double() + lv[1:].double()) / 2).float()
    vals = torch.cat([mids, torch.nextafter(mids, torch.full_like(mids, 1e9)),
                      torch.nextafter(mids, torch.full_like(mids, -1e9))]) * s
    g = torch.Generator().manual_seed(block)
    vals = vals[torch.randperm(vals.numel(), generator=g)][: block - 1]
    out = torch.zeros(block)
    out[0] = spec.qmax * s
    out[1:1 + vals.numel()] = vals
    return out


def _subnormal_product_block(spec: FormatSpec, block: int, g: torch.Generator) -> torch.Tensor:
    """Scale = 1.25 * 2**-126 (just above the flush threshold): every code with |decode| < 0.8 then
    dequantizes to an fp32 subnormal, which flush-to-zero arithmetic would lose."""
    x0 = spec.qmax * 1.25 * 2.0**-126
    b = (torch.rand(block, generator=g) * 2 - 1) * x0
    b[0] = x0
    return b


def special_blocks(spec: FormatSpec, block: int, seed: int) -> torch.Tensor:
    """fp32 tensor of whole blocks, one value class each, followed by a ragged tail of block // 2 + 3
    elements: Gaussian, heavy tail, all zeros, ties at three scales, +-fp32 max, tiny normals and
    subnormals (flushed), tiny scales (dequantized products that are fp32 subnormals), NaN, +Inf, -Inf,
    one outlier, and values around fp16's range."""
    g = torch.Generator().manual_seed(seed)
    f32 = torch.finfo(torch.float32)

    def rnd(scale=1.0):
        return torch.randn(block, generator=g) * scale

    def put(vals):
        b = torch.zeros(block)
        v = torch.as_tensor(vals, dtype=torch.float32)[:block]
        b[: v.numel()] = v
        return b

    blocks = [
        rnd(3.0),
        torch.randn(block, generator=g) / torch.rand(block, generator=g).clamp_min(1e-3),
        torch.zeros(block),
        _tie_block(spec, block, 1.0), _tie_block(spec, block, 2.0**-7), _tie_block(spec, block, 2.0**9),
        put([f32.max, -f32.max, 1.0, -0.0, -1.0]),
        put([-f32.max * 0.75, 1.0, -2.0**-12]),                               # int6/int8 scale step-down
        put([1.0, -1e-6, -1e-30, -0.0, -2.0**-12]),                           # tiny negatives: fp8 +0 code
        torch.arange(block) * f32.tiny,                                       # tiny normals
        put([f32.tiny / 4, -f32.tiny / 2, 1e-40, -1e-45, 3.0, -0.0]),         # subnormals are flushed
        rnd(2.0**-118), rnd(2.0**-112), rnd(2.0**-100),                       # scales near 2**-126
        _subnormal_product_block(spec, block, g),
        torch.cat([rnd()[:-1], torch.tensor([float("nan")])]),
        torch.cat([torch.tensor([float("inf")]), rnd()[1:]]),
        put([-float("inf")]),
        torch.cat([rnd(1e-3)[:-1], torch.tensor([1e4])]),
        put([65504.0, 70000.0, -1e5, 3.0e38, 1e-8, 6e-5, 5.9e-8, -2.0]),
    ]
    tail = rnd(5.0)[: block // 2 + 3]
    return torch.cat(blocks + [tail])


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Bit equality on the CPU (both sides moved there); NaN matches NaN (payloads are not part of the contract)."""
    got = got.detach().cpu().contiguous()
    want = want.detach().cpu().contiguous()  # either side may live on the GPU
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, got.shape, want.dtype, want.shape)
    if got.dtype.is_floating_point:
        gn, wn = torch.isnan(got), torch.isnan(want)
        assert torch.equal(gn, wn), f"{what}: NaN at different positions: {(gn != wn).nonzero().flatten()[:8].tolist()}"
        iv = {4: torch.int32, 2: torch.int16}[got.element_size()]
        a, b = got[~gn].view(iv), want[~wn].view(iv)
        sel_g, sel_w = got[~gn], want[~wn]
    else:
        a, b, sel_g, sel_w = got, want, got, want
    bad = (a != b).nonzero().flatten()
    assert bad.numel() == 0, (f"{what}: {bad.numel()} of {a.numel()} differ; first at {int(bad[0])}: got "
                              f"{sel_g[bad[0]].item()!r}, want {sel_w[bad[0]].item()!r}")


def poisoned_q(spec: FormatSpec, n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes and scales buffers for ``n`` elements filled with values no kernel writes (unwritten = caught)."""
    return (torch.full((spec.code_bytes(n),), 0xA5, dtype=torch.uint8, device=device),
            torch.full((spec.num_blocks(n),), -7.0, dtype=torch.float32, device=device))


def assert_roundtrip_bitexact(launch, x: torch.Tensor, spec: FormatSpec, device, out_dtypes) -> None:
    """quantize(x) through ``launch`` equals the reference bit for bit, and so does dequantize of the
    reference's codes into every dtype of ``out_dtypes``."""
    n = x.numel()
    codes, scales = poisoned_q(spec, n, device)
    launch.quantize(x.to(device), spec, codes, scales)
    want_c, want_s = ref.quantize_blocks(x, spec)
    assert_bits_equal(codes, want_c, "codes")
    assert_bits_equal(scales, want_s, "scales")
    for odt in out_dtypes:
        out = torch.full((n,), 123.0, dtype=odt, device=device)
        launch.dequantize(want_c.to(device), want_s.to(device), spec, out)
        assert_bits_equal(out, ref.dequantize_blocks(want_c, want_s, spec, n, odt), f"dequantize to {odt}")
