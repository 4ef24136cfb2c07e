"""Issue 20 risk 5: agoq-ascend writes and reads 5/6-bit pack groups with one access contiguous per block
(the kernels' CONTIG constexpr) instead of one store/load per byte with a stride of 5/3 bytes, which
Triton-Ascend can only move element by element. The bytes must not change: the format spec and the golden
files fix them (the conformance suite checks them against the golden set on every backend).

Here, on the agoq-ascend launch path in Triton's interpreter: CONTIG is what agoq-ascend launches and
agoq-cuda does not; both layouts store identical bytes (guard bytes around the buffer untouched) for whole
and ragged tensors; the contiguous load decodes every byte value like the reference; and the frontend
compile script checks the constexprs agoq-ascend launches and flags a strided global-memory view.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from agoq_ascend.geometry import DeviceProps
from agoq_ascend.launch import AscendGeometry
from agoq_core.formats import reference as ref
from agoq_core.formats.spec import get_format
from agoq_triton_kernels.launch import Launcher, is_interpreted

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "frontend_compile.py"
PROPS = DeviceProps(vector_cores=3)


class _Strided(AscendGeometry):
    """agoq-ascend's geometry with the strided per-byte packing (CUDA's layout): the comparison point."""

    contig_pack = False


@pytest.fixture(autouse=True)
def _interpreted():
    if not is_interpreted():
        pytest.skip("needs Triton's CPU interpreter (TRITON_INTERPRET=1 before the kernels are imported)")


def test_agoq_ascend_launches_contiguous_groups_and_agoq_cuda_does_not():
    spec = get_format("int5")
    cpu = torch.device("cpu")
    assert Launcher(AscendGeometry(PROPS))._format(spec, cpu, None)["CONTIG"] is True
    assert "CONTIG" not in Launcher(_Strided(PROPS))._format(spec, cpu, None)
    cuda_launch = pytest.importorskip("agoq_cuda.launch")
    assert "CONTIG" not in Launcher(cuda_launch.CudaGeometry())._format(spec, cpu, False)  # CUDA: unchanged


def _guarded(nbytes: int, guard: int = 16) -> torch.Tensor:
    return torch.full((nbytes + 2 * guard,), 0xA5, dtype=torch.uint8)


@pytest.mark.parametrize("fmt", ["int5", "int6"])
@pytest.mark.parametrize("block,n", [(128, 128 * 7), (128, 128 * 2 + 37), (32, 29), (264, 264 * 3 + 4), (64, 1)])
def test_contiguous_and_strided_layouts_store_the_same_bytes(fmt, block, n):
    spec = get_format(fmt).with_block(block)
    g = torch.Generator().manual_seed(block * 1000 + n)
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-6, 6, (n,), generator=g).float())
    d = torch.randn(n, generator=g)
    nb, cb = spec.num_blocks(n), spec.code_bytes(n)
    out = {}
    for name, geo in (("contig", AscendGeometry(PROPS)), ("strided", _Strided(PROPS))):
        la = Launcher(geo)
        buf, scales = _guarded(cb), torch.empty(nb)
        codes = buf[16:16 + cb]
        la.quantize(x, spec, codes, scales, rows=1 if n < 4 * block else 2)
        q = (buf.clone(), scales.clone())
        la.accumulate(codes, scales, spec, d)
        out[name] = (q, (buf.clone(), scales.clone()))
    (qc, ac), (qs, as_) = out["contig"], out["strided"]
    assert torch.equal(qc[0], qs[0]) and torch.equal(qc[1], qs[1])
    assert torch.equal(ac[0], as_[0]) and torch.equal(ac[1], as_[1])
    assert (qc[0][:16] == 0xA5).all() and (qc[0][16 + cb:] == 0xA5).all()  # nothing written outside the codes
    want_c, want_s = ref.quantize_blocks(x, spec)  # and both are the format's bytes
    assert torch.equal(qc[0][16:16 + cb], want_c) and torch.equal(qc[1], want_s)
    want_c, want_s = ref.accumulate(want_c, want_s, spec, n, d)
    assert torch.equal(ac[0][16:16 + cb], want_c) and torch.equal(ac[1], want_s)


@pytest.mark.parametrize("fmt", ["int5", "int6"])
def test_contiguous_load_decodes_every_byte_value_like_the_reference(fmt):
    spec = get_format(fmt).with_block(32)
    n = 32 * 40 + 13  # ragged last block
    codes = torch.arange(spec.code_bytes(n), dtype=torch.int64).mul(97).remainder(256).to(torch.uint8)
    assert set(codes.tolist()) == set(range(256))
    scales = torch.rand(spec.num_blocks(n), generator=torch.Generator().manual_seed(5)) + 0.5
    got = torch.empty(n)
    Launcher(AscendGeometry(PROPS)).dequantize(codes, scales, spec, got)
    assert torch.equal(got, ref.dequantize_blocks(codes, scales, spec, n, torch.float32))
    # reduce_requantize reads two ranks' codes through the same load and stores through the same store
    w2c, w2s = torch.stack([codes, codes.flip(0)]), torch.stack([scales, scales.flip(0)])
    out_c, out_s = torch.empty_like(codes), torch.empty_like(scales)
    Launcher(AscendGeometry(PROPS)).reduce_requantize(w2c, w2s, spec, n, out_c, out_s)
    want = ref.reduce_requantize(w2c, w2s, spec, n)
    assert torch.equal(out_c, want[0]) and torch.equal(out_s, want[1])


def _frontend_script():
    spec = importlib.util.spec_from_file_location("agoq_frontend_compile", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_frontend_compile_script_compiles_what_agoq_ascend_launches():
    fc = _frontend_script()
    for ragged in (False, True):
        consts = fc.launch_constexprs("int5", ragged)
        assert consts["CONTIG"] is AscendGeometry.contig_pack and consts["NF4_LUT"] is AscendGeometry.nf4_lut
        assert consts["HW"] is AscendGeometry(PROPS).hw(torch.device("cpu"), None) and consts["RAGGED"] is ragged


def test_frontend_compile_flags_strided_global_memory_views():
    fc = _frontend_script()
    old = ("%reinterpret_cast_55 = memref.reinterpret_cast %arg3 to offset: [%259], sizes: [8, 32], strides: [96, 3] "
           ": memref<?xi8> to memref<8x32xi8, strided<[96, 3], offset: ?>>")
    new = ("%reinterpret_cast_62 = memref.reinterpret_cast %arg3 to offset: [%263], sizes: [8, 32, 4], strides: "
           "[96, 3, 1] : memref<?xi8> to memref<8x32x4xi8, strided<[96, 3, 1], offset: ?>>")
    assert fc.strided_gm_views(old) == ["sizes [8, 32] strides [96, 3]"]
    assert fc.strided_gm_views(new) == []
