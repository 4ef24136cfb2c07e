"""Memory model of one pipeline stage: static state (weights, gradients, optimizer) and activations.

Activations are described by an :class:`ActivationCostTable`: for each candidate format, the bytes
one decoder layer keeps for backward per micro-batch, plus what the first virtual stage (embedding)
and the last one (final norm, LM head, loss) keep. Three ways to fill it:

- ``ActivationCostTable.measure(...)`` (agoq_core.planner.measure): LAAQ's byte accounting, read from
  the tensors LAAQ really stores during a forward pass — what plans are made from by default;
- ``from_formula(...)``: the same tensors counted from shapes (LAAQ's policy: both RMSNorm inputs,
  the SiLU&Mul input and the out-projection input in the format, the SDPA attention core in 16-bit);
- ``from_bits(...)``: the paper's own accounting (memory of a stage = bits x in-flight micro-batches),
  for reproducing its numbers.

Static memory is counted from the parameter count with a small, documented table.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, Mapping, Sequence

from agoq_core.errors import FormatError
from agoq_core.formats.spec import activation_formats, get_format
from agoq_core.planner.errors import PlannerError
from agoq_core.planner.model import TransformerShape

__all__ = ["ActivationCostTable", "StaticMemoryConfig", "static_bytes", "check_candidates"]


def check_candidates(formats: Sequence[str], block: int | None = None) -> tuple[str, ...]:
    """Canonical names of activation formats, or a PlannerError naming the known ones."""
    if isinstance(formats, str):
        formats = [f for f in formats.split(",") if f.strip()]
    out = []
    for f in formats:
        try:
            spec = get_format(f, block)
        except FormatError:
            raise PlannerError(f"unknown format {f!r}; activation formats: {', '.join(activation_formats())}") from None
        if spec.name not in activation_formats():
            raise PlannerError(f"{spec.name} is a gradient format; activation formats: {', '.join(activation_formats())}")
        if spec.name not in out:
            out.append(spec.name)
    if not out:
        raise PlannerError(f"no candidate formats given; choose from {', '.join(activation_formats())}")
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class ActivationCostTable:
    """Bytes kept for backward per micro-batch, by format."""

    layer_bytes: Mapping[str, int]
    """Format -> all bytes one decoder layer keeps per micro-batch when its LAAQ roles use that format."""
    layer_fixed_bytes: int
    """The part of ``layer_bytes`` that no format changes (the 16-bit attention core)."""
    quantized_numel: int
    """Elements per layer and micro-batch stored in the chosen format (weights the fidelity cost)."""
    first_stage_bytes: int = 0
    """Extra bytes per micro-batch on virtual stage 0 (embedding)."""
    last_stage_bytes: int = 0
    """Extra bytes per micro-batch on the last virtual stage (final norm, LM head, loss)."""
    chunk_bytes: int = 0
    """Extra bytes per micro-batch on every virtual stage (the RoPE cos/sin each stage computes once)."""
    tokens: int = 0
    """Tokens per micro-batch the table is for (0 = abstract units)."""
    unit: str = "B"
    source: str = ""

    def __post_init__(self) -> None:
        if not self.layer_bytes:
            raise PlannerError("ActivationCostTable.layer_bytes is empty")
        for k, v in self.layer_bytes.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise PlannerError(f"ActivationCostTable.layer_bytes[{k!r}] must be an int >= 0, got {v!r}")
        for f in ("layer_fixed_bytes", "quantized_numel", "first_stage_bytes", "last_stage_bytes", "chunk_bytes",
                  "tokens"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise PlannerError(f"ActivationCostTable.{f} must be an int >= 0, got {v!r}")
        object.__setattr__(self, "layer_bytes", MappingProxyType(dict(self.layer_bytes)))

    @property
    def formats(self) -> tuple[str, ...]:
        return tuple(self.layer_bytes)

    def bytes_for(self, fmt: str) -> int:
        try:
            return self.layer_bytes[fmt]
        except KeyError:
            raise PlannerError(f"the activation cost table has no entry for {fmt!r}; it has "
                               f"{', '.join(self.layer_bytes)} ({self.source})") from None

    # ---- constructors ---------------------------------------------------------------------------
    @classmethod
    def from_formula(cls, shape: TransformerShape, *, tokens: int, formats: Sequence[str],
                     act_bytes: int = 2, block: int | None = None, seq_len: int | None = None,
                     final_norm_format: str = "nf4") -> "ActivationCostTable":
        """LAAQ's kept tensors counted from shapes (exact packed bytes of each format).

        Per layer and micro-batch of ``tokens`` tokens: in the format, the two RMSNorm inputs
        (tokens x hidden each) and the gate/up outputs (2 x tokens x intermediate); in ``act_bytes``,
        what SDPA keeps (q, k, v, output) plus its fp32 logsumexp. The out-projection input is a view
        of SDPA's output, which the kernel keeps anyway: LAAQ keeps it by reference (0 bytes).
        First stage: the int64 token ids the embedding keeps. Last stage: the final-norm input in
        ``final_norm_format``, the fp32 log-softmax of the logits, the int64 targets and the loss's
        4-byte weight. Every virtual stage: the RoPE cos and sin tables (``seq_len`` x head_dim each,
        shared by the micro-batch's sequences). tests/planner/test_measure.py checks this against
        LAAQ's measurement.
        """
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise PlannerError(f"tokens must be an int >= 1, got {tokens!r}")
        T, h = tokens, shape.hidden
        quant_tensors = [T * h, T * h, T * shape.intermediate, T * shape.intermediate]
        fixed = act_bytes * (2 * T * h + 2 * T * shape.kv_dim) + 4 * T * shape.heads
        per_fmt = {}
        for name in check_candidates(formats, block):
            spec = get_format(name, block)
            per_fmt[name] = fixed + sum(spec.storage_bytes(n) for n in quant_tensors)
        final = get_format(check_candidates([final_norm_format], block)[0], block).storage_bytes(T * h)
        seq = seq_len if seq_len is not None else T
        return cls(layer_bytes=per_fmt, layer_fixed_bytes=fixed, quantized_numel=sum(quant_tensors),
                   first_stage_bytes=8 * T, last_stage_bytes=final + 4 * T * shape.vocab + 8 * T + 4,
                   chunk_bytes=2 * seq * shape.head_dim * act_bytes, tokens=T,
                   source=f"formula (LAAQ roles from shapes, {T} tokens/micro-batch)")

    @classmethod
    def from_bits(cls, formats: Sequence[str], *, block: int | None = None,
                  with_scales: bool = False) -> "ActivationCostTable":
        """The paper's accounting: a layer costs its format's bits (per element), nothing else.

        ``with_scales=True`` counts bits per element including the fp32 block scale, in 1/1000 bit
        units (4-bit block 128 = 4250).
        """
        per_fmt = {}
        for name in check_candidates(formats, block):
            spec = get_format(name, block)
            per_fmt[name] = round(spec.bits_per_element * 1000) if with_scales else spec.bits
        unit = "mbit" if with_scales else "bit"
        return cls(layer_bytes=per_fmt, layer_fixed_bytes=0, quantized_numel=1, unit=unit,
                   source="paper accounting (memory = bits x in-flight micro-batches"
                          + (", block scales included)" if with_scales else ")"))


# ---- static memory -------------------------------------------------------------------------------

GradStorage = Literal["quangrad", "bf16", "fp32"]
Optimizer = Literal["adam", "adam8bit", "sgd", "none"]


@dataclass(frozen=True, kw_only=True)
class StaticMemoryConfig:
    """What every stage holds regardless of micro-batches."""

    param_bytes: int = 2
    """Bytes per weight as the model computes with it (bf16 = 2, fp32 = 4)."""
    grads: GradStorage = "quangrad"
    """Gradient storage: QuanGrad fp8_e4m3 block 256 (1 B + 4 B per 256), bf16, or fp32."""
    optimizer: Optimizer = "adam8bit"
    """adam (2 fp32 states), adam8bit (bitsandbytes: 2 x 1 B + one fp32 absmax per 256), sgd, none."""
    master_weights: bool = True
    """Keep an fp32 master copy when ``param_bytes`` < 4 (mixed precision)."""

    def __post_init__(self) -> None:
        if self.param_bytes not in (2, 4):
            raise PlannerError(f"param_bytes must be 2 (bf16/fp16) or 4 (fp32), got {self.param_bytes!r}")
        if self.grads not in ("quangrad", "bf16", "fp32"):
            raise PlannerError(f"grads must be quangrad, bf16 or fp32, got {self.grads!r}")
        if self.optimizer not in ("adam", "adam8bit", "sgd", "none"):
            raise PlannerError(f"optimizer must be adam, adam8bit, sgd or none, got {self.optimizer!r}")


def static_bytes(params: int, cfg: StaticMemoryConfig) -> dict[str, int]:
    """Bytes of weights, gradients and optimizer state for ``params`` parameters."""
    blocks256 = -(-params // 256)
    grads = {"quangrad": get_format("fp8_e4m3").storage_bytes(params) if params else 0,
             "bf16": 2 * params, "fp32": 4 * params}[cfg.grads]
    opt = {"adam": 8 * params, "adam8bit": 2 * params + 2 * 4 * blocks256, "sgd": 0, "none": 0}[cfg.optimizer]
    master = 4 * params if (cfg.master_weights and cfg.param_bytes < 4 and cfg.optimizer != "none") else 0
    return {"params": cfg.param_bytes * params, "grads": grads, "optimizer": opt + master}
