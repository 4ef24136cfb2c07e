"""Spec version 3 (docs/formats.md §3 step 6): v = RN(x * RN(1/scale)), one correctly rounded reciprocal per block
and one fp32 multiply per element, instead of version 2's RN(x / scale).

Checked against the independent float64/numpy oracle (tests/formats/oracle.py: the exact product of x and the
24-bit reciprocal, rounded once; codes by brute force), and against the kept version-2 golden set: codes change
only where the two scaled values round differently, scales never change.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from agoq_core.formats import reference as ref
from agoq_core.formats.packing import unpack_codes
from agoq_core.formats.spec import MIN_NORMAL_F32, SPEC_VERSION, get_format, list_formats
from tests.formats import oracle

FORMATS = [s.name for s in list_formats()]
f32, i32 = np.float32, np.int32


def test_spec_version_is_3():
    assert SPEC_VERSION == 3 and get_format("int4").version == 3


def _oracle_codes(x32: np.ndarray, fmt: str, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Codes and scales of whole finite blocks by §3 (v3) and §4, in numpy only."""
    xb = np.where(np.abs(x32) < f32(MIN_NORMAL_F32), f32(0), x32).reshape(-1, block)
    amax = np.abs(xb).max(axis=1)
    with np.errstate(over="ignore"):
        s = (amax / f32(oracle.QMAX[fmt])).astype(f32)
        s[s < f32(MIN_NORMAL_F32)] = 0
        over = np.isinf(s * f32(oracle.QMAX[fmt]))
    s = np.where(over, (s.view(i32) - 1).view(f32), s)
    safe = np.where(s == 0, f32(1), s)
    v = np.where((s == 0)[:, None], f32(0), oracle.scaled_values_v3(xb, safe[:, None]))
    return oracle.nearest_codes(v.reshape(-1), fmt), s


def _near_boundaries(fmt: str, block: int, rng) -> np.ndarray:
    """Blocks of x within a few ulps of scale x (a code boundary), for random odd scales over many binades, plus
    the largest blocks (absmax near FLT_MAX; for nf4 its reciprocal is below 2**-126 there)."""
    codes, vals = oracle.levels(fmt)
    pos = np.unique(np.abs(vals))
    if fmt == "nf4":
        mids = np.abs(((oracle.NF4[:-1] + oracle.NF4[1:]) * f32(0.5)).astype(f32)).astype(np.float64)
    else:
        mids = (pos[:-1] + pos[1:]) / 2
    out = []
    for e in (-120, -60, -7, 0, 9, 60, 120, 126):
        amax = f32(rng.uniform(1.0, 2.0) * 2.0**e) if e < 126 else f32(np.finfo(f32).max * rng.uniform(0.6, 1.0))
        s = f32(amax / f32(oracle.QMAX[fmt]))
        x = (rng.choice(mids, block) * np.float64(s)).astype(f32)
        x = (x.view(i32) + rng.integers(-3, 4, block).astype(i32)).view(f32) * rng.choice([f32(-1), f32(1)], block)
        x = np.clip(x, -amax, amax)
        x[0] = amax
        out.append(x)
    return np.concatenate(out).astype(f32)


@pytest.mark.parametrize("fmt", FORMATS)
def test_codes_are_the_brute_force_codes_of_the_v3_scaled_values(fmt):
    """Exact: no tolerance, every element's code is the nearest level (ties by the rule) to RN(x * RN(1/s))."""
    block = 64
    spec = get_format(fmt, block)
    rng = np.random.default_rng(FORMATS.index(fmt))
    gauss = (rng.standard_normal(8 * block) * np.exp2(rng.integers(-30, 30, 8 * block))).astype(f32)
    heavy = (rng.standard_normal(4 * block) / np.maximum(rng.random(4 * block), 1e-3)).astype(f32)
    x = np.concatenate([gauss, heavy, _near_boundaries(fmt, block, rng)])
    codes, scales = ref.quantize_blocks(torch.from_numpy(x), spec)
    want_codes, want_scales = _oracle_codes(x, fmt, block)
    assert np.array_equal(scales.numpy().view(i32), want_scales.view(i32))
    got = unpack_codes(codes, spec, x.size).numpy()
    bad = got != want_codes
    assert not bad.any(), f"{int(bad.sum())} codes differ, first x={x[bad][0]!r}: {got[bad][0]} != {want_codes[bad][0]}"


def test_nf4_keeps_the_reciprocal_bits_above_2_126():
    """nf4 (qmax 1): absmax >= 2**126 makes fp32's 1/scale subnormal; the contract multiplies by the 24-bit
    reciprocal instead, which codes some elements differently from the subnormal one (the input shows it)."""
    spec = get_format("nf4", 32)
    rng = np.random.default_rng(5)
    rows = []
    for _ in range(64):
        amax = f32(np.finfo(f32).max * rng.uniform(0.3, 1.0))
        t = ((oracle.NF4[:-1] + oracle.NF4[1:]) * f32(0.5)).astype(f32).astype(np.float64)
        x = (rng.choice(t, 32) * np.float64(amax)).astype(f32)
        x = (x.view(i32) + rng.integers(-8, 9, 32).astype(i32)).view(f32)
        x[0] = amax
        rows.append(x)
    x = np.concatenate(rows)
    codes, scales = ref.quantize_blocks(torch.from_numpy(x), spec)
    want, _ = _oracle_codes(x, "nf4", 32)
    got = unpack_codes(codes, spec, x.size).numpy()
    assert np.array_equal(got, want)
    with np.errstate(under="ignore"):
        sub = (x.reshape(-1, 32) * (f32(1) / scales.numpy())[:, None]).astype(f32)  # the subnormal reciprocal
    assert (oracle.nearest_codes(sub.reshape(-1), "nf4") != want).any(), "the input does not tell the two apart"


def _v2_and_v3_values(x: torch.Tensor, scales: torch.Tensor, block: int) -> tuple[np.ndarray, np.ndarray]:
    n = x.numel()
    nb = scales.numel()
    xp = np.zeros(nb * block, f32)
    xp[:n] = x.float().numpy()
    xp = np.where(np.abs(xp) < f32(MIN_NORMAL_F32), f32(0), xp).reshape(nb, block)
    s = scales.numpy()
    ok = np.isfinite(s) & (s > 0)
    safe = np.where(ok, s, f32(1))[:, None]
    with np.errstate(all="ignore"):
        v2 = (xp / safe).astype(f32)
        v3 = oracle.scaled_values_v3(xp, safe)
    keep = np.repeat(ok, block)
    return np.where(keep, v2.reshape(-1), 0)[:n], np.where(keep, v3.reshape(-1), 0)[:n]


def test_v3_differs_from_v2_only_where_the_two_scaled_values_round_differently():
    """Every quantize case of the kept version-2 golden set, re-quantized under version 3: scales are identical
    and a code differs only at an element whose RN(x / s) and RN(x * RN(1/s)) differ (and some do)."""
    from agoq_conformance.golden import load_legacy_golden

    g2 = load_legacy_golden(2)
    t = g2["tensors"]
    changed = split = 0
    for case in g2["cases"]:
        if case["op"] != "quantize":
            continue
        spec = get_format(case["fmt"], case["block"])
        x = t[case["input"]]
        old_codes, old_scales = (t[k] for k in case["expect"])
        codes, scales = ref.quantize_blocks(x, spec)
        assert torch.equal(scales.isnan(), old_scales.isnan()), case["id"]
        assert torch.equal(scales.nan_to_num(), old_scales.nan_to_num()), case["id"]
        n = x.numel()
        c2 = unpack_codes(old_codes, spec, n).numpy()
        c3 = unpack_codes(codes, spec, n).numpy()
        v2, v3 = _v2_and_v3_values(x, scales, spec.block)
        differ = c2 != c3
        rounds_apart = v2.view(i32) != v3.view(i32)
        assert not (differ & ~rounds_apart).any(), f"{case['id']}: a code changed where v did not"
        changed += int(differ.sum())
        split += int(rounds_apart.sum())
    assert changed > 0, "no code changed between v2 and v3 on the v2 golden inputs: the check has no teeth"
    assert split > changed  # most changes of v's last bit change no code


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8", "nvfp4"])
def test_microscaling_formats_are_unchanged(fmt):
    """MX scales are powers of two (x * 2**-e is exact either way) and NVFP4 already multiplied by a per-block
    reciprocal (docs/formats.md §9): their golden set (golden_mx_v1.pt) is unchanged by version 3."""
    from agoq_conformance.golden_mx import load_golden_mx

    g = load_golden_mx()
    cases = [c for c in g["cases"] if c["op"] == "quantize" and c["fmt"] == fmt]
    assert cases
    for case in cases:
        spec = get_format(case["fmt"])
        x = g["tensors"][case["input"]]
        codes, scales = ref.quantize_blocks(x, spec)
        want_c, want_s = (g["tensors"][k] for k in case["expect"][:2])
        assert torch.equal(codes, want_c), case["id"]
        assert torch.equal(scales.nan_to_num(), want_s.nan_to_num()), case["id"]
