"""QuanGradConfig: every knob of QuanGrad in one frozen, keyword-only, validated dataclass."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from agoq_core.formats.policy import DEFAULT_GRADIENT_FORMAT
from agoq_core.formats.spec import FormatSpec, get_format

__all__ = ["QuanGradConfig", "GRADIENT_FORMATS", "DEFAULT_BLOCK", "DEFAULT_MIN_COMPRESS_BYTES", "COLLECTIVES",
           "resolve_spec"]

#: 8-bit gradient formats QuanGrad stores and sends.
GRADIENT_FORMATS = ("fp8_e4m3", "fp8_e5m2", "int8", "mxfp8")

#: One fp32 scale per 256 gradients: 0.125 bit/element of overhead (1.6% of the 8-bit payload), the
#: block size of the authors' code. Used for all three formats, int8 included (its activation default
#: is 128), so that switching the format never silently changes the block.
DEFAULT_BLOCK = 256

#: How a bucket is reduced across ranks. "quangrad" is the paper's protocol; the others are baselines
#: kept for comparison (and for the training job's ablations).
COLLECTIVES = ("quangrad", "fp32", "bf16", "naive_fp8")

# Below this many bytes of fp32 gradient a bucket goes through the vendor all-reduce. Small buckets are
# latency-bound: QuanGrad issues two collectives (all-to-all, all-gather) and three codec kernels where the
# vendor issues one ring all-reduce. At the paper's 200 Gb/s, 1 MiB of fp32 needs 42 us on the wire, about
# one collective's launch latency, so the 4x byte saving cannot pay for the second collective there (the
# paper's Table 4 shows the win at 32 MiB: 39 ms vs 131 ms). On loopback gloo with the pure-torch codec
# (docs/bench/quangrad.md) the vendor collective is as fast or faster at every size from 1 to 64 MiB; on
# NCCL within one NVLink host the crossover is measured by the multi-GPU runs: set it from there.
DEFAULT_MIN_COMPRESS_BYTES = 1 << 20


def resolve_spec(fmt: str | FormatSpec, block: int | None) -> FormatSpec:
    """The FormatSpec QuanGrad uses for ``fmt``: an 8-bit gradient format with block 256 unless given."""
    name = fmt.name if isinstance(fmt, FormatSpec) else fmt
    if isinstance(name, str) and name.strip().lower() == "auto":
        name = DEFAULT_GRADIENT_FORMAT  # device-independent meaning; QuanGradDDP resolves it per backend
    if not isinstance(name, str) or name.strip().lower() not in GRADIENT_FORMATS:
        raise ValueError(
            f"QuanGrad stores and sends 8-bit gradients: fmt must be one of {', '.join(GRADIENT_FORMATS)}, "
            f"got {fmt!r}"
        )
    if block is None:
        block = fmt.block if isinstance(fmt, FormatSpec) else DEFAULT_BLOCK
    return get_format(name.strip().lower(), default_block=block)  # mxfp8 keeps its fixed block of 32


@dataclass(frozen=True, kw_only=True, slots=True)
class QuanGradConfig:
    """Configuration of QuanGrad's gradient storage, collective and optimizer glue.

    Every rank of a job must use the same config (the bucket layout hash covers the fields that
    shape the wire format, and ranks that disagree fail at setup).
    """

    fmt: str = "auto"
    """Gradient storage and wire format: "fp8_e4m3", "fp8_e5m2", "int8" or "mxfp8" (OCP MX: block 32 with
    power-of-two scales; ``block`` does not apply to it). "auto" (default): fp8_e4m3, or int8 on a device
    without FP8 units (Ascend A2/A3; agoq_core.formats.policy, the reason is logged)."""
    block: int = DEFAULT_BLOCK
    """Elements per fp32 scale (a positive multiple of 8)."""
    collective: Literal["quangrad", "fp32", "bf16", "naive_fp8"] = "quangrad"
    """Cross-rank reduction: the precision-preserving all-reduce, or a baseline: exact fp32 all-reduce,
    bf16 all-reduce, or the naive FP8 all-reduce (one shared scale, FP8 partial sums; FP8-LM style)."""
    sharded: bool = False
    """ZeRO-1 style: reduce-scatter only; each rank keeps its fp32-reduced shard, steps the optimizer
    on its shard of the fp32 master weights and all-gathers the updated parameters."""
    bucket_cap_mb: float = 25.0
    """Bucket size in MiB of 8-bit codes (= MiB of gradient elements). A parameter larger than the
    cap gets a bucket of its own."""
    min_compress_bytes: int = DEFAULT_MIN_COMPRESS_BYTES
    """Crossover: buckets whose fp32 size is below this use the vendor all-reduce (fallback_dtype),
    where two collectives plus the codec cost more than they save. 0 compresses every bucket. The
    setup report lists every bucket that falls back."""
    fallback_dtype: Literal["fp32", "bf16"] = "fp32"
    """Dtype of the vendor all-reduce used below the crossover."""
    overlap: bool = True
    """Launch each bucket's collective as soon as backward has produced all of its gradients."""
    average: bool = True
    """Divide the summed gradient by the world size (as DDP does)."""
    max_grad_norm: float | None = None
    """Clip to this global L2 norm (computed over all ranks' reduced gradient); None: no clipping."""
    master_weights: Literal["auto", "on", "off"] = "auto"
    """Keep fp32 master weights for the optimizer: "auto" = when any parameter is not fp32."""
    on_nonfinite: Literal["skip", "raise", "apply"] = "skip"
    """A NaN/Inf gradient: skip the optimizer step (report says so), raise NonFiniteError, or ``"apply"``: no check
    before the step (as plain training: the step is applied, the report's grad_norm shows NaN/Inf afterwards and a
    warning is logged). Checking costs one host synchronisation before the optimizer runs; "apply" removes it unless
    clipping (``max_grad_norm``) or sharding needs the norm first. On LLaMA-2-7B with torchao's AdamW8bit on an H100
    the two measured the same (3.762 against 3.756 s per step, docs/benchmarks.md §5.11)."""
    step_per_bucket: bool = True
    """Dequantize and step the optimizer a group of buckets at a time (``step_group_mb``), so at most one
    group of fp32 gradient exists at once (the optimizer must be element-wise per parameter: Adam, AdamW,
    SGD, 8-bit Adam). False: one optimizer call over every bucket's fp32 gradient at once."""
    step_group_mb: float = 512.0
    """With ``step_per_bucket``: consecutive buckets are stepped together in one optimizer call until their
    fp32 gradient reaches this many MiB (at least one bucket per call). Each optimizer call costs host time
    (a 1B model in 25 MiB buckets made 40 calls per step); 0 steps every bucket on its own."""
    broadcast_params: bool = True
    """Broadcast rank 0's parameters at setup so every rank starts identical (as DDP does)."""
    backend: Any = None
    """Backend name or object for the codecs; None = the selected backend (AGOQ_BACKEND or auto)."""
    group: Any = None
    """torch.distributed process group; None = the default group."""

    def __post_init__(self) -> None:
        spec = resolve_spec(self.fmt, self.block)  # validates fmt and block
        if not (isinstance(self.fmt, str) and self.fmt.strip().lower() == "auto"):  # QuanGradDDP resolves "auto"
            object.__setattr__(self, "fmt", spec.name)
        if self.collective not in COLLECTIVES:
            raise ValueError(f"collective must be one of {', '.join(COLLECTIVES)}, got {self.collective!r}")
        if self.collective == "naive_fp8" and not spec.kind.startswith("fp8"):
            raise ValueError(f"collective='naive_fp8' needs an fp8 fmt (fp8_e4m3 or fp8_e5m2), got fmt={spec.name!r}")
        if not isinstance(self.sharded, bool):
            raise TypeError(f"sharded must be a bool, got {self.sharded!r}")
        if not (isinstance(self.bucket_cap_mb, (int, float)) and self.bucket_cap_mb > 0):
            raise ValueError(f"bucket_cap_mb must be a positive number of MiB, got {self.bucket_cap_mb!r}")
        if isinstance(self.min_compress_bytes, bool) or not isinstance(self.min_compress_bytes, int) \
                or self.min_compress_bytes < 0:
            raise ValueError(f"min_compress_bytes must be an int >= 0, got {self.min_compress_bytes!r}")
        if self.fallback_dtype not in ("fp32", "bf16"):
            raise ValueError(f"fallback_dtype must be 'fp32' or 'bf16', got {self.fallback_dtype!r}")
        if self.max_grad_norm is not None and not (self.max_grad_norm > 0):
            raise ValueError(f"max_grad_norm must be > 0 or None, got {self.max_grad_norm!r}")
        if self.master_weights not in ("auto", "on", "off"):
            raise ValueError(f"master_weights must be 'auto', 'on' or 'off', got {self.master_weights!r}")
        if isinstance(self.step_group_mb, bool) or not isinstance(self.step_group_mb, (int, float)) \
                or not self.step_group_mb >= 0:
            raise ValueError(f"step_group_mb must be a number of MiB >= 0, got {self.step_group_mb!r}")
        if self.on_nonfinite not in ("skip", "raise", "apply"):
            raise ValueError(f"on_nonfinite must be 'skip', 'raise' or 'apply', got {self.on_nonfinite!r}")

    @property
    def spec(self) -> FormatSpec:
        return resolve_spec(self.fmt, self.block)

    @property
    def bucket_cap_numel(self) -> int:
        return max(1, int(self.bucket_cap_mb * (1 << 20)))
