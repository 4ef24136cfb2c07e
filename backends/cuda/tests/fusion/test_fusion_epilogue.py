"""gemm_quant_epilogue: y = x Wᵀ (+ b) and Q(y) in one kernel.

Oracles: agoq_core.formats.reference (the unfused codec) applied to the y the kernel returned, bit for
bit; float64 matmul of the same operands for y, within the SQNR floor (agoq_core.testing.tolerances).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from agoq_core.formats import reference as ref
from agoq_core.formats.spec import activation_formats, get_format
from agoq_cuda.fusion import gemm_quant_epilogue, launch
from agoq_cuda.fusion.launch import TileConfig
from agoq_core.testing.tolerances import sqnr_db, sqnr_floor
from fusion_helpers import assert_bits_equal, ref_linear

DTYPES = [torch.bfloat16, torch.float16]


def _operands(m, k, n, dtype, seed, *, bias=False, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    return x.to(device), w.to(device), (b.to(device) if b is not None else None)


def _check(y, q, x, w, b, fmt, block=None):
    spec = get_format(fmt, block)
    want_c, want_s = ref.quantize_blocks(y.cpu(), spec)
    assert_bits_equal(q.codes, want_c, f"{fmt} codes")
    assert_bits_equal(q.scales, want_s, f"{fmt} scales")
    assert q.numel == y.numel() and q.dtype == y.dtype and q.spec == spec
    want = ref_linear(x, w, b)
    assert torch.equal(torch.isnan(y.cpu()), torch.isnan(want)), "NaN pattern of y"
    s = sqnr_db(y, want)
    assert s >= sqnr_floor(y.dtype), f"y SQNR {s:.1f} dB < {sqnr_floor(y.dtype)} dB"
    return s


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "f16"])
@pytest.mark.parametrize("fmt", activation_formats())
def test_codes_bit_exact_and_output_within_floor(fmt, dtype, device):
    x, w, b = _operands(40, 96, 256, dtype, seed=len(fmt), bias=True, device=device)
    y, q = gemm_quant_epilogue(x, w, b, fmt=fmt)
    s = _check(y, q, x, w, b, fmt)
    # As accurate as torch's own GEMM on the same operands (CPU torch: fp32 accumulate, one rounding).
    torch_y = F.linear(x.cpu(), w.cpu(), b.cpu())
    assert s >= sqnr_db(torch_y, ref_linear(x, w, b)) - 1.0


@pytest.mark.parametrize("block", [32, 64, 256])
def test_other_block_sizes(block, device):
    x, w, _ = _operands(24, 64, 512, torch.bfloat16, seed=block, device=device)
    y, q = gemm_quant_epilogue(x, w, fmt="int4", block=block)
    _check(y, q, x, w, None, "int4", block)


def test_many_ragged_tiles_and_grouped_order(device):
    # 16x128 tiles over M=45, N=384 (3 x 3 programs, the last row tile ragged), K=72 in 16-steps with a
    # ragged last step: every edge path of the kernel, and GROUP_M=2 reorders programs.
    x, w, b = _operands(45, 72, 384, torch.bfloat16, seed=3, bias=True, device=device)
    cfg = TileConfig(block_m=16, block_n=128, block_k=16, group_m=2, num_warps=4, num_stages=2)
    y, q = gemm_quant_epilogue(x, w, b, fmt="int5", config=cfg)
    _check(y, q, x, w, b, "int5")
    y2, q2 = gemm_quant_epilogue(x, w, b, fmt="int5")  # default tiles: the same codes for the same y
    if torch.equal(y2.cpu(), y.cpu()):
        assert_bits_equal(q2.codes, q.codes, "codes across tilings")


def test_strided_operands_and_3d_input(device):
    g = torch.Generator().manual_seed(5)
    xt = torch.randn(96, 2, 30, generator=g).to(torch.bfloat16).to(device)   # x = xt.permute: non-contiguous
    wt = (torch.randn(96, 256, generator=g) / 10).to(torch.bfloat16).to(device)  # w = wt.t(): column-major
    x = xt.permute(1, 2, 0)
    w = wt.t()
    assert not x.is_contiguous() and not w.is_contiguous()
    y, q = gemm_quant_epilogue(x, w, fmt="nf4")
    assert y.shape == (2, 30, 256) and q.shape == y.shape
    _check(y.reshape(60, 256), q, x.reshape(60, 96), w, None, "nf4")


def _tie_rows(k: int, seed: int) -> torch.Tensor:
    """[k, 256] bf16 rows. Block 0 of an even row has absmax exactly 7*s (int4's scale is then s, a power of
    two) and holds every int4 midpoint (i + 0.5)*s; of an odd row absmax 6*s and the fp4 E2M1 decision
    points {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5}*s. Block 1 holds subnormals, bf16's max, zeros."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for r in range(k):
        s = 2.0 ** (r % 9 - 6)
        if r % 2 == 0:
            qmax, special = 7.0, [(i + 0.5) for i in range(-7, 7)] + [7.0, -7.0]
        else:
            qmax, special = 6.0, [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -1.75, -5.0, 6.0]
        b0 = (torch.rand(128, generator=g) * 2 - 1) * qmax * s
        pos = torch.randperm(128, generator=g)[:len(special)]
        b0[pos] = torch.tensor(special) * s
        b1 = torch.randn(128, generator=g) * 2.0 ** (r % 7)
        if r % 5 == 0:
            b1.zero_()
        elif r % 5 == 1:
            pos = torch.randperm(128, generator=g)[:6]
            b1[pos] = torch.tensor([2.0**-130, -(2.0**-127), 2.0**-133, 1e-39, 3.3895313892515355e38, -(2.0**100)])
        rows.append(torch.cat([b0, b1]))
    return torch.stack(rows).to(torch.bfloat16)


def test_chosen_output_values_ties_subnormals_extremes(device):
    # With x = I the GEMM is exact (one product and zeros per output), so y = Wᵀ holds values we pick.
    k = 64
    target = _tie_rows(k, seed=7)
    x = torch.eye(k, dtype=torch.bfloat16).to(device)
    w = target.t().contiguous().to(device)       # [N=256, K=64]
    # Tensor cores may flush subnormal products/results to zero (the codec flushes them anyway): allow that.
    sub = (target != 0) & (target.float().abs() < 2.0**-126)
    for fmt in ("int4", "fp4_e2m1", "nf4", "int6"):
        y, q = gemm_quant_epilogue(x, w, fmt=fmt)
        y = y.cpu()
        assert_bits_equal(torch.where(sub & (y == 0), target, y), target, "y = I @ W^T is exact")
        want_c, want_s = ref.quantize_blocks(target, get_format(fmt))  # same codes either way: flushed first
        assert_bits_equal(q.codes, want_c, f"{fmt} codes")
        assert_bits_equal(q.scales, want_s, f"{fmt} scales")
    # The ties really are ties for int4: the reference's scaled values hit k + 0.5 exactly.
    sc = ref.quantize_blocks(target[0:1, :128], get_format("int4"))[1]
    assert sc.item() == 2.0**-6


def test_nan_and_overflow_rows_make_nan_blocks(device):
    x, w, _ = _operands(16, 64, 256, torch.bfloat16, seed=11, device=device)
    x[2, 7] = float("nan")
    x[5, :2] = 3e38        # 3e38 * 1 + 3e38 * 1 overflows the fp32 accumulator in every column
    w[:, :2] = 1.0
    y, q = gemm_quant_epilogue(x, w, fmt="int4")
    assert torch.isnan(y[2]).all() and not torch.isfinite(y[5]).any()
    scales = q.scales.cpu().view(16, 2)
    assert torch.isnan(scales[2]).all() and torch.isnan(scales[5]).all()
    assert torch.isfinite(scales[[0, 1, 3, 4, 6]]).all()
    want_c, want_s = ref.quantize_blocks(y.cpu(), get_format("int4"))
    assert_bits_equal(q.codes, want_c, "codes")
    assert_bits_equal(q.scales, want_s, "scales")


def test_row_chunking_for_int32_offsets_changes_nothing(device, monkeypatch):
    x, w, b = _operands(50, 16, 256, torch.float16, seed=13, bias=True, device=device)
    y, q = gemm_quant_epilogue(x, w, b, fmt="int8")
    calls = []
    real = launch.K.gemm_quant_epilogue_kernel

    class Spy:
        def __getitem__(self, grid):
            calls.append(grid)
            return real[grid]

    monkeypatch.setattr(launch, "_MAX_INDEX", 4200)   # (4200 - 16) // 256 -> 16 rows per launch; W spans 4096
    monkeypatch.setattr(launch.K, "gemm_quant_epilogue_kernel", Spy())
    y2, q2 = gemm_quant_epilogue(x, w, b, fmt="int8", config=launch._INTERP_EPILOGUE)
    assert len(calls) == 4                                      # 16 + 16 + 16 + 2 rows
    assert_bits_equal(y2, y, "y")
    assert_bits_equal(q2.codes, q.codes, "codes")
    assert_bits_equal(q2.scales, q.scales, "scales")


def test_empty_m(device):
    x, w, _ = _operands(0, 64, 256, torch.bfloat16, seed=1, device=device)
    y, q = gemm_quant_epilogue(x, w, fmt="int4")
    assert y.shape == (0, 256) and q.codes.numel() == 0 and q.scales.numel() == 0


# ---- the persistent TMA-fed kernel family ------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["int4", "int5", "nf4", "fp4_e2m1"])
def test_tma_kernel_codes_bit_exact_on_ragged_tiles(fmt, device):
    # M=45, N=384, K=72 against 16x128x16 tiles: TMA zero-fills the ragged K step and the edge tiles;
    # two persistent programs (interpreter) walk 9 tiles with a stride.
    x, w, b = _operands(45, 72, 384, torch.bfloat16, seed=17, bias=True, device=device)
    cfg = TileConfig(block_m=16, block_n=128, block_k=16, group_m=2, num_warps=4, num_stages=2)
    y, q = gemm_quant_epilogue(x, w, b, fmt=fmt, config=cfg, kernel="tma")
    _check(y, q, x, w, b, fmt)
    y2, _ = gemm_quant_epilogue(x, w, b, fmt=fmt, config=cfg, kernel="ptr")
    assert sqnr_db(y, y2) >= sqnr_floor(y.dtype)


def test_kernel_family_requests(device, monkeypatch):
    x, w, _ = _operands(16, 64, 256, torch.float16, seed=2, device=device)
    with pytest.raises(ValueError, match="kernel='tma' needs"):
        gemm_quant_epilogue(x.t().contiguous().t(), w, fmt="int4", kernel="tma")   # column-major x
    with pytest.raises(ValueError, match="not one of"):
        gemm_quant_epilogue(x, w, fmt="int4", kernel="cublas")
    monkeypatch.setenv("AGOQ_FUSION_KERNEL", "tma")
    y, q = gemm_quant_epilogue(x, w, fmt="int8")
    _check(y, q, x, w, None, "int8")
    monkeypatch.setenv("AGOQ_FUSION_KERNEL", "bogus")
    with pytest.raises(ValueError, match="AGOQ_FUSION_KERNEL"):
        gemm_quant_epilogue(x, w, fmt="int8")


def test_auto_choice_checks_agreement_and_keeps_the_faster(device, monkeypatch):
    # _pick_kernel is what the first tuned GPU launch of a shape runs; here with the interpreter's kernels
    # and a fake timer: it must refuse a tma result that disagrees, and keep the faster family otherwise.
    import triton.testing

    x, w, _ = _operands(32, 64, 256, torch.bfloat16, seed=4, device=device)
    spec = get_format("int4")
    y = torch.empty(32, 256, dtype=torch.bfloat16, device=device)
    codes = torch.empty(spec.code_bytes(y.numel()), dtype=torch.uint8, device=device)
    scales = torch.empty(spec.num_blocks(y.numel()), dtype=torch.float32, device=device)
    cfg = launch._INTERP_EPILOGUE

    def run(kernel, corrupt=False):
        def go():
            launch.gemm_quant_epilogue_into(x, w, None, spec, y, codes, scales, config=cfg, kernel=kernel)
            if corrupt:
                codes[3] ^= 0x10
        return go

    times = {}
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **kw: times[fn])
    ptr, tma = run("ptr"), run("tma")
    times.update({ptr: 2.0, tma: 1.0})
    assert launch._pick_kernel("k", ptr, tma, y, codes, scales, spec) == "tma"
    times.update({ptr: 1.0, tma: 2.0})
    assert launch._pick_kernel("k", ptr, tma, y, codes, scales, spec) == "ptr"
    want_c, _ = ref.quantize_blocks(y.cpu(), spec)
    assert_bits_equal(codes, want_c, "outputs left by the chosen kernel")
    bad = run("tma", corrupt=True)
    times[bad] = 0.5
    with pytest.raises(RuntimeError, match="disagree"):
        launch._pick_kernel("k", ptr, bad, y, codes, scales, spec)
