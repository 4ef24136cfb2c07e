"""Property-based tests of the block codecs against the spec oracle (tests/property/spec_oracle.py,
written from docs/formats.md): random shapes (ragged tails, non-contiguous views), input dtypes,
formats, block sizes and special values (0, -0, +-FLT_MAX, subnormals, tiny negatives, NaN, +-Inf).

Properties: codes and scales bit-exact with the oracle; dequantize equals the oracle's fp32 product
cast once to the output dtype; finite input gives finite output (blocks without NaN/Inf); FP8 never
emits the -0 code."""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import agoq_core
from agoq_core.formats.spec import list_formats

from . import spec_oracle as O
from .conftest import PROFILE

FORMATS = [s.name for s in list_formats()]
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
F32 = np.finfo(np.float32)
SPECIALS = [0.0, -0.0, float(F32.max), -float(F32.max), 0.75 * float(F32.max), 1e-40, -1e-40, 2.0**-126, -2.0**-126,
            1e-30, -1e-30, -1e-6, 65504.0, -65520.0, 1e5, 0.25, -0.75, 2.5, float("nan"), float("inf"), float("-inf")]


@st.composite
def tensors(draw, dtypes=tuple(DTYPES)):
    """A tensor of a random shape and dtype: a Gaussian at a random magnitude with special values
    injected; 2-D ones may be transposed (non-contiguous) or column-sliced views."""
    n_rows = draw(st.integers(1, 12))
    n_cols = draw(st.integers(0, 64))
    seed = draw(st.integers(0, 2**31 - 1))
    mag = 10.0 ** draw(st.integers(-30, 30))
    rng = np.random.default_rng(seed)
    base = (rng.standard_normal(n_rows * n_cols) * mag).astype(np.float32)
    if base.size:
        k = draw(st.integers(0, min(8, base.size)))
        for _ in range(k):
            base[draw(st.integers(0, base.size - 1))] = draw(st.sampled_from(SPECIALS))
    x = torch.from_numpy(base).reshape(n_rows, n_cols).to(DTYPES[draw(st.sampled_from(dtypes))])
    view = draw(st.sampled_from(["flat", "2d", "transposed", "sliced"]))
    if view == "flat":
        x = x.reshape(-1)
    elif view == "transposed":
        x = x.t()
    elif view == "sliced" and n_cols > 1:
        x = x[:, ::2]
    return x


def _logical_f32(x: torch.Tensor) -> np.ndarray:
    return x.float().contiguous().reshape(-1).numpy()  # bf16/f16 -> fp32 is exact; row-major logical order


def _scales_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.all((np.isnan(a) & np.isnan(b)) | (a.view(np.uint32) == b.view(np.uint32))))


@settings(PROFILE)
@given(x=tensors(), fmt=st.sampled_from(FORMATS), block8=st.integers(1, 33))
def test_quantize_matches_the_spec_oracle(x, fmt, block8):
    block = block8 * 8
    q = agoq_core.quantize(x, fmt, block=block)
    want_codes, want_scales = O.quantize(_logical_f32(x), fmt, block)
    assert q.codes.numpy().tobytes() == want_codes, (fmt, block, x.dtype, tuple(x.shape))
    assert _scales_equal(q.scales.numpy(), want_scales)
    if fmt.startswith("fp8"):
        assert not (q.codes == 0x80).any()  # no -0 code (spec version 2)


@settings(PROFILE)
@given(x=tensors(), fmt=st.sampled_from(FORMATS), block8=st.integers(1, 33), out=st.sampled_from(list(DTYPES)))
def test_dequantize_matches_the_spec_oracle_and_finite_stays_finite(x, fmt, block8, out):
    block = block8 * 8
    q = agoq_core.quantize(x, fmt, block=block)
    odt = DTYPES[out]
    y = agoq_core.dequantize(q, odt)
    assert y.shape == x.shape and y.dtype == odt
    prod = O.dequantize_f32(q.codes.numpy().tobytes(), q.scales.numpy(), fmt, block, x.numel())
    want = torch.from_numpy(prod).to(odt)  # one round-to-nearest-even cast
    got = y.contiguous().reshape(-1)
    same = (got.float().isnan() & want.float().isnan()) | (got.view(-1).float() == want.float())
    assert bool(same.all()), (fmt, block, out)
    # finite in, finite out (docs/formats.md §3 step 5), for every block without NaN/Inf
    x32 = _logical_f32(x)
    nb = -(-x32.size // block)
    pad = np.zeros(nb * block, dtype=np.float32)
    pad[: x32.size] = x32
    finite_blocks = np.isfinite(pad.reshape(nb, block)).all(axis=1)
    y32 = agoq_core.dequantize(q, x.dtype).float().contiguous().reshape(-1).numpy()
    ypad = np.zeros(nb * block, dtype=np.float32)
    ypad[: y32.size] = y32
    assert np.isfinite(ypad.reshape(nb, block)[finite_blocks]).all(), (fmt, block, x.dtype)
    assert np.isnan(ypad.reshape(nb, block)[~finite_blocks][:, 0]).all() if (~finite_blocks).any() else True


@settings(PROFILE)
@given(x=tensors(dtypes=("f32",)), fmt=st.sampled_from(FORMATS))
def test_quantize_is_independent_of_memory_layout(x, fmt):
    """A non-contiguous view and its contiguous copy give the same bytes (logical order)."""
    a = agoq_core.quantize(x, fmt)
    b = agoq_core.quantize(x.contiguous(), fmt)
    assert torch.equal(a.codes, b.codes) and _scales_equal(a.scales.numpy(), b.scales.numpy())
