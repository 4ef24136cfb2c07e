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
  misaligned buffer send the call back through Triton.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

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


# ---- the real-mode launch, on CPU: a fake NVIDIA driver and a stub CompiledKernel -----------------------------
_REAL_MODE = textwrap.dedent('''
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
    from agoq_cuda.launch import CudaGeometry
    from agoq_triton_kernels import launch as L
    assert not L.is_interpreted()
    L.COMPILED_TYPES = (Stub,)
    la = L.Launcher(CudaGeometry())
    assert la.fast

    def norm(a):  # tensors as the address the launcher sends
        return tuple(x.data_ptr() if isinstance(x, torch.Tensor) else x for x in a)

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

    # a launch hook set: the normal path (the hook gets Triton's metadata)
    from triton import knobs
    seen = []
    hook = lambda md: seen.append(md)
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        CALLS.clear(); hits = la.fast_hits
        la.quantize(buf[1:], spec, codes, scales)
        assert la.fast_hits == hits and CALLS[0][7] is knobs.runtime.launch_enter_hook
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    la.quantize(buf[1:], spec, codes, scales)
    assert la.fast_hits == hits + 1
    print("REAL-MODE OK")
''')


def test_real_mode_launch_matches_triton_dispatch():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    r = subprocess.run([sys.executable, "-c", _REAL_MODE], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "REAL-MODE OK" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
