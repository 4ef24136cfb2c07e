"""The microscaling formats (mxfp4, mxfp8, nvfp4) through the shared Triton launcher, bit for bit against
the reference (agoq_core.formats.mx): special values, ragged tails, many tiles, bf16/fp16/fp32 inputs,
mxfp8's fused accumulate and reduce-requantize (QuanGrad), and nvfp4's refusal of both."""
from __future__ import annotations

import pytest
import torch

from agoq_core.formats import reference as ref
from agoq_core.formats.spec import get_format, microscaling_formats
from agoq_cuda import launch
from cuda_inputs import assert_bits_equal, assert_roundtrip_bitexact, poisoned_q, special_blocks

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _inputs(spec, seed: int) -> torch.Tensor:
    x = special_blocks(spec, spec.block, seed=seed)
    g = torch.Generator().manual_seed(seed)
    extra = torch.randn(5 * spec.block + 3, generator=g) * 4  # ragged tail
    extra[::9] *= 300.0  # saturation band and outlier blocks
    extra[spec.block:2 * spec.block] *= 2.0 ** -120  # tiny block (MX exponent clamp, NVFP4 s_b clamp)
    return torch.cat([x, extra])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fmt", microscaling_formats())
def test_quantize_dequantize_bitexact(fmt, dtype, device):
    spec = get_format(fmt)
    assert_roundtrip_bitexact(launch, _inputs(spec, seed=len(fmt)).to(dtype), spec, device, DTYPES)


@pytest.mark.parametrize("fmt", microscaling_formats())
@pytest.mark.parametrize("n", [1, 17, 3 * 32 + 5])
def test_odd_shapes_many_tiles(fmt, n, device):
    spec = get_format(fmt)
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 2
    codes, scales = poisoned_q(spec, n, device)
    launch.quantize(x.to(device), spec, codes, scales, rows=1, programs=3)
    want_c, want_s = ref.quantize_blocks(x, spec)
    assert_bits_equal(codes, want_c, "codes")
    assert_bits_equal(scales, want_s, "scales")


def test_nvfp4_zero_and_nonfinite_tensor(device):
    spec = get_format("nvfp4")
    for x in (torch.zeros(48), torch.tensor([1.0, float("nan")] + [0.5] * 46), torch.full((48,), 1e-30)):
        codes, scales = poisoned_q(spec, x.numel(), device)
        launch.quantize(x.to(device), spec, codes, scales)
        want_c, want_s = ref.quantize_blocks(x, spec)
        assert_bits_equal(codes, want_c, "codes")
        assert_bits_equal(scales, want_s, "scales")


def test_mxfp8_accumulate_and_reduce(device):
    spec = get_format("mxfp8")
    g = torch.Generator().manual_seed(3)
    n = 7 * 32 + 9
    a = torch.randn(n, generator=g) * 1e-2
    gr = (torch.randn(n, generator=g) * 3e-3).to(torch.bfloat16)
    c0, s0 = ref.quantize_blocks(a, spec)
    want_c, want_s = ref.accumulate(c0, s0, spec, n, gr)
    c, s = c0.clone().to(device), s0.clone().to(device)
    launch.accumulate(c, s, spec, gr.to(device))
    assert_bits_equal(c, want_c, "accumulate codes")
    assert_bits_equal(s, want_s, "accumulate scales")
    parts = [ref.quantize_blocks(torch.randn(n, generator=g) * (r + 1), spec) for r in range(3)]
    codes, scales = torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])
    want_c, want_s = ref.reduce_requantize(codes, scales, spec, n)
    co, so = poisoned_q(spec, n, device)
    launch.reduce_requantize(codes.to(device), scales.to(device), spec, n, co, so)
    assert_bits_equal(co, want_c, "reduce codes")
    assert_bits_equal(so, want_s, "reduce scales")


def test_nvfp4_refuses_blockwise_requantize(device):
    spec = get_format("nvfp4")
    c, s = ref.quantize_blocks(torch.randn(32), spec)
    with pytest.raises(ValueError, match="per-tensor scale"):
        launch.accumulate(c.to(device), s.to(device), spec, torch.randn(32, device=device))


@pytest.mark.parametrize("fmt", microscaling_formats())
def test_portable_microscaling_path_on_the_gpu(fmt, device):
    """HW=False of mx_quantize_tile (fp32 compares, NVFP4's divisions by codes.exact_div, the sign by an integer
    OR: what the interpreter and Ascend run) gives the reference's bits on a GPU too, as HW=True does."""
    if device.type != "cuda":
        pytest.skip("on CPU every test here already runs the portable path")
    spec = get_format(fmt)
    x = _inputs(spec, seed=5)
    n = x.numel()
    want_c, want_s = ref.quantize_blocks(x, spec)
    for dtype in DTYPES:
        codes, scales = poisoned_q(spec, n, device)
        launch.quantize(x.to(dtype).to(device), spec, codes, scales, hw=False)
        wc, ws = ref.quantize_blocks(x.to(dtype), spec) if dtype != torch.float32 else (want_c, want_s)
        assert_bits_equal(codes, wc, f"{fmt} {dtype} codes")
        assert_bits_equal(scales, ws, f"{fmt} {dtype} scales")
    out = torch.empty(n, dtype=torch.bfloat16, device=device)
    codes, scales = want_c.to(device), want_s.to(device)
    launch.dequantize(codes, scales, spec, out, hw=False)
    assert_bits_equal(out, ref.dequantize_blocks(want_c, want_s, spec, n, torch.bfloat16), f"{fmt} dequantize")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nvfp4_tensor_scale_kernel_matches_reference(dtype, device):
    """The launcher's one-pass absmax kernel gives the reference's [S, RN(1/S)] bit for bit: NaN, +-Inf and
    subnormals skipped, ragged tails, several pieces and programs (partial maxima), all-special tensors."""
    from agoq_core.formats.mx import nvfp4_tensor_scale
    from agoq_triton_kernels.launch import _scale_and_inverse

    spec = get_format("nvfp4")
    g = torch.Generator().manual_seed(7)
    xs = []
    for n in (1, 16, 5 * 16 + 3, 1000):
        x = torch.randn(n, generator=g) * 50
        xs.append(x)
    big = torch.randn(700, generator=g)
    big[[3, 50, 400]] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    big[99] = -123.0  # the absmax sits in the middle of a later tile
    xs += [big, torch.full((40,), float("nan")), torch.full((33,), 1e-40), torch.zeros(5)]
    for x in xs:
        x = x.to(dtype)
        want = _scale_and_inverse(nvfp4_tensor_scale(x))  # the reference's torch computation
        for programs in (None, 1, 3):
            got = launch.LAUNCHER.tensor_scale(spec, x.to(device), programs=programs)
            assert_bits_equal(got.cpu(), want, f"tensor scale n={x.numel()} programs={programs}")


def test_nvfp4_tensor_scale_takes_the_geometrys_partials_launch(device):
    """Launcher.tensor_scale launches its absmax pass with the geometry's partials_launch (agoq-cuda: 1,024 rows
    and 16 programs per SM on a GPU) where it has one; any rows and grid give the reference's bits."""
    from agoq_core.formats.mx import nvfp4_tensor_scale
    from agoq_triton_kernels.launch import Launcher, _scale_and_inverse

    calls = []

    class Few(launch.CudaGeometry):
        def partials_launch(self, dev):
            calls.append(dev)
            return 2, 3

    spec, few = get_format("nvfp4"), Launcher(Few())
    g = torch.Generator().manual_seed(11)
    for n in (16, 40 * 16 + 5, 3000):
        x = torch.randn(n, generator=g) * 20
        x[n // 2] = -700.0  # the absmax in a middle tile
        want = _scale_and_inverse(nvfp4_tensor_scale(x))
        assert_bits_equal(few.tensor_scale(spec, x.to(device)).cpu(), want, f"tensor scale n={n}, rows 2, 3 programs")
    assert len(calls) == 3


def test_cuda_partials_launch_is_persistent_on_a_gpu(monkeypatch):
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(launch, "sm_count", lambda dev: 132)
    assert launch.CudaGeometry().partials_launch(gpu) == (launch.PARTIALS_ROWS, 16 * 132) == (1024, 2112)
    assert launch.CudaGeometry().partials_launch(torch.device("cpu")) == (None, None)


def _f32_values(bits) -> torch.Tensor:
    return torch.tensor(bits, dtype=torch.int32).view(torch.float32)


def test_nvfp4_tensor_scale_step_at_its_edges(device):
    """tensor_scale_kernel (the max of the partials, S = RN(a / 2688), its flush below 2**-100, RN(1/S)) against
    the reference's torch step for absmax values where the division-free arithmetic could slip: the flush
    threshold and its neighbours, the smallest and largest fp32, quotients at exponent boundaries, exact
    multiples of 2688 and random bit patterns over every exponent."""
    from agoq_core.formats.mx import NVFP4_MIN_TENSOR_SCALE, NVFP4_SCALE_DIVISOR, nvfp4_tensor_scale_from_absmax
    from agoq_triton_kernels.launch import _scale_and_inverse

    spec = get_format("nvfp4")
    t = torch.tensor(NVFP4_SCALE_DIVISOR * NVFP4_MIN_TENSOR_SCALE, dtype=torch.float32).view(torch.int32).item()
    edges = [0x00800000, 0x00800001, t - 1, t, t + 1, 0x7F7FFFFF, 0x7F7FFFFE, 0x3F800000]
    edges += [torch.tensor(v, dtype=torch.float32).view(torch.int32).item()
              for v in (NVFP4_SCALE_DIVISOR, 2 * NVFP4_SCALE_DIVISOR, 448.0, 6.0, 2.0 ** 64, 2.0 ** -90)]
    g = torch.Generator().manual_seed(11)
    edges += torch.randint(0x00800000, 0x7F800000, (40,), generator=g, dtype=torch.int32).tolist()
    for a in _f32_values(edges):
        x = torch.zeros(32)
        x[5] = -a
        want = _scale_and_inverse(nvfp4_tensor_scale_from_absmax(a))
        got = launch.LAUNCHER.tensor_scale(spec, x.to(device))
        assert_bits_equal(got.cpu(), want, f"tensor scale at absmax {a.item()!r}")


def test_nvfp4_tensor_scale_step_over_many_partials(device):
    """More partial maxima than the finishing kernel's tile (several passes of its loop, a ragged last one), the
    largest at the start, the middle and the very end."""
    from agoq_core.formats.mx import NVFP4_MIN_TENSOR_SCALE, NVFP4_SCALE_DIVISOR, nvfp4_tensor_scale_from_absmax
    from agoq_triton_kernels import kernels as K
    from agoq_triton_kernels.launch import _scale_and_inverse

    g = torch.Generator().manual_seed(3)
    for n, where in ((2500, 0), (2500, 1234), (2500, 2499), (7, 6)):
        part = torch.rand(n, generator=g) * 100
        part[where] = 977.5
        out = torch.empty(2, device=device)
        K.tensor_scale_kernel[(1,)](part.to(device), n, out, DIVISOR=NVFP4_SCALE_DIVISOR, MIN_SCALE=NVFP4_MIN_TENSOR_SCALE,
                                    BLOCK_P=min(1024, 1 << (n - 1).bit_length()), enable_fp_fusion=False)
        want = _scale_and_inverse(nvfp4_tensor_scale_from_absmax(part.amax()))
        assert_bits_equal(out.cpu(), want, f"{n} partials, max at {where}")


def test_bench_absmax_smoke(tmp_path):
    """benchmarks/bench_absmax.py --smoke: the NVFP4 tensor-scale pass at each geometry (one program per tile and a
    persistent grid) finds torch's maximum; the report lists every variant."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    out = tmp_path / "a.json"
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_absmax.py"), "--smoke", "--json", str(out)],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, TRITON_INTERPRET="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [x for x in json.loads(out.read_text())["rows"] if x["what"] == "absmax"]
    assert {(x["rows"], x["programs"]) for x in rows} == {(4, 64), (4, 2), (16, 16), (16, 2)}
    assert all(x["exact"] for x in rows)
