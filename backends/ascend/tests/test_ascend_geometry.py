"""Launch-geometry rules (plain Python, no hardware): grid <= 65,535 and <= vector cores, tiles inside the
UB budget, 32-byte tail alignment, full coverage of the tensor, and clear errors."""
from __future__ import annotations

import random

import pytest

from agoq_ascend import geometry as P
from agoq_ascend.geometry import DeviceProps, PlanError, plan_launch, working_set
from agoq_triton_kernels.layout import MAX_BLOCK, MAX_CHUNK_ELEMENTS

A2 = DeviceProps(vector_cores=48)  # Atlas 800T A2 (910B3): 24 AI cores x 2 vector cores


def _is_pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def _random_cases(count: int, seed: int):
    rng = random.Random(seed)
    a2_max = P.max_block(A2)
    for _ in range(count):
        kind, bits = rng.choice(P.FORMAT_CODES)
        op = rng.choice(P.OPS)
        block = 8 * rng.randint(1, a2_max // 8)
        # numel: from one element to the 2**30 chunk limit, log-uniform so small and huge both appear
        numel = min(MAX_CHUNK_ELEMENTS, max(1, int(2 ** rng.uniform(0, 30.0001))))
        cores = rng.choice([1, 2, 3, 20, 40, 48, 64, 80, rng.randint(1, 200), 70000, 1 << 20])
        ub = rng.choice([P.UB_BYTES_A2, P.UB_BYTES_950, P.UB_BYTES_A2 * 2])
        dt = rng.choice(P.IO_DTYPES)
        yield op, kind, bits, block, numel, DeviceProps(vector_cores=cores, ub_bytes=ub), dt


@pytest.mark.parametrize("seed", range(4))
def test_plan_properties_over_many_shapes(seed):
    for op, kind, bits, block, numel, dev, dt in _random_cases(500, seed):
        p = plan_launch(op=op, numel=numel, kind=kind, bits=bits, block=block, device=dev, io_dtype=dt)
        ctx = (op, kind, bits, block, numel, dev, dt, p)
        # grid: 1-D, at most one program per vector core, never above the uint16 coreDim limit
        assert 1 <= p.grid <= min(P.MAX_GRID, dev.vector_cores, p.n_tiles), ctx
        assert p.grid == min(p.n_tiles, dev.vector_cores, P.MAX_GRID), ctx
        # tile geometry: powers of two (tl.arange), lanes cover the block, 32-byte tails even for 1-byte tiles
        assert _is_pow2(p.rows) and _is_pow2(p.lanes), ctx
        assert p.lanes >= block and p.lanes >= P.MIN_LANES and p.lanes < 2 * max(block, P.MIN_LANES), ctx
        assert (p.lanes * 1) % P.ALIGN_BYTES == 0 and p.pad_lanes == p.lanes - block >= 0, ctx
        # the tiles cover every block exactly once
        assert p.n_blocks == -(-numel // block), ctx
        assert p.rows * p.n_tiles >= p.n_blocks > p.rows * (p.n_tiles - 1), ctx
        # UB: the working set fits the budget, which is half the UB with multibuffer, all of it without
        assert p.ub_bytes_used == working_set(op, kind, bits, lanes=p.lanes, rows=p.rows, io_dtype=dt), ctx
        assert p.ub_bytes_used <= p.ub_budget <= dev.ub_bytes, ctx
        assert p.ub_budget == (dev.ub_bytes // 2 if p.multibuffer else dev.ub_bytes), ctx
        if not p.multibuffer:  # only when a single row does not fit half the UB
            assert working_set(op, kind, bits, lanes=p.lanes, rows=1, io_dtype=dt) > dev.ub_bytes // 2, ctx
        # rows is the largest power of two allowed by the UB and by "a tile for every core first"
        bigger = 2 * p.rows
        assert (working_set(op, kind, bits, lanes=p.lanes, rows=bigger, io_dtype=dt) > p.ub_budget
                or bigger > max(1, p.n_blocks // dev.vector_cores)), ctx
        # when there are at least as many blocks as cores, every core (up to 65535) gets work
        if p.n_blocks >= dev.vector_cores:
            assert p.grid == min(dev.vector_cores, P.MAX_GRID), ctx


def test_programs_caps_the_grid():
    p = plan_launch(op="quantize", numel=1 << 20, kind="int", bits=4, block=128, device=A2, programs=5)
    assert p.grid == 5
    assert plan_launch(op="quantize", numel=100, kind="int", bits=4, block=128, device=A2, programs=5).grid == 1


def test_grid_is_capped_at_65535_even_with_more_cores():
    dev = DeviceProps(vector_cores=1 << 20)
    p = plan_launch(op="quantize", numel=MAX_CHUNK_ELEMENTS, kind="int", bits=4, block=8, device=dev)
    assert p.n_tiles > P.MAX_GRID and p.grid == P.MAX_GRID


def test_working_set_follows_the_documented_rule_by_hand():
    # int8 quantize from fp32, lanes 128, rows 4, counted from the module docstring's rule:
    row = 0
    row += 128 * 4 + 128 * 2          # element offsets int32, element mask (bool counts 2)
    row += 128 * 4                    # x fp32 (the DMA tile itself)
    # the portable quantizer (division-free quotient): |x|, kept x, x - x, scaled |x|, q head bits, q,
    # remainder, q corrected, q head, q tail (10 x 4 bytes) + flush mask (2); 4 exact-remainder terms;
    # ulp bits, ulp above, ulp below, thresholds, q +- ulp, v, codes (7 x 4) + 2 compare masks (2 x 2)
    row += 128 * (10 * 4 + 2) + 128 * 4 * 4 + 128 * (7 * 4 + 2 * 2)
    row += 2 * 128 * 4                # int encode: clamped, rounded
    row += 128 * 2 + 128 * 2          # code bytes (int8 counts 2) and the int16 temporary of the int8 cast
    per_row_vectors = P.ROW_VECTORS * 32  # 4 rows x 4 bytes = 16 -> one 32-byte unit each
    lane_index = 128 * 4
    assert working_set("quantize", "int", 8, lanes=128, rows=4) == 4 * row + per_row_vectors + lane_index


def test_narrow_pack_tiles_are_counted_padded_to_32_bytes():
    # int5 at 32 lanes: the pack-group tiles are 32/8 = 4 lanes wide (16 bytes of int32) but occupy 32 bytes each
    listed = P.buffers("quantize", "int", 5)
    ws = working_set("quantize", "int", 5, lanes=32, rows=1)
    assert ws >= len(listed) * P.ALIGN_BYTES
    narrow = [b for b in listed if b[1] == 8 and "pair" not in b[0] and "(padded)" not in b[0]]
    assert narrow and all(32 // div * nbytes < 32 for _, div, nbytes in narrow)


@pytest.mark.parametrize("bits,g", [(5, 8), (6, 4)])
def test_contiguous_group_access_is_counted_32_bytes_per_group(bits, g):
    # agoq-ascend launches the 5/6-bit packing with CONTIG: [rows, groups, slots] tiles (8 or 4 slots of 1-4
    # bytes), one 32-byte unit per pack group, for the one store and the one load; no per-byte planes left
    for op, what in (("quantize", "store"), ("dequantize", "load")):
        listed = P.buffers(op, "int", bits)
        groups = [b for b in listed if b[0].startswith(f"{what} ") and b[0].endswith("(padded)")]
        assert len(groups) >= 6 and all(div == g and nbytes == 32 for _, div, nbytes in groups), listed
        assert not any(name.startswith(("packed byte", "loaded byte")) for name, _, _ in listed)
        assert sum(P._pad32(128 // d * nb) for _, d, nb in groups) == len(groups) * 128 // g * 32


@pytest.mark.parametrize("kind,bits", P.FORMAT_CODES)
def test_working_set_grows_with_rows_and_lanes(kind, bits):
    for op in P.OPS:
        a = working_set(op, kind, bits, lanes=64, rows=2)
        assert working_set(op, kind, bits, lanes=64, rows=4) > a
        assert working_set(op, kind, bits, lanes=128, rows=2) > a


def test_multibuffer_is_dropped_only_when_one_row_needs_more_than_half_the_ub():
    dev = A2
    cases = [(op, k, b, dt) for op in P.OPS for k, b in P.FORMAT_CODES for dt in P.IO_DTYPES]
    switched = 0
    for op, kind, bits, dt in cases:
        one_row = working_set(op, kind, bits, lanes=1024, rows=1, io_dtype=dt)
        if one_row > dev.ub_bytes:
            continue
        p = plan_launch(op=op, numel=1 << 20, kind=kind, bits=bits, block=1024, device=dev, io_dtype=dt)
        assert p.multibuffer == (one_row <= dev.ub_bytes // 2)
        switched += not p.multibuffer
    assert switched > 0, "no case exercised the multibuffer-off budget"


def test_max_block_is_the_largest_block_every_op_fits():
    for dev in (A2, DeviceProps(vector_cores=64, ub_bytes=P.UB_BYTES_950)):
        mb = P.max_block(dev)
        assert _is_pow2(mb) and 128 <= mb <= MAX_BLOCK
        for kind, bits in P.FORMAT_CODES:
            for op in P.OPS:
                for dt in P.IO_DTYPES:
                    plan_launch(op=op, numel=3 * mb, kind=kind, bits=bits, block=mb, device=dev, io_dtype=dt)
        if mb < MAX_BLOCK:
            assert any(working_set(op, k, b, lanes=2 * mb, rows=1, io_dtype=dt) > dev.ub_bytes
                       for op in P.OPS for k, b in P.FORMAT_CODES for dt in P.IO_DTYPES)


def test_a_bigger_ub_gives_bigger_tiles():
    small = plan_launch(op="quantize", numel=1 << 24, kind="fp8_e4m3", bits=8, block=256, device=A2)
    big = plan_launch(op="quantize", numel=1 << 24, kind="fp8_e4m3", bits=8, block=256,
                      device=DeviceProps(vector_cores=48, ub_bytes=P.UB_BYTES_A2 * 4))
    assert big.rows > small.rows


def test_format_codes_match_the_core_registry():
    from agoq_core.formats.spec import list_formats

    assert sorted(P.FORMAT_CODES) == sorted({(s.kind, s.bits) for s in list_formats()})


def test_compile_options_are_triton_ascend_fields():
    p = plan_launch(op="accumulate", numel=4096, kind="fp8_e4m3", bits=8, block=256, device=A2)
    assert P.compile_options(p) == {"multibuffer": p.multibuffer}  # enable_fp_fusion=False: the shared launcher


@pytest.mark.parametrize("kwargs,match", [
    (dict(block=12), "multiple of 8"),
    (dict(block=0), "multiple of 8"),
    (dict(block=MAX_BLOCK * 2), "maximum"),
    (dict(block=8192), "needs .* bytes of UB .* use block <= 512"),
    (dict(numel=0), r"numel must be an int in \[1"),
    (dict(numel=MAX_CHUNK_ELEMENTS + 1), "launchers chunk"),
    (dict(op="gemm"), "unknown op"),
    (dict(kind="int3"), "unknown code kind"),
    (dict(bits=7), "bits must be"),
    (dict(io_dtype="float64"), "dtype must be one of"),
    (dict(rows=3), "power of two"),
    (dict(rows=1 << 20), "power of two in"),
    (dict(programs=0), "programs=0"),
])
def test_plan_errors_name_the_problem(kwargs, match):
    args = dict(op="quantize", numel=1 << 20, kind="int", bits=4, block=128, device=A2, io_dtype="float32")
    args.update(kwargs)
    with pytest.raises(PlanError, match=match):
        plan_launch(**args)


@pytest.mark.parametrize("kwargs", [dict(vector_cores=0), dict(vector_cores=True), dict(vector_cores=4, ub_bytes=1024)])
def test_device_props_are_validated(kwargs):
    with pytest.raises(PlanError):
        DeviceProps(**kwargs)


def test_geometry_imports_no_torch_npu_or_triton():
    import subprocess
    import sys

    code = ("import sys, agoq_ascend.geometry as p; p.plan_launch(op='quantize', numel=10, kind='int', bits=4, "
            "block=8, device=p.DeviceProps(vector_cores=2)); "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'torch_npu', 'triton')]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_nvfp4_quantize_counts_the_per_row_temporaries_of_its_two_divisions():
    """NVFP4's quantize runs codes.exact_div twice per block row on the portable path: the UB rule adds
    TENSOR_SCALED_QUANTIZE_ROW_VECTORS [rows] vectors for it (the quantize only), and the planner keeps the tile
    inside the budget with them; the launcher passes the flag from the format."""
    import torch

    from agoq_ascend.launch import AscendGeometry
    from agoq_core.formats.spec import get_format

    nv = get_format("nvfp4")
    assert nv.tensor_scaled and nv.block == 16
    for rows in (1, 16, 64):
        plain = working_set("quantize", nv.kind, nv.bits, lanes=32, rows=rows)
        scaled = working_set("quantize", nv.kind, nv.bits, lanes=32, rows=rows, tensor_scaled=True)
        assert scaled - plain == P.TENSOR_SCALED_QUANTIZE_ROW_VECTORS * -(-rows * 4 // 32) * 32
        assert working_set("dequantize", nv.kind, nv.bits, lanes=32, rows=rows, tensor_scaled=True) == \
            working_set("dequantize", nv.kind, nv.bits, lanes=32, rows=rows)
    for dt in P.IO_DTYPES:
        p = plan_launch(op="quantize", numel=1 << 24, kind=nv.kind, bits=nv.bits, block=nv.block, device=A2,
                        io_dtype=dt, tensor_scaled=True)
        assert p.ub_bytes_used == working_set("quantize", nv.kind, nv.bits, lanes=p.lanes, rows=p.rows, io_dtype=dt,
                                              tensor_scaled=True) <= p.ub_budget
        assert working_set("quantize", nv.kind, nv.bits, lanes=p.lanes, rows=2 * p.rows, io_dtype=dt,
                           tensor_scaled=True) > p.ub_budget or p.rows * A2.vector_cores >= p.n_blocks
    launched = AscendGeometry(A2).plan("quantize", nv, 1 << 24, torch.bfloat16, torch.device("cpu"), rows=None,
                                       programs=None)
    assert launched.plan.ub_bytes_used == working_set("quantize", nv.kind, nv.bits, lanes=launched.plan.lanes,
                                                      rows=launched.plan.rows, io_dtype="bfloat16", tensor_scaled=True)
