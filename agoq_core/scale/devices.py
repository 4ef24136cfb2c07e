"""Device profiles: what one accelerator computes and moves per second, and how much it holds.

The H200 profile is *measured* by this project (docs/benchmarks.md, 2026-11-29): copy bandwidth,
cuBLAS GEMM throughput at LLaMA shapes, the codec kernels' share of copy bandwidth, and an attention
efficiency fitted to one measured training step (``ATTENTION_FIT`` below says which). The other
devices are *rooflines*: published peak bf16 tensor FLOP/s and memory bandwidth, times the
efficiencies measured on the H200 (an assumption: the same software reaches the same share of
each device's peak). Every profile carries its source.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Mapping

from agoq_core.scale.errors import ScaleError

__all__ = ["DeviceProfile", "DEVICES", "device_profile", "H200_MEASURED", "CODEC_COPY_FRACTION", "ATTENTION_FIT",
           "LAYER_OVERHEAD_FIT"]

GiB = 1 << 30

#: Share of the device-to-device copy bandwidth each codec kernel reaches at 1 GiB of bf16 on the
#: H200 (docs/bench/codecs.md, 2026-11-29, commit 994778b). Quantize is instruction-bound, hence
#: the lower shares; dequantize of 8-bit and int4 codes runs at the memory limit.
CODEC_COPY_FRACTION: Mapping[str, Mapping[str, float]] = MappingProxyType({
    "quantize": MappingProxyType({"int4": 0.550, "int5": 0.262, "int6": 0.310, "int8": 0.694, "fp4_e2m1": 0.425,
                                  "nf4": 0.411, "fp8_e4m3": 0.648, "fp8_e5m2": 0.648}),
    "dequantize": MappingProxyType({"int4": 0.929, "int5": 0.846, "int6": 0.769, "int8": 0.959, "fp4_e2m1": 0.767,
                                    "nf4": 0.606, "fp8_e4m3": 0.975, "fp8_e5m2": 0.975}),
    "accumulate": MappingProxyType({"int8": 0.798, "fp8_e4m3": 0.749, "fp8_e5m2": 0.749}),
    "reduce_requantize": MappingProxyType({"int8": 0.626, "fp8_e4m3": 0.621, "fp8_e5m2": 0.621}),
})

#: H200 measurements (docs/benchmarks.md and docs/bench/, all 2026-11-29, one H200, torch 2.11).
H200_MEASURED = MappingProxyType({
    "copy_GBps": 4202.0,            # bench_codecs.py: 1 GiB device-to-device copy, 511.0 us
    "gemm_TFLOPs": 677.4,           # bench_fusion.py run2: median cuBLAS bf16 of 24 LLaMA-7B/8B GEMMs
    "memory_bytes": 150109880320,   # total_memory of the device properties torch reports (139.8 GiB)
})

#: The two H200 numbers fitted rather than measured directly, from the plain bf16 LLaMA-2-7B steps at
#: 4,096 and 16,384 tokens (0.389 s and 1.794 s, docs/bench/h200-2026-11-29/run2/bench_laaq.json):
#: attention (SDPA flash, forward + backward) efficiency, and a fixed time per decoder layer and
#: micro-batch (kernel launches of an eager layer, ~1.7 ms forward + backward). The LAAQ and
#: checkpointing rows of the same run are then predictions (docs/scale.md §5).
#: agoq_core.scale.single_gpu.fit_h200 re-fits them; tests/scale/test_single_gpu.py checks these constants.
ATTENTION_FIT = 0.467
LAYER_OVERHEAD_FIT = 1.68e-3


@dataclass(frozen=True, kw_only=True)
class DeviceProfile:
    name: str
    memory_bytes: int
    peak_flops: float
    """Dense bf16 tensor-core FLOP/s, as published."""
    hbm_bandwidth: float
    """Memory bandwidth in bytes/s, as published."""
    gemm_efficiency: float
    """Achieved / peak FLOP/s of large bf16 GEMMs."""
    attention_efficiency: float
    """Achieved / peak FLOP/s of flash attention (forward + backward, causal FLOPs)."""
    memory_efficiency: float
    """Achieved copy bandwidth / published bandwidth (memory-bound kernels run at this share,
    codec kernels at ``CODEC_COPY_FRACTION`` of it)."""
    intra_link: str
    """Default intra-node link (a name of agoq_core.scale.network.INTRA_LINKS)."""
    layer_overhead_s: float = LAYER_OVERHEAD_FIT
    """Fixed seconds per decoder layer and micro-batch, forward + backward (launch overhead; fitted on the
    H200, assumed the same elsewhere)."""
    reserve_fraction: float = 0.05
    """Memory not available to tensors (CUDA/CANN context, communication buffers, fragmentation); assumed."""
    source: str = ""
    measured: str = ""
    """Date and command of the measurements behind the profile ("" for a pure roofline)."""
    codec_copy_fraction: Mapping[str, Mapping[str, float]] = field(default_factory=lambda: CODEC_COPY_FRACTION)

    def __post_init__(self) -> None:
        for f in ("peak_flops", "hbm_bandwidth", "memory_bytes"):
            if not getattr(self, f) > 0:
                raise ScaleError(f"DeviceProfile {self.name!r}: {f} must be > 0, got {getattr(self, f)!r}")
        for f in ("gemm_efficiency", "attention_efficiency", "memory_efficiency"):
            v = getattr(self, f)
            if not 0 < v <= 1:
                raise ScaleError(f"DeviceProfile {self.name!r}: {f} must be in (0, 1], got {v!r}")
        if not 0 <= self.reserve_fraction < 1:
            raise ScaleError(f"DeviceProfile {self.name!r}: reserve_fraction must be in [0, 1)")

    @property
    def usable_bytes(self) -> int:
        return int(self.memory_bytes * (1.0 - self.reserve_fraction))

    @property
    def gemm_flops(self) -> float:
        return self.peak_flops * self.gemm_efficiency

    @property
    def attention_flops(self) -> float:
        return self.peak_flops * self.attention_efficiency

    @property
    def copy_bandwidth(self) -> float:
        return self.hbm_bandwidth * self.memory_efficiency

    def codec_bandwidth(self, op: str, fmt: str) -> float:
        """Bytes/s (read + written) of a codec kernel on this device."""
        try:
            return self.copy_bandwidth * self.codec_copy_fraction[op][fmt]
        except KeyError:
            known = {o: sorted(f) for o, f in self.codec_copy_fraction.items()}
            raise ScaleError(f"no codec throughput for {op} {fmt} on {self.name}; measured: {known}") from None


_H200_PEAK = 989.4e12   # NVIDIA H200 datasheet: BF16 tensor 1,979 TFLOPS with sparsity = 989.4 dense
_H200_HBM = 4.8e12      # NVIDIA H200 datasheet: 4.8 TB/s HBM3e, 141 GB
_GEMM_EFF = H200_MEASURED["gemm_TFLOPs"] * 1e12 / _H200_PEAK
_MEM_EFF = H200_MEASURED["copy_GBps"] * 1e9 / _H200_HBM
_TRANSFER = ("roofline: published peak x the H200's measured efficiencies (GEMM {:.3f}, attention {:.3f}, copy "
             "{:.3f}; an assumption)").format(_GEMM_EFF, ATTENTION_FIT, _MEM_EFF)


def _roofline(name: str, *, memory_gb: float, peak_tflops: float, hbm_tbps: float, intra: str, source: str,
              memory_bytes: int | None = None) -> DeviceProfile:
    return DeviceProfile(name=name, memory_bytes=memory_bytes or int(memory_gb * 1e9), peak_flops=peak_tflops * 1e12,
                         hbm_bandwidth=hbm_tbps * 1e12, gemm_efficiency=_GEMM_EFF,
                         attention_efficiency=ATTENTION_FIT, memory_efficiency=_MEM_EFF, intra_link=intra,
                         source=f"{source}; {_TRANSFER}")


DEVICES: dict[str, DeviceProfile] = {d.name: d for d in (
    DeviceProfile(
        name="H200", memory_bytes=H200_MEASURED["memory_bytes"], peak_flops=_H200_PEAK, hbm_bandwidth=_H200_HBM,
        gemm_efficiency=_GEMM_EFF, attention_efficiency=ATTENTION_FIT, memory_efficiency=_MEM_EFF,
        intra_link="nvlink4",
        source="peak and bandwidth: NVIDIA H200 datasheet; efficiencies measured here (see measured)",
        measured="2026-11-29, one H200, torch 2.11: copy 4,202 GB/s and codec shares (bench_codecs.py, "
                 "docs/bench/codecs.md); cuBLAS 677 TFLOP/s median (bench_fusion.py, docs/bench/fusion.md); "
                 "attention efficiency fitted to the plain LLaMA-2-7B 16K step (bench_laaq.py, docs/bench/laaq.md)"),
    _roofline("H100", memory_gb=80, peak_tflops=989.4, hbm_tbps=3.35, intra="nvlink4", memory_bytes=80 * GiB,
              source="NVIDIA H100 SXM5 datasheet: 989.4 TFLOPS bf16 dense, 3.35 TB/s HBM3, 80 GB"),
    _roofline("A100", memory_gb=80, peak_tflops=312, hbm_tbps=2.039, intra="nvlink3", memory_bytes=80 * GiB,
              source="NVIDIA A100 SXM4 80GB datasheet: 312 TFLOPS bf16 dense, 2,039 GB/s HBM2e"),
    _roofline("A6000", memory_gb=48, peak_tflops=154.8, hbm_tbps=0.768, intra="pcie4", memory_bytes=48 * GiB,
              source="NVIDIA RTX A6000 datasheet: 309.7 TFLOPS tensor with sparsity = 154.8 dense, 768 GB/s GDDR6, "
                     "48 GB, PCIe 4.0 x16 (no NVLink bridges assumed)"),
    _roofline("910B", memory_gb=64, peak_tflops=320, hbm_tbps=1.6, intra="hccs", memory_bytes=64 * GiB,
              source="Ascend 910B, public reporting only (low confidence: Huawei publishes no per-SKU datasheet; "
                     "figures quoted for the 910B range 280-376 TFLOPS fp16 and 0.4-1.6 TB/s): ~320 TFLOPS fp16, "
                     "64 GB HBM2e, 1.6 TB/s assumed. No Ascend measurement exists in this project"),
)}


def device_profile(name: str | DeviceProfile) -> DeviceProfile:
    """A profile by name (case-insensitive: H200, H100, A100, A6000, 910B)."""
    if isinstance(name, DeviceProfile):
        return name
    key = {k.lower(): k for k in DEVICES}.get(str(name).strip().lower())
    if key is None:
        raise ScaleError(f"unknown device {name!r}; known devices: {', '.join(DEVICES)}")
    return DEVICES[key]


def with_attention_efficiency(dev: DeviceProfile, eff: float) -> DeviceProfile:
    return replace(dev, attention_efficiency=eff)
