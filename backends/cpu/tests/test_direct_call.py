"""The compiled codecs called past Dynamo's frame hook (agoq_cpu.compiled._Direct).

Oracle: agoq_core.formats.reference for every output; the direct path must give the same bits as the
compiled function called normally, must actually be taken after the first call (it is the speed-up),
and must step aside when its guards reject the arguments or another torch.compile is running."""
from __future__ import annotations

import pytest
import torch

from agoq_core.formats import reference as ref
from agoq_core.formats.spec import get_format
from agoq_cpu import compiled as C


@pytest.fixture()
def taken(monkeypatch):
    """Records what every _Direct call returned (True: the direct path ran the codec)."""
    log: list[bool] = []
    real = C._Direct.__call__

    def spy(self, args):
        r = real(self, args)
        log.append(r)
        return r

    monkeypatch.setattr(C._Direct, "__call__", spy)
    return log


@pytest.mark.parametrize("fmt", ["nf4", "int4", "fp8_e4m3", "int6"])
def test_direct_path_is_taken_and_bit_exact(compiled, taken, fmt):
    spec = get_format(fmt)
    gen = torch.Generator().manual_seed(3)
    for nb in (5, 5, 9, 33):  # a repeat and new sizes: the number of blocks is a dynamic dimension
        n = nb * spec.block + 7  # a ragged tail too (reference codecs for the tail)
        x = torch.randn(n, generator=gen) * 3
        codes = torch.empty(spec.code_bytes(n), dtype=torch.uint8)
        scales = torch.empty(spec.num_blocks(n))
        compiled.quantize_into(x, spec, codes, scales)
        rc, rs = ref.quantize_blocks(x, spec)
        assert torch.equal(codes, rc) and torch.equal(scales, rs)
        out = torch.empty(n, dtype=torch.bfloat16)
        compiled.dequantize_into(codes, scales, spec, out)
        assert torch.equal(out, ref.dequantize_blocks(rc, rs, spec, n, torch.bfloat16))
        g = torch.randn(n, generator=gen)
        ac, as_ = ref.accumulate(codes.clone(), scales.clone(), spec, n, g)
        compiled.accumulate_(codes, scales, spec, g)
        assert torch.equal(codes, ac) and torch.equal(scales, as_)
    assert taken.count(True) >= 6, taken  # after each variant's first call, the direct path ran


def test_guard_miss_falls_back(compiled, taken):
    """Arguments the compiled entry was not made for fail its guards (here: grad mode, a global state
    every Dynamo entry guards on): nothing runs on the direct path, the compiled function handles the call
    (recompiling once), bits exact; the new entry then serves the direct path too."""
    spec = get_format("int8")
    nb = 6
    table, qmax = compiled.compiler.consts(spec)
    v = compiled.compiler.get("quantize", spec, torch.float32)

    def call():
        x = torch.randn(nb * spec.block)
        codes = torch.empty(nb, spec.block, dtype=torch.uint8)
        scales = torch.empty(nb)
        v(x.view(nb, spec.block), qmax, codes, scales)
        rc, rs = ref.quantize_blocks(x, spec)
        assert torch.equal(codes.reshape(-1), rc) and torch.equal(scales, rs)

    with torch.enable_grad():
        call()
        call()
    assert taken[-1] is True
    with torch.no_grad():
        call()
        assert taken[-1] is False
        call()
        assert taken[-1] is True
    with torch.enable_grad():
        call()
        assert taken[-1] is True


def test_not_taken_inside_another_compile(compiled, taken):
    spec = get_format("int4")
    x = torch.randn(8 * spec.block)
    codes = torch.empty(spec.code_bytes(x.numel()), dtype=torch.uint8)
    scales = torch.empty(8)
    compiled.quantize_into(x, spec, codes, scales)  # compiles the variant

    @torch.compile(backend="eager")
    def outer(t):
        y = t * 1.0
        torch._dynamo.graph_break()
        compiled.quantize_into(y, spec, codes, scales)  # runs under the outer function's frame hook
        return y

    n0 = len(taken)
    outer(x)
    assert True not in taken[n0:]
    rc, rs = ref.quantize_blocks(x, spec)
    assert torch.equal(codes, rc) and torch.equal(scales, rs)


def test_switch_off(monkeypatch):
    monkeypatch.setenv(C.ENV_DIRECT, "0")
    assert C.Compiler(quiet=True).direct is False
    monkeypatch.setenv(C.ENV_DIRECT, "1")
    assert C.Compiler(quiet=True).direct is True
