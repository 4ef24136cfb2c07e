"""Fused RMSNorm + quantize-its-input (agoq_cuda.fused_norm): codes and scales bit-exact with the codec
(reference), y equal to HF LlamaRMSNorm's output within one rounding of the output dtype."""
from __future__ import annotations

import pytest
import torch

from agoq_core.formats import reference as ref
from agoq_core.formats.spec import get_format
from agoq_cuda.fused_norm import rmsnorm_quant_into, rmsnorm_quant_unsupported
from cuda_inputs import assert_bits_equal


def _hf_rmsnorm(x, w, eps):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    m = LlamaRMSNorm(x.shape[-1], eps=eps).to(x.dtype)
    with torch.no_grad():
        m.weight.copy_(w)
        return m(x)


@pytest.mark.parametrize("fmt", ["int4", "nf4", "fp4_e2m1", "int5", "mxfp4", "nvfp4", "fp8_e4m3"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("vec16", [False, True], ids=["generic", "vec16"])
def test_rmsnorm_quant_matches_unfused(fmt, dtype, vec16, device):
    spec = get_format(fmt)
    h = 256 if spec.block <= 128 else 512
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(5, h, generator=g) * 3).to(dtype)
    x[1, 3] = 200.0  # an outlier block
    w = (1 + 0.1 * torch.randn(h, generator=g)).to(dtype)
    y = torch.empty_like(x, device=device)
    codes = torch.full((spec.code_bytes(x.numel()),), 0xA5, dtype=torch.uint8, device=device)
    scales = torch.full((spec.num_blocks(x.numel()),), -7.0, device=device)
    rmsnorm_quant_into(x.to(device), w.to(device), 1e-5, spec, y, codes, scales, vec16=vec16)
    want_c, want_s = ref.quantize_blocks(x, spec)
    assert_bits_equal(codes, want_c, "codes")
    assert_bits_equal(scales, want_s, "scales")
    want_y = _hf_rmsnorm(x, w, 1e-5)
    ulp = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -20  # one rounding of the output dtype, relative
    assert torch.allclose(y.cpu().float(), want_y.float(), rtol=ulp, atol=0), (y.cpu() - want_y).abs().max()
    if dtype == torch.bfloat16:  # almost every element is bit-identical
        assert (y.cpu() != want_y).float().mean() < 0.02


@pytest.mark.parametrize("fmt", ["int4", "nf4", "mxfp4"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("programs", [1, 2, 3])
@pytest.mark.parametrize("vec16", [False, True], ids=["generic", "vec16"])
def test_prefetch_changes_no_bit(fmt, dtype, programs, vec16, device):
    """prefetch=True (the next row loaded before this one's work) against the reference and the plain path, every
    output, on both tiles; 7 rows over 1-3 persistent programs so programs see a last row, a masked-off next row and
    uneven shares."""
    spec = get_format(fmt)
    h = 256
    g = torch.Generator().manual_seed(11)
    x = (torch.randn(7, h, generator=g) * 3).to(dtype)
    x[4, 9] = -150.0
    w = (1 + 0.1 * torch.randn(h, generator=g)).to(dtype)
    outs = []
    for prefetch in (False, True):
        y = torch.full_like(x, 5.0, device=device)
        codes = torch.full((spec.code_bytes(x.numel()),), 0xA5, dtype=torch.uint8, device=device)
        scales = torch.full((spec.num_blocks(x.numel()),), -7.0, device=device)
        rinv = torch.full((7,), -1.0, device=device)
        rmsnorm_quant_into(x.to(device), w.to(device), 1e-5, spec, y, codes, scales, vec16=vec16, rinv=rinv,
                           programs=programs, prefetch=prefetch)
        outs.append((y.cpu(), codes.cpu(), scales.cpu(), rinv.cpu()))
    want_c, want_s = ref.quantize_blocks(x, spec)
    assert_bits_equal(outs[1][1], want_c, "codes")
    assert_bits_equal(outs[1][2], want_s, "scales")
    for other in outs[1:]:
        for name, a, b in zip(("y", "codes", "scales", "rinv"), outs[0], other):
            assert_bits_equal(b, a, name)
        assert (other[3] > 0).all()  # every row written


@pytest.mark.parametrize("fmt,prefetch,pf_words", [
    ("int8", False, ""), ("int5", False, ""), ("fp8_e4m3", False, ""), ("int4", False, ""), ("int4", True, ""),
    ("int4", True, "none"), ("nf4", True, ""), ("mxfp4", True, "")])
@pytest.mark.parametrize("h", [256, 2048, 4096])
def test_bf16_words_change_no_bit(fmt, prefetch, pf_words, h, device, monkeypatch):
    """The 16-lane tile reads bf16 x as int32 words (kernels._load16_words) wherever every thread owns its own 16
    elements (launch.words_unreplicated: 2,048 and 4,096 columns on a GPU; not 256, whose 16 groups are fewer than
    the 128 threads: that tile gave wrong codes on an H100 with word loads, docs/bench/codecs.md), and takes the block
    absmax from the words (MAX16) where the device has a halfword-wise max; the prefetching loop reads words only
    with MAX16. Every output equals the int16 view's bit for bit, and the codes and scales the reference's, with an
    outlier, a non-finite block and an all-zero block among the rows."""
    import agoq_cuda.fused_norm as fn
    from agoq_cuda.launch import norm_prefetch_words, words_unreplicated

    monkeypatch.setenv("AGOQ_CUDA_NORM_PREFETCH_WORDS", pf_words)  # "": the table; "none": the int16 view

    seen = []
    launch = fn.LAUNCHER.launch

    def spy(kernel, grid, args, consts):
        seen.append((bool(consts.get("WORDS")), bool(consts.get("MAX16"))))
        return launch(kernel, grid, args, consts)

    monkeypatch.setattr(fn.LAUNCHER, "launch", spy)
    spec = get_format(fmt)
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(6, h, generator=g) * 2).to(torch.bfloat16)
    x[1, 5] = 300.0
    x[2, 40] = float("inf")
    x[3, : spec.block] = 0.0
    x[4, 7] = -310.0  # a negative peak in an odd half, beside a positive almost as large
    x[4, 8] = 309.0
    w = (1 + 0.1 * torch.randn(h, generator=g)).to(torch.bfloat16)
    outs = []
    for words in (True, False):
        monkeypatch.setattr(fn.LAUNCHER.geometry, "bf16_words", words)
        y = torch.full_like(x, 5.0, device=device)
        codes = torch.full((spec.code_bytes(x.numel()),), 0xA5, dtype=torch.uint8, device=device)
        scales = torch.full((spec.num_blocks(x.numel()),), -7.0, device=device)
        rmsnorm_quant_into(x.to(device), w.to(device), 1e-5, spec, y, codes, scales, vec16=True, prefetch=prefetch)
        outs.append((y.cpu(), codes.cpu(), scales.cpu()))
    warps = 4 if h <= 2048 else 8
    owned = words_unreplicated(spec.block, h // spec.block, warps, torch.device(device))
    assert owned == (device.type == "cpu" or h >= 2048)
    packed = owned and fn.LAUNCHER.geometry.packs_max(torch.device(device))
    words = owned and (not prefetch or (packed and norm_prefetch_words(fmt)))
    assert seen == [(words, words and packed), (False, False)]
    want_c, want_s = ref.quantize_blocks(x, spec)
    assert_bits_equal(outs[0][1], want_c, "codes")
    assert_bits_equal(outs[0][2], want_s, "scales")
    for name, a, b in zip(("y", "codes", "scales"), outs[1], outs[0]):
        assert_bits_equal(b, a, name)


def test_unsupported_shapes_are_explained():
    spec = get_format("int4")
    assert "power-of-two" in rmsnorm_quant_unsupported(torch.zeros(2, 384), torch.zeros(384), spec)
    assert "weight" in rmsnorm_quant_unsupported(torch.zeros(2, 256), torch.zeros(128), spec)
    assert rmsnorm_quant_unsupported(torch.zeros(2, 4096, dtype=torch.bfloat16),
                                     torch.zeros(4096, dtype=torch.bfloat16), spec) is None


def _torch_cuda_order_rmsnorm(x, w, eps):
    """HF LlamaRMSNorm with the sum of squares in the order of torch's CUDA reduction kernel (ATen
    Reduce.cuh, rows of H > 128 fp32 elements: vector loads of 4, 32 lanes per row, 4 sequential
    accumulators per lane, then ((a0 + a1) + a2) + a3, then the warp's shfl_down tree) and a correctly
    rounded 1/sqrt. Written from that description with torch ops on CPU, not from the kernel."""
    xf = x.float()
    m, h = xf.shape
    lanes = min(h // 4, 32)
    sq = (xf * xf).view(m, h // (4 * lanes), lanes, 4)
    acc = torch.zeros(m, lanes, 4)
    for k in range(sq.shape[1]):
        acc = acc + sq[:, k]
    s = ((acc[..., 0] + acc[..., 1]) + acc[..., 2]) + acc[..., 3]
    while s.shape[1] > 1:
        s = s.view(m, -1, 2)
        s = s[..., 0] + s[..., 1]
    # Correctly rounded sqrt: through fp64 (exact to round once more: 53 >= 2 * 24 + 2). torch's own fp32
    # sqrt on CPU is not correctly rounded everywhere (torch 2.13 on AMD EPYC: ~17% of values 1 ulp off).
    r = 1.0 / torch.sqrt((s / h + eps).double()).float()
    return w * (xf * r).to(x.dtype)


@pytest.mark.parametrize("h", [256, 2048])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("vec16", [False, True], ids=["generic", "vec16"])
def test_torch_cuda_order_variant_is_bit_exact(h, dtype, vec16, device):
    """The variant LAAQ tries first on a GPU computes torch's CUDA summation order (here with the
    correctly rounded 1/sqrt the interpreter has); y equals the emulation bit for bit."""
    spec = get_format("nf4")
    g = torch.Generator().manual_seed(11)
    x = (torch.randn(16, h, generator=g) * torch.rand(16, 1, generator=g) * 8).to(dtype)
    w = (1 + 0.1 * torch.randn(h, generator=g)).to(dtype)
    y = torch.empty_like(x, device=device)
    codes = torch.empty(spec.code_bytes(x.numel()), dtype=torch.uint8, device=device)
    scales = torch.empty(spec.num_blocks(x.numel()), device=device)
    rmsnorm_quant_into(x.to(device), w.to(device), 1e-5, spec, y, codes, scales, variant="torch_cuda_rn", vec16=vec16)
    assert_bits_equal(y, _torch_cuda_order_rmsnorm(x, w, 1e-5), "y")
    want_c, want_s = ref.quantize_blocks(x, spec)
    assert_bits_equal(codes, want_c, "codes")


def test_order_matters(device):
    """Teeth: on rows where the sum of squares depends on the order, the tree variant differs from the emulation."""
    spec = get_format("int8")
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(16, 4096, generator=g) * torch.logspace(-3, 3, 4096)).to(torch.float32)
    w = torch.ones(4096)
    outs = {}
    for v in ("tree", "torch_cuda_rn"):
        y = torch.empty_like(x, device=device)
        rmsnorm_quant_into(x.to(device), w.to(device), 1e-5, spec, y,
                           torch.empty(spec.code_bytes(x.numel()), dtype=torch.uint8, device=device),
                           torch.empty(spec.num_blocks(x.numel()), device=device), variant=v)
        outs[v] = y.cpu()
    want = _torch_cuda_order_rmsnorm(x, w, 1e-5)
    assert torch.equal(outs["torch_cuda_rn"], want)
    assert not torch.equal(outs["tree"], want)


def test_run_fused_norm_script_smoke():
    """benchmarks/run_fused_norm.py (the Nsight Compute target of gpu_session.sh's ncu-norm stage) launches the fused
    norm and reports what it ran (the interpreter; the kernel's numerics are the other tests' business)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "run_fused_norm.py"), "--smoke", "--format", "int4",
                        "--calls", "1"], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, TRITON_INTERPRET="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rmsnorm_quant int4 8x256: 1 launches" in r.stdout


def test_bench_fused_host_smoke(tmp_path):
    """benchmarks/bench_fused_host.py: every fused launcher reaches its (stubbed) launch on every call, and the
    report has a positive host time per launcher."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    out = tmp_path / "h.json"
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_fused_host.py"), "--calls", "20", "--repeats",
                        "2", "--json", str(out)], capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [x["launcher"] for x in rows] == ["rmsnorm_quant_into", "silu_mul_quant_into", "silu_mul_backward_into"]
    assert all(x["us_per_call"] > 0 for x in rows)


def test_sweep_norm_geometry_smoke(tmp_path):
    """benchmarks/sweep_norm_geometry.py --smoke: every combination of tile, prefetch and register-cap setting runs
    (the interpreter), and each one writes the same codes, scales and y as the first of its tile."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    out = tmp_path / "s.json"
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "sweep_norm_geometry.py"), "--smoke", "--formats",
                        "mxfp4", "--prefetch", "0", "1", "--maxnreg", "auto", "rmsnorm_quant:mxfp4=64",
                        "--programs-per-sm", "1", "--json", str(out)], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, TRITON_INTERPRET="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    got = {(x["tile"], x["prefetch"], x["maxnreg"]) for x in rows}
    assert got == {(t, p, c) for t in ("generic", "vec16") for p in (0, 1) for c in ("auto", "rmsnorm_quant:mxfp4=64")}
    assert all(x["same_bits"] for x in rows)
    assert "AGOQ_CUDA_MAXNREG" not in os.environ


def test_norm_programs_defaults(monkeypatch):
    """The fused norm's persistent grid: NORM_PROGRAMS_PER_SM per SM (nf4 on the 16-lane tile: 16; the rest 8), at
    most one program per token row; two in the interpreter."""
    from agoq_cuda import launch as L

    monkeypatch.setattr(L, "sm_count", lambda dev: 132)
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert L.norm_programs(get_format("nf4"), gpu, True, 16384) == 2112
    assert L.norm_programs(get_format("nf4"), gpu, False, 16384) == 1056
    assert L.norm_programs(get_format("int4"), gpu, True, 16384) == 1056
    assert L.norm_programs(get_format("int4"), gpu, False, 300) == 300
    assert L.norm_programs(get_format("int4"), cpu, False, 16384) == 2
    assert L.norm_programs(get_format("int4"), cpu, False, 1) == 1


def test_norm_prefetch_defaults(monkeypatch):
    """The prefetch default: the NORM_PREFETCH formats of the tile on a GPU, never in the interpreter;
    AGOQ_CUDA_NORM_PREFETCH overrides it, and a value it cannot read is an error, not a silent default."""
    from agoq_cuda.launch import NORM_PREFETCH, norm_prefetch

    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    monkeypatch.delenv("AGOQ_CUDA_NORM_PREFETCH", raising=False)
    fmts = ("int4", "nf4", "fp4_e2m1", "mxfp4", "int8")
    assert {f for f in fmts if norm_prefetch(get_format(f), gpu)} == set(NORM_PREFETCH[False]) \
        == {"int4", "nf4", "fp4_e2m1", "mxfp4"}
    assert {f for f in fmts if norm_prefetch(get_format(f), gpu, vec16=True)} == set(NORM_PREFETCH[True]) \
        == {"int4", "nf4", "fp4_e2m1", "mxfp4"}
    assert not norm_prefetch(get_format("int4"), cpu)
    monkeypatch.setenv("AGOQ_CUDA_NORM_PREFETCH", "1")
    assert norm_prefetch(get_format("int8"), gpu) and norm_prefetch(get_format("int8"), gpu, vec16=True)
    assert not norm_prefetch(get_format("int8"), cpu)
    monkeypatch.setenv("AGOQ_CUDA_NORM_PREFETCH", "0")
    assert not norm_prefetch(get_format("int4"), gpu) and not norm_prefetch(get_format("nf4"), gpu, vec16=True)
    monkeypatch.setenv("AGOQ_CUDA_NORM_PREFETCH", "maybe")
    with pytest.raises(ValueError, match="AGOQ_CUDA_NORM_PREFETCH"):
        norm_prefetch(get_format("int4"), gpu)
