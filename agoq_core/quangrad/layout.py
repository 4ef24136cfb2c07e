"""Bucket layout: which parameter's gradient lives where in the flat 8-bit buffers.

Parameters are taken in reverse registration order (backward produces the last layers' gradients
first, so the first bucket fills first), packed into buckets of at most ``cap`` elements. Each
parameter starts on a block boundary, so its blocks are its own: folding one parameter's gradient in
(``accumulate_``) never touches a neighbour, and a parameter is a plain view of the bucket. Each bucket
is padded to a multiple of world_size x block so that every rank's chunk is whole blocks. Padding
costs < block elements per parameter plus < world_size x block per bucket (LLaMA-2-7B, 291
parameters, W=8: under 0.01% of 6.7e9).

The layout's hash covers everything that shapes the wire format; ranks compare it at setup.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

import torch

from agoq_core.errors import RankMismatchError
from agoq_core.formats.spec import FormatSpec
from agoq_core.quangrad.protocol import padded_numel

if TYPE_CHECKING:
    from agoq_core.backend.protocol import Backend

__all__ = ["ParamSlot", "Bucket", "BucketLayout", "plan_buckets", "check_layout_across_ranks", "LayoutMismatchError"]


class LayoutMismatchError(RankMismatchError, RuntimeError):
    """Ranks built different QuanGrad bucket layouts (different models, configs or world sizes)."""


@dataclass(frozen=True, slots=True)
class ParamSlot:
    name: str
    index: int
    """Position in the list of trainable parameters (model.parameters() order)."""
    shape: tuple[int, ...]
    dtype: str
    bucket: int
    offset: int
    """First element in the bucket (a multiple of block)."""
    numel: int


@dataclass(frozen=True, slots=True)
class Bucket:
    index: int
    slots: tuple[ParamSlot, ...]
    used: int
    """Elements up to the end of the last parameter (block-aligned starts included)."""
    numel: int
    """Padded element count: a multiple of world_size x block."""
    path: str
    """How it is reduced: "quangrad", "naive_fp8", or "fp32"/"bf16" (vendor all-reduce)."""
    reason: str


@dataclass(frozen=True, slots=True)
class BucketLayout:
    buckets: tuple[Bucket, ...]
    slots: tuple[ParamSlot, ...]
    """In parameter-index order."""
    world_size: int
    spec: FormatSpec
    sharded: bool

    @property
    def numel(self) -> int:
        return sum(b.numel for b in self.buckets)

    @property
    def param_numel(self) -> int:
        return sum(s.numel for s in self.slots)

    def describe(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size, "fmt": self.spec.name, "block": self.spec.block, "sharded": self.sharded,
            "buckets": [{"index": b.index, "numel": b.numel, "path": b.path,
                         "params": [[s.name, list(s.shape), s.dtype, s.offset] for s in b.slots]}
                        for b in self.buckets],
        }

    @property
    def digest(self) -> str:
        """sha256 of the canonical JSON description (what every rank must agree on)."""
        blob = json.dumps(self.describe(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()

    def summary(self) -> str:
        return (f"{len(self.slots)} parameters ({self.param_numel} elements) in {len(self.buckets)} buckets "
                f"({self.numel} padded elements), fmt {self.spec.name}, block {self.spec.block}, "
                f"world size {self.world_size}, sharded={self.sharded}")


def plan_buckets(named_params: Iterable[tuple[str, torch.Tensor]], *, world_size: int, spec: FormatSpec,
                 cap_numel: int, path_for: Any = None, sharded: bool = False) -> BucketLayout:
    """Assign parameters to buckets. ``path_for(padded_numel) -> (path, reason)`` decides each
    bucket's reduction (the crossover rule); default: "quangrad" for all."""
    params = list(named_params)
    if not params:
        raise ValueError("QuanGrad: the model has no trainable parameters (none with requires_grad=True)")
    b = spec.block
    groups: list[list[tuple[int, str, torch.Tensor]]] = [[]]
    fill = 0
    for idx in reversed(range(len(params))):
        name, p = params[idx]
        aligned = -(-p.numel() // b) * b
        if groups[-1] and fill + aligned > cap_numel:
            groups.append([])
            fill = 0
        groups[-1].append((idx, name, p))
        fill += aligned
    buckets, slots = [], []
    for bi, group in enumerate(groups):
        off = 0
        bslots = []
        for idx, name, p in group:
            s = ParamSlot(name=name, index=idx, shape=tuple(p.shape), dtype=str(p.dtype).replace("torch.", ""),
                          bucket=bi, offset=off, numel=p.numel())
            bslots.append(s)
            off += -(-p.numel() // b) * b
        padded = padded_numel(max(off, 1), world_size, b)
        path, reason = path_for(padded) if path_for is not None else ("quangrad", "")
        buckets.append(Bucket(index=bi, slots=tuple(bslots), used=off, numel=padded, path=path, reason=reason))
        slots.extend(bslots)
    slots.sort(key=lambda s: s.index)
    return BucketLayout(buckets=tuple(buckets), slots=tuple(slots), world_size=world_size, spec=spec, sharded=sharded)


def check_layout_across_ranks(layout: BucketLayout, *, group: Any, device: torch.device, backend: "Backend") -> None:
    """Collective: every rank compares its layout digest with every other's; a mismatch raises
    LayoutMismatchError on every rank (one fixed-size all-gather, so it cannot hang)."""
    import torch.distributed as dist

    world = dist.get_world_size(group)
    mine = torch.frombuffer(bytearray(bytes.fromhex(layout.digest)), dtype=torch.uint8).to(device)
    allh = torch.empty(world, mine.numel(), dtype=torch.uint8, device=device)
    backend.all_gather_bytes(allh, mine, group=group)
    if bool((allh == allh[0]).all()):
        return
    # Error path only: exchange readable descriptions to say what differs.
    descs: list[Any] = [None] * world
    dist.all_gather_object(descs, layout.describe(), group=group)
    rank = dist.get_rank(group)
    lines = []
    for r in range(world):
        if not bool((allh[r] == allh[0]).all()):
            lines.append(f"rank {r} differs from rank 0: {_first_difference(descs[0], descs[r])}")
    raise LayoutMismatchError(
        f"QuanGrad bucket layouts differ across ranks (seen from rank {rank}); "
        + "; ".join(lines)
        + ". Every rank must wrap the same model (same parameters, shapes, dtypes, requires_grad) with the "
        "same QuanGradConfig (fmt, block, bucket_cap_mb, min_compress_bytes, sharded)."
    )


def _first_difference(a: dict[str, Any], b: dict[str, Any]) -> str:
    for key in ("world_size", "fmt", "block", "sharded"):
        if a[key] != b[key]:
            return f"{key} is {a[key]!r} on rank 0 but {b[key]!r} here"
    pa = [(bk["index"], *p) for bk in a["buckets"] for p in bk["params"]]
    pb = [(bk["index"], *p) for bk in b["buckets"] for p in bk["params"]]
    for i, (x, y) in enumerate(zip(pa, pb)):
        if x != y:
            return (f"parameter #{i} in layout order is {x[1]!r} {x[2]} {x[3]} (bucket {x[0]}, offset {x[4]}) on "
                    f"rank 0 but {y[1]!r} {y[2]} {y[3]} (bucket {y[0]}, offset {y[4]})")
    if len(pa) != len(pb):
        return f"{len(pa)} trainable parameters on rank 0 but {len(pb)}"
    for x, y in zip(a["buckets"], b["buckets"]):
        if x["numel"] != y["numel"] or x["path"] != y["path"]:
            return (f"bucket {x['index']} has {x['numel']} elements reduced by {x['path']!r} on rank 0 but "
                    f"{y['numel']} by {y['path']!r}")
    return "the bucket layouts differ"
