"""What a prediction is for: the cluster (devices, nodes, links) and the parallel layout on it."""
from __future__ import annotations

import re
from dataclasses import dataclass

from agoq_core.planner.schedules import PipelineSpec
from agoq_core.scale.devices import DeviceProfile, device_profile
from agoq_core.scale.errors import ScaleError
from agoq_core.scale.network import NetworkProfile, network_for

__all__ = ["Cluster", "Parallel", "parse_cluster"]

_CLUSTER = re.compile(r"^\s*(\d+)\s*[x*]\s*([A-Za-z0-9_.-]+)\s*$")


@dataclass(frozen=True, kw_only=True)
class Cluster:
    devices: int
    device: DeviceProfile
    network: NetworkProfile
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        for f in ("devices", "gpus_per_node"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ScaleError(f"Cluster.{f} must be an int >= 1, got {v!r}")
        if self.devices > self.gpus_per_node and self.devices % self.gpus_per_node:
            raise ScaleError(f"{self.devices} devices do not fill whole nodes of {self.gpus_per_node}: "
                             f"{self.devices} % {self.gpus_per_node} = {self.devices % self.gpus_per_node}; "
                             f"use a multiple of {self.gpus_per_node} or set --gpus-per-node")

    @property
    def nodes(self) -> int:
        return max(1, self.devices // self.gpus_per_node)

    @property
    def name(self) -> str:
        return f"{self.devices}x{self.device.name}"


def parse_cluster(text: str, *, inter: str | None = None, intra: str | None = None, gpus_per_node: int = 8,
                  network: NetworkProfile | None = None, nics_per_node: int | None = None) -> Cluster:
    """``"64xA6000"`` (+ the inter-node rate, e.g. ``"200Gbps"`` or a preset such as ``ib-400``)."""
    m = _CLUSTER.match(str(text))
    if not m:
        raise ScaleError(f"cannot read cluster {text!r}; write DEVICESxTYPE, e.g. 64xA6000 or 1024xH100")
    n, dev = int(m.group(1)), device_profile(m.group(2))
    if n < 1:
        raise ScaleError(f"cluster {text!r} has no devices")
    gpn = min(gpus_per_node, n)
    if network is None:
        nics = nics_per_node if nics_per_node is not None else (gpn if dev.name in ("H100", "H200", "A100") else 1)
        network = network_for(intra or dev.intra_link, inter or "ib-200", nics_per_node=nics)
    return Cluster(devices=n, device=dev, network=network, gpus_per_node=gpn)


@dataclass(frozen=True, kw_only=True)
class Parallel:
    """Megatron-style layout: tensor (innermost, inside a node), data, then pipeline (outermost)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    schedule: str = "1f1b"
    microbatches: int = 8
    """Micro-batches per step per pipeline (= global batch / (dp x microbatch_size))."""
    chunks: int | None = None
    microbatch_size: int = 1
    zero: int = 0
    """0: plain data parallel (Megatron, no distributed optimizer); 1: ZeRO-1; 2: ZeRO-2; 3: FSDP / ZeRO-3."""
    sequence_parallel: bool = True

    def __post_init__(self) -> None:
        for f in ("tp", "pp", "dp", "microbatches", "microbatch_size"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ScaleError(f"{f} must be an int >= 1, got {v!r}")
        if self.zero not in (0, 1, 2, 3):
            raise ScaleError(f"zero must be 0, 1, 2 or 3 (3 = FSDP), got {self.zero!r}")
        self.spec  # validates schedule / chunks / micro-batches with the planner's rules

    @property
    def spec(self) -> PipelineSpec:
        return PipelineSpec(schedule=self.schedule, stages=self.pp, microbatches=self.microbatches, chunks=self.chunks)

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def check(self, cluster: Cluster) -> None:
        if self.world != cluster.devices:
            raise ScaleError(f"tp({self.tp}) * pp({self.pp}) * dp({self.dp}) = {self.world} != {cluster.devices} "
                             f"devices of {cluster.name}; choose sizes whose product is {cluster.devices}")
        if self.tp > cluster.gpus_per_node and self.tp % cluster.gpus_per_node:
            raise ScaleError(f"tp({self.tp}) spans nodes of {cluster.gpus_per_node} GPUs unevenly; use tp <= "
                             f"{cluster.gpus_per_node} or a multiple of it")
        if self.tp < cluster.gpus_per_node and cluster.gpus_per_node % self.tp:
            raise ScaleError(f"tp({self.tp}) must divide the {cluster.gpus_per_node} GPUs of a node")
