"""The 16-lane tile of agoq-cuda's codec kernels (kernels.VEC16: a thread owns 16 consecutive elements and
packs/unpacks its codes in registers into int32/int16 words) against the reference, bit for bit: special
value blocks (zero, non-finite, ties, tiny scales), blocks of 16 and the defaults, and the launcher's choice
of tile: aligned code buffers take VEC16, a code buffer at an odd address (or an odd rank stride) the
generic tile, with the same bits."""
from __future__ import annotations

import pytest
import torch

from agoq_core.formats import reference as ref
from agoq_core.formats.spec import get_format
from agoq_cuda import launch
from cuda_inputs import assert_bits_equal, special_blocks

# (format, block, code buffer at an odd address): every packing width, both tiles
CASES = [("int4", None, False), ("int5", None, False), ("int5", 16, True), ("int6", None, True), ("int6", 16, False),
         ("nf4", 16, False), ("nf4", None, False), ("fp4_e2m1", None, False), ("mxfp4", None, False),
         ("fp8_e4m3", None, True), ("mxfp8", None, False)]


@pytest.fixture
def vec16_seen(monkeypatch):
    """The VEC16 constexpr of every launch of the test."""
    seen = []
    run = launch.LAUNCHER._run

    def spy(kernel, la, args, consts, replan=None):
        seen.append(bool(consts(la).get("VEC16")))
        return run(kernel, la, args, consts, replan)

    monkeypatch.setattr(launch.LAUNCHER, "_run", spy)
    monkeypatch.setattr(launch.LAUNCHER, "fast", False)  # on a GPU the fast path would launch past the spy
    # the tile itself is under test: asked for in every op (the per-(op, format) defaults would pick the generic
    # tile for some dequantizes); cached plans made under other rules are set aside
    monkeypatch.setattr(launch.LAUNCHER.geometry, "vec16_rules", launch.parse_vec16("1"))
    monkeypatch.setattr(launch.LAUNCHER, "_plans", {})
    return seen


def _spec(fmt, block):
    spec = get_format(fmt)
    return spec if block is None or spec.scale_kind != "absmax" else get_format(fmt, block)


def _odd(t: torch.Tensor, odd: bool) -> torch.Tensor:
    """t's bytes, copied to an address that is odd when ``odd`` (a view into a bigger buffer)."""
    if not odd:
        return t.clone()
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    buf[1:] = t
    return buf[1:]


@pytest.mark.parametrize("fmt,block,odd", CASES, ids=[f"{f}-b{b or 'default'}-{'odd' if o else 'aligned'}"
                                                     for f, b, o in CASES])
def test_quantize_dequantize_accumulate(fmt, block, odd, vec16_seen, device):
    spec = _spec(fmt, block)
    x = special_blocks(spec, spec.block, seed=spec.block)
    x = x[: x.numel() // spec.block * spec.block]  # whole blocks: one launch each
    n = x.numel()
    want_c, want_s = ref.quantize_blocks(x, spec)
    codes = _odd(torch.zeros(spec.code_bytes(n), dtype=torch.uint8, device=device), odd)
    scales = torch.empty(spec.num_blocks(n), device=device)
    launch.quantize(x.to(device), spec, codes, scales)
    assert_bits_equal(codes.cpu(), want_c, "codes")
    assert_bits_equal(scales.cpu(), want_s, "scales")
    out = torch.empty(n, dtype=torch.bfloat16, device=device)
    launch.dequantize(codes, scales, spec, out)
    assert_bits_equal(out.cpu(), ref.dequantize_blocks(want_c, want_s, spec, n, torch.bfloat16), "dequantized")
    g = (torch.randn(n, generator=torch.Generator().manual_seed(1)) * 1e-3).to(torch.bfloat16)
    launch.accumulate(codes, scales, spec, g.to(device))
    acc_c, acc_s = ref.accumulate(want_c, want_s, spec, n, g)
    assert_bits_equal(codes.cpu(), acc_c, "accumulated codes")
    assert_bits_equal(scales.cpu(), acc_s, "accumulated scales")
    # packed words (int32/int16) at an odd address take the generic tile; 8-bit codes are read as bytes (dequantize
    # keeps the tile) but written as int32 words (quantize and accumulate do not)
    assert vec16_seen == ([not odd, True, not odd] if spec.bits == 8 else [not odd] * 3)


@pytest.mark.parametrize("fmt", ["int4", "int5", "nf4", "fp4_e2m1", "mxfp4", "fp8_e4m3", "mxfp8", "nvfp4"])
def test_bf16_input_words(fmt, vec16_seen, device):
    """bf16 input on the 16-lane tile moves as int32 words of two elements (kernels._load16_raw / _widen16): the
    codes and scales of quantize, and of accumulate's bf16 gradient, equal the reference's bit for bit, with
    non-finite, zero and tiny blocks among the Gaussian ones (an odd-element / even-element mix-up would move
    every other value)."""
    spec = get_format(fmt)
    x = special_blocks(spec, spec.block, seed=7)
    x = x[: x.numel() // spec.block * spec.block].to(torch.bfloat16)
    n = x.numel()
    want_c, want_s = ref.quantize_blocks(x, spec)
    codes = torch.zeros(spec.code_bytes(n), dtype=torch.uint8, device=device)
    scales = torch.empty(spec.num_blocks(n), device=device)
    launch.quantize(x.to(device), spec, codes, scales)
    assert_bits_equal(codes.cpu(), want_c, "codes")
    assert_bits_equal(scales.cpu(), want_s, "scales")
    if not spec.tensor_scaled:  # accumulate takes block-local formats (nvfp4's scale is per tensor too)
        g = torch.randn(n, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
        launch.accumulate(codes, scales, spec, g.to(device))
        acc_c, acc_s = ref.accumulate(want_c, want_s, spec, n, g)
        assert_bits_equal(codes.cpu(), acc_c, "accumulated codes")
        assert_bits_equal(scales.cpu(), acc_s, "accumulated scales")
    assert vec16_seen and all(vec16_seen)


@pytest.mark.parametrize("odd_stride", [False, True], ids=["stride16", "odd-stride"])
@pytest.mark.parametrize("fmt", ["fp8_e4m3", "mxfp8"])
def test_reduce_requantize(fmt, odd_stride, vec16_seen, device):
    spec = get_format(fmt)
    g = torch.Generator().manual_seed(5)
    nc = 9 * spec.block
    w = 3
    parts = [ref.quantize_blocks(torch.randn(nc, generator=g) * 10.0 ** -r, spec) for r in range(w)]
    cin = torch.stack([c for c, _ in parts])
    sin = torch.stack([s for _, s in parts])
    if odd_stride:  # rank rows one byte apart from a multiple of 16
        wide = torch.zeros(w, cin.shape[1] + 1, dtype=torch.uint8)
        wide[:, :-1] = cin
        cdev = wide.to(device)[:, :-1]
    else:
        cdev = cin.to(device)
    cout = torch.empty(spec.code_bytes(nc), dtype=torch.uint8, device=device)
    sout = torch.empty(spec.num_blocks(nc), device=device)
    launch.reduce_requantize(cdev, sin.to(device), spec, nc, cout, sout)
    want_c, want_s = ref.reduce_requantize(cin, sin, spec, nc)
    assert_bits_equal(cout.cpu(), want_c, "codes")
    assert_bits_equal(sout.cpu(), want_s, "scales")
    assert vec16_seen == [True]  # 8-bit codes read as bytes (any stride), written to an aligned buffer


@pytest.mark.parametrize("programs", [1, 3])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("fmt", ["int4", "int5", "int6", "nf4", "fp4_e2m1", "mxfp4", "fp8_e4m3", "mxfp8", "nvfp4"])
def test_quantize_prefetch(fmt, dtype, programs, device):
    """The prefetching quantize (persistent programs that load their next tile first, kernels.quantize_kernel's
    PREFETCH) against the reference: a program walks several tiles (2-block tiles, 1 or 3 programs for 11+ tiles),
    the last one short, so the final prefetch reads past the end (masked)."""
    from agoq_triton_kernels.launch import Launcher

    spec = get_format(fmt)
    x = special_blocks(spec, spec.block, seed=11)
    nb = x.numel() // spec.block
    nb -= 1 - nb % 2  # an odd number of whole blocks: the last 2-block tile is short
    x = x[: nb * spec.block].to(dtype)
    n = x.numel()
    assert nb >= 11, nb
    want_c, want_s = ref.quantize_blocks(x, spec)
    la = Launcher(launch.CudaGeometry(vec16="1", quant_prefetch=True))
    la.fast = False
    seen = []
    run = la._run

    def spy(kernel, lau, args, consts, replan=None):
        seen.append((bool(consts(lau).get("PREFETCH")), lau.grid, lau.n_tiles))
        return run(kernel, lau, args, consts, replan)

    la._run = spy
    codes = torch.zeros(spec.code_bytes(n), dtype=torch.uint8, device=device)
    scales = torch.empty(nb, device=device)
    la.quantize(x.to(device), spec, codes, scales, rows=2, programs=programs)
    assert_bits_equal(codes.cpu(), want_c, "codes")
    assert_bits_equal(scales.cpu(), want_s, "scales")
    main = seen[-1]  # nvfp4's tensor-scale pass launches first
    assert main == (True, programs, -(-nb // 2)), seen


def test_quant_prefetch_switch(monkeypatch):
    """AGOQ_CUDA_QUANT_PREFETCH: off by default and in the interpreter whatever it says (the table is empty until a
    GPU times it); a value other than 1/0/auto fails when the geometry is made, not at the first quantize."""
    spec = get_format("int4")
    cpu = torch.device("cpu")
    monkeypatch.setenv("AGOQ_CUDA_QUANT_PREFETCH", "1")
    g = launch.CudaGeometry(vec16="1")
    assert not g.plan("quantize", spec, 4096, torch.bfloat16, cpu, rows=None, programs=None).prefetch
    forced = launch.CudaGeometry(vec16="1", quant_prefetch=True)
    assert forced.plan("quantize", spec, 4096, torch.bfloat16, cpu, rows=None, programs=None).prefetch
    assert not forced.plan("dequantize", spec, 4096, torch.bfloat16, cpu, rows=None, programs=None).prefetch
    assert not launch.CudaGeometry(vec16="0", quant_prefetch=True).plan(
        "quantize", spec, 4096, torch.bfloat16, cpu, rows=None, programs=None).prefetch  # generic tile: none
    monkeypatch.setenv("AGOQ_CUDA_QUANT_PREFETCH", "maybe")
    with pytest.raises(ValueError, match="AGOQ_CUDA_QUANT_PREFETCH"):
        launch.CudaGeometry()


def test_sweep_quant_geometry_smoke(tmp_path):
    """benchmarks/sweep_quant_geometry.py --smoke: the default, persistent and prefetching launches run (the
    interpreter) and write the default launch's codes and scales."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    out = tmp_path / "s.json"
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "sweep_quant_geometry.py"), "--smoke", "--formats",
                        "nf4", "int5", "--programs-per-sm", "1", "--json", str(out)], capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, TRITON_INTERPRET="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(x["format"], x["variant"]) for x in rows] == [
        (f, v) for f in ("nf4", "int5") for v in ("default", "persistent 1/SM", "prefetch 1/SM")]
    assert all(x["same_bits"] for x in rows)
