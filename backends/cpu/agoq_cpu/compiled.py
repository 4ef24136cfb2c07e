"""Compiled codec variants: the functions of agoq_cpu.codecs through ``torch.compile`` (Inductor C++).

One variant per (op, format, dtype), compiled on first use. The number of blocks and the block size
are dynamic dimensions (``mark_dynamic``), so a new tensor size or block size never recompiles. Compile
time is measured and shown once per variant on stderr; Inductor's FX graph cache (on by default,
``TORCHINDUCTOR_CACHE_DIR``, default ``/tmp/torchinductor_$USER``) makes later processes load the
compiled code instead of rebuilding it.

Without a C++ compiler (or with ``AGOQ_CPU_COMPILE=0``) the same functions run eagerly: same bits,
several times slower; the reason is shown once.

Calling a compiled function costs ~50 µs of Python on a 2-core x86 machine before any codec work: Dynamo's
frame hook (eval-frame callback, stance, config and context-variable switches), most of it not the guards
themselves. A codec call on a small tensor does ~20 µs of work, and `agoq train`'s AGoQ arm makes ~70
of them per step, so after a variant has compiled, :class:`_Direct` evaluates the same guards Dynamo
would (its guard manager, on the same locals) and runs Dynamo's own transformed code for the entry
they accept, skipping only the frame hook. Any miss (another size class, dtype, grad mode, a torch
without these internals) goes through the compiled function as before, which recompiles if it must.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
import types
from typing import Callable

import torch

from agoq_cpu import codecs
from agoq_core.formats.reference import decode_table
from agoq_core.formats.spec import FormatSpec

__all__ = ["Compiler", "compiler_status"]

ENV_COMPILE = "AGOQ_CPU_COMPILE"
ENV_DIRECT = "AGOQ_CPU_DIRECT"

#: Inductor C++ options pinned for every codec graph (whatever the user's environment sets), because
#: the codes depend on them: no FMA contraction (the dequantize multiply and the accumulate add round
#: separately, docs/formats.md §6) and no unsafe math (no reassociation, no reciprocal division).
#: These are torch's defaults today; pinning them keeps TORCHINDUCTOR_CPP_* variables from changing bits.
EXACT_OPTIONS = {
    "cpp.enable_floating_point_contract_flag": "off",
    "cpp.enable_unsafe_math_opt_flag": False,
}


def _env_off(name: str) -> bool:
    """Whether environment variable ``name`` is set to 0/false/off/no (unset: on)."""
    return os.environ.get(name, "1").strip().lower() in ("0", "false", "off", "no")


def compiler_status() -> tuple[bool, str]:
    """(compile?, why): whether codecs go through Inductor's C++ backend here. Cheap: no torch._inductor."""
    if _env_off(ENV_COMPILE):
        return False, f"{ENV_COMPILE}=0: codecs run eagerly (same bits, slower)"
    cxx = os.environ.get("CXX") or ("clang++" if sys.platform == "darwin" else "g++")
    path = shutil.which(cxx)
    if path is None:
        return False, (f"no C++ compiler ({cxx!r} not on PATH): codecs run eagerly (same bits, several times "
                       "slower); install g++ (or set CXX) for compiled codecs")
    return True, f"codecs compiled by torch.compile (Inductor C++, {path})"


def _fresh(fn: Callable, name: str) -> Callable:
    """``fn`` with its own code object. Dynamo keeps compiled graphs per code object and stops adding
    them after ``recompile_limit`` (8); every variant is a closure of the same code, so each gets a copy."""
    code = fn.__code__.replace(co_name=name, co_qualname=name) if sys.version_info >= (3, 11) \
        else fn.__code__.replace(co_name=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


# The variants. Tensors are whole blocks with the block index in dim 0 (dynamic); outputs are written
# into the caller's buffers inside the graph, so Inductor stores straight into them.
def _quantize(spec: FormatSpec):
    def run(x2d, qmax, codes2d, scales):
        c, s = codecs.quantize_blocks(x2d, qmax, spec)
        codes2d.copy_(c.view(codes2d.shape))
        scales.copy_(s)
    return run


def _dequantize(spec: FormatSpec, dtype: torch.dtype):
    def run(codes2d, scales, table, out2d):
        out2d.copy_(codecs.dequantize_blocks(codes2d, scales, table, spec, dtype))
    return run


def _accumulate(spec: FormatSpec):
    def run(codes2d, scales, g2d, table, qmax):
        c, s = codecs.accumulate_blocks(codes2d, scales, g2d, table, qmax, spec)
        codes2d.copy_(c.view(codes2d.shape))
        scales.copy_(s)
    return run


def _reduce(spec: FormatSpec):
    def run(codes3d, scales2d, table, qmax, codes_out2d, scales_out):
        c, s = codecs.reduce_blocks(codes3d, scales2d, table, qmax, spec)
        codes_out2d.copy_(c.view(codes_out2d.shape))
        scales_out.copy_(s)
    return run


# op -> (builder, the (argument, dim) pairs that are dynamic: the number of blocks and the block size)
_OPS = {
    "quantize": (_quantize, ((0, 0), (0, 1), (2, 0), (2, 1), (3, 0))),
    "dequantize": (_dequantize, ((0, 0), (0, 1), (1, 0), (3, 0), (3, 1))),
    "accumulate": (_accumulate, ((0, 0), (0, 1), (1, 0), (2, 0), (2, 1))),
    "reduce_requantize": (_reduce, ((0, 1), (0, 2), (1, 1), (4, 0), (4, 1), (5, 0))),
}


def _python_dispatch_mode_active() -> bool:
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return _get_current_dispatch_mode() is not None


try:
    from torch._C._dynamo.eval_frame import get_eval_frame_callback as _frame_hook
except ImportError:  # pragma: no cover - torch internals moved: never take the direct path
    _frame_hook = None


def _no_frame_hook() -> bool:
    return _frame_hook is not None and _frame_hook() is None


class _Direct:
    """Dynamo's compiled entries of one function, called without Dynamo's frame hook (module docstring).

    Built from the function's cache entries after it compiled: for each entry, its guard manager and its
    transformed code as a plain function over the original globals and closure. ``__call__`` returns
    False (nothing ran) unless some entry's guards accept the arguments; then that entry's code ran,
    exactly what Dynamo would have run for them. Uses torch internals (torch._dynamo.eval_frame's cache
    entry list, CacheEntry.code / guard_manager); :meth:`build` returns None where they are missing.
    """

    __slots__ = ("entries", "names", "cells")

    def __init__(self, entries, names, cells) -> None:
        self.entries, self.names, self.cells = entries, names, cells

    @classmethod
    def build(cls, compiled: Callable) -> "_Direct | None":
        try:
            from torch._dynamo.eval_frame import _debug_get_cache_entry_list

            fn = getattr(compiled, "_torchdynamo_orig_callable", None) or compiled.__wrapped__
            code = fn.__code__
            if code.co_flags & 0x0C or code.co_kwonlyargcount:  # *args / **kwargs / keyword-only: not ours
                return None
            entries = []
            for e in _debug_get_cache_entry_list(code):
                entries.append((e.guard_manager.check,
                                types.FunctionType(e.code, fn.__globals__, code.co_name, None, fn.__closure__)))
            if not entries:
                return None
            cells = {n: c.cell_contents for n, c in zip(code.co_freevars, fn.__closure__ or ())}
            return cls(tuple(entries), code.co_varnames[: code.co_argcount], cells)
        except Exception:  # torch internals moved: keep Dynamo's own path
            return None

    def __call__(self, args) -> bool:
        if len(args) != len(self.names):
            return False
        scope = dict(self.cells)
        scope.update(zip(self.names, args))
        for check, run in self.entries:
            if check(scope):
                run(*args)
                return True
        return False


class _Variant:
    """One codec variant; the first call compiles it and reports how long that took."""

    __slots__ = ("fn", "eager", "label", "dynamic_dims", "owner", "ready", "direct")

    def __init__(self, fn: Callable, label: str, dynamic_dims, owner: "Compiler", eager: Callable | None = None) -> None:
        self.fn, self.label, self.dynamic_dims, self.owner = fn, label, dynamic_dims, owner
        self.eager = eager if eager is not None else fn
        self.ready = not owner.compile
        self.direct: _Direct | None = None

    def __call__(self, *args) -> None:
        if _python_dispatch_mode_active():
            # Compiled graphs do not run under a Python dispatch mode (torch.compile skips the frame); the
            # same functions run eagerly there, same bits (e.g. the conformance no-float64 capability mode).
            self.eager(*args)
            return
        if self.ready:
            d = self.direct
            # The direct path only where no Dynamo frame hook is active (not inside another torch.compile'd
            # function, traced or running: there the plain call is what Dynamo must see).
            if d is None or torch.compiler.is_compiling() or not _no_frame_hook():
                self.fn(*args)
            elif not d(args):  # the guards rejected these arguments: Dynamo picks or compiles an entry
                self.fn(*args)
                self.direct = _Direct.build(self.fn) or d  # with the entry it may just have added
            return
        for i, d in self.dynamic_dims:
            torch._dynamo.mark_dynamic(args[i], d)
        self.owner._compiling(self.label)
        t0 = time.perf_counter()
        try:
            self.fn(*args)
        except Exception as exc:
            if not self.owner.quiet:
                print(" failed", file=sys.stderr, flush=True)
            raise RuntimeError(
                f"agoq-cpu: compiling the {self.label} codec with torch.compile failed ({type(exc).__name__}: "
                f"{exc}). Set {ENV_COMPILE}=0 to run the codecs eagerly (same bits, slower), or "
                "AGOQ_BACKEND=reference.") from exc
        self.ready = True
        self.owner._compiled(self.label, time.perf_counter() - t0)
        if self.owner.compile and self.owner.direct:
            self.direct = _Direct.build(self.fn)  # None (never retried) where torch's internals differ


class Compiler:
    """Builds and caches the codec variants of one backend instance."""

    def __init__(self, compile: bool | None = None, *, quiet: bool = False, direct: bool | None = None) -> None:
        ok, why = compiler_status()
        self.compile = ok if compile is None else compile
        # Call compiled entries past Dynamo's frame hook (_Direct); AGOQ_CPU_DIRECT=0 turns it off.
        self.direct = not _env_off(ENV_DIRECT) if direct is None else direct
        self.reason = why if compile is None else ("forced " + ("on" if compile else "off"))
        self.quiet = quiet
        self.compile_seconds = 0.0
        self.compiled: list[tuple[str, float]] = []
        self._variants: dict[tuple, _Variant] = {}
        self._consts: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        if not self.compile and not quiet and compile is None and os.environ.get(ENV_COMPILE) is None:
            print(f"agoq-cpu: {why}", file=sys.stderr, flush=True)

    def consts(self, spec: FormatSpec) -> tuple[torch.Tensor, torch.Tensor]:
        """(decode table, qmax as a 0-d fp32 tensor) of ``spec``."""
        key = codecs.spec_key(spec)
        if key not in self._consts:
            table = decode_table(spec) if spec.kind != "int" else torch.zeros(1)
            self._consts[key] = (table, torch.tensor(spec.qmax, dtype=torch.float32))
        return self._consts[key]

    def get(self, op: str, spec: FormatSpec, dtype: torch.dtype) -> _Variant:
        key = (op, codecs.spec_key(spec), dtype)  # the block size is a dynamic dimension
        v = self._variants.get(key)
        if v is None:
            codecs.prepare(spec)
            build, dims = _OPS[op]
            fn = eager = build(spec, dtype) if op == "dequantize" else build(spec)
            dt = str(dtype).removeprefix("torch.")
            label = f"{spec.name} {op} ({dt})"
            if self.compile:
                name = f"agoq_cpu_{op}_{spec.kind}{spec.bits}_{dt}"
                fn = torch.compile(_fresh(fn, name), fullgraph=True, dynamic=False, options=EXACT_OPTIONS)
            v = self._variants[key] = _Variant(fn, label, dims, self, eager)
        return v

    def _compiling(self, label: str) -> None:
        if not self.quiet:
            print(f"agoq-cpu: compiling the {label} codec (Inductor C++, once per process) ...", end="",
                  file=sys.stderr, flush=True)

    def _compiled(self, label: str, seconds: float) -> None:
        self.compile_seconds += seconds
        self.compiled.append((label, seconds))
        if not self.quiet:
            print(f" {seconds:.1f} s (total {self.compile_seconds:.1f} s; cached in {_cache_dir()})",
                  file=sys.stderr, flush=True)


def _cache_dir() -> str:
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        return cache_dir()
    except Exception:  # pragma: no cover - private helper moved
        return os.environ.get("TORCHINDUCTOR_CACHE_DIR", "the Inductor cache dir")
