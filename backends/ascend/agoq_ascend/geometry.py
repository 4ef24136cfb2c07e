"""Launch geometry of the Ascend kernels, in plain Python (imports neither torch, torch_npu nor triton).

Triton-Ascend runs each program of a launch on one physical core and refuses grids above 65,535
("coreDim=... can't be greater than UINT16_MAX"); every tensor a kernel body creates lives in the
core's unified buffer (UB, 192 KB on Atlas A2/A3), and a working set that does not fit is a compile
error ("ub overflow"), not a slowdown. So the geometry decides, from numbers alone:

* **grid** = min(tiles, vector cores, 65,535): one program per vector core (the shared bodies loop
  over tiles with a persistent strided loop, so any grid size is correct);
* **tile** = ``rows`` whole blocks of ``lanes`` lanes (the shared kernels' ROWS x BLOCK_P), with
  ``rows`` the largest power of two whose working set fits the UB budget (the UB rule below), no larger
  than needed to give every core a tile;
* **alignment**: ``lanes`` is a power of two >= the block and >= 32, so the tail axis of every
  [rows, lanes] tile is a whole number of 32-byte units even for its 1-byte (int8 / bool) tiles
  (Triton-Ascend pads a misaligned tail axis itself, at a cost). Lanes beyond the block are masked.

The UB rule (``working_set``) counts every buffer the kernel body creates for one tile, as if all were
live at once (the compiler reuses some; we do not rely on it):

* each lane-wise buffer: ``pad32(width * bytes)`` per tile row, where width is ``lanes`` or
  ``lanes / G`` for the pack-group tiles of the 4/5/6-bit packing (G = 2, 8, 4 codes per group);
  fp32/int32 count 4 bytes, bf16/fp16/int16 2, and int8/bool tiles 2 (Triton-Ascend computes int8 and
  bool through a wider type and documents that int8 "occupies more on-chip space");
* per-row vectors (block indices, absmax, scale, flags ...): ``ROW_VECTORS x pad32(rows * 4)``, and for a
  tensor-scaled format's quantize (NVFP4) ``TENSOR_SCALED_QUANTIZE_ROW_VECTORS`` more (its two divisions by
  ``exact_div`` are per-row work);
* lane-index vectors shared by all rows: ``pad32(lanes * 4)`` each.

The budget is half the UB while ``multibuffer`` is on (Triton-Ascend's op table: "all tensors alive
together may not exceed 96 KB; 192 KB with double buffering off"). A tile that does not fit even with
one row switches multibuffer off and uses the whole UB; if that fails too the block is too large for
the device (:func:`max_block`). None of this has run on an NPU: it follows Triton-Ascend's documented
limits, and the first Ascend run may show room for bigger tiles (``AGOQ_ASCEND_UB_BYTES``).
"""
from __future__ import annotations

from dataclasses import dataclass

from agoq_triton_kernels.layout import KIND_IDS, MAX_BLOCK, MAX_CHUNK_ELEMENTS, next_pow2

__all__ = [
    "DeviceProps", "LaunchPlan", "PlanError", "plan_launch", "working_set", "buffers", "max_block",
    "compile_options", "OPS", "IO_DTYPES", "FORMAT_CODES",
    "UB_BYTES_A2", "UB_BYTES_950", "MAX_GRID", "ALIGN_BYTES", "MIN_LANES", "ROW_VECTORS",
    "EXACT_DIV_ROW_VECTORS", "TENSOR_SCALED_QUANTIZE_ROW_VECTORS",
]

UB_BYTES_A2 = 192 * 1024
"""Unified buffer per core on Atlas A2/A3 (910B, 910_93): Triton-Ascend docs, "ub overflow ... 1572684 bits"."""
UB_BYTES_950 = 256 * 1024
"""Ascend 950: torch_npu's inductor config uses 256 KB (``ub_size = 256 * 1024`` when soc >= Ascend950)."""
MAX_GRID = 65535
"""coreDim is a uint16 in the CANN launch: more programs is an error, not a queue."""
ALIGN_BYTES = 32
"""Vector instructions work on 32-byte units; a tail axis that is not a multiple is padded by the compiler."""
MIN_LANES = 32
"""Smallest tile width: 32 one-byte lanes (the int8 code tile, the masks) make one 32-byte unit."""
ROW_VECTORS = 8
"""[rows]-shaped vectors alive in the worst kernel: block index, row mask, absmax, scale, scale-is-zero,
non-finite flag, the loaded scale (dequantize) and the stored scale."""

EXACT_DIV_ROW_VECTORS = 20
"""[rows]-shaped temporaries of one ``codes.exact_div`` call, counted from its body and its helpers' (the divisor's
power-of-two normalisation and 12-bit split, the dividend's mantissa, the reciprocal's Newton steps, the quotient,
its split and remainder, the ulps above and below, the corrected quotient, the exponent sum and the result bits)."""
TENSOR_SCALED_QUANTIZE_ROW_VECTORS = 2 * EXACT_DIV_ROW_VECTORS
"""NVFP4's quantize divides twice per block row (RN(amax / 6) / S for the E4M3 scale and RN(1/S) / s_b for the
block's reciprocal), each by ``exact_div`` on the portable path: what a tensor-scaled format adds to ROW_VECTORS."""

OPS = ("quantize", "dequantize", "accumulate", "reduce_requantize")
FORMAT_CODES = (("int", 4), ("int", 5), ("int", 6), ("int", 8), ("fp4_e2m1", 4), ("nf4", 4),
                ("fp8_e4m3", 8), ("fp8_e5m2", 8))
"""(code kind, bits) of every registered format (a test checks this against agoq_core's registry)."""
IO_DTYPES = ("float32", "bfloat16", "float16")

# Bytes per lane of the tile buffers (see the module docstring for int8/bool).
_F32 = _I32 = 4
_F16 = _I16 = 2
_I8 = _BOOL = 2

_PACK_GROUP = {4: 2, 5: 8, 6: 4, 8: 1}


class PlanError(ValueError):
    """The launch cannot be planned (bad arguments, or a block whose tile does not fit the UB)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceProps:
    """What the geometry planner needs to know about one NPU (or the fake one of interpreter mode)."""

    vector_cores: int
    ub_bytes: int = UB_BYTES_A2
    name: str = "Atlas A2 (Ascend 910B)"

    def __post_init__(self) -> None:
        if isinstance(self.vector_cores, bool) or not isinstance(self.vector_cores, int) or self.vector_cores < 1:
            raise PlanError(f"vector_cores must be a positive int, got {self.vector_cores!r}")
        if isinstance(self.ub_bytes, bool) or not isinstance(self.ub_bytes, int) or self.ub_bytes < 16 * 1024:
            raise PlanError(f"ub_bytes must be an int >= 16384 (the UB of every Ascend part is 192 KB or more), "
                            f"got {self.ub_bytes!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchPlan:
    """One launch: ``grid`` programs walk ``n_tiles`` tiles of ``rows`` blocks x ``lanes`` lanes."""

    op: str
    numel: int
    block: int
    lanes: int
    """BLOCK_P of the kernel: a power of two >= max(block, 32); lanes >= block are masked."""
    rows: int
    """ROWS of the kernel: blocks per tile (a power of two)."""
    n_blocks: int
    n_tiles: int
    grid: int
    multibuffer: bool
    ub_bytes_used: int
    ub_budget: int

    @property
    def pad_lanes(self) -> int:
        """Masked lanes per block row, added so the tail axis is 32-byte aligned (and a power of two)."""
        return self.lanes - self.block

    @property
    def tile_elements(self) -> int:
        return self.rows * self.block


def _pad32(nbytes: int) -> int:
    return -(-nbytes // ALIGN_BYTES) * ALIGN_BYTES


def _prev_pow2(n: int) -> int:
    return 1 << (max(1, int(n)).bit_length() - 1)


# ---- the buffers of each kernel stage: (name, lane divisor, bytes per element) -----------------------
def _load(dtype: str, what: str) -> list[tuple[str, int, int]]:
    if dtype == "float32":
        return [(f"{what} fp32", 1, _F32)]
    if dtype == "bfloat16":  # loaded through an int16 view, widened with a shift, bitcast to fp32
        return [(f"{what} bf16 bits", 1, _I16), (f"{what} bits << 16", 1, _I32), (f"{what} fp32", 1, _F32)]
    return [(f"{what} fp16", 1, _F16), (f"{what} fp32", 1, _F32)]


def _store(dtype: str) -> list[tuple[str, int, int]]:
    if dtype == "float32":
        return []  # the product tile is stored as is
    if dtype == "bfloat16":  # integer round-half-even on the magnitude, then an int16 store
        return [("out bits", 1, _I32), ("out sign", 1, _I32), ("out |bits|", 1, _I32), ("out rounded", 1, _I32),
                ("out bf16 bits", 1, _I16)]
    return [("out fp16", 1, _F16)]


_TILE = [("element offsets", 1, _I32), ("element mask", 1, _BOOL)]
# Spec version 3 removed the per-element quotient (one reciprocal per block, one multiply per element): the
# list below still counts the version-2 quotient's buffers, an overestimate (safe: smaller tiles than needed).
# Shrinking it changes every planned tile and max_block; left for the first NPU run to calibrate.
# The portable block quantizer (kernels.quantize_tile, FAST_DIV=False): |x|, the flush mask, the kept x and
# the x - x row-sum operand, then the division-free quotient (codes.exact_quotient): the scaled |x|, the
# first quotient and its 12-bit head, the Newton remainder, the corrected quotient, its split, the four-term
# exact remainder, the ulp above and below, the two threshold products and compares, the corrected and the
# selected quotient, the signed v, and the codes. Peak liveness, not every SSA value: the compiler reuses the
# rest (an underestimate shows as "ub overflow" at compile time: the launcher then halves the rows).
_QUANTIZE = ([("|x|", 1, _F32), ("flush mask", 1, _BOOL), ("kept x", 1, _F32), ("x - x", 1, _F32),
              ("scaled |x|", 1, _F32), ("q head bits", 1, _I32), ("q", 1, _F32), ("remainder", 1, _F32),
              ("q corrected", 1, _F32), ("q head", 1, _F32), ("q tail", 1, _F32)]
             + [("exact remainder term", 1, _F32)] * 4
             + [("ulp bits", 1, _I32), ("ulp above", 1, _F32), ("ulp below", 1, _F32), ("thresholds", 1, _F32),
                ("compare", 1, _BOOL), ("compare", 1, _BOOL), ("q +- ulp", 1, _F32), ("v", 1, _F32),
                ("codes", 1, _I32)])
_ENCODE = {
    "int": [("clamped v", 1, _F32), ("rounded v", 1, _F32)],
    # codes._encode_fp4: |v|, the three rounded lines 2|v| + M, |v| + M + 2, |v|/2 + M + 4, their minimum, the
    # sign compare
    "fp4_e2m1": [("|v|", 1, _F32), ("2|v| + M", 1, _F32), ("|v| + M + 2", 1, _F32), ("|v|/2 + M + 4", 1, _F32),
                 ("code", 1, _I32), ("sign compare", 1, _BOOL)],
    "nf4": [("threshold count", 1, _I32), ("threshold compare", 1, _BOOL)],
    "fp8_e4m3": [("clamped v", 1, _F32), ("v bits", 1, _I32), ("sign", 1, _I32), ("|bits|", 1, _I32),
                 ("subnormal code", 1, _I32), ("normal code", 1, _I32)],
}
_ENCODE["fp8_e5m2"] = _ENCODE["fp8_e4m3"]
_DECODE = {
    "int": [("value", 1, _F32)],
    "fp4_e2m1": [("index", 1, _I32), ("exponent", 1, _I32), ("mantissa", 1, _I32), ("magnitude bits", 1, _I32),
                 ("value", 1, _F32)],
    # The select tree (agoq_triton_kernels.codes._nf4_select): 4 bit masks, then 8 + 4 + 2 + 1 selects.
    "nf4": [("code bit masks", 1, _BOOL)] * 4 + [("select level", 1, _F32)] * 15,
    "fp8_e4m3": [("sign", 1, _I32), ("exponent", 1, _I32), ("mantissa", 1, _I32), ("subnormal bits", 1, _I32),
                 ("magnitude bits", 1, _I32), ("value", 1, _F32)],
}
_DECODE["fp8_e5m2"] = _DECODE["fp8_e4m3"]


def _pair_tiles(g: int, what: str) -> list[tuple[str, int, int]]:
    """The tl.reshape / tl.split (or tl.join) intermediates between a [rows, lanes] tile and its G group
    sub-tiles: tiles whose innermost axis has 2 elements, which the compiler pads to a whole 32-byte unit
    per pair (8 bytes used of 32). Level m (innermost 2 x ... x 2, m axes) holds G / 2**m tiles of lanes / 2
    pairs... expressed as (name, lanes per 32-byte unit, 32)."""
    out = []
    tiles, pairs_div = 1, 2  # the reshaped tile: lanes / 2 pairs
    while pairs_div <= g:
        out += [(f"{what} pair tile (padded)", pairs_div, 32)] * tiles
        tiles, pairs_div = tiles * 2, pairs_div * 2
    return out


def _group_tiles(what: str, g: int, names: list[str]) -> list[tuple[str, int, int]]:
    """[rows, groups, slots] tiles of the contiguous 5/6-bit access (kernels.CONTIG, which agoq-ascend
    launches): a group's 8 or 4 slots of 1-4 bytes fit one 32-byte unit and are padded to it, so each
    tile costs 32 bytes per pack group (lane divisor G)."""
    return [(f"{what} {name} (padded)", g, 32) for name in names]


def _pack(bits: int) -> list[tuple[str, int, int]]:
    """Buffers of store_codes: the reshape/split tree (pair tiles padded to 32 bytes), G sub-tiles of
    lanes/G, the packed word(s); then for 4 bits one int8 tile with the int16 temporary of its int32 ->
    int8 cast, for 5/6 bits (CONTIG) the 32-bit windows of the group's word and the [rows, groups, slots]
    tiles of the one store (the window x per-slot power of two products, their sum, the >> 24, the int8 and
    its int16 cast temporary, offsets, mask); plus the group offsets and mask."""
    g = _PACK_GROUP[bits]
    if g == 1:
        return [("code bytes", 1, _I8), ("int8 cast temporary", 1, _I16)]
    words = 2 if bits == 5 else 1
    head = _pair_tiles(g, "split") + [("group code", g, _I32)] * g + [("packed word", g, _I32)] * words
    tail = [("group offsets", g, _I32), ("group mask", g, _BOOL)]
    if g == 2:
        return head + [("packed byte", g, _I8), ("int8 cast temporary", g, _I16)] + tail
    # The [rows, groups, slots] tensors of the store in Triton-Ascend's linalg IR (frontend_compile.py --keep):
    # the per-slot multipliers and the 24 splat broadcast to the tile (loop-invariant, still UB), the window(s)
    # broadcast along the slots, (5-bit: the slot-0 select and its mask), the product, >> 24, the int8 tile and
    # its int16 cast temporary. Offsets and mask leave no tensor (a strided view and a subview).
    if bits == 5:  # w_a = lo | hi << 20, w_b = lo >> 8 | hi << 12 and their two shifted operands
        return (head + [("32-bit window", g, _I32)] * 4
                + _group_tiles("store", g, ["multipliers", "24 splat", "w_a broadcast", "w_b broadcast",
                                            "slot-0 mask", "selected window", "window x multiplier", ">> 24", "int8",
                                            "int8 cast temporary"]) + tail)
    return (head + _group_tiles("store", g, ["multipliers", "24 splat", "word broadcast", "word x multiplier",
                                             ">> 24", "int8", "int8 cast temporary"]) + tail)


def _unpack(bits: int) -> list[tuple[str, int, int]]:
    """Buffers of load_codes: for 4 bits the loaded bytes and their int32 widening; for 5/6 bits (CONTIG)
    the [rows, groups, slots] tiles of the one load (offsets, mask, int8 bytes, int32 widening, & 0xFF, fp32,
    the power-of-two weighted bytes) and the fp32 slot sums with their int32 conversions; then the word(s),
    G code sub-tiles, the join intermediates, and the joined [rows, lanes] code tile."""
    g = _PACK_GROUP[bits]
    if g == 1:
        return [("code bytes", 1, _I8), ("codes", 1, _I32)]
    words = 2 if bits == 5 else 1
    nbytes = g * bits // 8
    joins = _pair_tiles(g, "join")  # the tl.join tree below the final [rows, lanes], innermost axis 2: padded
    if g == 2:
        loaded = [("loaded byte", g, _I8)] * nbytes + [("widened byte", g, _I32)] * nbytes
    else:
        # as in the linalg IR: the 0xFF splat and the weights broadcast (loop-invariant), the loaded int8 bytes,
        # their widening, & 0xFF, fp32 conversion and the weighted bytes (one per word); no offset/mask tensor
        loaded = (_group_tiles("load", g, ["0xFF splat", "bytes int8", "bytes int32", "bytes & 0xFF", "bytes fp32"]
                               + ["weights", "bytes x weight"] * words)
                  + [("slot sum fp32", g, _F32)] * words + [("slot sum int32", g, _I32)] * words)
    return (loaded + [("unpacked word", g, _I32)] * words + [("group code", g, _I32)] * g + joins
            + [("codes", 1, _I32), ("group offsets", g, _I32), ("group mask", g, _BOOL)])


def buffers(op: str, kind: str, bits: int, io_dtype: str = "float32") -> list[tuple[str, int, int]]:
    """Every lane-wise buffer one tile of ``op`` creates: (name, lane divisor, bytes per element).

    ``io_dtype`` is the float tensor the op reads or writes: x (quantize), out (dequantize), g
    (accumulate); reduce_requantize has none."""
    _check_args(op, kind, bits, io_dtype)
    dequant = _unpack(bits) + _DECODE[kind] + [("decode * scale", 1, _F32)]
    requant = _QUANTIZE + _ENCODE[kind] + _pack(bits)
    if op == "quantize":
        return _TILE + _load(io_dtype, "x") + requant
    if op == "dequantize":
        return _TILE + dequant + _store(io_dtype)
    if op == "accumulate":
        return _TILE + dequant + _load(io_dtype, "g") + [("d + g", 1, _F32)] + requant
    # reduce_requantize: the fp32 accumulator plus one rank's dequantized tile at a time.
    return _TILE + dequant + [("rank-order sum", 1, _F32)] + requant


def working_set(op: str, kind: str, bits: int, *, lanes: int, rows: int, io_dtype: str = "float32",
                tensor_scaled: bool = False) -> int:
    """UB bytes one tile of ``rows`` x ``lanes`` needs by the rule in the module docstring; ``tensor_scaled``
    (NVFP4) adds the per-row temporaries of its quantize's two divisions (TENSOR_SCALED_QUANTIZE_ROW_VECTORS)."""
    if lanes < MIN_LANES or lanes & (lanes - 1):
        raise PlanError(f"lanes must be a power of two >= {MIN_LANES}, got {lanes}")
    if rows < 1 or rows & (rows - 1):
        raise PlanError(f"rows must be a power of two >= 1, got {rows}")
    per_row = sum(_pad32(lanes // div * nbytes) for _, div, nbytes in buffers(op, kind, bits, io_dtype))
    lane_index = _pad32(lanes * _I32) + (_pad32(lanes // _PACK_GROUP[bits] * _I32) if bits != 8 else 0)
    if bits in (5, 6):  # [slots] vectors of the contiguous access: slot index, slot mask, 2 multiplier/weight rows
        lane_index += 4 * _pad32(8 * _I32)
    row_vectors = ROW_VECTORS + (TENSOR_SCALED_QUANTIZE_ROW_VECTORS if tensor_scaled and op == "quantize" else 0)
    return rows * per_row + row_vectors * _pad32(rows * _F32) + lane_index


def _check_args(op: str, kind: str, bits: int, io_dtype: str | None) -> None:
    if op not in OPS:
        raise PlanError(f"unknown op {op!r}; known: {', '.join(OPS)}")
    if kind not in KIND_IDS:
        raise PlanError(f"unknown code kind {kind!r}; known: {', '.join(KIND_IDS)}")
    if bits not in _PACK_GROUP:
        raise PlanError(f"bits must be 4, 5, 6 or 8, got {bits!r}")
    if op != "reduce_requantize" and io_dtype not in IO_DTYPES:
        raise PlanError(f"{op}: dtype must be one of {', '.join(IO_DTYPES)}, got {io_dtype!r}")


def _lanes_for(block: int) -> int:
    return max(next_pow2(block), MIN_LANES)


def _fit_rows(op: str, kind: str, bits: int, lanes: int, io_dtype: str, budget: int, tensor_scaled: bool) -> int:
    """Largest power-of-two rows whose working set fits ``budget`` (0 if not even one row fits)."""
    rows = 0
    r = 1
    while working_set(op, kind, bits, lanes=lanes, rows=r, io_dtype=io_dtype, tensor_scaled=tensor_scaled) <= budget:
        rows = r
        r *= 2
    return rows


def plan_launch(*, op: str, numel: int, kind: str, bits: int, block: int, device: DeviceProps,
                io_dtype: str = "float32", rows: int | None = None, programs: int | None = None,
                tensor_scaled: bool = False) -> LaunchPlan:
    """Plan one launch over ``numel`` elements (at most MAX_CHUNK_ELEMENTS: the launcher chunks bigger
    tensors so int32 offsets cannot wrap). ``rows`` overrides the tile height (a power of two that fits);
    ``programs`` caps the grid (tests, tuning); ``tensor_scaled``: the format has a tensor scale (NVFP4),
    whose quantize needs more per-row vectors (:func:`working_set`)."""
    _check_args(op, kind, bits, io_dtype)
    if isinstance(block, bool) or not isinstance(block, int) or block <= 0 or block % 8:
        raise PlanError(f"block must be a positive multiple of 8, got {block!r}")
    if block > MAX_BLOCK:
        raise PlanError(f"block={block} exceeds the shared kernels' maximum {MAX_BLOCK}")
    if isinstance(numel, bool) or not isinstance(numel, int) or not 1 <= numel <= MAX_CHUNK_ELEMENTS:
        raise PlanError(f"numel must be an int in [1, {MAX_CHUNK_ELEMENTS}] (launchers chunk bigger tensors), "
                        f"got {numel!r}")
    lanes = _lanes_for(block)
    n_blocks = -(-numel // block)
    multibuffer, budget = True, device.ub_bytes // 2
    fit = _fit_rows(op, kind, bits, lanes, io_dtype, budget, tensor_scaled)
    if fit == 0:
        multibuffer, budget = False, device.ub_bytes
        fit = _fit_rows(op, kind, bits, lanes, io_dtype, budget, tensor_scaled)
    if fit == 0:
        need = working_set(op, kind, bits, lanes=lanes, rows=1, io_dtype=io_dtype, tensor_scaled=tensor_scaled)
        raise PlanError(
            f"{op} of {kind}/{bits}-bit with block={block} needs {need} bytes of UB for a single block row "
            f"({lanes} lanes), more than the {device.ub_bytes}-byte UB of {device.name}; use block <= "
            f"{max_block(device)} on this device, or the reference backend")
    if rows is None:
        # Enough tiles for every core before making tiles bigger: rows <= n_blocks / cores.
        rows = min(fit, _prev_pow2(max(1, n_blocks // device.vector_cores)))
    elif rows < 1 or rows & (rows - 1) or rows > fit:
        raise PlanError(f"rows={rows} must be a power of two in [1, {fit}] for {op} {kind}/{bits}-bit, "
                        f"block {block}, {io_dtype} on {device.name}")
    n_tiles = -(-n_blocks // rows)
    grid = min(n_tiles, device.vector_cores, MAX_GRID)
    if programs is not None:  # a cap (tests, tuning): never more than tiles, cores or 65535 allow
        if isinstance(programs, bool) or not isinstance(programs, int) or programs < 1:
            raise PlanError(f"programs={programs!r} must be a positive int (an upper bound on the grid)")
        grid = min(grid, programs)
    return LaunchPlan(op=op, numel=numel, block=block, lanes=lanes, rows=rows, n_blocks=n_blocks, n_tiles=n_tiles,
                      grid=grid, multibuffer=multibuffer,
                      ub_bytes_used=working_set(op, kind, bits, lanes=lanes, rows=rows, io_dtype=io_dtype,
                                                tensor_scaled=tensor_scaled),
                      ub_budget=budget)


def max_block(device: DeviceProps) -> int:
    """Largest block every op, format and dtype can run with on ``device`` (one block row per tile,
    multibuffer off): what ``capabilities().max_block`` claims."""
    best = 0
    lanes = MIN_LANES
    while lanes <= MAX_BLOCK:
        for kind, bits in FORMAT_CODES:
            for op in OPS:
                for dt in (IO_DTYPES if op != "reduce_requantize" else ("float32",)):
                    if working_set(op, kind, bits, lanes=lanes, rows=1, io_dtype=dt) > device.ub_bytes:
                        return best
        best = lanes
        lanes *= 2
    return best


def compile_options(plan: LaunchPlan) -> dict:
    """Triton-Ascend compile options of a launch (NPUOptions fields; upstream Triton would reject them,
    the CPU interpreter ignores them). The shared launcher adds ``enable_fp_fusion=False`` to every
    launch (no multiply-add contraction); whether bishengir honours it on A2/A3 is not known (the
    accumulate conformance cases would show a contraction)."""
    return {"multibuffer": plan.multibuffer}
