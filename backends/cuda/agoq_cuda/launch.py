"""CUDA launch geometry for the shared codec launcher (agoq_triton_kernels.launch), and the launchers
bound to it.

Every launcher takes keyword overrides for tests and tuning: ``rows`` (blocks per tile), ``programs``
(grid size) and ``hw`` (False runs the portable integer/div_rn kernel variant on a GPU).

The kernel bodies and the host launcher live in agoq_triton_kernels; what is CUDA here: tile rows, grid
size, warps, and whether the device may use hardware conversions (HW=True, sm_89+).
"""
from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch

from agoq_triton_kernels.launch import Launch, Launcher, is_interpreted, vec16_aligned
from agoq_triton_kernels.layout import next_pow2

__all__ = ["Geometry", "geometry", "CudaGeometry", "VEC16_DEFAULTS", "MAXNREG", "NORM_PREFETCH", "NORM_PREFETCH_WORDS",
           "norm_prefetch_words", "norm_prefetch", "BACKWARD_PAIRED_ROUNDING", "backward_pairs", "has_max_u16x2",
           "NORM_PROGRAMS_PER_SM", "norm_programs", "sm_count", "PARTIALS_ROWS", "PARTIALS_PROGRAMS_PER_SM",
           "words_unreplicated",
           "parse_vec16", "parse_maxnreg", "LAUNCHER", "quantize", "dequantize", "accumulate", "reduce_requantize",
           "is_interpreted"]


@dataclass(frozen=True, slots=True)
class Geometry:
    """How one launch is cut: ROWS blocks per tile, ``programs`` persistent programs, warps."""

    rows: int
    programs: int
    num_warps: int


# GPU (measured on the H200, 2026-11-29, docs/bench/codecs.md): these kernels are bound by instruction
# issue, not DRAM. Tiles of 2048 lanes on 4 warps (16 elements per thread), one tile per program, were the
# best or within 5% of the best of {1024, 2048, 4096} lanes (and of 8 programs/SM vs one tile/program) for
# int4, int5 dequantize and fp8_e4m3. Exception: 5-bit quantize, 197 us with 1024 lanes vs 328 us with
# 2048 and 1140 us with 4096 (256 MiB); 6-bit quantize likely shares the cliff but was not swept.
# Interpreter: each program instance costs ~8 ms of Python (cpu-feasibility.md §2), a tile of 2**15
# lanes ~1 ms of numpy, so one or two big programs are fastest; two exercise the strided loop.
_GPU_TILE_LANES = 2048
_GPU_TILE_LANES_5BIT_QUANTIZE = 1024
_GPU_MAX_PROGRAMS = (1 << 31) - 1
_INTERP_TILE_LANES = 1 << 15
_INTERP_PROGRAMS = 2

# A pass that writes one partial result per program for a single program to combine (NVFP4's tensor absmax,
# Launcher.tensor_scale) runs persistent: one program per tile (the codec plan: 262,144 programs for 1 GiB of bf16)
# left the finishing program 262,144 partial maxima to read one 1024-wide load after another. H100, 2026-12-07
# (benchmarks/bench_absmax.py, 1 GiB bf16, copy 2,994 GB/s): the launcher's pass 483.1 us against 361.2 us for its
# absmax kernel alone at that geometry; the kernel at 1024 rows (16,384 elements, 16 warps) and 16 programs per SM
# 357.5 us (100.3% of copy), leaving the finishing program 2,112 partials.
PARTIALS_ROWS = 1024
PARTIALS_PROGRAMS_PER_SM = 16


@functools.cache
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of CUDA ``device`` (132 on the H100 SXM and the H200)."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def geometry(block_p: int, n_blocks: int, device: torch.device, *, rows: int | None = None,
             programs: int | None = None, lanes: int = _GPU_TILE_LANES) -> Geometry:
    """Default launch geometry for ``n_blocks`` blocks of ``block_p`` lanes (overridable for tests/tuning)."""
    if device.type == "cpu":
        r = rows or max(1, _INTERP_TILE_LANES // block_p)
        tiles = -(-n_blocks // r)
        return Geometry(r, max(1, min(tiles, programs or _INTERP_PROGRAMS)), 4)
    r = rows or max(1, lanes // block_p)
    tiles = -(-n_blocks // r)
    lanes = r * block_p
    warps = 4 if lanes <= 2048 else 8 if lanes <= 4096 else 16
    return Geometry(r, max(1, min(tiles, programs or _GPU_MAX_PROGRAMS)), warps)


# The 16-lane tile per (op, format). The rule (CudaGeometry.vec16_for): every op where the kernel allows it (whole
# power-of-two blocks >= 16), reduce_requantize only for 8-bit codes. The 2026-12-01 H200 run measured VEC16
# dequantize slower for int4/int8/fp8/nf4/mxfp8 and faster for int5/int6/fp4/mxfp4/nvfp4 (docs/bench/codecs.md);
# `bench_codecs.py --dequant-tiles both` timed both tiles in one run on 2026-12-02 (1 GiB, % of copy bandwidth,
# generic / 16-lane): int4 93.3/82.5, int8 96.0/91.0, nf4 60.7/55.2, fp8_e4m3 97.6/85.3, fp8_e5m2 97.6/85.4,
# mxfp8 98.0/87.7, nvfp4 96.7/91.5 -> generic; int5 84.5/91.8, int6 77.1/88.6, fp4_e2m1 84.0/89.3, mxfp4
# 87.7/90.8 -> 16-lane (the rule). Later runs moved fp4_e2m1 and mxfp4 to the generic tile (12:20: 96.6/89.7,
# 97.2/91.3), and the 16-lane dequantize of 4-bit codes that gives each thread one code word per 8 outputs won for
# nf4 only (14:52: nf4 65.7/89.3; int4 96.4/96.2, fp4_e2m1 96.3/96.3, mxfp4 97.0/96.8, nvfp4 97.1/97.2 -> ties, kept
# generic). Entries here overrule the rule.
# The fused SiLU&Mul kernels (agoq_cuda.fused_swiglu) follow the rule: timed faster on the 16-lane tile for int4
# and nf4 (15:24, bench_swiglu_tiles.py), and fewer sm_90 instructions per element on it for every format
# (python -m agoq_cuda.codec_isa --fused; a static count for the other formats, not a timing). With the in-register
# bf16 rounding (2026-12-02 19:00, bench_swiglu_tiles.py; ms generic / 16-lane) the int4 backward turned around:
# 8192x8192 0.345/0.427, 4096x11008 0.252/0.269 -> generic; nf4 backward 0.520/0.395, 0.337/0.242 and every forward
# (int4 0.284/0.255, 0.171/0.162) stay on the 16-lane tile.
# The fused RMSNorm + quantize (agoq_cuda.fused_norm), 16384x4096, same day (bench_codecs.py, us generic / 16-lane):
# int4 97.9/104.0, fp4_e2m1 107.8/106.0, mxfp4 100.5/108.2 -> generic (off by default, VEC16_OFF_BY_DEFAULT);
# nf4 174.3/116.6 -> 16-lane.
VEC16_DEFAULTS: dict[tuple[str, str], bool] = {
    **{("dequantize", f): False
       for f in ("int4", "int8", "fp8_e4m3", "fp8_e5m2", "mxfp8", "nvfp4", "fp4_e2m1", "mxfp4")},
    ("silu_mul_backward", "int4"): False,
    ("rmsnorm_quant", "nf4"): True,
}

#: Ops whose 16-lane tile is off unless VEC16_DEFAULTS or AGOQ_CUDA_VEC16 (rmsnorm_quant=1) turns it on.
VEC16_OFF_BY_DEFAULT = frozenset({"rmsnorm_quant"})

_OPS = ("quantize", "dequantize", "accumulate", "reduce_requantize", "silu_mul_quant", "silu_mul_backward",
        "rmsnorm_quant")


def parse_vec16(text: str | None) -> dict[tuple[str, str], bool | None]:
    """AGOQ_CUDA_VEC16 / CudaGeometry(vec16=...): ``auto`` (default: the table, then the rule), ``0``, ``1``, or
    comma-separated rules ``OP=V``, ``OP:FORMAT=V``, ``*:FORMAT=V`` (V in 0/1/auto), e.g.
    ``dequantize=0`` or ``dequantize:int8=0,dequantize:int5=1``. The most specific rule wins. ``1`` turns the
    tile on only where the kernel allows it."""
    values = {"0": False, "off": False, "false": False, "1": True, "on": True, "true": True, "auto": None, "": None}
    text = (text or "auto").strip().lower()
    if text in values:
        return {("*", "*"): values[text]}
    rules: dict[tuple[str, str], bool | None] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        what, sep, val = part.partition("=")
        op, _, fmt = what.strip().partition(":")
        op, fmt, val = op.strip() or "*", fmt.strip() or "*", val.strip()
        if not sep or val not in values or (op != "*" and op not in _OPS):
            raise ValueError(f"AGOQ_CUDA_VEC16: cannot read {part!r}; want auto, 0, 1 or rules like "
                             f"'dequantize=0' / 'dequantize:int8=1' (ops: {', '.join(_OPS)})")
        rules[(op, fmt)] = values[val]
    return rules


def _flag(name: str, default: bool) -> bool:
    """An on/off environment switch: 1/on/true, 0/off/false, unset, empty or auto = ``default``; else an error."""
    v = os.environ.get(name, "").strip().lower()
    if v in ("", "default", "auto"):
        return default
    if v in ("1", "on", "true"):
        return True
    if v in ("0", "off", "false"):
        return False
    raise ValueError(f"{name}={v!r}: want 1 or 0")


@functools.cache
def _hw_conversions(device: torch.device) -> bool:
    """HW=True kernels (hardware fp8/bf16 conversions, libdevice rcp.rn / mul.rn) need CUDA sm_89+ (fp8 cvt)."""
    if device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


class CudaGeometry:
    """The LaunchGeometry of agoq-cuda: tiles of whole blocks sized in lanes, persistent programs."""

    who = "agoq-cuda"
    pure_plans = True  # plan() depends on its arguments only: the launcher caches the plans
    fast_launch = True  # repeated calls launch the compiled kernel directly (Launcher's fast path; AGOQ_FAST_LAUNCH=0: off)
    float64_via_float32 = True

    def __init__(self, vec16: str | None = None):
        """``vec16``: the tile rules (:func:`parse_vec16`); None reads AGOQ_CUDA_VEC16 (default ``auto``)."""
        self.vec16_rules = parse_vec16(os.environ.get("AGOQ_CUDA_VEC16") if vec16 is None else vec16)
        # NF4 by a table (one gather per element) rather than the 15-threshold search: faster in the sm_90 codec
        # kernels (agoq_triton_kernels.kernels). AGOQ_CUDA_NF4_LUT=0 takes the search (the form agoq-ascend launches;
        # same codes) in every kernel of this process, for timing the fused ones both ways.
        self.nf4_lut = _flag("AGOQ_CUDA_NF4_LUT", True)
        # bf16 inputs of the 16-lane quantize / accumulate read as int32 words (kernels._load16_f32): sm_90 SASS
        # 0.5-0.8 fewer instructions per element. AGOQ_CUDA_BF16_WORDS=0 reads them through the int16 view.
        self.bf16_words = _flag("AGOQ_CUDA_BF16_WORDS", True)
        # with the words, quantize's block absmax two magnitudes per integer max (kernels.MAX16, sm_90 max.u16x2):
        # sm_90 SASS 0.7 fewer instructions per element. AGOQ_CUDA_PACKED_MAX=0 keeps the per-element max.
        self.packed_max = _flag("AGOQ_CUDA_PACKED_MAX", True)

    def packs_max(self, device: torch.device) -> bool:
        """Whether the 16-lane kernels that read bf16 words on ``device`` take each block's absmax from the words
        (kernels.MAX16, with the fused norm's paired rounding): wherever the device has a halfword-wise max
        (:func:`has_max_u16x2`: the interpreter, sm_90+) unless AGOQ_CUDA_PACKED_MAX=0. On by default since an H100
        passed the GPU kernel tests and the conformance suite with it (2026-12-07, docs/bench/codecs.md,
        twenty-third session)."""
        return self.packed_max and has_max_u16x2(device)

    def reads_words(self, io_dtype: torch.dtype, block_p: int, rows: int, warps: int, device: torch.device) -> bool:
        """Whether a 16-lane tile of ``rows`` blocks reads its ``io_dtype`` input as int32 words (``WORDS``): bf16,
        AGOQ_CUDA_BF16_WORDS on, and every thread owning its own 16 elements (:func:`words_unreplicated`). The
        codec tiles (plan), the fused SiLU&Mul forward (through plan) and the fused norm ask here."""
        return self.bf16_words and io_dtype == torch.bfloat16 and words_unreplicated(block_p, rows, warps, device)

    def vec16_for(self, op: str, spec) -> bool:
        """Whether ``op`` on ``spec`` asks for the 16-lane tile (the launcher still checks the kernel's
        conditions: whole power-of-two blocks >= 16, aligned code buffers)."""
        r = self.vec16_rules
        for k in ((op, spec.name), ("*", spec.name), (op, "*"), ("*", "*")):
            if k in r and r[k] is not None:
                return r[k]
        d = VEC16_DEFAULTS.get((op, spec.name))
        if d is not None:
            return d
        if op in VEC16_OFF_BY_DEFAULT:
            return False
        # sm_90 SASS: 4/5/6-bit reduce_requantize grew with the 16-lane tile (its unpacking is redone for every rank)
        return op != "reduce_requantize" or spec.bits == 8

    def hw(self, device: torch.device, requested: bool | None) -> bool:
        """The device default, or False on request (tests run the portable path on a GPU)."""
        if requested is None:
            return _hw_conversions(device)
        if requested and not _hw_conversions(device):
            raise ValueError(f"hw=True needs a CUDA device of compute capability >= 8.9, got {device}")
        return bool(requested)

    def partials_launch(self, device: torch.device) -> tuple[int | None, int | None]:
        """(rows, programs) of a pass whose per-program partials one program then combines (Launcher.tensor_scale):
        PARTIALS_ROWS and PARTIALS_PROGRAMS_PER_SM on a GPU; the interpreter's plan (two programs) on CPU."""
        if device.type == "cpu":
            return None, None
        return PARTIALS_ROWS, PARTIALS_PROGRAMS_PER_SM * sm_count(device)

    def plan(self, op: str, spec, numel: int, io_dtype: torch.dtype, device: torch.device, *,
             rows: int | None, programs: int | None) -> Launch:
        block_p = next_pow2(spec.block)
        nb = spec.num_blocks(numel)
        # the 16-lane tile (codes packed and unpacked in registers) where the kernel allows it and vec16_for asks
        vec16 = block_p == spec.block >= 16 and self.vec16_for(op, spec)
        lanes = _GPU_TILE_LANES_5BIT_QUANTIZE if op == "quantize" and spec.bits == 5 and not vec16 else _GPU_TILE_LANES
        geo = geometry(block_p, nb, device, rows=rows, programs=programs, lanes=lanes)
        words = vec16 and op in ("quantize", "accumulate") and self.reads_words(io_dtype, block_p, geo.rows,
                                                                                geo.num_warps, device)
        return Launch(grid=geo.programs, rows=geo.rows, block_p=block_p, n_tiles=-(-nb // geo.rows),
                      options={"num_warps": geo.num_warps}, plan=geo, vec16=vec16, words=words,
                      max16=words and op == "quantize" and self.packs_max(device))


@functools.cache
def has_max_u16x2(device: torch.device) -> bool:
    """Whether quantize's MAX16 absmax can run on ``device``: the interpreter (plain integer ops there) or CUDA
    sm_90+ (PTX max.u16x2; sm_80/sm_89 have no halfword-wise max and keep the per-element one). Cached: the fused
    norm asks on every launch."""
    if device.type == "cpu":
        return True
    return device.type == "cuda" and torch.cuda.is_available() and torch.cuda.get_device_capability(device) >= (9, 0)


def words_unreplicated(block_p: int, rows: int, warps: int, device: torch.device) -> bool:
    """Whether a 16-lane tile of ``rows`` blocks gives every thread of its ``warps`` warps its own 16 elements: the
    only tiles that read bf16 as words (kernels._load16_f32). On an H100 (2026-12-07) the word loads gave wrong codes,
    differing from run to run, at tiles with fewer 16-element groups than threads (a 256-column fused norm, 2-block
    quantize tiles: Triton replicates such tensors across threads), and the reference's bits wherever every thread
    owned its own group (the default codec tiles: 2,048 elements for 128 threads). The interpreter has no threads."""
    return device.type == "cpu" or (block_p // 16) * rows >= 32 * warps


LAUNCHER = Launcher(CudaGeometry())
quantize = LAUNCHER.quantize
dequantize = LAUNCHER.dequantize
accumulate = LAUNCHER.accumulate
reduce_requantize = LAUNCHER.reduce_requantize


#: Register caps (ptxas ``maxnreg``) of the fused kernels, per (op, format, 16-lane tile): where the uncapped kernel
#: takes a few registers over 64 (a program fewer per SM), the capped one spills nothing (sm_90 SASS, checked without
#: a GPU by test_fused_compile.py::test_fused_register_caps_spill_nothing_and_are_needed), and a GPU timed it faster.
#: rmsnorm_quant fp4_e2m1 on the generic tile: the three-line FP4 encoder (2026-12-06) took it from 64 to 73
#: registers and 10% slower on an H100; capped at 64 it ran 120.1-120.6 us against 134.6 uncapped (16384 x 4096,
#: H100, same call; the pre-encoder kernel 122.0), back at 1.30x the compiled norm + codec pair (docs/bench/codecs.md).
#: Timed and left uncapped: rmsnorm_quant mxfp4 generic (72 registers; capped 127.0-127.5 us against 128.4; Nsight
#: Compute, twelfth session: 4 programs per SM capped, 3 uncapped, the same 120.3 / 120.6 us). A prefetching launch
#: (NORM_PREFETCH) takes no cap, so fp4's applies only with the prefetch off (AGOQ_CUDA_NORM_PREFETCH=0).
#: Fit 64 without a spill, not adopted (one H100 run of bench_maxnreg.py that still timed the host's launch cost,
#: so "not faster" rather than "slower"): rmsnorm_quant int6 generic (78; 1.110 ms capped against 1.100) and
#: silu_mul_backward nf4 16-lane (72, LAAQ's default; 0.59 / 0.41 ms capped against 0.47 / 0.39). Spill when
#: capped: rmsnorm_quant nf4 generic (98), nvfp4 (76-80), silu_mul_quant on the generic tile (72-96) and mxfp4's
#: 16-lane tile (79). AGOQ_CUDA_MAXNREG (parse_maxnreg) overrides the table.
MAXNREG: dict[tuple[str, str, bool], int] = {
    ("rmsnorm_quant", "fp4_e2m1", False): 64,
}


#: Formats whose fused RMSNorm + quantize loads each program's next token row before working on the current one
#: (fused_norm's ``prefetch``: two rows in flight per program, +8 registers, no register cap), per tile (False: the
#: generic tile, True: the 16-lane one, fused_vec16). 16384 x 4096 bf16 on an H100, 2026-12-06 (docs/bench/codecs.md,
#: twelfth session; default geometry, 8 warps, 1056 programs), generic tile: mxfp4 128.2 -> 115.0 us (Nsight
#: Compute: 120.6 -> 109.0 us, DRAM 72% -> 79% of peak; bench_codecs' row 127.0 -> 115.2 us, 1.25x -> 1.37x the
#: compiled pair), int4 115.4 -> 111.7 (bench_codecs 115.0 -> 112.2), fp4_e2m1 capped 120.6 -> 114.9 uncapped with
#: the prefetch, nf4 185.7 -> 134.8. The 16-lane tile (nf4's default, VEC16_DEFAULTS), thirteenth session, same card
#: and geometry, two sweeps for nf4: nf4 129.2 / 129.3 -> 127.8 / 127.2 us (1.24x -> 1.25x), int4 125.4 -> 115.5,
#: fp4_e2m1 120.4 -> 114.7, mxfp4 130.9 -> 123.8 (docs/bench/codecs.md). AGOQ_CUDA_NORM_PREFETCH=0 / 1 turns it
#: off / on for every format and tile; ``auto`` or unset: this table.
NORM_PREFETCH: dict[bool, frozenset[str]] = {
    False: frozenset({"int4", "nf4", "fp4_e2m1", "mxfp4"}),
    True: frozenset({"int4", "nf4", "fp4_e2m1", "mxfp4"}),
}

#: Formats whose prefetching fused norm on the 16-lane tile holds the next token row as bf16 words, with the block
#: absmax from them (MAX16; without MAX16 the prefetching loop keeps the int16 view). sm_90 SASS per element and
#: registers (codec_isa, twenty-second session): nf4 26.25 -> 25.00 (80 registers both), fp4_e2m1 26.62 -> 25.19
#: (79 -> 77), mxfp4 27.12 -> 24.94 (79 -> 80), int4 21.94 -> 19.44 (64 -> 73). H100, 16384 x 4096, 8 warps, 8
#: programs per SM, interleaved twice (2026-12-07, twenty-third session, gpu_session's norm-words-ab): int4 on this
#: tile 124.1-124.9 us on the int16 view, 112.6 us on words uncapped, 112.9-113.0 capped at 64 registers (so no cap);
#: nf4, its default tile, 120.1 / 120.9 -> 116.1 / 115.4 us with MAX16 and the paired rounding (norm-fusion).
NORM_PREFETCH_WORDS: frozenset[str] = frozenset({"nf4", "fp4_e2m1", "mxfp4", "int4"})


def _env_formats(var: str, default: frozenset[str]) -> frozenset[str]:
    """The formats the environment variable ``var`` names: ``auto`` / unset gives ``default``, ``none`` the empty
    set, else a comma-separated list of registered format names (an unknown one is a ValueError). Read at each call
    (the parse is cached), so a test or a timing run may change it between launches."""
    return _parse_format_set(os.environ.get(var, ""), default, var)


@functools.cache
def _parse_format_set(text: str, default: frozenset[str], var: str) -> frozenset[str]:
    text = text.strip().lower()
    if text in ("", "auto", "default"):
        return default
    if text in ("none", "0", "off"):
        return frozenset()
    from agoq_core.formats import list_formats
    known = {s.name for s in list_formats(microscaling=True)}
    names = frozenset(filter(None, (t.strip() for t in text.split(","))))
    if not names <= known:
        raise ValueError(f"{var}: unknown format(s) {sorted(names - known)}; want auto, none "
                         f"or a comma-separated list of {sorted(known)}")
    return names


def norm_prefetch_words(name: str) -> bool:
    """Whether the prefetching fused norm on the 16-lane tile holds the next row as bf16 words for the format
    ``name`` (where MAX16 is on): AGOQ_CUDA_NORM_PREFETCH_WORDS, a comma-separated list of formats or ``none``;
    ``auto`` / unset: :data:`NORM_PREFETCH_WORDS`. For timing the words loop against the int16 view on a GPU
    (gpu_session's ``norm-words-ab``); the bits never change."""
    return name in _env_formats("AGOQ_CUDA_NORM_PREFETCH_WORDS", NORM_PREFETCH_WORDS)


#: Formats whose fused SiLU&Mul backward on the 16-lane tile rounds the decoded gate and up to bf16 a pair per
#: cvt.rn.bf16x2 (fused_swiglu._round_pair) by default: none. sm_90 SASS, loop per element and registers (codec_isa,
#: twenty-third session), unpaired -> paired: nf4 37.56 (72) -> 36.94 (64), int4 38.62 (64) -> 36.81 (72), int8 34.31
#: (56) -> 33.25 (64), fp4_e2m1 / mxfp4 41.31 (64) -> 39.12 (72). Fewer instructions, but slower where timed: nf4 on an
#: H100 (2026-12-08, gpu_session's swiglu-ab, interleaved twice, bit-identical) 0.324-0.326 -> 0.335-0.336 ms at
#: [8192, 8192] and 0.223-0.224 -> 0.230-0.232 ms at [4096, 11008], so it stays off; AGOQ_CUDA_BACKWARD_PAIRED (a list
#: of formats) turns it on for timing.
BACKWARD_PAIRED_ROUNDING: frozenset[str] = frozenset()


def backward_pairs(name: str) -> bool:
    """Whether the 16-lane SiLU&Mul backward of the format ``name`` pairs its roundings: AGOQ_CUDA_BACKWARD_PAIRED, a
    comma-separated list of formats or ``none``; ``auto`` / unset: :data:`BACKWARD_PAIRED_ROUNDING`. Never with
    AGOQ_CUDA_PACKED_MAX=0. The bits never change."""
    return name in _env_formats("AGOQ_CUDA_BACKWARD_PAIRED", BACKWARD_PAIRED_ROUNDING) and LAUNCHER.geometry.packed_max


#: Persistent programs per SM of the fused RMSNorm + quantize, per (format, 16-lane tile); the rest take
#: NORM_PROGRAMS_PER_SM_DEFAULT. nf4 on the 16-lane tile (its default, prefetching, 8 warps, 16384 x 4096 bf16), H100:
#: 8 per SM 127.8 / 126.6 us, 16 per SM 123.1 / 123.2 us (2026-12-06 and 2026-12-07, benchmarks/sweep_norm_geometry.py;
#: 1.29-1.30x the compiled norm + codec pair against 1.25-1.26x). The other formats were timed at 8 only.
NORM_PROGRAMS_PER_SM: dict[tuple[str, bool], int] = {("nf4", True): 16}
NORM_PROGRAMS_PER_SM_DEFAULT = 8


def norm_programs(spec, device, vec16: bool, rows: int) -> int:
    """The fused norm's persistent grid for ``rows`` token rows: two programs in the interpreter (the strided loop
    runs), else NORM_PROGRAMS_PER_SM programs per SM, at most one per row."""
    if device.type == "cpu":
        return min(rows, 2)
    per_sm = NORM_PROGRAMS_PER_SM.get((spec.name, bool(vec16)), NORM_PROGRAMS_PER_SM_DEFAULT)
    return max(1, min(rows, per_sm * sm_count(device)))


def norm_prefetch(spec, device, vec16: bool = False) -> bool:
    """Whether the fused norm prefetches for ``spec`` on ``device`` by default on the generic tile or (``vec16``)
    the 16-lane one; never in the interpreter, whose default is the plain loop."""
    return device.type != "cpu" and _flag("AGOQ_CUDA_NORM_PREFETCH", spec.name in NORM_PREFETCH[bool(vec16)])


_FUSED_OPS = ("silu_mul_quant", "silu_mul_backward", "rmsnorm_quant")
_TILES = {"generic": (False,), "vec16": (True,), "*": (False, True)}


@functools.cache
def parse_maxnreg(text: str | None, table: bool = True) -> Mapping[tuple[str, str, bool], int]:
    """AGOQ_CUDA_MAXNREG: the register caps in force. ``auto`` (default): :data:`MAXNREG`; ``0`` / ``off``: none;
    or comma-separated rules ``OP:FORMAT[:TILE]=N`` on top of the table (TILE: ``generic``, ``vec16`` or ``*``,
    the default; N = 0 removes a cap), e.g. ``rmsnorm_quant:fp4_e2m1=0`` or ``silu_mul_backward:nf4:vec16=64``.
    ``table=False``: the rules on top of no table (only the caps the text sets). For timing a cap against none on a
    GPU (benchmarks/bench_maxnreg.py); the bits never change. Read-only."""
    base = MAXNREG if table else {}
    text = (text or "auto").strip().lower()
    if text in ("auto", ""):
        return MappingProxyType(dict(base))
    if text in ("0", "off", "none"):
        return MappingProxyType({})
    caps = dict(base)
    for part in filter(None, (p.strip() for p in text.split(","))):
        what, sep, val = part.partition("=")
        keys = [k.strip() for k in what.split(":")]
        op, fmt, tile = (keys + ["*"])[:3] if len(keys) in (2, 3) else ("", "", "")
        if not sep or op not in _FUSED_OPS or not fmt or tile not in _TILES or not val.strip().isdigit() \
                or int(val) > 255:
            raise ValueError(f"AGOQ_CUDA_MAXNREG: cannot read {part!r}; want auto, off or rules like "
                             f"'rmsnorm_quant:fp4_e2m1=0' / 'silu_mul_backward:nf4:vec16=64' (ops: "
                             f"{', '.join(_FUSED_OPS)}; tiles: generic, vec16, *; N in 0..255, 0 = no cap)")
        for t in _TILES[tile]:
            if int(val):
                caps[(op, fmt, t)] = int(val)
            else:
                caps.pop((op, fmt, t), None)
    return MappingProxyType(caps)  # cached: callers share it


def fused_maxnreg(op: str, spec, tile: dict, device, *, table: bool = True) -> dict:
    """{"maxnreg": N} for a fused launch of ``op`` on the tile ``tile`` (fused_vec16's answer) where the caps in
    force (:func:`parse_maxnreg` of AGOQ_CUDA_MAXNREG; default MAXNREG) cap it on a GPU; else {}. ``table=False``
    (the prefetching norm, whose loop the table's caps were not timed with): only a cap that AGOQ_CUDA_MAXNREG
    sets itself, not one it keeps from MAXNREG."""
    if device.type == "cpu":
        return {}
    cap = parse_maxnreg(os.environ.get("AGOQ_CUDA_MAXNREG"), table).get((op, spec.name, bool(tile)))
    return {"maxnreg": cap} if cap else {}


def fused_vec16(op: str, spec, codes, *, writes: bool, vec16: bool | None = None) -> dict:
    """{"VEC16": True} where a fused kernel (``op``: silu_mul_quant, silu_mul_backward, rmsnorm_quant) runs on the
    codec kernels' 16-lane tile: asked for (``vec16``; None: the rules, AGOQ_CUDA_VEC16 / VEC16_DEFAULTS) and
    allowed (whole power-of-two blocks >= 16; each buffer of ``codes`` aligned for the packed words it is read as,
    or written as when ``writes``); else {} (the generic tile)."""
    want = LAUNCHER.geometry.vec16_for(op, spec) if vec16 is None else bool(vec16)
    if not want or spec.block < 16 or spec.block & (spec.block - 1):
        return {}
    return {"VEC16": True} if all(vec16_aligned(spec, (c,), writes=writes) for c in codes) else {}

