"""The one host launcher of the four codec kernels, for every Triton backend.

Everything on the bit-exact path between a flat buffer and a kernel argument happens here, once: buffer
checks, how tensors cross the boundary (codes as int8 views: no uint8 arithmetic in kernels; bf16 as its
int16 bit pattern, widened and rounded with integer logic; fp32 scales), the format constexprs, the NF4
tables, the cutting of tensors above 2**30 elements into pieces of whole blocks (int32 offsets cannot
wrap) with a ragged last block in a launch of its own (RAGGED=True), and launching with fp contraction
off (``enable_fp_fusion=False``: accumulate's ``decode(c) * s + g`` must round twice like the reference,
never once as an FMA).

What differs between devices is only the launch geometry, which a plugin supplies as a
:class:`LaunchGeometry` strategy: agoq-cuda sizes tiles in lanes per CTA and fills the SMs (and may use
hardware conversions, HW=True, on sm_89+); agoq-ascend plans one program per vector core with tiles sized
to the unified buffer and lanes padded to 32 bytes, decodes NF4 with a select tree (no cheap gather) and
always runs the portable arithmetic (HW=False).
"""
from __future__ import annotations

import functools
import inspect
import os
import struct
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

import torch
import triton

from agoq_triton_kernels import kernels as K
from agoq_triton_kernels.buffers import check_codec_buffers, float_view
from agoq_triton_kernels.codes import NF4_LEVELS_KERNEL
from agoq_triton_kernels.layout import MAX_CHUNK_ELEMENTS, encode_lut, spec_constexprs

__all__ = ["Launch", "LaunchGeometry", "Launcher", "is_interpreted", "segments", "nf4_lut", "nf4_encode_lut",
           "OPS"]

OPS = ("quantize", "dequantize", "accumulate", "reduce_requantize")


def is_interpreted(kernel: Any = None) -> bool:
    """Whether ``kernel`` (default: the shared quantize kernel) was decorated under TRITON_INTERPRET
    (Triton fixes the mode when the decorator runs, i.e. at import)."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(K.quantize_kernel if kernel is None else kernel, InterpretedFunction)


@functools.cache
def nf4_lut(device: torch.device) -> torch.Tensor:
    """The NF4 decode table (fp32 levels) on ``device``. Every kernel takes its pointer; launches with
    NF4_LUT=False never read it."""
    return torch.tensor(NF4_LEVELS_KERNEL, dtype=torch.float32, device=device)


@functools.cache
def nf4_encode_lut(kind: str, device: torch.device) -> torch.Tensor:
    """The bucket table that encodes ``kind`` with one gather per element (layout.encode_lut)."""
    return torch.tensor(encode_lut(kind), dtype=torch.int64, device=device)


def segments(spec, n: int):
    """One launch per piece: runs of whole blocks (<= 2**30 elements each) with RAGGED=False (row masks
    only), then the last, partial block, if any, with RAGGED=True (element masks), as the shared kernels
    expect. Yields (element offset, elements, code-byte offset, block offset, ragged)."""
    full = n // spec.block * spec.block
    step = max(spec.block, MAX_CHUNK_ELEMENTS // spec.block * spec.block)
    per_block = spec.block * spec.bits // 8
    for off in range(0, full, step):
        yield off, min(step, full - off), off // spec.block * per_block, off // spec.block, False
    if full < n:
        yield full, n - full, full // spec.block * per_block, full // spec.block, True


@dataclass(frozen=True, kw_only=True, slots=True)
class Launch:
    """One launch as a geometry decides it: ``grid`` programs walk ``n_tiles`` tiles of ``rows`` blocks x
    ``block_p`` lanes (BLOCK_P: a power of two >= the block; lanes beyond it are masked)."""

    grid: int
    rows: int
    block_p: int
    n_tiles: int
    options: Mapping[str, Any] = field(default_factory=dict)
    """Device launch/compile options (CUDA: num_warps; Triton-Ascend: multibuffer)."""
    plan: Any = None
    """The geometry's own record of the decision (tests and benchmarks read it from ``last_plans``)."""
    vec16: bool = False
    """Use the 16-lane tile (kernels.VEC16: a thread owns 16 consecutive elements and
    packs/unpacks its codes in registers) where the launch allows it (whole power-of-two blocks >= 16, aligned code buffer)."""
    words: bool = False
    """With the 16-lane tile, read a bf16 input as int32 words of two elements (kernels.WORDS; agoq-cuda decides,
    and only for tiles where every thread owns its own elements)."""
    max16: bool = False
    """With ``words``, quantize takes the block absmax from the words two magnitudes at a time (kernels.MAX16; the
    GPU form needs sm_90's max.u16x2, agoq-cuda decides)."""


class LaunchGeometry(Protocol):
    """What a plugin decides about launches; the launcher does everything else."""

    who: str
    """Names the backend in error messages ("agoq-cuda")."""
    nf4_lut: bool
    """True: NF4 decodes by a table gather and encodes by a bucket table; False: select tree / threshold
    search (for devices where gathers are slow)."""
    float64_via_float32: bool
    """Accept float64 inputs by rounding them to float32 with torch first (as the reference does)."""
    # Optional: ``contig_pack: bool`` (default False): the CONTIG constexpr of the kernels: 5/6-bit pack groups
    # written and read by one access contiguous per block instead of one strided access per byte (agoq-ascend:
    # Triton-Ascend makes a 3/5-byte innermost stride a byte-by-byte transfer). Same bytes either way.

    def hw(self, device: torch.device, requested: bool | None) -> bool:
        """The HW constexpr for ``device`` (``requested``: None = the device default; an explicit True the
        device cannot honour must raise)."""

    # Optional: ``retry_smaller(exc, launch, replan) -> Launch | None``: a smaller launch to retry with after
    # a compile error ``exc`` (agoq-ascend: "ub overflow" -> half the rows); None re-raises.
    # Optional: ``partials_launch(device) -> (rows, programs)``: the tile rows and grid (None: the plan's) of a pass
    # whose per-program partial results one program then combines (NVFP4's tensor scale); agoq-cuda: few persistent
    # programs. Any values give the same bits (a maximum is exact in any order).

    def plan(self, op: str, spec, numel: int, io_dtype: torch.dtype, device: torch.device, *,
             rows: int | None, programs: int | None) -> Launch:
        """The launch of ``op`` over ``numel`` elements (<= 2**30, whole blocks or one ragged block);
        ``io_dtype`` is the float tensor it reads or writes (float32 for reduce_requantize); ``rows`` and
        ``programs`` are test/tuning overrides."""


def _scale_and_inverse(s: torch.Tensor) -> torch.Tensor:
    """[S, RN(1/S)] (1/S with torch's correctly rounded fp32 division; 0 -> 0)."""
    inv = torch.where(s == 0, torch.zeros_like(s), torch.ones_like(s) / torch.where(s == 0, torch.ones_like(s), s))
    return torch.stack([s, inv])


def _vec16(la: Launch, spec, ragged: bool, *codes: torch.Tensor, stride: int = 0, op: str = "") -> dict:
    """{"VEC16": True} where the geometry asks for the 16-lane tile and this piece allows it: whole power-of-two
    blocks of >= 16 elements, and code buffers (and reduce_requantize's rank stride) aligned for the packed
    loads and stores: 4- and 6-bit codes move as int32 words, 5-bit as int16; 8-bit codes are read as bytes
    (any address) but written as int32 words (kernels._store_codes16), so the buffer an op writes (the last of
    ``codes``; dequantize writes none) must be 4-byte aligned. Otherwise nothing (the generic tile). (Until the
    H200 run of 2026-12-02 an odd 8-bit buffer took the tile and the store raised "misaligned address": the
    interpreter cannot see alignment.)"""
    if not la.vec16 or ragged or la.block_p != spec.block or spec.block < 16:
        return {}
    if not vec16_aligned(spec, codes, writes=op != "dequantize", stride=stride):
        return {}
    if not (la.words and op in ("quantize", "accumulate")):
        return {"VEC16": True}
    return {"VEC16": True, "WORDS": True, "MAX16": True} if la.max16 and op == "quantize" else \
        {"VEC16": True, "WORDS": True}


def vec16_aligned(spec, codes, *, writes: bool, stride: int = 0) -> bool:
    """Whether code buffers ``codes`` (and a rank stride) are aligned for the 16-lane tile's packed accesses (see
    :func:`_vec16`); ``writes``: the last buffer is written."""
    if spec.bits == 8:
        return not writes or codes[-1].data_ptr() % 4 == 0
    align = _VEC16_ALIGN[spec.bits]
    return stride % align == 0 and all(c.data_ptr() % align == 0 for c in codes)


_VEC16_ALIGN = {4: 4, 6: 4, 5: 2}


# The direct-launch fast path (Launcher._fast_*): for each op, the buffers a call passes to _dispatch (the only
# arguments that change between calls of one key), in that order: (positional kernel argument, how the normal path
# passes it: "float" = float_view of the flat tensor, "codes" = the uint8 buffer viewed as int8, "plain" = as is).
_FAST_SLOTS = {"quantize": ((0, "float"), (1, "codes"), (2, "plain")),
               "dequantize": ((3, "float"), (0, "codes"), (1, "plain")),
               "accumulate": ((3, "float"), (0, "codes"), (1, "plain")),
               # codes [W, B], scales [W, NB] (one row per rank), codes_out, scales_out
               "reduce_requantize": ((0, "codes"), (1, "plain"), (3, "codes"), (4, "plain"))}
# per op, which of its buffers are float tensors (their dtype must be one the fast path handles)
_FAST_FLOATS = {op: tuple(j for j, (_, kind) in enumerate(slots) if kind == "float")
                for op, slots in _FAST_SLOTS.items()}


def _compiled_types() -> tuple:
    """The handle types a real (not interpreted) Triton launch returns and the fast path can launch again."""
    try:
        from triton.compiler import CompiledKernel
    except ImportError:  # pragma: no cover
        return ()
    return (CompiledKernel,)


COMPILED_TYPES: tuple = ()
"""Filled on first use from triton.compiler (tests add a stub type to run the real-mode path on CPU)."""


def fast_launch_default() -> bool:
    """AGOQ_FAST_LAUNCH=0 turns the direct-launch fast path off (default on)."""
    return os.environ.get("AGOQ_FAST_LAUNCH", "1").strip().lower() not in ("0", "false", "off", "no")


_FAST_DTYPES = frozenset({torch.float32, torch.bfloat16, torch.float16})

_float_bits = struct.Struct("<d").pack


@functools.cache
def _knobs():
    from triton import knobs

    return knobs


def _hooked(hook) -> bool:
    """Whether a Triton launch hook is set: Triton 3.6 keeps an always-present HookChain (empty: no hook);
    older versions None."""
    return hook is not None and bool(getattr(hook, "calls", True))


@functools.cache
def _driver_config():
    from triton.runtime import driver

    return driver


def _driver():
    """Triton's active driver (looked up per call: tests swap it; the import, 0.8 us per call on the H200 host, is
    made once)."""
    return _driver_config().active


def _compiled() -> tuple:
    global COMPILED_TYPES
    if not COMPILED_TYPES:
        COMPILED_TYPES = _compiled_types()
    return COMPILED_TYPES


@dataclass(slots=True)
class _FastEntry:
    """One checked call signature: the compiled kernel to launch again and its full argument list (every
    parameter of the kernel in signature order, constexprs included, as Triton's binder would pass them),
    with the buffer slots to fill per call."""

    template: list
    slots: tuple                  # the positions of the call's buffers in ``template`` (_FAST_SLOTS order)
    kinds: tuple                  # per slot: how the codec op passes it (_FAST_SLOTS)
    grid: int
    plan: Any
    kernel: Any                   # the JITFunction (its pre_run_hooks are checked per call)
    run: Any = None               # real mode: the CompiledKernel's launcher (CudaLauncher)
    function: Any = None
    packed_metadata: Any = None
    device_index: int | None = None
    options: dict | None = None   # interpreted mode (tests only): the launch options
    keep: tuple = ()              # real mode: the tables (NF4 LUTs) whose addresses the template holds
    sources: tuple = ()           # Launcher.launch: per slot, where the call has the tensor (an int: that positional
    #                               argument, a str: that keyword)


def ts_arg(ts: torch.Tensor | None) -> dict:
    return {} if ts is None else {"ts_ptr": ts}


def _block_local(spec, what: str) -> None:
    if getattr(spec, "tensor_scaled", False):
        raise ValueError(f"{what}: {spec.name} has a per-tensor scale; only block-local formats can be "
                         "requantized block by block")


class Launcher:
    """The shared kernels launched with the geometry a plugin provides. ``last_plans`` holds the
    geometry's plans of the most recent call (one per piece)."""

    def __init__(self, geometry: LaunchGeometry):
        self.geometry = geometry
        self.last_plans: list[Any] = []
        # Host time per call matters for QuanGrad's buckets (2**25 elements move in ~25 us on an H200): the
        # format constexprs, and the plans of a geometry that declares them pure (``pure_plans``: same
        # arguments, same Launch; agoq-ascend's learn from failures and are not cached), are computed once.
        self._formats: dict = {}
        self._plans: dict = {}
        # The direct-launch fast path (issue 17): per checked call signature, the compiled kernel and its argument
        # list, launched again without the checks, views, plan lookups and Triton's binder/specialization/cache
        # lookup (JITFunction.run). Only for geometries that declare ``fast_launch`` (pure plans, Triton's NVIDIA
        # launcher) and single-launch calls; anything the key does not cover takes the normal path.
        self.fast = bool(getattr(geometry, "fast_launch", False)) and fast_launch_default()
        self.fast_interpreted = False
        """Tests: build entries under TRITON_INTERPRET too (launched through the interpreted kernel with the cached
        argument list, so the list and the slot filling are checked bit for bit on CPU)."""
        self.fast_hits = 0
        self._interp = is_interpreted()
        self._fast: dict = {}
        self._tls = threading.local()  # .record: the launches of the current normal-path call, when recording

    def _format(self, spec, device: torch.device, hw: bool | None) -> dict:
        """The constexprs fixed for a whole call (checked before any launch: a bad block fails here)."""
        key = (spec, device, hw)
        c = self._formats.get(key)
        if c is None:
            c = dict(spec_constexprs(spec))
            c.update(HW=self.geometry.hw(device, hw), NF4_LUT=self.geometry.nf4_lut)
            if getattr(self.geometry, "contig_pack", False):  # passed only when set: CUDA's launches stay unchanged
                c["CONTIG"] = True
            if len(self._formats) < 4096:
                self._formats[key] = c
        return c

    def _first(self, replan, rows: int | None) -> Launch:
        """replan(rows=rows), from the cache when the geometry's plans are pure."""
        if not getattr(self.geometry, "pure_plans", False):
            return replan(rows=rows)
        key = (replan.args, replan.keywords.get("programs"), rows)
        la = self._plans.get(key)
        if la is None:
            la = replan(rows=rows)
            if len(self._plans) < 4096:
                self._plans[key] = la
        return la

    @staticmethod
    def _consts(fmt: dict, launch: Launch, ragged: bool) -> dict:
        return {**fmt, "BLOCK_P": launch.block_p, "ROWS": launch.rows, "RAGGED": ragged}

    def _run(self, kernel, launch: Launch, args, consts, replan=None) -> None:
        """Launch ``kernel``; ``args``/``consts`` map a Launch to the arguments. If compiling fails and the
        geometry offers a smaller launch for that error (``retry_smaller``: Triton-Ascend's "ub overflow"),
        retry with it (``replan(rows)`` plans the same piece with at most ``rows`` rows)."""
        while True:
            try:
                a, c = args(launch), consts(launch)
                res = kernel[(launch.grid,)](*a, **c, **launch.options, enable_fp_fusion=False)
            except Exception as exc:  # noqa: BLE001  (the geometry decides which errors a smaller tile fixes)
                retry = getattr(self.geometry, "retry_smaller", None)
                smaller = retry(exc, launch, replan) if retry is not None and replan is not None else None
                if smaller is None:
                    raise
                launch = smaller
                continue
            self.last_plans.append(launch.plan)
            rec = getattr(self._tls, "record", None)
            if rec is not None:
                rec.append((kernel, launch, a, c, res))
            return

    # ---- the direct-launch fast path (issue 17) ----------------------------------------------------------------
    # A call's key holds everything that decides its launch and Triton's choice of compiled kernel: op, format,
    # element count, the dtypes/shapes/devices of its buffers (the normal path checked them when the entry was
    # made; a contiguous buffer's shape fixes its strides), the overrides, the address of each buffer modulo 16
    # (Triton specializes pointers on 16-byte alignment; VEC16 needs 2- or 4-byte aligned codes), Triton's
    # debug/instrumentation knobs and the current device. Contiguous buffers, one launch (<= 2**30 elements), no
    # per-tensor scale, no launch-enter hook: otherwise the normal path runs (and makes no entry).

    def _fast_state(self):
        """What ends every key: Triton's debug/instrumentation knobs and the current device. None (no key: the normal
        path, no entry) when the fast path is off or a launch hook is set (proton...: hooks get their metadata from
        the normal path)."""
        if not self.fast or (self._interp and not self.fast_interpreted):
            return None
        knobs = _knobs()
        if _hooked(knobs.runtime.launch_enter_hook) or _hooked(knobs.runtime.launch_exit_hook):
            return None
        return knobs.runtime.debug, knobs.compilation.instrumentation_mode, self._current_device()

    def _fast_key(self, op: str, spec, bufs: tuple, n: int, rows, programs, hw):
        if not n or not all(b.is_contiguous() for b in bufs) or getattr(spec, "tensor_scaled", False):
            return None
        for j in _FAST_FLOATS[op]:
            if bufs[j].dtype not in _FAST_DTYPES:
                return None
        state = self._fast_state()
        if state is None:
            return None
        return (op, spec, n, *((b.dtype, tuple(b.shape), b.device, b.data_ptr() & 15) for b in bufs), rows, programs,
                hw, *state)

    def _current_device(self):
        if self._interp:
            return None
        return _driver().get_current_device()

    @staticmethod
    def _applies(e: _FastEntry, kernel) -> bool:
        """Entry ``e`` may launch for ``kernel`` (the kernel the caller launches now): it was made with that very
        kernel (not one replaced since, e.g. by a test), and no pre-run hook asks to see the call."""
        return e.kernel is kernel and not (e.run is not None and kernel.pre_run_hooks)

    def _fire(self, e: _FastEntry, a: list) -> None:
        """Launch entry ``e`` with its filled argument list ``a``."""
        if e.run is not None:
            # what JITFunction.run does after its cache hit, with the binder's list made once: the launcher takes
            # pointers as ints (it would call data_ptr() itself), constexprs are in the list and ignored
            e.run(e.grid, 1, 1, _driver().get_current_stream(e.device_index), e.function, e.packed_metadata, None,
                  None, None, *a)
        else:  # interpreted (tests): the kernel called with the cached list
            e.kernel[(e.grid,)](*a, **e.options)
        self.fast_hits += 1

    def _fast_launch(self, e: _FastEntry, kernel, bufs: tuple) -> bool:
        """Launch entry ``e`` for these buffers; False (nothing launched) when it does not apply (_applies)."""
        if not self._applies(e, kernel):
            return False
        a = e.template.copy()
        if e.run is not None:
            for i, b in zip(e.slots, bufs):
                a[i] = b.data_ptr()
        else:  # interpreted: buffers as the normal path passes them
            for i, kind, b in zip(e.slots, e.kinds, bufs):
                a[i] = float_view(b.reshape(-1), "fast path")[0] if kind == "float" else \
                    b.view(torch.int8) if kind == "codes" else b
        self._fire(e, a)
        self.last_plans = [e.plan]
        return True

    def _recorded(self, key, op: str, normal, bufs: tuple) -> None:
        """Run ``normal()`` (the normal path) recording its launches; make an entry for ``key`` when it launched
        exactly once through a kernel the fast path can launch again."""
        self._tls.record = rec = []
        try:
            normal()
        finally:
            self._tls.record = None
        if len(rec) != 1:
            return
        kernel, la, a, c, res = rec[0]
        slots = tuple(i for i, _ in _FAST_SLOTS[op])
        # the one launch covered the whole buffers (not pieces of them)
        if any(a[i].data_ptr() != b.data_ptr() for i, b in zip(slots, bufs)):
            return
        self._store(key, lambda: self._entry(kernel, la, a, c, res, op))

    def _store(self, key, make) -> None:
        """Keep ``make()`` (an entry or None) as the entry of ``key``, while there is room."""
        if len(self._fast) >= 4096:
            return
        try:
            e = make()
        except Exception:  # noqa: BLE001  (the call itself succeeded: without an entry it stays on the normal path)
            e = None
        if e is not None:
            self._fast[key] = e

    def _bound(self, kernel, res, args: tuple, kwargs: dict, grid: int, plan) -> tuple[_FastEntry, list] | None:
        """A new entry (slots not set yet) for the launch ``kernel[(grid,)](*args, **kwargs)`` that returned
        ``res``, and the kernel's parameter names. ``entry.template``: every parameter in signature order, constexprs
        included: Triton's own binder list (real mode: ``res`` a compiled kernel the fast path can launch again), or
        the list bound from the kernel's signature (interpreter with ``fast_interpreted``: ``entry.options`` are the
        launch options, the keywords that are no parameter). None: no entry."""
        if isinstance(res, _compiled()) and getattr(kernel, "device_caches", None) is not None \
                and not getattr(kernel, "pre_run_hooks", None):
            dev = _driver().get_current_device()
            binder = kernel.device_caches[dev][4]
            bound, _, _ = binder(*args, **kwargs)  # Triton's own argument list for this launch
            return _FastEntry(template=list(bound.values()), slots=(), kinds=(), grid=grid, plan=plan, kernel=kernel,
                              run=res.run, function=res.function, packed_metadata=res.packed_metadata,
                              device_index=dev), list(bound)
        if not (self.fast_interpreted and is_interpreted(kernel)):
            return None
        params = inspect.signature(kernel.fn).parameters
        template = []
        for idx, (name, p) in enumerate(params.items()):
            if idx < len(args):
                template.append(args[idx])
            elif name in kwargs:
                template.append(kwargs[name])
            elif p.default is not inspect.Parameter.empty:
                template.append(p.default)
            else:
                return None
        options = {k: v for k, v in kwargs.items() if k not in params}
        return _FastEntry(template=template, slots=(), kinds=(), grid=grid, plan=plan, kernel=kernel,
                          options=options), list(params)

    @staticmethod
    def _emptied(e: _FastEntry) -> _FastEntry:
        for s_ in e.slots:
            e.template[s_] = None  # the entry must not keep this call's buffers alive
        return e

    def _entry(self, kernel, la: Launch, a, c, res, op: str) -> _FastEntry | None:
        b = self._bound(kernel, res, a, {**c, **la.options, "enable_fp_fusion": False}, la.grid, la.plan)
        if b is None:
            return None
        e = b[0]
        e.slots, e.kinds = zip(*_FAST_SLOTS[op])
        if e.run is not None:
            t = e.template
            e.keep = tuple(v for idx, v in enumerate(t) if idx not in e.slots and isinstance(v, torch.Tensor))
            # the tables go as their addresses too (the launcher would ask the driver about each pointer per launch)
            e.template = [v.data_ptr() if idx not in e.slots and isinstance(v, torch.Tensor) else v
                          for idx, v in enumerate(t)]
        return self._emptied(e)

    def _dispatch(self, op: str, kernel, spec, bufs: tuple, n: int, rows, programs, hw, normal) -> None:
        """Launch this call from its fast-path entry if one exists and applies, else run ``normal()`` (the checked
        path), recording its launch as the entry for the call's key when it can be one. ``bufs``: the call's
        buffers in _FAST_SLOTS[op] order; ``n``: its element count."""
        key = self._fast_key(op, spec, bufs, n, rows, programs, hw)
        if key is None:
            normal()
            return
        e = self._fast.get(key)
        if e is not None and self._fast_launch(e, kernel, bufs):
            return
        self._recorded(key, op, normal, bufs)

    # ---- the same fast path for any kernel: Launcher.launch ----------------------------------------------------
    # For kernels launched outside the four ops (agoq-cuda's fused LAAQ kernels: ~65 launches per step of a 16-layer
    # model, 7.4 ms of host time in JITFunction.run under cProfile). The caller has checked its call; the key is the
    # kernel, the grid and every argument (_launch_key), plus _fast_state. Every tensor in the bound list is a slot,
    # filled per call from the call's own argument (tables included: no addresses kept). Measured on an H200 host
    # (rmsnorm_quant's launch of 29 arguments, no profiler): 33 us per launch through JITFunction.run, 17 us through an
    # entry (7.8 us of it the key); whole calls rmsnorm_quant_into 72 -> 63 us, silu_mul_quant_into 114 -> 89 us,
    # silu_mul_backward_into 110 -> 98 us (the rest is their checks and views).

    def launch(self, kernel, grid: int, args: tuple, kwargs: dict) -> None:
        """``kernel[(grid,)](*args, **kwargs)`` (``kwargs``: constexprs, keyword tensors, which may be None, and
        launch options such as num_warps / enable_fp_fusion), launched directly from a cached entry when an earlier
        call had the same key; ``fast_hits`` counts those. ``last_plans`` is left alone (no geometry plan here)."""
        key = self._launch_key(kernel, grid, args, kwargs)
        if key is not None:
            e = self._fast.get(key)
            if e is not None and self._applies(e, kernel):
                a = e.template.copy()
                real = e.run is not None
                for i, src in zip(e.slots, e.sources):
                    t = args[src] if type(src) is int else kwargs[src]
                    a[i] = t.data_ptr() if real else t
                self._fire(e, a)
                return
        res = kernel[(grid,)](*args, **kwargs)
        if key is not None:
            self._store(key, lambda: self._launch_entry(kernel, res, grid, args, kwargs))

    def _launch_key(self, kernel, grid: int, args: tuple, kwargs: dict):
        """The kernel, the grid, the keyword names (sorted), _fast_state, then one item per argument (positional, then
        keyword by name): a tensor by what Triton specialises a pointer on (element type, 16-byte alignment; a pointer
        carries no shape) and its device; an int, a str or None as itself; a bool as (bool, v) (True == 1, but Triton
        compiles another kernel); a float as its bits (0.0 == -0.0 and NaN != NaN: an entry passes the value of the
        call that made it). Ints are specialised on value (== 1, % 16, i32/i64): keying on it is conservative. Any
        other type: None (the normal launch). A plain loop: one helper call per argument made the key 21 us on a dev CPU,
        this 5 us."""
        state = self._fast_state()
        if state is None:
            return None
        names = sorted(kwargs)
        key = [id(kernel), grid, len(args), *names, *state]
        add = key.append
        for v in (*args, *map(kwargs.__getitem__, names)):
            t = type(v)
            if t is int or t is str or v is None:
                add(v)
            elif t is bool:
                add((bool, v))
            elif t is float:
                add(_float_bits(v))
            elif isinstance(v, torch.Tensor):
                add((v.dtype, v.device, v.data_ptr() & 15))
            else:
                return None
        return tuple(key)

    def _launch_entry(self, kernel, res, grid: int, args: tuple, kwargs: dict) -> _FastEntry | None:
        b = self._bound(kernel, res, args, kwargs, grid, None)
        if b is None:
            return None
        e, names = b
        e.slots = tuple(i for i, v in enumerate(e.template) if isinstance(v, torch.Tensor))
        e.sources = tuple(i if i < len(args) else names[i] for i in e.slots)
        if any(type(k) is str and k not in kwargs for k in e.sources):  # a tensor default: not the call's
            return None
        return self._emptied(e)

    def tensor_scale(self, spec, x: torch.Tensor, *, programs: int | None = None) -> torch.Tensor | None:
        """NVFP4's [S, RN(1/S)] for ``x`` (None for other formats), bit-identical to the reference: one pass of
        absmax_kernel over x (per-program partial maxima), then tensor_scale_kernel (their max, the scale step
        of nvfp4_tensor_scale_from_absmax and the reciprocal, division-free). Two launches; no host sync."""
        if not getattr(spec, "tensor_scaled", False):
            return None
        n = x.numel()
        if n == 0:
            return _scale_and_inverse(torch.zeros((), dtype=torch.float32, device=x.device))
        from agoq_core.formats.mx import NVFP4_MIN_TENSOR_SCALE, NVFP4_SCALE_DIVISOR

        xv, xk, io = self._float_in(x, "quantize")
        dev, fmt = x.device, spec_constexprs(spec)
        # few persistent programs where the geometry says how many (each partial is one more value for the one
        # finishing program to read); else the quantize plan's
        hook = getattr(self.geometry, "partials_launch", None)
        rows, progs = hook(dev) if hook is not None else (None, None)
        launches = [(off, m, ragged, self.plan("quantize", spec, m, io, dev, rows=rows, programs=programs or progs))
                    for off, m, _, _, ragged in segments(spec, n)]
        part = torch.empty(sum(la.grid for *_, la in launches), dtype=torch.float32, device=dev)
        p = 0
        for off, m, ragged, la in launches:
            K.absmax_kernel[(la.grid,)](xv[off:off + m], part[p:p + la.grid], m, spec.num_blocks(m), la.n_tiles,
                                        BLOCK=fmt["BLOCK"], BLOCK_P=la.block_p, ROWS=la.rows, RAGGED=ragged,
                                        X_FLOAT=xk, **la.options)
            p += la.grid
        out = torch.empty(2, dtype=torch.float32, device=dev)
        last = launches[-1][-1]
        K.tensor_scale_kernel[(1,)](part, p, out, DIVISOR=NVFP4_SCALE_DIVISOR, MIN_SCALE=NVFP4_MIN_TENSOR_SCALE,
                                    BLOCK_P=min(1024, triton.next_power_of_2(p)), **last.options,
                                    enable_fp_fusion=False)
        return out

    def plan(self, op: str, spec, n: int, dtype: torch.dtype, device: torch.device, *,
             programs: int | None = None, rows: int | None = None) -> Launch:
        """The geometry's launch for ``op`` over ``n`` elements, as the codec calls take it (from the plan cache
        where the geometry's plans are pure). For kernels outside this module that launch like a codec."""
        return self._first(functools.partial(self.geometry.plan, op, spec, n, dtype, device, programs=programs), rows)

    def encode_table(self, spec, device: torch.device) -> torch.Tensor | None:
        """NF4's bucket table (the ``elut_ptr`` argument) where the geometry uses it, else None."""
        return nf4_encode_lut(spec.kind, device) if self.geometry.nf4_lut else None

    def _float_in(self, t: torch.Tensor, what: str) -> tuple[torch.Tensor, int, torch.dtype]:
        """(kernel view, FLOAT constexpr, dtype the kernel reads) of a float input."""
        if t.dtype == torch.float64 and self.geometry.float64_via_float32:
            t = t.to(torch.float32)
        view, kind = float_view(t.reshape(-1), what, self.geometry.who)
        return view, kind, t.dtype

    def quantize(self, x: torch.Tensor, spec, codes: torch.Tensor, scales: torch.Tensor, *,
                 rows: int | None = None, programs: int | None = None, hw: bool | None = None) -> None:
        """x flat [N] -> codes uint8[code_bytes(N)], scales fp32[NB]."""
        self._dispatch("quantize", K.quantize_kernel, spec, (x, codes, scales), x.numel(), rows, programs, hw,
                       lambda: self._quantize(x, spec, codes, scales, rows=rows, programs=programs, hw=hw))

    def _quantize(self, x, spec, codes, scales, *, rows, programs, hw) -> None:
        n = x.numel()
        check_codec_buffers(spec, n, codes, scales, x.device, "quantize")
        xv, xk, io = self._float_in(x, "quantize")
        g, dev = self.geometry, x.device
        f, cv, elut = self._format(spec, dev, hw), codes.view(torch.int8), self.encode_table(spec, dev)
        ts = self.tensor_scale(spec, x, programs=programs) if n else None
        self.last_plans = []
        for off, m, boff, soff, ragged in segments(spec, n):
            replan = functools.partial(g.plan, "quantize", spec, m, io, dev, programs=programs)
            nb = spec.num_blocks(m)
            cpiece = cv[boff:boff + spec.code_bytes(m)]
            self._run(K.quantize_kernel, self._first(replan, rows),
                      lambda la: (xv[off:off + m], cpiece, scales[soff:soff + nb], m, nb, la.n_tiles),
                      lambda la: {**self._consts(f, la, ragged), "X_FLOAT": xk, "elut_ptr": elut, **ts_arg(ts),
                                  **_vec16(la, spec, ragged, cpiece, op="quantize")},
                      replan)

    def dequantize(self, codes: torch.Tensor, scales: torch.Tensor, spec, out: torch.Tensor, *,
                   rows: int | None = None, programs: int | None = None, hw: bool | None = None) -> None:
        """codes + scales -> out flat [N] (fp32, bf16 or fp16)."""
        self._dispatch("dequantize", K.dequantize_kernel, spec, (out, codes, scales), out.numel(), rows, programs, hw,
                       lambda: self._dequantize(codes, scales, spec, out, rows=rows, programs=programs, hw=hw))

    def _dequantize(self, codes, scales, spec, out, *, rows, programs, hw) -> None:
        n = out.numel()
        check_codec_buffers(spec, n, codes, scales, out.device, "dequantize")
        ov, ok = float_view(out.reshape(-1), "dequantize", self.geometry.who)
        g, dev = self.geometry, out.device
        f, cv, lut = self._format(spec, dev, hw), codes.view(torch.int8), nf4_lut(dev)
        self.last_plans = []
        for off, m, boff, soff, ragged in segments(spec, n):
            replan = functools.partial(g.plan, "dequantize", spec, m, out.dtype, dev, programs=programs)
            nb = spec.num_blocks(m)
            cpiece = cv[boff:boff + spec.code_bytes(m)]
            self._run(K.dequantize_kernel, self._first(replan, rows),
                      lambda la: (cpiece, scales[soff:soff + nb], lut, ov[off:off + m], m, nb, la.n_tiles),
                      lambda la: {**self._consts(f, la, ragged), "OUT_FLOAT": ok,
                                  **_vec16(la, spec, ragged, cpiece, op="dequantize")},
                      replan)

    def accumulate(self, codes: torch.Tensor, scales: torch.Tensor, spec, g: torch.Tensor, *,
                   rows: int | None = None, programs: int | None = None, hw: bool | None = None) -> None:
        """In place: (codes, scales) <- Q(D(codes, scales) + g), g flat [N] (fp32, bf16, fp16)."""
        self._dispatch("accumulate", K.accumulate_kernel, spec, (g, codes, scales), g.numel(), rows, programs, hw,
                       lambda: self._accumulate(codes, scales, spec, g, rows=rows, programs=programs, hw=hw))

    def _accumulate(self, codes, scales, spec, g, *, rows, programs, hw) -> None:
        n = g.numel()
        _block_local(spec, "accumulate_")
        check_codec_buffers(spec, n, codes, scales, g.device, "accumulate_")
        gv, gk, io = self._float_in(g, "accumulate_")
        geo, dev = self.geometry, g.device
        f, cv, lut = self._format(spec, dev, hw), codes.view(torch.int8), nf4_lut(dev)
        elut = self.encode_table(spec, dev)
        self.last_plans = []
        for off, m, boff, soff, ragged in segments(spec, n):
            replan = functools.partial(geo.plan, "accumulate", spec, m, io, dev, programs=programs)
            nb = spec.num_blocks(m)
            cpiece = cv[boff:boff + spec.code_bytes(m)]
            self._run(K.accumulate_kernel, self._first(replan, rows),
                      lambda la: (cpiece, scales[soff:soff + nb], lut, gv[off:off + m], m, nb, la.n_tiles),
                      lambda la: {**self._consts(f, la, ragged), "G_FLOAT": gk, "elut_ptr": elut,
                                  **_vec16(la, spec, ragged, cpiece, op="accumulate")}, replan)

    def reduce_requantize(self, codes: torch.Tensor, scales: torch.Tensor, spec, numel: int,
                          codes_out: torch.Tensor, scales_out: torch.Tensor, *, rows: int | None = None,
                          programs: int | None = None, hw: bool | None = None) -> None:
        """codes uint8[W, code_bytes], scales fp32[W, NB] -> Q(sum_r D_r) (fp32, rank order)."""
        self._dispatch("reduce_requantize", K.reduce_requantize_kernel, spec, (codes, scales, codes_out, scales_out),
                       numel, rows, programs, hw,
                       lambda: self._reduce_requantize(codes, scales, spec, numel, codes_out, scales_out, rows=rows,
                                                       programs=programs, hw=hw))

    def _reduce_requantize(self, codes, scales, spec, numel, codes_out, scales_out, *, rows, programs, hw) -> None:
        if codes.dim() != 2 or scales.dim() != 2 or codes.shape[0] != scales.shape[0] or codes.shape[0] < 1:
            raise ValueError(f"reduce_requantize: want codes[W, B] and scales[W, NB] with W >= 1, got "
                             f"{tuple(codes.shape)} and {tuple(scales.shape)}")
        n, w = numel, codes.shape[0]
        _block_local(spec, "reduce_requantize")
        check_codec_buffers(spec, n, codes_out, scales_out, codes.device, "reduce_requantize")
        check_codec_buffers(spec, n, codes[0], scales[0], codes.device, "reduce_requantize (input row)")
        if codes.stride(1) != 1 or scales.stride(1) != 1:
            raise ValueError("reduce_requantize: rows of codes and scales must be contiguous")
        g, dev = self.geometry, codes.device
        f, lut, elut = self._format(spec, dev, hw), nf4_lut(dev), self.encode_table(spec, dev)
        cv, cov = codes.view(torch.int8), codes_out.view(torch.int8)
        self.last_plans = []
        for off, m, boff, soff, ragged in segments(spec, n):
            replan = functools.partial(g.plan, "reduce_requantize", spec, m, torch.float32, dev, programs=programs)
            nb, cb = spec.num_blocks(m), spec.code_bytes(m)
            self._run(K.reduce_requantize_kernel, self._first(replan, rows),
                      lambda la: (cv[:, boff:boff + cb], scales[:, soff:soff + nb], lut, cov[boff:boff + cb],
                                  scales_out[soff:soff + nb], m, nb, la.n_tiles, w, codes.stride(0), scales.stride(0)),
                      lambda la: {**self._consts(f, la, ragged), "elut_ptr": elut,
                                  **_vec16(la, spec, ragged, cv[:, boff:], cov[boff:], stride=codes.stride(0),
                                           op="reduce_requantize")},
                      replan)
