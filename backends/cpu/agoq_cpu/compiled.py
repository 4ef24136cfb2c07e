"""Compiled codec variants: the functions of agoq_cpu.codecs through ``torch.compile`` (Inductor C++).

One variant per (op, format, dtype), compiled on first use. The number of blocks and the block size
are dynamic dimensions (``mark_dynamic``), so a new tensor size or block size never recompiles. Compile
time is measured and shown once per variant on stderr; Inductor's FX graph cache (on by default,
``TORCHINDUCTOR_CACHE_DIR``, default ``/tmp/torchinductor_$USER``) makes later processes load the
compiled code instead of rebuilding it.

Without a C++ compiler (or with ``AGOQ_CPU_COMPILE=0``) the same functions run eagerly: same bits,
several times slower; the reason is shown once.
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

#: Inductor C++ options pinned for every codec graph (whatever the user's environment sets), because
#: the codes depend on them: no FMA contraction (the dequantize multiply and the accumulate add round
#: separately, docs/formats.md §6) and no unsafe math (no reassociation, no reciprocal division).
#: These are torch's defaults today; pinning them keeps TORCHINDUCTOR_CPP_* variables from changing bits.
EXACT_OPTIONS = {
    "cpp.enable_floating_point_contract_flag": "off",
    "cpp.enable_unsafe_math_opt_flag": False,
}


def compiler_status() -> tuple[bool, str]:
    """(compile?, why): whether codecs go through Inductor's C++ backend here. Cheap: no torch._inductor."""
    if os.environ.get(ENV_COMPILE, "1").strip().lower() in ("0", "false", "off", "no"):
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


class _Variant:
    """One codec variant; the first call compiles it and reports how long that took."""

    __slots__ = ("fn", "eager", "label", "dynamic_dims", "owner", "ready")

    def __init__(self, fn: Callable, label: str, dynamic_dims, owner: "Compiler", eager: Callable | None = None) -> None:
        self.fn, self.label, self.dynamic_dims, self.owner = fn, label, dynamic_dims, owner
        self.eager = eager if eager is not None else fn
        self.ready = not owner.compile

    def __call__(self, *args) -> None:
        if _python_dispatch_mode_active():
            # Compiled graphs do not run under a Python dispatch mode (torch.compile skips the frame); the
            # same functions run eagerly there, same bits (e.g. the conformance no-float64 capability mode).
            self.eager(*args)
            return
        if self.ready:
            self.fn(*args)
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


class Compiler:
    """Builds and caches the codec variants of one backend instance."""

    def __init__(self, compile: bool | None = None, *, quiet: bool = False) -> None:
        ok, why = compiler_status()
        self.compile = ok if compile is None else compile
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
