"""Device profiles: what one accelerator computes and moves per second, and how much it holds.

The H200 profile is *measured* by this project: copy bandwidth and cuBLAS GEMM throughput at LLaMA
shapes (docs/benchmarks.md, 2026-11-29), the codec kernels' share of copy bandwidth (docs/bench/codecs.md,
newest H200 runs of 2026-12-02), and an attention efficiency fitted to one measured training step
(``ATTENTION_FIT`` below says which). The H100 is measured in part (memory, copy bandwidth and its codec
shares, 2026-12-06); its FLOP/s are a roofline. The other devices are *rooflines*: published peak bf16
tensor FLOP/s and memory bandwidth, times the efficiencies measured on the H200 (an assumption: the same
software reaches the same share of each device's peak). Every profile carries its source.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Mapping

from agoq_core.scale.errors import ScaleError

__all__ = ["DeviceProfile", "DEVICES", "device_profile", "H200_MEASURED", "H100_MEASURED", "CODEC_COPY_FRACTION",
           "CODEC_COPY_FRACTION_2026_11_29", "H100_CODEC_COPY_FRACTION", "H200_2026_11_29", "ATTENTION_FIT",
           "LAYER_OVERHEAD_FIT"]

GiB = 1 << 30


def _table(**ops: Mapping[str, float]) -> Mapping[str, Mapping[str, float]]:
    return MappingProxyType({op: MappingProxyType(dict(f)) for op, f in ops.items()})


#: Share of the device-to-device copy bandwidth each codec kernel reached at 1 GiB of bf16 on the H200 on
#: 2026-11-29 (docs/bench/codecs.md "Previous run (2026-11-29)", kernels at commit 994778b,
#: `bench_codecs.py`, do_bench device time against the copy of the same run). Kept because the step of
#: ``single_gpu.H200_RUN`` ran with these kernels: ``H200_2026_11_29`` below, used by
#: ``single_gpu.h200_check`` and ``fit_h200``. Quantize was instruction-bound then, hence the lower shares.
CODEC_COPY_FRACTION_2026_11_29: Mapping[str, Mapping[str, float]] = _table(
    quantize={"int4": 0.550, "int5": 0.262, "int6": 0.310, "int8": 0.694, "fp4_e2m1": 0.425, "nf4": 0.411,
              "fp8_e4m3": 0.648, "fp8_e5m2": 0.648},
    dequantize={"int4": 0.929, "int5": 0.846, "int6": 0.769, "int8": 0.959, "fp4_e2m1": 0.767, "nf4": 0.606,
                "fp8_e4m3": 0.975, "fp8_e5m2": 0.975},
    accumulate={"int8": 0.798, "fp8_e4m3": 0.749, "fp8_e5m2": 0.749},
    reduce_requantize={"int8": 0.626, "fp8_e4m3": 0.621, "fp8_e5m2": 0.621},
)

#: The same shares for the kernels of 2026-12-02 (spec version 3 and the newer encoders; every row bit-exact):
#: the newest H200 run of each op and format, one NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, each run's
#: `python3 benchmarks/bench_codecs.py --sizes-mib 1024 --no-sweep ...` (env.command of its JSON):
#:   - int4, nf4, fp4_e2m1, mxfp4: seventh session 19:00 UTC, git 4c3bbe6, as shipped
#:     (docs/bench/h200-2026-12-02-s7/call1/n0/bench_codecs_norm.json). nf4 dequantize runs on the 16-lane
#:     tile since the sixth session (89.3%; 65.3% on the generic tile at 12:20).
#:   - nvfp4: sixth session 14:52 UTC, git 9e60d03 (h200-2026-12-02-s6/tiles/bench_codecs_tiles.json, default rows).
#:   - every other row: fifth session 12:20 UTC (h200-2026-12-02-s5/tiles/bench_codecs.json; codecs.md
#:     "fifth session (12:10-12:30 UTC)"); accumulate and reduce_requantize (W = 4) are its 1 GiB rows, device
#:     time as above, not the 2^25 bucket rows (graph-replayed / one eager call) of the same JSON.
#: Shares above 1 are what was measured: accumulate reads 3 bytes per byte it writes and int8 quantize 2, and a
#: read-heavy stream likely runs faster than the copy's 1:1 mix of reads and writes (not measured apart).
#: tests/scale/test_devices.py checks every number against its JSON.
CODEC_COPY_FRACTION_2026_12_02: Mapping[str, Mapping[str, float]] = _table(
    quantize={"int4": 0.950, "int5": 0.889, "int6": 0.911, "int8": 1.006, "fp4_e2m1": 0.766, "nf4": 0.765,
              "fp8_e4m3": 0.960, "fp8_e5m2": 0.959, "mxfp4": 0.734, "mxfp8": 0.929, "nvfp4": 0.286},
    dequantize={"int4": 0.964, "int5": 0.923, "int6": 0.886, "int8": 0.982, "fp4_e2m1": 0.965, "nf4": 0.893,
                "fp8_e4m3": 0.982, "fp8_e5m2": 0.981, "mxfp4": 0.969, "mxfp8": 0.983, "nvfp4": 0.973},
    accumulate={"int8": 1.015, "fp8_e4m3": 1.034, "fp8_e5m2": 1.034, "mxfp8": 1.039},
    reduce_requantize={"int8": 0.775, "fp8_e4m3": 0.833, "fp8_e5m2": 0.830, "mxfp8": 0.837},
)

#: The table every profile uses unless it names another: the newest H200 measurements.
CODEC_COPY_FRACTION = CODEC_COPY_FRACTION_2026_12_02

#: Codec shares measured on an NVIDIA H100 80GB HBM3 on 2026-12-06 (driver 580.159.04, torch 2.11.0+cu130,
#: Triton 3.6.0; docs/bench/codecs.md "eleventh session" and "tenth session"), overlaid on the H200 table for
#: the rows not measured there (int5/int6/int8, FP8, mxfp8, accumulate, reduce_requantize):
#:   - int4, nf4, fp4_e2m1, mxfp4: 16:21 UTC, git 7dfaf9e, the last as-shipped run
#:     (docs/bench/h100-2026-12-06-s11/norm-caps/auto3.json, `bench_codecs.py --formats int4 nf4 fp4_e2m1 mxfp4
#:     --sizes-mib 1024 --no-sweep --bucket-log2 0 --compile-formats`).
#:   - nvfp4: 12:47 UTC, the new encoders (h100-2026-12-06-s10/codecs-ab1/codecs_new2.json).
#: The H100's copy is ~30% slower than the H200's, so its codec kernels sit nearer the copy limit (quantize
#: 96-102% against the H200's 73-95%).
_H100_CODECS_MEASURED = {
    "quantize": {"int4": 1.023, "nf4": 0.967, "fp4_e2m1": 1.004, "mxfp4": 1.006, "nvfp4": 0.475},
    "dequantize": {"int4": 0.965, "nf4": 0.967, "fp4_e2m1": 0.964, "mxfp4": 0.970, "nvfp4": 0.973},
}
H100_CODEC_COPY_FRACTION: Mapping[str, Mapping[str, float]] = _table(**{
    op: {**fmts, **_H100_CODECS_MEASURED.get(op, {})} for op, fmts in CODEC_COPY_FRACTION_2026_12_02.items()})

#: H200 measurements (docs/benchmarks.md and docs/bench/, all 2026-11-29, one H200, torch 2.11).
H200_MEASURED = MappingProxyType({
    "copy_GBps": 4202.0,            # bench_codecs.py: 1 GiB device-to-device copy, 511.0 us
    "gemm_TFLOPs": 677.4,           # bench_fusion.py run2: median cuBLAS bf16 of 24 LLaMA-7B/8B GEMMs
    "memory_bytes": 150109880320,   # total_memory of the device properties torch reports (139.8 GiB)
})

#: H100 measurements: one NVIDIA H100 80GB HBM3 (SXM5), 2026-12-06, driver 580.159.04, torch 2.11.0+cu130, the
#: tenth (12:41-12:48 UTC) and eleventh (16:04-16:27 UTC) sessions of docs/bench/codecs.md; raw JSON under
#: docs/bench/h100-2026-12-06-s10/ and -s11/. Its GEMM and attention efficiencies were not measured.
H100_MEASURED = MappingProxyType({
    # median of the 12 device-to-device copies of 1 GiB that `python3 benchmarks/bench_codecs.py --sizes-mib 1024
    # --no-sweep --bucket-log2 0 ...` wrote in those folders (the "copy" entries: 3,000.1-3,021.6 GB/s)
    "copy_GBps": 3002.6,
    # torch's total capacity, 79.18 GiB ("GPU 0 has a total capacity of 79.18 GiB", the OOM message in
    # h100-2026-12-06-s10/cells-16k/bench_equal_memory_cells.json; env.memory_gib 79.2 = total_memory / 2^30 to
    # one decimal in every JSON; nvidia-smi 81,559 MiB counts the driver's reserve too). The exact byte count
    # was not recorded: this is 79.18 GiB to within 5 MiB.
    "memory_bytes": round(79.18 * GiB),
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
    codec kernels at ``codec_copy_fraction`` of it)."""
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
    """Each codec kernel's share of this device's copy bandwidth, by op then format (default: the newest H200
    table, ``CODEC_COPY_FRACTION``)."""

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
_H100_PEAK = 989.4e12   # NVIDIA H100 SXM5 datasheet: 989.4 TFLOPS bf16 dense
_H100_HBM = 3.35e12     # NVIDIA H100 SXM5 datasheet: 3.35 TB/s HBM3, 80 GB
_GEMM_EFF = H200_MEASURED["gemm_TFLOPs"] * 1e12 / _H200_PEAK
_MEM_EFF = H200_MEASURED["copy_GBps"] * 1e9 / _H200_HBM
_H200_MEASURED_STEP = ("2026-11-29, one H200, torch 2.11: copy 4,202 GB/s (bench_codecs.py, docs/bench/codecs.md); "
                       "cuBLAS 677 TFLOP/s median (bench_fusion.py, docs/bench/fusion.md); attention efficiency fitted "
                       "to the plain LLaMA-2-7B 16K step (bench_laaq.py, docs/bench/laaq.md). ")
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
        measured=_H200_MEASURED_STEP + "2026-12-02, one H200, torch 2.11: codec shares of copy bandwidth at 1 GiB, "
                 "newest run of each row (bench_codecs.py, docs/bench/codecs.md fifth to seventh sessions; "
                 "CODEC_COPY_FRACTION_2026_12_02)"),
    DeviceProfile(
        name="H100", memory_bytes=H100_MEASURED["memory_bytes"], peak_flops=_H100_PEAK, hbm_bandwidth=_H100_HBM,
        gemm_efficiency=_GEMM_EFF, attention_efficiency=ATTENTION_FIT,
        memory_efficiency=H100_MEASURED["copy_GBps"] * 1e9 / _H100_HBM, intra_link="nvlink4",
        codec_copy_fraction=H100_CODEC_COPY_FRACTION,
        source="peak and bandwidth: NVIDIA H100 SXM5 datasheet (989.4 TFLOPS bf16 dense, 3.35 TB/s HBM3); memory, "
               f"copy bandwidth and codec shares measured here (see measured); GEMM {_GEMM_EFF:.3f} and attention "
               f"{ATTENTION_FIT:.3f} efficiencies are the H200's (not measured on an H100; an assumption)",
        measured="2026-12-06, one NVIDIA H100 80GB HBM3, driver 580.159.04, torch 2.11.0+cu130: total capacity "
                 "79.18 GiB (torch); device-to-device copy of 1 GiB 3,002.6 GB/s, median of 12 runs "
                 "(3,000.1-3,021.6) of `python3 benchmarks/bench_codecs.py --sizes-mib 1024 --no-sweep "
                 "--bucket-log2 0 ...`; codec shares of int4, nf4, fp4_e2m1, mxfp4 (16:21 UTC, git 7dfaf9e) and nvfp4 "
                 "(12:47 UTC), the other codecs the H200's (docs/bench/codecs.md tenth and eleventh sessions, "
                 "docs/bench/h100-2026-12-06-s10/ and -s11/)"),
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


#: The H200 as the LLaMA-2-7B steps of 2026-11-29 ran on it: the codec kernels of that day
#: (``CODEC_COPY_FRACTION_2026_11_29``), everything else as ``DEVICES["H200"]``. ``single_gpu.h200_check`` and
#: ``fit_h200`` use it, so that the check compares a measured step with the kernels that ran in it. Not in
#: ``DEVICES``: the planner and ``agoq plan`` use today's kernels.
H200_2026_11_29 = replace(
    DEVICES["H200"], codec_copy_fraction=CODEC_COPY_FRACTION_2026_11_29,
    measured=_H200_MEASURED_STEP + "2026-11-29: codec shares of copy bandwidth at 1 GiB (bench_codecs.py, kernels at "
             "commit 994778b, docs/bench/codecs.md 'Previous run (2026-11-29)'; CODEC_COPY_FRACTION_2026_11_29)")


def device_profile(name: str | DeviceProfile) -> DeviceProfile:
    """A profile by name (case-insensitive: H200, H100, A100, A6000, 910B)."""
    if isinstance(name, DeviceProfile):
        return name
    key = {k.lower(): k for k in DEVICES}.get(str(name).strip().lower())
    if key is None:
        raise ScaleError(f"unknown device {name!r}; known devices: {', '.join(DEVICES)}")
    return DEVICES[key]


def profile_name_for(gpu_name: str | None) -> str | None:
    """The profile of a card by the name its runtime reports ("NVIDIA H100 80GB HBM3" -> "H100"), or None when no
    profile matches (the caller picks its default and says so)."""
    text = str(gpu_name or "").upper()
    for name in DEVICES:  # H200 before H100 in DEVICES' order does not matter: names do not contain each other
        if name.upper() in text:
            return name
    return None


def with_attention_efficiency(dev: DeviceProfile, eff: float) -> DeviceProfile:
    return replace(dev, attention_efficiency=eff)
