"""Deterministic conformance inputs: the value classes every codec must get bit-exactly right.

Each generator returns an fp32 tensor; the golden builder stores it (and its bf16/fp16 casts), so
backends never regenerate inputs: they read the same bytes from the golden file.
"""
from __future__ import annotations

import torch

from agoq_core.formats import reference as ref
from agoq_core.formats.spec import FP4_E2M1_LEVELS, FormatSpec

__all__ = ["value_classes", "tie_values", "reciprocal_split_values"]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def tie_values(spec: FormatSpec, block: int) -> torch.Tensor:
    """Blocks whose scaled values sit exactly on rounding ties (and +-1 ulp around them).

    The first element of each block is qmax * s with s a power of two, so the scale is exactly s and
    x / scale is exact: every listed value is a true tie of the format's code.
    """
    if spec.kind == "int":
        mags = [k + 0.5 for k in range(int(spec.qmax))]
    elif spec.kind == "fp4_e2m1":
        lv = FP4_E2M1_LEVELS
        mags = [(lv[i] + lv[i + 1]) / 2 for i in range(len(lv) - 1)]
    elif spec.kind == "nf4":
        mags = [abs(t) for t in ref.nf4_thresholds()]
    else:  # fp8: midpoints between neighbouring representable values, incl. subnormal ones
        table = ref.decode_table(spec)
        pos = torch.sort(table[(table > 0) & torch.isfinite(table)]).values
        mids = ((pos[:-1].double() + pos[1:].double()) / 2).float()
        step = max(1, mids.numel() // 96)
        mags = mids[::step].tolist()
    t = torch.tensor(mags, dtype=torch.float32)
    t = torch.cat([t, -t, torch.nextafter(t, torch.full_like(t, 1e9)), torch.nextafter(t, torch.zeros_like(t))])
    out = []
    for s in (1.0, 2.0**-7, 2.0**9):
        vals = t * s
        for i in range(0, vals.numel(), block - 1):
            chunk = vals[i:i + block - 1]
            blk = torch.zeros(block)
            blk[0] = spec.qmax * s
            blk[1:1 + chunk.numel()] = chunk
            out.append(blk)
    return torch.cat(out)


def _boundaries(spec: FormatSpec) -> torch.Tensor:
    """The positive decision boundaries of the format's code on the scaled value v (fp64)."""
    if spec.kind == "int":
        return torch.arange(int(spec.qmax), dtype=torch.float64) + 0.5
    if spec.kind == "fp4_e2m1":
        lv = torch.tensor(FP4_E2M1_LEVELS, dtype=torch.float64)
        return (lv[:-1] + lv[1:]) / 2
    if spec.kind == "nf4":
        return torch.tensor(ref.nf4_thresholds(), dtype=torch.float64).abs()
    table = ref.decode_table(spec)
    pos = torch.sort(table[(table > 0) & torch.isfinite(table)]).values.double()
    return (pos[:-1] + pos[1:]) / 2


def reciprocal_split_values(spec: FormatSpec, block: int, seed: int) -> torch.Tensor:
    """Blocks whose elements code differently under spec version 2 (v = RN(x / scale)) and version 3
    (v = RN(x * RN(1/scale))): x within a few ulps of scale times a code boundary, kept where the two scaled
    values fall on different sides of it. A backend still dividing per element, or one whose multiply is fused
    into the rounding add, fails these. Scales are random (odd mantissas), from 2**-100 to the largest finite
    blocks (absmax 2**127: for nf4, qmax 1, the reciprocal is below 2**-126 there and keeps its 24 bits);
    there, elements are also kept where v3 differs from a multiply by the subnormal fp32 reciprocal."""
    g = _gen(seed)
    t = _boundaries(spec)
    ulps = torch.arange(-4, 5, dtype=torch.float64)
    qmax = torch.tensor(spec.qmax, dtype=torch.float32)
    out = []
    for e in (-100, -3, 0, 17, 100, 127):
        for attempt in range(64):  # random scales until one splits at least 4 elements (the last one: any)
            m = 1.0 + torch.rand((), generator=g, dtype=torch.float64)
            amax = torch.tensor(float(m) * 2.0 ** e, dtype=torch.float64).clamp(max=torch.finfo(torch.float32).max)
            amax = amax.float()
            scale = amax / qmax
            if not torch.isfinite(scale * qmax) or scale < torch.finfo(torch.float32).tiny:
                continue
            x0 = (t * scale.double()).float()
            x = (x0.view(torch.int32)[:, None] + ulps.to(torch.int32)[None, :]).view(torch.float32).reshape(-1)
            x = torch.cat([x, -x])
            x = x[(x.abs() <= amax) & (x.abs() >= torch.finfo(torch.float32).tiny)]
            v2 = ref.encode(x / scale, spec)
            v3 = ref.encode(ref.scaled_values(x[None, :], scale.reshape(1))[0], spec)
            split = (v2 != v3) | (ref.encode(x * (1.0 / scale), spec) != v3)  # 1/scale: fp32, subnormal if huge
            x = x[split]
            if x.numel() >= 4 or (x.numel() and attempt == 63):
                break
        x = x[torch.randperm(x.numel(), generator=g)][: block - 1]
        blk = torch.zeros(block)
        blk[0] = amax
        blk[1:1 + x.numel()] = x
        out.append(blk)
    return torch.cat(out)


def value_classes(spec: FormatSpec, block: int, seed: int) -> dict[str, torch.Tensor]:
    """name -> flat fp32 input. Sizes are deliberately not multiples of the block (ragged tails)."""
    g = _gen(seed)
    f32 = torch.finfo(torch.float32)
    gauss = torch.randn(3 * block + 37, generator=g)
    # heavy-tailed: a Gaussian divided by a uniform (Cauchy-like tails, outliers up to ~1e3 sigma)
    heavy = torch.randn(2 * block + 5, generator=g) / torch.rand(2 * block + 5, generator=g).clamp_min(1e-3)
    special = torch.cat([
        torch.zeros(block),                                       # all-zero block
        torch.tensor([f32.max, -f32.max, 1.0, -0.0] + [0.0] * (block - 4)),    # +-max fp32 (finite out)
        torch.tensor([-f32.max * 0.75, 1.0, -2.0**-12] + [0.0] * (block - 3)),  # near max, int step-down
        torch.tensor([1.0, -1e-6, -1e-30, -0.0, -2.0**-12] + [0.0] * (block - 5)),  # tiny negatives: +0 code
        torch.full((block,), f32.tiny) * torch.arange(block),     # tiny normals
        torch.tensor([f32.tiny / 4, -f32.tiny / 2, 1e-40, 3.0] + [1e-30] * (block - 4)),  # subnormals
        torch.cat([torch.randn(block - 1, generator=g), torch.tensor([float("nan")])]),   # NaN block
        torch.cat([torch.tensor([float("inf")]), torch.randn(block - 1, generator=g)]),   # Inf block
        torch.cat([torch.tensor([-float("inf")]), torch.zeros(block - 1)]),
        torch.cat([torch.randn(block - 1, generator=g) * 1e-3, torch.tensor([1e4])]),    # one outlier
        torch.tensor([65504.0, 70000.0, -1e5, 3.0e38, 1e-8, 6e-5, 5.9e-8, 2.0]),         # fp16-overflow etc.
    ])
    return {
        "gauss": gauss,
        "heavy": heavy,
        "ties": tie_values(spec, block),
        "rcp_split": reciprocal_split_values(spec, block, seed + 1),
        "special": special,
        "single": torch.tensor([-2.75]),
        "tail7": torch.randn(7, generator=g) * 3,
    }
