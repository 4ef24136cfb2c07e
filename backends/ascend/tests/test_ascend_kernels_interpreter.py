"""The shared kernel bodies, launched with the Ascend geometry (planner rows, 32-byte-padded lanes, one
program per fake vector core, NF4 select tree), in upstream Triton's CPU interpreter: bit-exact against
the reference for every format, over geometries the conformance suite's defaults do not reach.

Also a static check that the bodies stay inside the Triton subset Triton-Ascend documents."""
from __future__ import annotations

import ast
import inspect
import types

import pytest
import torch

from agoq_core.formats import reference as ref
from agoq_core.formats.spec import get_format, list_formats
from agoq_triton_kernels import launch as L
from agoq_ascend.geometry import MIN_LANES, PlanError

FORMATS = [s.name for s in list_formats()]


def _input(n: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    """Gaussian with structure: an all-zero block, a NaN, an Inf, exact ties, subnormals, a big outlier."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-6, 6, (n,), generator=g).float())
    if n >= 64:
        x[8:16] = 0.0
        x[20] = 2.0 ** -130          # subnormal: flushed by the contract
        x[21] = -(2.0 ** -127)
        x[30] = float("nan")
        x[40] = float("-inf")
        x[50] = 3.5                  # ties after scaling appear in int formats
        x[51] = -2.5
        x[63] = 6.0e4
    return x.to(dtype)


def _want_q(x, spec):
    return ref.quantize_blocks(x, spec)


def _same_bits(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bit-identical floats, except that any NaN matches any NaN (payloads are not part of the contract)."""
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[want.dtype]
    nan = want.isnan()
    return (got.dtype == want.dtype and torch.equal(got.isnan(), nan)
            and torch.equal(got.view(ints).masked_fill(nan, 0), want.view(ints).masked_fill(nan, 0)))


# (n, block, rows, programs): padded lanes (block 8/24/40 -> 32/32/64 lanes), one row per tile with many
# tiles per program, a ragged tail, the largest block the A2 UB takes.
GEOMETRIES = [
    (64, 8, 1, 3),
    (24 * 7 + 5, 24, 2, 2),
    (40 * 9, 40, 1, 1),
    (1000, 128, None, None),
    (3 * 1024 + 17, 1024, None, None),
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n,block,rows,programs", GEOMETRIES)
def test_quantize_dequantize_bit_exact_with_ascend_geometry(interp_backend, fmt, n, block, rows, programs):
    spec = get_format(fmt, block)
    la = interp_backend.launcher
    if block == 1024 and spec.bits in (5, 6):
        # the contiguous 5/6-bit group store (issue 20 risk 5) counts more UB: block 1024 no longer fits an A2 core;
        # refused with the fix named (max_block, what the backend declares, is 512 on A2 either way)
        with pytest.raises(PlanError, match=r"use block <= 512 on this device"):
            la.quantize(_input(n, seed=1), spec, torch.empty(spec.code_bytes(n), dtype=torch.uint8),
                        torch.empty(spec.num_blocks(n)))
        block, n = 512, 3 * 512 + 17
        spec = get_format(fmt, block)
    x = _input(n, seed=n + block)
    codes = torch.empty(spec.code_bytes(n), dtype=torch.uint8)
    scales = torch.empty(spec.num_blocks(n))
    la.quantize(x, spec, codes, scales, rows=rows, programs=programs)
    wc, ws = _want_q(x, spec)
    assert torch.equal(codes, wc), f"{fmt}: codes differ at {(codes != wc).nonzero()[:5].tolist()}"
    assert _same_bits(scales, ws)
    for p in la.last_plans:
        assert p.grid <= interp_backend.props.vector_cores and p.lanes >= max(block, MIN_LANES)
    assert la.last_plans[-1].block == block
    for out_dtype in (torch.float32, torch.bfloat16, torch.float16):
        out = torch.empty(n, dtype=out_dtype)
        la.dequantize(wc, ws, spec, out, rows=rows, programs=programs)
        assert _same_bits(out, ref.dequantize_blocks(wc, ws, spec, n, out_dtype)), (fmt, out_dtype)


@pytest.mark.parametrize("in_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fmt", ["int4", "nf4", "fp8_e4m3", "int5"])
def test_half_precision_inputs(interp_backend, fmt, in_dtype):
    spec = get_format(fmt, 32)
    x = _input(32 * 5 + 3, seed=7, dtype=in_dtype)
    codes = torch.empty(spec.code_bytes(x.numel()), dtype=torch.uint8)
    scales = torch.empty(spec.num_blocks(x.numel()))
    interp_backend.launcher.quantize(x, spec, codes, scales, rows=1)
    wc, ws = _want_q(x, spec)
    assert torch.equal(codes, wc) and _same_bits(scales, ws)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2", "int8", "int6"])
def test_accumulate_and_reduce_requantize(interp_backend, fmt):
    spec = get_format(fmt, 64)
    n = 64 * 5 + 9
    la = interp_backend.launcher
    c0, s0 = ref.quantize_blocks(_input(n, 1), spec)
    g = (_input(n, 2) * 0.01).to(torch.bfloat16)
    codes, scales = c0.clone(), s0.clone()
    la.accumulate(codes, scales, spec, g, rows=2, programs=2)
    wc, ws = ref.accumulate(c0, s0, spec, n, g)
    assert torch.equal(codes, wc) and _same_bits(scales, ws)
    qs = [ref.quantize_blocks(torch.randn(n, generator=torch.Generator().manual_seed(10 + r)) * (r + 1), spec)
          for r in range(3)]
    cin = torch.stack([q[0] for q in qs])
    sin = torch.stack([q[1] for q in qs])
    co = torch.empty(spec.code_bytes(n), dtype=torch.uint8)
    so = torch.empty(spec.num_blocks(n))
    la.reduce_requantize(cin, sin, spec, n, co, so, rows=1, programs=3)
    wc, ws = ref.reduce_requantize(cin, sin, spec, n)
    assert torch.equal(co, wc) and _same_bits(so, ws)


def test_nf4_decodes_with_the_select_tree_not_the_table(interp_backend, monkeypatch):
    """Ascend launches pass NF4_LUT=False: a poisoned table must not change the result."""
    spec = get_format("nf4")
    x = _input(300, 3)
    wc, ws = ref.quantize_blocks(x, spec)
    monkeypatch.setattr(L, "nf4_lut", lambda device: torch.full((16,), float("nan")))
    out = torch.empty(300)
    interp_backend.launcher.dequantize(wc, ws, spec, out)
    want = ref.dequantize_blocks(wc, ws, spec, 300, torch.float32)
    assert _same_bits(out, want)


def test_segments_cover_huge_tensors_in_int32_safe_pieces():
    from agoq_triton_kernels.layout import MAX_CHUNK_ELEMENTS

    for fmt, block in (("int5", 128), ("fp8_e4m3", 256), ("int4", 24)):
        spec = get_format(fmt, block)
        n = 2 * MAX_CHUNK_ELEMENTS + 3 * block + 5
        segs = list(L.segments(spec, n))
        assert sum(m for _, m, _, _, _ in segs) == n
        pos = 0
        for off, m, boff, soff, ragged in segs:
            assert off == pos and m <= MAX_CHUNK_ELEMENTS and off % block == 0
            assert boff == spec.code_bytes(off) and soff == spec.num_blocks(off)
            assert ragged == (m % block != 0) and (not ragged or off + m == n)
            pos += m
        assert segs[-1][4] and segs[-1][1] == n % block != 0


def test_last_plans_follow_the_geometry(interp_backend):
    spec = get_format("int4")
    n = 128 * 40 + 7
    x = _input(n, 4)
    codes = torch.empty(spec.code_bytes(n), dtype=torch.uint8)
    scales = torch.empty(spec.num_blocks(n))
    interp_backend.launcher.quantize(x, spec, codes, scales)
    whole, tail = interp_backend.launcher.last_plans
    assert (whole.n_blocks, tail.n_blocks, tail.numel) == (40, 1, 7)
    # 40 blocks / 3 cores would allow 8 rows; the A2 UB rule (division-free quantizer, padded pack tiles)
    # fits 4: 10 tiles over 3 programs
    assert whole.grid == 3 and whole.rows == 4 and whole.n_tiles == 10


# ---- the Triton-Ascend subset --------------------------------------------------------------------------
# Ops of Triton-Ascend's op table (docs/sources/python-api/outline.md) the bodies may use, and the dtypes
# its table lists for them. Absent on purpose: uint8/uint32 (no column / unsupported), fp8 (no FP8 on
# A2/A3), int64 (where unsupported), libdevice (no rint, different module), inline asm, sort, dot_scaled.
_ALLOWED_TL = {
    "constexpr", "program_id", "num_programs", "arange", "load", "store", "where", "max", "min", "sum",
    "split", "join", "reshape", "minimum", "maximum", "abs", "math", "div_rn", "cast", "zeros_like",
    "int8", "int16", "int32", "float16", "float32", "bfloat16",
    "int64",  # scalar rank offsets only (r * codes_stride passes 2**31); the table lacks int64 `where` only
    "zeros",  # an fp32 accumulator; triton-ascend 3.2.0 ships tl.zeros (language/standard.py, a tl.full)
}


# constexpr switches whose True branch is CUDA-only; agoq-ascend always launches them False, so Triton
# prunes those branches before Triton-Ascend ever sees them.
_CUDA_ONLY_SWITCHES = {"HW", "FAST_DIV", "VEC16"}


def _cuda_only_test(test) -> bool:
    """``HW`` / ``FAST_DIV`` / ``VEC16``, or an ``and`` with one of them among its operands (``VEC16 and PREFETCH``)."""
    if isinstance(test, ast.Name):
        return test.id in _CUDA_ONLY_SWITCHES
    return isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) and any(map(_cuda_only_test, test.values))


def _walk_ascend_reachable(node):
    """ast.walk, except the True branch of ``if HW:`` / ``if FAST_DIV:`` / ``if VEC16:`` (and ``if VEC16 and X:``)."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, ast.If) and _cuda_only_test(n.test):
            stack.extend(n.orelse)
            continue
        stack.extend(ast.iter_child_nodes(n))


def _ascend_reachable_defs(*modules) -> list[ast.FunctionDef]:
    """The function bodies Triton-Ascend compiles: every ``*_kernel`` of the modules and, transitively, the
    module-level functions they call outside CUDA-only branches (a helper called only under ``if VEC16:``
    is pruned with its branch and never reaches Triton-Ascend)."""
    defs = {}
    for m in modules:
        for node in ast.parse(inspect.getsource(m)).body:
            if isinstance(node, ast.FunctionDef):
                defs[node.name] = node
    todo = [name for name in defs if name.endswith("_kernel")]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for n in _walk_ascend_reachable(defs[name]):
            if isinstance(n, ast.Name) and n.id in defs and n.id not in seen:
                todo.append(n.id)
    return [defs[k] for k in sorted(seen)]


def _tl_attrs(defs) -> set[str]:
    found = set()
    for d in defs:
        for node in _walk_ascend_reachable(d):
            if isinstance(node, ast.Attribute):
                base = node.value
                if isinstance(base, ast.Name) and base.id == "tl":
                    found.add(node.attr)
                elif isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and base.value.id == "tl":
                    found.add(node.attr)  # tl.math.<fn>
    return found


def test_shared_bodies_use_only_ops_and_dtypes_triton_ascend_supports():
    from agoq_triton_kernels import codes, kernels

    defs = _ascend_reachable_defs(codes, kernels)
    assert {"quantize_kernel", "dequantize_kernel", "quantize_tile", "store_codes"} <= {d.name for d in defs}
    used = _tl_attrs(defs)
    unsupported = used - _ALLOWED_TL
    assert not unsupported, (f"the shared kernel bodies use {sorted(unsupported)}, outside the Triton-Ascend subset; "
                             "give agoq-ascend an Ascend variant or keep the bodies portable")
    # libdevice (CUDA's; Triton-Ascend has its own module) and inline asm only in CUDA-only branches
    names = {n.id for d in defs for n in _walk_ascend_reachable(d) if isinstance(n, ast.Name)}
    assert "libdevice" not in names
    # kernels._rcp_2_4: only under FAST_DIV (CUDA); kernels._max_u16x2: only on the 16-lane tile (VEC16): pruned above
    assert "inline_asm_elementwise" not in used
    every = [n for m in (codes, kernels) for n in ast.parse(inspect.getsource(m)).body
             if isinstance(n, ast.FunctionDef)]
    asm = {d.name for d in every if "inline_asm" in ast.unparse(d)}
    assert asm <= {"_rcp_2_4", "_max_u16x2"} and not asm & {d.name for d in defs}, asm


def test_the_lint_prunes_helpers_called_only_under_cuda_switches():
    src = ("def a_kernel(x, VEC16):\n    if VEC16:\n        return wide(x)\n    return narrow(x)\n"
           "def wide(x):\n    return tl.permute(x, (1, 0))\n"
           "def narrow(x):\n    return tl.where(x, x, x)\n")
    mod = types.ModuleType("lint_probe")
    mod.__file__ = "<lint_probe>"
    import linecache

    linecache.cache["<lint_probe>"] = (len(src), None, src.splitlines(True), "<lint_probe>")
    exec(compile(src, "<lint_probe>", "exec"), mod.__dict__)
    defs = _ascend_reachable_defs(mod)
    assert [d.name for d in defs] == ["a_kernel", "narrow"]
    assert _tl_attrs(defs) == {"where"}


def test_the_lint_prunes_an_and_with_a_cuda_switch_but_not_an_or():
    src = ("def f(x, VEC16, PREFETCH):\n    if VEC16 and PREFETCH:\n        return tl.permute(x, (1, 0))\n"
           "    if PREFETCH or VEC16:\n        return tl.join(x, x)\n    return x\n")
    seen = {n.attr for n in _walk_ascend_reachable(ast.parse(src)) if isinstance(n, ast.Attribute)}
    assert seen == {"join"}


def test_the_lint_sees_cuda_only_constructs_when_they_are_reachable():
    src = "def f(x, HW):\n    if HW:\n        return x.to(tl.float8e4nv)\n    return x.to(tl.uint8)\n"
    tree = ast.parse(src)
    seen = {n.attr for n in _walk_ascend_reachable(tree) if isinstance(n, ast.Attribute)}
    assert seen == {"to", "uint8"}
