"""The launcher's direct-launch fast path (issue 17: host time per eager call).

A repeated call with the same key (op, format, element count, buffer dtypes/sizes/devices, overrides, buffer
addresses modulo 16, Triton's knobs, current device) launches the cached compiled kernel with the cached
argument list. Checked here:

* bits: the fast path gives the same codes/scales/outputs as the normal path (another Launcher with the fast
  path off), for each op (QuanGrad's reduce_requantize included), across packing widths, the 16-lane tile,
  NF4's tables and MX scales. On CPU the entries are built in Triton's interpreter (``fast_interpreted``: the interpreted kernel called with the cached
  list, so the list and the per-call slot filling are what is checked); on a GPU they are real CompiledKernels;
* fallbacks: a code buffer at another address class, another size, non-contiguous data, NVFP4 (per-tensor scale)
  and a launcher with the fast path off take the normal path;
* the real-mode launch (CompiledKernel.run with Triton's own bound argument list) on CPU, in a subprocess without
  TRITON_INTERPRET, with a fake driver and a stub compiled kernel: the fast launch passes exactly the arguments
  Triton's JITFunction.run passed on the first call (tensors as their addresses), and launch hooks or a
  misaligned buffer send the call back through Triton;
* ``Launcher.launch`` (any kernel; agoq-cuda's fused LAAQ kernels: rmsnorm_quant, silu_mul_quant, silu_mul_backward):
  its key argument by argument on a small kernel, the fused ops' bits against Triton's own dispatch call after call
  (new inputs, fresh outputs, rmsnorm's optional rinv, another row count), and in real mode the exact argument list.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import triton
import triton.language as tl

from agoq_core.formats import reference as ref
from agoq_core.formats.spec import get_format
from agoq_cuda.launch import CudaGeometry
from agoq_triton_kernels.launch import Launcher
from cuda_inputs import assert_bits_equal

FORMATS = ["fp8_e4m3", "int4", "int5", "nf4", "mxfp8"]


def _launchers():
    fast, slow = Launcher(CudaGeometry()), Launcher(CudaGeometry())
    fast.fast, fast.fast_interpreted = True, True
    slow.fast = False
    return fast, slow


def _data(spec, n, seed, device, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g) * (1 + seed)).to(dtype).to(device)


def _buffers(spec, n, device, odd=False):
    if odd:  # a code buffer at an odd address: another key (VEC16 off, no 16-byte alignment)
        codes = torch.zeros(spec.code_bytes(n) + 1, dtype=torch.uint8, device=device)[1:]
    else:
        codes = torch.zeros(spec.code_bytes(n), dtype=torch.uint8, device=device)
    return codes, torch.zeros(spec.num_blocks(n), device=device)


@pytest.mark.parametrize("fmt", FORMATS)
def test_fast_path_taken_and_bit_identical(fmt, device):
    spec = get_format(fmt)
    n = 2 * spec.block
    fast, slow = _launchers()
    for i in range(3):  # call 0 makes the entry; 1 and 2 launch it with other buffers (same key)
        x = _data(spec, n, i, device)
        cf, sf = _buffers(spec, n, device)
        cs, ss = _buffers(spec, n, device)
        hits = fast.fast_hits
        fast.quantize(x, spec, cf, sf)
        slow.quantize(x, spec, cs, ss)
        assert fast.fast_hits == hits + (i > 0)
        assert_bits_equal(cf, cs, f"{fmt} quantize codes, call {i}")
        assert_bits_equal(sf, ss, f"{fmt} quantize scales, call {i}")
        rc, rs = ref.quantize_blocks(x.cpu(), spec)
        assert_bits_equal(cf, rc, f"{fmt} quantize codes vs reference")
        assert_bits_equal(sf, rs, f"{fmt} quantize scales vs reference")

        g = _data(spec, n, 10 + i, device) * 0.25
        hits = fast.fast_hits
        fast.accumulate(cf, sf, spec, g)
        slow.accumulate(cs, ss, spec, g)
        assert fast.fast_hits == hits + (i > 0)
        assert_bits_equal(cf, cs, f"{fmt} accumulate codes, call {i}")
        assert_bits_equal(sf, ss, f"{fmt} accumulate scales, call {i}")

        of = torch.empty(n, dtype=torch.float32, device=device)
        os_ = torch.empty(n, dtype=torch.float32, device=device)
        hits = fast.fast_hits
        fast.dequantize(cf, sf, spec, of)
        slow.dequantize(cs, ss, spec, os_)
        assert fast.fast_hits == hits + (i > 0)
        assert_bits_equal(of, os_, f"{fmt} dequantize, call {i}")
        assert fast.last_plans == slow.last_plans


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "int8", "mxfp8"])
@pytest.mark.parametrize("world", [2, 4])
def test_fast_reduce_requantize_bit_identical(fmt, world, device):
    """QuanGrad's reduce_requantize (W rows of codes and scales -> the fp32 sum requantized) on the fast path: the
    same bits as the normal path and the reference for every call; another W is another key."""
    spec = get_format(fmt)
    n = 4 * spec.block
    fast, slow = _launchers()
    for i in range(3):
        rows = [ref.quantize_blocks(_data(spec, n, 20 * i + r, device, torch.float32).cpu(), spec)
                for r in range(world)]
        codes = torch.stack([c for c, _ in rows]).to(device)
        scales = torch.stack([s_ for _, s_ in rows]).to(device)
        cf, sf = _buffers(spec, n, device)
        cs, ss = _buffers(spec, n, device)
        hits = fast.fast_hits
        fast.reduce_requantize(codes, scales, spec, n, cf, sf)
        slow.reduce_requantize(codes, scales, spec, n, cs, ss)
        assert fast.fast_hits == hits + (i > 0)
        assert_bits_equal(cf, cs, f"{fmt} W={world} reduce_requantize codes, call {i}")
        assert_bits_equal(sf, ss, f"{fmt} W={world} reduce_requantize scales, call {i}")
        total = sum(ref.dequantize_blocks(c, s_, spec, n) for c, s_ in rows)  # fp32, rank order
        rc, rs = ref.quantize_blocks(total, spec)
        assert_bits_equal(cf, rc, f"{fmt} W={world} reduce_requantize vs reference")
        assert_bits_equal(sf, rs, f"{fmt} W={world} scales vs reference")
    keys = len(fast._fast)
    fast.reduce_requantize(codes[:1].clone(), scales[:1].clone(), spec, n, cf, sf)  # W = 1: another key
    assert len(fast._fast) == keys + 1


def test_mismatches_fall_back(device):
    spec = get_format("int4")
    n = 4 * spec.block
    fast, slow = _launchers()
    x = _data(spec, n, 0, device)
    cf, sf = _buffers(spec, n, device)
    fast.quantize(x, spec, cf, sf)
    fast.quantize(x, spec, cf, sf)
    assert fast.fast_hits == 1 and len(fast._fast) == 1

    # a code buffer at an odd address: a new key, the normal path (generic tile), then its own entry
    co, so = _buffers(spec, n, device, odd=True)
    fast.quantize(x, spec, co, so)
    assert fast.fast_hits == 1 and len(fast._fast) == 2
    assert_bits_equal(co, cf, "odd-address codes")
    fast.quantize(x, spec, co, so)
    assert fast.fast_hits == 2

    # another element count: another key
    m = 2 * spec.block
    c2, s2 = _buffers(spec, m, device)
    fast.quantize(x[:m], spec, c2, s2)
    assert fast.fast_hits == 2 and len(fast._fast) == 3
    cs, ss = _buffers(spec, m, device)
    slow.quantize(x[:m], spec, cs, ss)
    assert_bits_equal(c2, cs, "shorter codes")

    # non-contiguous data: normal path, no entry
    xs = _data(spec, 2 * n, 3, device)[::2]
    fast.quantize(xs, spec, cf, sf)
    fast.quantize(xs, spec, cf, sf)
    assert fast.fast_hits == 2 and len(fast._fast) == 3
    slow.quantize(xs, spec, cs2 := _buffers(spec, n, device)[0], ss2 := _buffers(spec, n, device)[1])
    assert_bits_equal(cf, cs2, "non-contiguous data codes")
    assert_bits_equal(sf, ss2, "non-contiguous data scales")

    # wrong buffer sizes still fail with the normal path's error (no entry matches them)
    with pytest.raises(ValueError, match="code bytes"):
        fast.quantize(x, spec, c2, s2)

    # the fast path off: never taken
    fast.fast = False
    fast.quantize(x, spec, cf, sf)
    assert fast.fast_hits == 2


def test_a_replaced_kernel_is_not_bypassed(device, monkeypatch):
    from agoq_triton_kernels import kernels as K

    fast, _ = _launchers()
    spec = get_format("fp8_e4m3")
    x = _data(spec, spec.block, 0, device)
    c, s = _buffers(spec, spec.block, device)
    fast.quantize(x, spec, c, s)
    calls = []
    real = K.quantize_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*a, **kw):
                calls.append(grid)
                return real[grid](*a, **kw)
            return launch

    monkeypatch.setattr(K, "quantize_kernel", Spy())
    fast.quantize(x, spec, c, s)
    assert calls and fast.fast_hits == 0


def test_tensor_scaled_and_float64_take_the_normal_path(device):
    fast, _ = _launchers()
    spec = get_format("nvfp4")
    n = 2 * spec.block
    x = _data(spec, n, 1, device, torch.float32)
    c, s = _buffers(spec, n, device)
    for _ in range(2):
        fast.quantize(x, spec, c, s)
    spec8 = get_format("fp8_e4m3")
    x64 = _data(spec8, spec8.block, 2, device, torch.float64)
    c8, s8 = _buffers(spec8, spec8.block, device)
    for _ in range(2):
        fast.quantize(x64, spec8, c8, s8)
    assert fast.fast_hits == 0 and not fast._fast
    rc, rs = ref.quantize_blocks(x64.cpu(), spec8)
    assert_bits_equal(c8, rc, "float64 codes")


def test_entries_do_not_hold_the_buffers(device):
    fast, _ = _launchers()
    spec = get_format("fp8_e4m3")
    x = _data(spec, spec.block, 0, device)
    c, s = _buffers(spec, spec.block, device)
    fast.quantize(x, spec, c, s)
    (e,) = fast._fast.values()
    assert all(e.template[i] is None for i in e.slots)


# ---- Launcher.launch: the fused LAAQ kernels (agoq_cuda.fused_norm, agoq_cuda.fused_swiglu) ----------------------
FUSED_FORMATS = ["int4", "nf4", "fp8_e4m3", "mxfp4"]


@pytest.fixture
def plugin_launcher(monkeypatch):
    """agoq-cuda's LAUNCHER (the fused ops launch through it) with the fast path on, entries built in the interpreter,
    and no entries or hits from earlier tests."""
    from agoq_cuda.launch import LAUNCHER

    for name, value in (("fast", True), ("fast_interpreted", True), ("_fast", {}), ("fast_hits", 0)):
        monkeypatch.setattr(LAUNCHER, name, value)
    return LAUNCHER


def _counted(la, hit: bool, call, what: str) -> None:
    """call() on the fast path: one cache hit and no new entry, or (a miss) one new entry."""
    hits, keys = la.fast_hits, len(la._fast)
    call()
    assert (la.fast_hits - hits, len(la._fast) - keys) == ((1, 0) if hit else (0, 1)), what


def _unhurried(la, call) -> None:
    """call() with the fast path off: Triton's own dispatch (JITFunction.run)."""
    la.fast = False
    try:
        call()
    finally:
        la.fast = True


def _assert_entries_hold_no_tensors(la) -> None:
    for e in la._fast.values():
        assert e.slots and all(e.template[i] is None for i in e.slots)
        assert not any(isinstance(v, torch.Tensor) for v in e.template)
    assert any(isinstance(k, str) for e in la._fast.values() for k in e.sources)  # elut_ptr: a keyword tensor slot


@pytest.mark.parametrize("fmt", FUSED_FORMATS)
def test_fused_norm_fast_launch_bit_identical(fmt, plugin_launcher, device):
    """rmsnorm_quant_into through Launcher.launch: the calls after the first of a key hit the cache and write the same
    bits as Triton's own dispatch, into each call's own fresh outputs from each call's own inputs; the optional rinv
    output (None or a tensor) and another row count are other keys."""
    from agoq_cuda.fused_norm import rmsnorm_quant_into

    la, spec, h = plugin_launcher, get_format(fmt), 256

    def outs(m):  # y, codes, scales, rinv: poisoned, so a launch that writes elsewhere shows
        return (torch.full((m, h), 7.0, dtype=torch.bfloat16, device=device),
                torch.full((spec.code_bytes(m * h),), 0xA5, dtype=torch.uint8, device=device),
                torch.full((spec.num_blocks(m * h),), -7.0, device=device),
                torch.full((m,), -1.0, device=device))

    # (rows, rinv wanted, a cache hit)
    calls = [(2, False, False), (2, False, True), (2, True, False), (2, True, True), (2, False, True),
             (3, False, False), (3, False, True)]
    for i, (m, with_r, hit) in enumerate(calls):
        x = _data(spec, m * h, i, device).view(m, h)
        w = (1 + 0.1 * _data(spec, h, 50 + i, device)).to(torch.bfloat16)
        fast_out, slow_out = outs(m), outs(m)

        def run(o):
            rmsnorm_quant_into(x, w, 1e-5, spec, *o[:3], rinv=o[3] if with_r else None)

        _counted(la, hit, lambda: run(fast_out), f"{fmt} call {i}")
        _unhurried(la, lambda: run(slow_out))
        for a, b, what in zip(fast_out, slow_out, ("y", "codes", "scales", "rinv")):
            assert_bits_equal(a, b, f"{fmt} rmsnorm_quant {what}, call {i}")
        rc, rs = ref.quantize_blocks(x.cpu().reshape(-1), spec)
        assert_bits_equal(fast_out[1], rc, f"{fmt} rmsnorm_quant codes vs reference, call {i}")
        assert_bits_equal(fast_out[2], rs, f"{fmt} rmsnorm_quant scales vs reference, call {i}")
        assert bool((fast_out[3] > 0).all()) == with_r
    assert la.fast_hits == 4 and len(la._fast) == 3
    _assert_entries_hold_no_tensors(la)


@pytest.mark.parametrize("fmt", FUSED_FORMATS)
def test_fused_swiglu_fast_launch_bit_identical(fmt, plugin_launcher, device):
    """silu_mul_quant_into and silu_mul_backward_into through Launcher.launch: hits after the first call of a key,
    the same bits as Triton's own dispatch for every call (new inputs, fresh outputs), another size another key."""
    from agoq_cuda.fused_swiglu import silu_mul_backward_into, silu_mul_quant_into

    la, spec, cols = plugin_launcher, get_format(fmt), 256
    for i, (rows, hit) in enumerate([(2, False), (2, True), (2, True), (3, False), (3, True)]):
        n = rows * cols
        gate, up, dh = (_data(spec, n, 3 * i + k, device).view(rows, cols) for k in range(3))

        def fwd_outs():  # h, gate codes/scales, up codes/scales
            return [torch.full_like(gate, 3.0), *_buffers(spec, n, device), *_buffers(spec, n, device)]

        ff, fs = fwd_outs(), fwd_outs()
        _counted(la, hit, lambda: silu_mul_quant_into(gate, up, spec, ff[0], *ff[1:]), f"{fmt} forward {i}")
        _unhurried(la, lambda: silu_mul_quant_into(gate, up, spec, fs[0], *fs[1:]))
        for a, b, what in zip(ff, fs, ("h", "gate codes", "gate scales", "up codes", "up scales")):
            assert_bits_equal(a, b, f"{fmt} silu_mul_quant {what}, call {i}")

        bf, bs = ([torch.full_like(dh, 5.0) for _ in range(3)] for _ in range(2))  # h, dgate, dup
        _counted(la, hit, lambda: silu_mul_backward_into(dh, *ff[1:], spec, *bf), f"{fmt} backward {i}")
        _unhurried(la, lambda: silu_mul_backward_into(dh, *ff[1:], spec, *bs))
        for a, b, what in zip(bf, bs, ("h", "dgate", "dup")):
            assert_bits_equal(a, b, f"{fmt} silu_mul_backward {what}, call {i}")
        assert not bool((bf[1] == 5.0).all())
    assert la.fast_hits == 6 and len(la._fast) == 4
    _assert_entries_hold_no_tensors(la)


@triton.jit
def _scale_kernel(x_ptr, y_ptr, r_ptr, n, s, BLOCK: tl.constexpr, TAG: tl.constexpr = 0):
    """y = x * s; r = y + 1 where r_ptr is given (a pointer that may be None: no constexpr flag tells). TAG: unused
    (only the key sees it)."""
    offs = tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(x_ptr + offs, mask=m) * s
    tl.store(y_ptr + offs, v, mask=m)
    if r_ptr is not None:
        tl.store(r_ptr + offs, v + 1.0, mask=m)


class _Float(float):
    """A float of a type the key does not cover."""


def test_launch_keys_every_argument(device):
    """Launcher.launch's key, one argument at a time: a pointer None or given, another float (-0.0 too), 1 or True,
    another int, another 16-byte alignment, another dtype of a pointer: each a new entry; the same again: a hit; an
    argument of a type the key does not cover: the normal launch, no entry. Each call's outputs are its own."""
    la, _ = _launchers()
    x = torch.arange(40, dtype=torch.float32, device=device)

    def call(hit, xs, n=32, s=2.0, with_r=False, tag=0):
        y, r = torch.full_like(x, -5.0), torch.full_like(x, -5.0)
        _counted(la, hit, lambda: la.launch(_scale_kernel, 1, (xs, y), {"r_ptr": r if with_r else None, "n": n,
                                                                         "s": s, "BLOCK": 64, "TAG": tag,
                                                                         "enable_fp_fusion": False}), str((n, s)))
        if str(s) == "-0.0":  # the interpreter drops the sign of a -0.0 argument (a GPU launcher passes its bits)
            assert bool((y[:n] == 0).all())
        else:  # exact: small integers times 2, 3 or 0
            assert_bits_equal(y[:n], xs[:n].float() * s, f"y, s={s}")
        assert bool((y[n:] == -5.0).all())
        assert torch.equal(r[:n], y[:n] + 1.0) if with_r else bool((r == -5.0).all())

    call(False, x)
    call(True, x)
    call(False, x, with_r=True)
    call(True, x, with_r=True)
    call(True, x)
    call(False, x, s=3.0)
    call(False, x, s=0.0)
    call(False, x, s=-0.0)  # == 0.0, but other bits: another key
    call(True, x, s=-0.0)
    call(False, x, tag=1)
    call(False, x, tag=True)  # == 1, but another constexpr to Triton: another key
    call(True, x, tag=True)
    call(False, x, n=31)
    call(True, x[4:])    # 16 bytes further: the same alignment class (the entry, filled with this pointer)
    call(False, x[1:])   # 4 bytes further: another
    call(True, x[1:])
    call(False, x.to(torch.float16))
    keys = len(la._fast)
    hits = la.fast_hits
    la.launch(_scale_kernel, 1, (x, torch.empty_like(x)), {"r_ptr": None, "n": 32, "s": _Float(2.0), "BLOCK": 64})
    assert (len(la._fast), la.fast_hits) == (keys, hits)


# ---- the real-mode launch, on CPU: a fake NVIDIA driver and a stub CompiledKernel -----------------------------
_FAKE_TRITON = textwrap.dedent('''
    import torch, triton
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    class FakeDriver:
        def get_current_device(self): return 0
        def get_current_stream(self, device=None): return 1234
        def get_current_target(self): return GPUTarget("cuda", 90, 32)
        def get_active_torch_device(self): return torch.device("cpu")

    CALLS = []

    class Stub:  # what JITFunction.run and the fast path call: CompiledKernel.run(grid, stream, ..., *args)
        function, packed_metadata = "fn", "meta"
        def launch_metadata(self, grid, stream, *args): return None
        def run(self, *a): CALLS.append(a)

    driver.set_active(FakeDriver())
    compiles = []
    def _do_compile(self, key, signature, device, constexprs, options, attrs, warmup):
        compiles.append(key)
        k = Stub(); self.device_caches[device][0][key] = k
        return k
    JITFunction._do_compile = _do_compile

    from agoq_core.formats.spec import get_format
    from agoq_triton_kernels import launch as L
    assert not L.is_interpreted()
    L.COMPILED_TYPES = (Stub,)

    def norm(a):  # tensors as the address the launcher sends
        return tuple(x.data_ptr() if isinstance(x, torch.Tensor) else x for x in a)

    def hooked_then_fast(launcher, call):  # call() has an entry
        from triton import knobs
        hook = lambda md: None
        knobs.runtime.launch_enter_hook.add(hook)
        try:  # a launch hook set: Triton's dispatch (the hook gets its metadata)
            CALLS.clear(); hits = launcher.fast_hits
            call()
            assert launcher.fast_hits == hits and CALLS[0][7] is knobs.runtime.launch_enter_hook
        finally:
            knobs.runtime.launch_enter_hook.remove(hook)
        call()  # and the entry again
        assert launcher.fast_hits == hits + 1
''')
_REAL_MODE = _FAKE_TRITON + textwrap.dedent('''
    from agoq_cuda.launch import CudaGeometry
    la = L.Launcher(CudaGeometry())
    assert la.fast

    for fmt in ("fp8_e4m3", "int4", "nf4"):
        spec = get_format(fmt)
        n = 8 * spec.block
        g = torch.randn(n).to(torch.bfloat16)
        codes = torch.zeros(spec.code_bytes(n), dtype=torch.uint8)
        scales = torch.zeros(spec.num_blocks(n))
        rcodes = torch.stack([codes, codes]); rscales = torch.stack([scales, scales]) + 1.0
        out_c, out_s = torch.zeros_like(codes), torch.zeros_like(scales)
        for op, call in (("quantize", lambda: la.quantize(g, spec, codes, scales)),
                         ("accumulate", lambda: la.accumulate(codes, scales, spec, g)),
                         ("reduce_requantize", lambda: la.reduce_requantize(rcodes, rscales, spec, n, out_c, out_s))):
            CALLS.clear(); hits = la.fast_hits
            call(); call()
            assert la.fast_hits == hits + 1, (fmt, op)
            first, second = CALLS
            # grid, stream, function, metadata: the same; launch hooks: Triton passes its (empty) chains
            assert first[:6] == second[:6] and first[1:3] == (1, 1) and first[3] == 1234, (first[:6], second[:6])
            assert second[6:9] == (None, None, None)
            assert norm(first[9:]) == second[9:], (fmt, op, norm(first[9:]), second[9:])

    # a misaligned data pointer: another key, Triton dispatches (and specializes) again
    spec = get_format("fp8_e4m3"); n = 8 * spec.block
    buf = torch.randn(n + 1).to(torch.bfloat16)
    codes = torch.zeros(spec.code_bytes(n), dtype=torch.uint8); scales = torch.zeros(spec.num_blocks(n))
    la.quantize(buf[:n], spec, codes, scales); hits = la.fast_hits; nc = len(compiles)
    la.quantize(buf[1:], spec, codes, scales)
    assert la.fast_hits == hits and len(compiles) == nc + 1  # a new specialization (pointer not 16-aligned)
    la.quantize(buf[1:], spec, codes, scales)
    assert la.fast_hits == hits + 1

    hooked_then_fast(la, lambda: la.quantize(buf[1:], spec, codes, scales))
    print("REAL-MODE OK")
''')


def _real_mode(script: str, done: str) -> None:
    """Run ``script`` in a fresh interpreter without TRITON_INTERPRET (real mode, with the fake Triton driver)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and done in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]


def test_real_mode_launch_matches_triton_dispatch():
    _real_mode(_REAL_MODE, "REAL-MODE OK")


# The fused LAAQ kernels in real mode (agoq-cuda's LAUNCHER): a hit passes exactly what Triton's own dispatch of the
# same call (same buffers, fast path off) passes, with every tensor as that call's address.
_REAL_MODE_FUSED = _FAKE_TRITON + textwrap.dedent('''
    from agoq_cuda.fused_norm import rmsnorm_quant_into
    from agoq_cuda.fused_swiglu import silu_mul_backward_into, silu_mul_quant_into
    from agoq_cuda.launch import LAUNCHER
    assert LAUNCHER.fast

    def dispatched(call):  # the launch Triton's JITFunction.run makes for call()
        LAUNCHER.fast = False
        try:
            CALLS.clear(); call(); (c,) = CALLS
        finally:
            LAUNCHER.fast = True
        return c

    def check(make, what):  # make() -> a call on fresh buffers
        first, second = make(), make()
        CALLS.clear(); hits, keys = LAUNCHER.fast_hits, len(LAUNCHER._fast)
        first(); second()
        assert (LAUNCHER.fast_hits, len(LAUNCHER._fast)) == (hits + 1, keys + 1), what
        triton_first, fast_second = CALLS
        want = dispatched(second)
        assert fast_second[:6] == want[:6] and fast_second[6:9] == (None, None, None), (what, fast_second[:9])
        assert fast_second[9:] == norm(want[9:]), (what, fast_second[9:], norm(want[9:]))
        assert fast_second[9:] != norm(triton_first[9:]), what  # the buffers were the second call's
        for e in LAUNCHER._fast.values():
            assert all(e.template[i] is None for i in e.slots) and e.run is not None
            assert not any(isinstance(v, torch.Tensor) for v in e.template)

    h = 256
    for fmt in ("int4", "nf4", "fp8_e4m3"):
        spec = get_format(fmt)
        x = torch.randn(4, h).to(torch.bfloat16); w = torch.ones(h, dtype=torch.bfloat16)
        n = x.numel()
        def codec():
            return (torch.zeros(spec.code_bytes(n), dtype=torch.uint8), torch.zeros(spec.num_blocks(n)))
        for with_r in (False, True):  # rinv None, then a tensor: another key
            def norm_call():
                y, (c, s), r = torch.empty_like(x), codec(), torch.zeros(4) if with_r else None
                return lambda: rmsnorm_quant_into(x, w, 1e-5, spec, y, c, s, rinv=r)
            check(norm_call, (fmt, "rmsnorm_quant", with_r))
        def fwd_call():
            hh, (gc, gs), (uc, us) = torch.empty_like(x), codec(), codec()
            return lambda: silu_mul_quant_into(x, x, spec, hh, gc, gs, uc, us)
        check(fwd_call, (fmt, "silu_mul_quant"))
        def bwd_call():
            (gc, gs), (uc, us), outs = codec(), codec(), [torch.empty_like(x) for _ in range(3)]
            return lambda: silu_mul_backward_into(x, gc, gs, uc, us, spec, *outs)
        check(bwd_call, (fmt, "silu_mul_backward"))

    hooked_then_fast(LAUNCHER, norm_call())
    print("REAL-MODE FUSED OK")
''')


def test_real_mode_fused_launch_matches_triton_dispatch():
    _real_mode(_REAL_MODE_FUSED, "REAL-MODE FUSED OK")
