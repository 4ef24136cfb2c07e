"""Links and network profiles: the alpha-beta numbers every collective time is computed from.

A :class:`Link` is one kind of connection as one GPU sees it: a per-message latency ``alpha``
(seconds per algorithm step) and a bandwidth (bytes/s per direction that a collective can use,
i.e. NCCL's "bus bandwidth"). A :class:`NetworkProfile` is what a cluster has: the intra-node link
(NVLink, HCCS, PCIe) and the inter-node one (InfiniBand, RoCE, Ethernet) with its NICs per node.

Presets are *published line rates times an efficiency* (the share of line rate a collective
library reaches on large messages; 0.8 unless stated). They are assumptions, and each says so in
its ``source``; a profile measured by ``benchmarks/calibrate_collectives.py`` or fitted to the
paper's table (``agoq_core.scale.fit``) replaces them. Profiles are JSON (``to_json``/``load_profile``).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from agoq_core.scale.errors import ScaleError

__all__ = ["Link", "NetworkProfile", "parse_rate", "INTRA_LINKS", "INTER_LINKS", "load_profile",
           "PROFILE_DIR", "network_for"]

#: Where measured / fitted profiles shipped with the library live (``<name>.json``).
PROFILE_DIR = Path(__file__).with_name("profiles")

_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)\s*(b|bit|bits|byte|bytes)?\s*(ps|/s|e)?\s*$", re.I)
_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_rate(text: str | float | int) -> float:
    """Bytes per second from a rate such as ``200Gbps``, ``200Gb/s``, ``25GbE``, ``400G``, ``900GB/s``.

    Lower-case ``b`` (or no unit letter, as in ``400G``) means bits, upper-case ``B`` bytes — the
    networking convention. A bare number is bytes/s.
    """
    if isinstance(text, bool):
        raise ScaleError(f"cannot read {text!r} as a rate")
    if isinstance(text, (int, float)):
        if text <= 0:
            raise ScaleError(f"a rate must be > 0, got {text!r}")
        return float(text)
    m = _RATE.match(str(text))
    if not m:
        raise ScaleError(f"cannot read {text!r} as a rate; write e.g. 200Gbps, 200Gb/s, 25GbE, 400G (bits/s) "
                         f"or 900GB/s (bytes/s)")
    value, prefix, unit, suffix = m.groups()
    if unit is None and not prefix and suffix is None:
        return _positive(float(value), text)
    is_bytes = unit is not None and (unit.startswith("B") or unit.lower() in ("byte", "bytes"))
    per_s = _SCALE[prefix.lower()] * float(value)
    return _positive(per_s if is_bytes else per_s / 8.0, text)


def _positive(v: float, text: object) -> float:
    if v <= 0:
        raise ScaleError(f"a rate must be > 0, got {text!r}")
    return v


@dataclass(frozen=True, kw_only=True)
class Link:
    """One kind of connection, as a GPU uses it in a collective."""

    name: str
    line_rate: float
    """Bytes/s per direction, as published (one NIC for inter-node links, one GPU for intra-node)."""
    alpha: float
    """Seconds per algorithm step (latency of one message, incl. the library's per-step overhead)."""
    efficiency: float = 0.8
    """Share of ``line_rate`` a collective reaches on large messages (bus bandwidth / line rate)."""
    source: str = ""

    def __post_init__(self) -> None:
        if not (self.line_rate > 0):
            raise ScaleError(f"Link {self.name!r}: line_rate must be > 0 bytes/s, got {self.line_rate!r}")
        if not (self.alpha >= 0):
            raise ScaleError(f"Link {self.name!r}: alpha must be >= 0 s, got {self.alpha!r}")
        if not (0 < self.efficiency <= 1):
            raise ScaleError(f"Link {self.name!r}: efficiency must be in (0, 1], got {self.efficiency!r}")

    @property
    def bandwidth(self) -> float:
        """Usable bytes/s per direction."""
        return self.line_rate * self.efficiency

    @property
    def beta(self) -> float:
        """Seconds per byte."""
        return 1.0 / self.bandwidth


@dataclass(frozen=True, kw_only=True)
class NetworkProfile:
    """The links of a cluster: inside a node and between nodes."""

    name: str
    intra: Link
    inter: Link
    nics_per_node: int = 1
    """Inter-node NICs per node; GPUs of a node that talk across nodes at the same time share them."""
    source: str = ""
    date: str = ""
    fitted: dict = field(default_factory=dict)
    """Free-form record of how the profile was measured or fitted (sizes, residuals)."""

    def __post_init__(self) -> None:
        if isinstance(self.nics_per_node, bool) or not isinstance(self.nics_per_node, int) or self.nics_per_node < 1:
            raise ScaleError(f"NetworkProfile.nics_per_node must be an int >= 1, got {self.nics_per_node!r}")

    def inter_bandwidth_per_gpu(self, sharing: int) -> float:
        """Inter-node bytes/s one GPU gets when ``sharing`` GPUs of its node send across nodes at once."""
        if sharing < 1:
            raise ScaleError(f"sharing must be >= 1, got {sharing}")
        return self.inter.bandwidth * min(1.0, self.nics_per_node / sharing)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self, path: str | os.PathLike) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def from_dict(cls, d: dict) -> "NetworkProfile":
        try:
            return cls(name=d["name"], intra=Link(**d["intra"]), inter=Link(**d["inter"]),
                       nics_per_node=int(d.get("nics_per_node", 1)), source=d.get("source", ""),
                       date=d.get("date", ""), fitted=dict(d.get("fitted", {})))
        except (KeyError, TypeError) as exc:
            raise ScaleError(f"not a network profile (needs name, intra, inter links): {exc}") from None


# ---- presets ---------------------------------------------------------------------------------------
# Line rates are the published ones; alphas are typical NCCL per-step latencies (assumptions).
INTRA_LINKS: dict[str, Link] = {l.name: l for l in (
    Link(name="nvlink4", line_rate=450e9, alpha=3e-6,
         source="NVLink 4 (H100/H200 SXM): 900 GB/s bidirectional per GPU (NVIDIA H100/H200 datasheets); "
                "efficiency 0.8 and alpha 3 us assumed"),
    Link(name="nvlink3", line_rate=300e9, alpha=3e-6,
         source="NVLink 3 (A100 SXM): 600 GB/s bidirectional per GPU (NVIDIA A100 datasheet); "
                "efficiency 0.8 and alpha 3 us assumed"),
    Link(name="pcie4", line_rate=32e9, alpha=5e-6, efficiency=0.6,
         source="PCIe 4.0 x16: 32 GB/s per direction (PCI-SIG); RTX A6000 nodes without NVLink bridges. "
                "Efficiency 0.6 assumed (8 GPUs behind shared PCIe switches / CPU root ports)"),
    Link(name="hccs", line_rate=196e9, alpha=5e-6,
         source="Ascend 910B HCCS: 56 GB/s per link, full mesh of 8 (public reporting, low confidence; "
                "Huawei publishes no per-SKU datasheet); a ring uses ~3.5 links' worth here (assumption)"),
    Link(name="localhost", line_rate=5e9, alpha=50e-6,
         source="loopback placeholder; run benchmarks/calibrate_collectives.py for a measured profile"),
)}

INTER_LINKS: dict[str, Link] = {l.name: l for l in (
    Link(name="ib-400", line_rate=parse_rate("400Gbps"), alpha=6e-6,
         source="InfiniBand NDR 400 Gb/s per NIC; efficiency 0.8, alpha 6 us assumed"),
    Link(name="ib-200", line_rate=parse_rate("200Gbps"), alpha=6e-6,
         source="InfiniBand HDR 200 Gb/s per NIC; efficiency 0.8, alpha 6 us assumed"),
    Link(name="roce-200", line_rate=parse_rate("200Gbps"), alpha=10e-6, efficiency=0.7,
         source="RoCE v2 200 Gb/s per NIC; efficiency 0.7, alpha 10 us assumed"),
    Link(name="eth-100", line_rate=parse_rate("100Gbps"), alpha=30e-6, efficiency=0.6,
         source="100 GbE, NCCL socket transport (no RDMA); efficiency 0.6, alpha 30 us assumed"),
    Link(name="eth-25", line_rate=parse_rate("25Gbps"), alpha=30e-6, efficiency=0.6,
         source="25 GbE, NCCL socket transport (no RDMA); efficiency 0.6, alpha 30 us assumed"),
    Link(name="eth-10", line_rate=parse_rate("10Gbps"), alpha=30e-6, efficiency=0.6,
         source="10 GbE, socket transport; efficiency 0.6, alpha 30 us assumed"),
)}


def network_for(intra: str | Link, inter: str | float | Link, *, nics_per_node: int = 1,
                name: str | None = None) -> NetworkProfile:
    """A profile from preset names (or a rate such as ``200Gbps`` for the inter-node link)."""
    if not isinstance(intra, Link):
        if intra not in INTRA_LINKS:
            raise ScaleError(f"unknown intra-node link {intra!r}; known: {', '.join(INTRA_LINKS)}")
        intra = INTRA_LINKS[intra]
    if not isinstance(inter, Link):
        if isinstance(inter, str) and inter in INTER_LINKS:
            inter = INTER_LINKS[inter]
        else:
            rate = parse_rate(inter)
            kind = "ib" if rate >= parse_rate("100Gbps") else "eth"
            base = next(l for l in INTER_LINKS.values() if l.name.startswith(kind))
            inter = replace(base, name=f"{kind}-{rate * 8 / 1e9:g}Gbps", line_rate=rate,
                            source=f"{rate * 8 / 1e9:g} Gb/s per NIC as given; alpha and efficiency of "
                                   f"{base.name}: {base.source.split(';', 1)[-1].strip()}")
    return NetworkProfile(name=name or f"{intra.name}+{inter.name}", intra=intra, inter=inter,
                          nics_per_node=nics_per_node)


def load_profile(name_or_path: str | os.PathLike) -> NetworkProfile:
    """A profile from a JSON file, or by name from the shipped ``profiles/`` folder."""
    p = Path(name_or_path)
    if not p.is_file():
        p = PROFILE_DIR / f"{name_or_path}.json"
    if not p.is_file():
        known = sorted(q.stem for q in PROFILE_DIR.glob("*.json"))
        raise ScaleError(f"no network profile {str(name_or_path)!r}: not a file, and not one of the shipped "
                         f"profiles ({', '.join(known) or 'none'})")
    try:
        return NetworkProfile.from_dict(json.loads(p.read_text()))
    except ValueError as exc:
        raise ScaleError(f"{p}: not valid JSON: {exc}") from None
