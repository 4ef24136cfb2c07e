"""The one host launcher (agoq_triton_kernels.launch) with a stand-in geometry: what it hands every
kernel whatever the plugin (views, pieces, the ragged tail, fp contraction off), and what it takes from
the geometry (grid, tile, BLOCK_P, options, HW, NF4 tables). The kernels are replaced by recorders, so
this runs in milliseconds; the real launches are checked bit for bit by the cuda and ascend tests and
the conformance suite."""
from __future__ import annotations

import pytest
import torch

from agoq_core.formats.spec import get_format
from agoq_triton_kernels import kernels as K
from agoq_triton_kernels import launch as L


class _Recorder:
    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kw: self.calls.append((grid, args, kw))


class _Geometry:
    who = "agoq-test"
    float64_via_float32 = False

    def __init__(self, nf4_lut: bool):
        self.nf4_lut = nf4_lut

    def hw(self, device, requested):
        if requested:
            raise ValueError("no hardware conversions here")
        return False

    def plan(self, op, spec, numel, io_dtype, device, *, rows, programs):
        r = rows or 2
        n_tiles = -(-spec.num_blocks(numel) // r)
        return L.Launch(grid=programs or 3, rows=r, block_p=64, n_tiles=n_tiles, options={"flavour": op},
                        plan=(op, numel, io_dtype))


@pytest.fixture
def kernels(monkeypatch):
    recs = {name: _Recorder() for name in ("quantize_kernel", "dequantize_kernel", "accumulate_kernel",
                                           "reduce_requantize_kernel")}
    for name, rec in recs.items():
        monkeypatch.setattr(K, name, rec)
    monkeypatch.setattr(L, "MAX_CHUNK_ELEMENTS", 4 * 24)  # pieces of 4 blocks
    return recs


def test_pieces_views_and_contract_options(kernels):
    spec = get_format("int5", 24)
    n = 9 * 24 + 5  # 9 whole blocks -> pieces of 4, 4, 1, then the ragged tail
    la = L.Launcher(_Geometry(nf4_lut=False))
    x = torch.zeros(n, dtype=torch.bfloat16)
    codes = torch.empty(spec.code_bytes(n), dtype=torch.uint8)
    scales = torch.empty(spec.num_blocks(n))
    la.quantize(x, spec, codes, scales, programs=5)
    calls = kernels["quantize_kernel"].calls
    assert [c[2]["RAGGED"] for c in calls] == [False, False, False, True]
    assert [c[1][3] for c in calls] == [96, 96, 24, 5]            # elements per launch
    assert [c[1][4] for c in calls] == [4, 4, 1, 1]               # blocks per launch
    assert [c[1][0].numel() for c in calls] == [96, 96, 24, 5]
    assert [c[1][1].numel() for c in calls] == [60, 60, 15, 5]    # 15 code bytes per block; a tail group: 5
    for grid, args, kw in calls:
        assert grid == (5,) and kw["enable_fp_fusion"] is False and kw["flavour"] == "quantize"
        assert args[0].dtype == torch.int16 and args[1].dtype == torch.int8  # bf16 bits, codes as int8
        assert (kw["BLOCK_P"], kw["ROWS"], kw["HW"], kw["NF4_LUT"], kw["elut_ptr"]) == (64, 2, False, False, None)
        assert (kw["BITS"], kw["BLOCK"], kw["X_FLOAT"]) == (5, 24, 1)
    assert la.last_plans == [("quantize", m, torch.bfloat16) for m in (96, 96, 24, 5)]


def test_nf4_tables_follow_the_geometry(kernels):
    spec = get_format("nf4", 32)
    codes = torch.empty(spec.code_bytes(64), dtype=torch.uint8)
    scales = torch.empty(spec.num_blocks(64))
    L.Launcher(_Geometry(nf4_lut=True)).accumulate(codes, scales, spec, torch.zeros(64))
    (_, args, kw), = kernels["accumulate_kernel"].calls
    assert kw["NF4_LUT"] is True and kw["elut_ptr"].dtype == torch.int64
    assert torch.equal(args[2], L.nf4_lut(torch.device("cpu")))


def test_bad_calls_fail_before_any_launch(kernels):
    spec = get_format("int8", 32)
    la = L.Launcher(_Geometry(nf4_lut=False))
    codes = torch.empty(64, dtype=torch.uint8)
    scales = torch.empty(2)
    with pytest.raises(TypeError, match="agoq-test"):
        la.quantize(torch.zeros(64, dtype=torch.float64), spec, codes, scales)  # this geometry takes no float64
    with pytest.raises(ValueError, match="no hardware conversions"):
        la.dequantize(codes, scales, spec, torch.empty(64), hw=True)
    with pytest.raises(ValueError, match="larger than the kernels' maximum"):
        la.quantize(torch.zeros(64), spec.with_block(1 << 14), codes[:64], scales[:1])
    with pytest.raises(ValueError, match=r"want codes\[W, B\]"):
        la.reduce_requantize(codes, scales, spec, 64, codes, scales)
    assert not any(r.calls for r in kernels.values())


def test_plan_is_the_codec_calls_plan(kernels):
    """Launcher.plan: what a codec call of the same size plans, cached only where the geometry says plans are
    pure, so fused kernels outside the module launch like a codec without reaching into the launcher."""
    spec = get_format("int4", 32)
    geom = _Geometry(nf4_lut=False)
    la = L.Launcher(geom)
    a = la.plan("quantize", spec, 64, torch.bfloat16, torch.device("cpu"), programs=5)
    assert (a.grid, a.rows, a.plan) == (5, 2, ("quantize", 64, torch.bfloat16))
    assert la.plan("quantize", spec, 64, torch.bfloat16, torch.device("cpu"), programs=5) is not a  # impure: replanned
    geom.pure_plans = True
    b = la.plan("quantize", spec, 64, torch.bfloat16, torch.device("cpu"), programs=5, rows=4)
    assert b.rows == 4 and la.plan("quantize", spec, 64, torch.bfloat16, torch.device("cpu"), programs=5, rows=4) is b
    assert la.plan("quantize", spec, 128, torch.bfloat16, torch.device("cpu"), programs=5, rows=4) is not b
    assert la.encode_table(get_format("nf4", 32), torch.device("cpu")) is None
    assert L.Launcher(_Geometry(nf4_lut=True)).encode_table(get_format("nf4", 32), torch.device("cpu")).dtype \
        == torch.int64
