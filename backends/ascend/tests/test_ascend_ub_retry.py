"""Issue 20 item 6: the UB rule counts the padded split/join pair tiles and int8-cast temporaries; a
"ub overflow" compile error halves the rows and retries (remembered per kernel); AGOQ_ASCEND_MAX_ROWS caps rows."""
from __future__ import annotations

import pytest
import torch

from agoq_core.formats import reference as ref
from agoq_core.formats.spec import get_format
from agoq_ascend import geometry as G
from agoq_triton_kernels import launch as shared_launch


def test_ub_rule_counts_padded_pair_tiles_and_int8_cast_temporaries():
    names = [b[0] for b in G.buffers("quantize", "int", 5)]
    # 5-bit: 8 codes per group -> reshape (.., 2, 2, 2) and two split levels: 1 + 2 + 4 pair tiles
    assert names.count("split pair tile (padded)") == 7
    # the int32 -> int8 cast of the one contiguous group store (CONTIG): its int16 temporary, one per pack group
    assert names.count("store int8 cast temporary (padded)") == 1
    assert [b[0] for b in G.buffers("quantize", "int", 4)].count("int8 cast temporary") == 1
    assert [b for b in G.buffers("quantize", "int", 4) if b[0] == "split pair tile (padded)"] == \
        [("split pair tile (padded)", 2, 32)]  # lanes/2 pairs of int32, each padded to a 32-byte unit
    assert names.count("join pair tile (padded)") == 0
    assert G.buffers("dequantize", "int", 6).count(("join pair tile (padded)", 2, 32)) == 1
    # the pair tiles are what makes a 4-bit tile so much bigger than its codes: 16 bytes per lane per row
    lanes = 128
    pair_bytes = sum(G._pad32(lanes // d * b) for n, d, b in G.buffers("quantize", "int", 4) if "pair" in n)
    assert pair_bytes == lanes // 2 * 32


@pytest.fixture
def ub_limited(monkeypatch):
    """The shared quantize kernel as a device whose compiler rejects tiles above 2 rows with Triton-Ascend's
    error text (the interpreter itself has no UB)."""
    real = shared_launch.K.quantize_kernel
    seen = []

    class Limited:
        def __getitem__(self, grid):
            def run(*args, **kw):
                seen.append(kw["ROWS"])
                if kw["ROWS"] > 2:
                    raise RuntimeError("MLIRCompilationError: ub overflow, requires 1703936 bits while 1572864 bits "
                                       "available! (possible reason: tiling basic block is too large)")
                return real[grid](*args, **kw)
            return run

    monkeypatch.setattr(shared_launch.K, "quantize_kernel", Limited())
    return seen


def test_ub_overflow_halves_the_rows_and_remembers(interp_backend, ub_limited, caplog):
    spec = get_format("int4")
    x = torch.randn(64 * spec.block + 5)
    la = interp_backend.launcher
    codes = torch.empty(spec.code_bytes(x.numel()), dtype=torch.uint8)
    scales = torch.empty(spec.num_blocks(x.numel()))
    la.quantize(x, spec, codes, scales)
    wc, ws = ref.quantize_blocks(x, spec)
    assert torch.equal(codes, wc) and torch.equal(scales, ws)
    first = list(ub_limited)
    assert first[0] > 2 and 2 in first and "overflowed the unified buffer" in caplog.text
    assert la.last_plans[0].rows == 2  # the plan that ran
    ub_limited.clear()
    la.quantize(x, spec, codes, scales)  # learned: starts at 2 rows, no failed compile
    assert max(ub_limited) <= 2


def test_other_compile_errors_are_not_retried(interp_backend, monkeypatch):
    class Broken:
        def __getitem__(self, grid):
            def run(*a, **k):
                raise RuntimeError("some other compiler error")
            return run

    monkeypatch.setattr(shared_launch.K, "quantize_kernel", Broken())
    spec = get_format("int8")
    x = torch.randn(4 * spec.block)
    with pytest.raises(RuntimeError, match="some other compiler error"):
        interp_backend.launcher.quantize(x, spec, torch.empty(spec.code_bytes(x.numel()), dtype=torch.uint8),
                                         torch.empty(spec.num_blocks(x.numel())))


def test_max_rows_setting(interp_backend, monkeypatch):
    spec = get_format("int8")
    x = torch.randn(256 * spec.block)
    codes = torch.empty(spec.code_bytes(x.numel()), dtype=torch.uint8)
    scales = torch.empty(spec.num_blocks(x.numel()))
    interp_backend.launcher.quantize(x, spec, codes, scales)
    assert interp_backend.launcher.last_plans[0].rows > 2
    monkeypatch.setenv("AGOQ_ASCEND_MAX_ROWS", "2")
    interp_backend.launcher.quantize(x, spec, codes, scales)
    assert interp_backend.launcher.last_plans[0].rows == 2
    assert torch.equal(codes, ref.quantize_blocks(x, spec)[0])
    monkeypatch.setenv("AGOQ_ASCEND_MAX_ROWS", "3")
    with pytest.raises(ValueError, match="AGOQ_ASCEND_MAX_ROWS='3' must be a power of two"):
        interp_backend.launcher.quantize(x, spec, codes, scales)


def test_frontend_compile_counts_masked_accesses():
    """frontend_compile.py's discrete-mask detector (the script itself needs triton-ascend; its IR parsing
    does not): a mask is the second tt.load operand / the third tt.store operand."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "frontend_compile.py"
    spec = importlib.util.spec_from_file_location("frontend_compile", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    before = ("%8 = tt.load %5, %3, %cst : tensor<1024x!tt.ptr<i32>>\n"
              "tt.store %7, %8, %3 : tensor<1024x!tt.ptr<i32>>\n"
              "%9 = tt.load %4 : tensor<1024x!tt.ptr<i32>>\n")
    after = ("%8 = tt.load %5 : tensor<1024x!tt.ptr<i32>> loc(#loc1)\n"
             "%10 = arith.select %3, %8, %cst : tensor<1024xi1>, tensor<1024xi32>\n"
             "tt.store %7, %10 : tensor<1024x!tt.ptr<i32>>\n")
    assert mod._masked_mem_ops(before) == (1, 1) and mod._masked_mem_ops(after) == (0, 0)
