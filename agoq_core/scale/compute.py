"""Compute time of one decoder layer (and the embedding / LM head) on one device: a roofline.

Per GPU and micro-batch of ``T = b x S`` tokens, with tensor parallelism ``t`` (Megatron layout,
sequence parallelism on: everything a layer does is split ``t`` ways):

- **GEMMs**: ``2 T (2h^2 + 2h kv + 3h i) / t`` FLOPs forward (q, o, k, v, gate, up, down), twice
  that backward; at ``device.gemm_flops``.
- **attention** (causal flash attention): ``2 b S^2 h / t`` FLOPs forward (QK^T and PV, half the
  square), 2.5x that backward (FlashAttention-2 runs 5 matmuls backward for 2 forward); at
  ``device.attention_flops``.
- **memory-bound ops** (RMSNorm, residual adds, RoPE, SwiGLU, layout copies): bytes moved per
  ``ELEMENTWISE`` below, twice that backward; at ``device.copy_bandwidth``.
- **LAAQ** (AGoQ's activation path): forward quantizes the two RMSNorm inputs and the SwiGLU input
  (+ the out-projection input in the paper's design); backward dequantizes them and recomputes
  both RMSNorms and SwiGLU. Codec kernels at their measured share of copy bandwidth
  (``device.codec_copy_fraction``), exact packed sizes from ``agoq_core.formats``.
- **full-layer recomputation** (Megatron ``--recompute-granularity full``): one more forward of
  the layer (and its tensor-parallel collectives) in backward.

Nothing here is fitted except the device's attention efficiency (agoq_core.scale.devices).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agoq_core.formats.spec import get_format
from agoq_core.planner.model import TransformerShape
from agoq_core.scale.devices import DeviceProfile
from agoq_core.scale.errors import ScaleError

__all__ = ["ELEMENTWISE", "Elementwise", "LayerCost", "layer_cost", "head_cost", "gemm_flops_fwd",
           "attention_flops_fwd", "laaq_overhead", "quangrad_codec_seconds", "accumulate_seconds", "optimizer_seconds",
           "OPTIMIZER_BYTES_PER_PARAM", "GRAD_STORAGE_STEP_BYTES_PER_PARAM", "grad_storage_seconds", "BACKWARD_GEMM",
           "BACKWARD_ATTENTION", "BACKWARD_ELEMENTWISE"]

Elementwise = Literal["fused", "hf"]

#: Bytes moved by the memory-bound ops of one layer's forward, per token, as coefficients of
#: (h, kv_dim, intermediate). "fused": Megatron with fused kernels (RMSNorm r2 w2 twice, two
#: residual adds r4 w2, fused RoPE on q and k r2 w2, SwiGLU r4 w2 of the FC1 output).
#: "hf": Hugging Face eager (RMSNorm as ~7 kernels through fp32 = ~38 B per element each, RoPE
#: as cat/mul/add = 16 B, SDPA layout copies of q, k, v = 4 B, SwiGLU as silu + mul = 10 B).
ELEMENTWISE: dict[str, tuple[float, float, float]] = {
    "fused": (2 * 4 + 2 * 6 + 4, 4, 6),
    "hf": (2 * 38 + 2 * 6 + 16 + 4, 16 + 8, 10),
}
BACKWARD_GEMM = 2.0
BACKWARD_ATTENTION = 2.5
BACKWARD_ELEMENTWISE = 2.0


@dataclass(frozen=True)
class LayerCost:
    """Seconds of one decoder layer, one micro-batch, one GPU (no communication)."""

    gemm_fwd: float
    attention_fwd: float
    elementwise_fwd: float

    @property
    def forward(self) -> float:
        return self.gemm_fwd + self.attention_fwd + self.elementwise_fwd

    @property
    def backward(self) -> float:
        return (BACKWARD_GEMM * self.gemm_fwd + BACKWARD_ATTENTION * self.attention_fwd
                + BACKWARD_ELEMENTWISE * self.elementwise_fwd)


def _check(tokens: int, seq: int, tp: int) -> None:
    for what, v in (("tokens", tokens), ("seq", seq), ("tp", tp)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ScaleError(f"{what} must be an int >= 1, got {v!r}")
    if tokens % seq:
        raise ScaleError(f"tokens ({tokens}) must be a whole number of sequences of {seq}")


def gemm_flops_fwd(shape: TransformerShape, tokens: int, tp: int = 1) -> float:
    h = shape.hidden
    return 2.0 * tokens * (2 * h * h + 2 * h * shape.kv_dim + 3 * h * shape.intermediate) / tp


def attention_flops_fwd(shape: TransformerShape, tokens: int, seq: int, tp: int = 1) -> float:
    return 2.0 * (tokens // seq) * seq * seq * shape.hidden / tp


def layer_cost(shape: TransformerShape, tokens: int, seq: int, dev: DeviceProfile, *, tp: int = 1,
               elementwise: Elementwise = "fused") -> LayerCost:
    _check(tokens, seq, tp)
    if elementwise not in ELEMENTWISE:
        raise ScaleError(f"elementwise must be one of {', '.join(ELEMENTWISE)}, got {elementwise!r}")
    ch, ckv, ci = ELEMENTWISE[elementwise]
    ew_bytes = tokens * (ch * shape.hidden + ckv * shape.kv_dim + ci * shape.intermediate) / tp
    return LayerCost(gemm_fwd=gemm_flops_fwd(shape, tokens, tp) / dev.gemm_flops,
                     attention_fwd=attention_flops_fwd(shape, tokens, seq, tp) / dev.attention_flops,
                     elementwise_fwd=ew_bytes / dev.copy_bandwidth)


def head_cost(shape: TransformerShape, tokens: int, dev: DeviceProfile, *, tp: int = 1,
              elementwise: Elementwise = "fused") -> tuple[float, float]:
    """(forward, backward) seconds of final norm + LM head + cross-entropy (vocabulary split ``tp`` ways).
    The loss moves ~10 B per logit forward fused (bf16 logits, fp32 softmax), 14 B in HF eager."""
    gemm = 2.0 * tokens * shape.hidden * shape.vocab / tp / dev.gemm_flops
    per_logit = 10 if elementwise == "fused" else 14
    ew = (tokens * shape.vocab / tp * per_logit + 8 * tokens * shape.hidden / tp) / dev.copy_bandwidth
    return gemm + ew, BACKWARD_GEMM * gemm + BACKWARD_ELEMENTWISE * ew


def _codec_s(dev: DeviceProfile, op: str, fmt: str, numel: float) -> float:
    spec = get_format(fmt)
    # the format's packed bytes of numel elements, and the bf16 side of the conversion
    return (spec.storage_bytes(int(numel)) + 2 * numel) / dev.codec_bandwidth(op, fmt)


def laaq_overhead(shape: TransformerShape, tokens: int, dev: DeviceProfile, fmt: str, *, tp: int = 1,
                  quantize_attn_out: bool = False, elementwise: Elementwise = "fused") -> tuple[float, float]:
    """(forward, backward) extra seconds of one LAAQ layer over a plain one.

    Forward: quantize both RMSNorm inputs (T x h each) and the SwiGLU input (T x 2i), plus the
    out-projection input (T x h) when ``quantize_attn_out`` (the paper quantizes it; this project keeps
    it by reference to SDPA's output, 0 bytes). Backward: dequantize the same, recompute both RMSNorms
    and SwiGLU forward (their memory-bound bytes)."""
    h, i = shape.hidden, shape.intermediate
    numel = tokens * (2 * h + 2 * i + (h if quantize_attn_out else 0)) / tp
    fwd = _codec_s(dev, "quantize", fmt, numel)
    ch, _, ci = ELEMENTWISE[elementwise]
    norm_coeff = (2 * 38 if elementwise == "hf" else 2 * 4)
    recompute_bytes = tokens * (norm_coeff * h + ci * i) / tp
    bwd = _codec_s(dev, "dequantize", fmt, numel) + recompute_bytes / dev.copy_bandwidth
    return fwd, bwd


def quangrad_codec_seconds(numel: float, dp: int, dev: DeviceProfile, fmt: str = "fp8_e4m3") -> float:
    """QuanGrad's dequantize-sum-requantize on the receiving side of the all-to-all: reads the dp
    received 8-bit chunks (``numel`` elements in all), writes its ``numel / dp`` reduced shard."""
    spec = get_format(fmt)
    moved = spec.storage_bytes(int(numel)) + spec.storage_bytes(int(numel // max(dp, 1)))
    return moved / dev.codec_bandwidth("reduce_requantize", fmt)


def accumulate_seconds(numel: float, dev: DeviceProfile, fmt: str = "fp8_e4m3") -> float:
    """QuanGrad's per-micro-batch gradient accumulation: 8-bit buffer += bf16 gradient, in place."""
    spec = get_format(fmt)
    return (2 * spec.storage_bytes(int(numel)) + 2 * numel) / dev.codec_bandwidth("accumulate", fmt)


#: Bytes an optimizer step moves per parameter. Adam (fp32 states, fp32 master, fp32 main grad):
#: read grad 4, master/m/v read+write 24, write bf16 weight 2. 8-bit Adam (bitsandbytes) with
#: QuanGrad: dequantize the 8-bit grad to an fp32 main grad (1 + 4) and read it (4), master r/w 8,
#: m/v r/w 4, write bf16 weight 2.
OPTIMIZER_BYTES_PER_PARAM = {"adam": 30.0, "adam8bit": 23.0, "sgd": 8.0, "none": 0.0}


def optimizer_seconds(params: float, dev: DeviceProfile, optimizer: str) -> float:
    if optimizer not in OPTIMIZER_BYTES_PER_PARAM:
        raise ScaleError(f"optimizer must be one of {', '.join(OPTIMIZER_BYTES_PER_PARAM)}, got {optimizer!r}")
    return params * OPTIMIZER_BYTES_PER_PARAM[optimizer] / dev.copy_bandwidth


#: What storing the gradients in QuanGrad's FP8 buffers costs one process per optimizer step, beyond the optimizer's
#: own work, in bytes of copy bandwidth per parameter: the backward's accumulate of each bf16 gradient into its
#: buffer, and the step's dequantize to an fp32 buffer, the reported norm, the cast to the weights' dtype and the
#: zeroing (QuanGradDDP.step). Counted, that is about 20 B; measured, it costs more. LLaMA-2-7B on an H100, the
#: float8 budget policy with and without FP8 gradients in the same run (docs/benchmarks.md §5.9-§5.11): the FP8 plans
#: were predicted 0.112 s (32K) and 0.233 s (64K) faster per step from their extra LAAQ layers; four pairs put the
#: FP8 buffers' cost at 0.159, 0.080 and 0.030 s (32K, three runs) and 0.181 s (64K) per step: 0.112 s on average,
#: 50 B per parameter at the card's copy bandwidth. The spread is the run-to-run spread of the bf16 arm (its 32K
#: step took 3.788 and 3.845 s on two machines; the FP8 arm 3.756 and 3.762 s). on_nonfinite="apply" (no host
#: synchronisation before the step) measured the same as "raise" (3.762 against 3.756 s, §5.11), so one charge
#: serves both. bf16 / fp32 .grad: nothing beyond the optimizer's.
GRAD_STORAGE_STEP_BYTES_PER_PARAM = {"quangrad": 50.0, "bf16": 0.0, "fp32": 0.0}


def grad_storage_seconds(params: float, dev: DeviceProfile, grads: str) -> float:
    """Seconds per optimizer step that the gradient storage ``grads`` adds on one process
    (:data:`GRAD_STORAGE_STEP_BYTES_PER_PARAM`)."""
    if grads not in GRAD_STORAGE_STEP_BYTES_PER_PARAM:
        raise ScaleError(f"grads must be one of {', '.join(GRAD_STORAGE_STEP_BYTES_PER_PARAM)}, got {grads!r}")
    return params * GRAD_STORAGE_STEP_BYTES_PER_PARAM[grads] / dev.copy_bandwidth
