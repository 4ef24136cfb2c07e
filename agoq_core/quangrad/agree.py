"""Ranks agree on what they are about to exchange before any payload moves.

QuanGrad's payloads are padded to whole blocks per rank, so inputs that disagree across ranks (100 vs
200 elements, fp8_e4m3 vs int8, block 256 vs 512, different backends) do not make the byte collectives
fail: they give wrong sums or all-NaN. Every checking-API call and every wrapper setup therefore first
all-gathers one fixed-size header (``HEADER_BYTES`` of canonical JSON) and compares the headers. All
ranks see all headers, so every rank raises the same ``RankMismatchError`` naming each differing field
and its value on every rank. The exchange is one tiny all-gather that every rank issues, whatever its
input (an empty tensor included), so a mismatch is an error on every rank, never a hang.
"""
from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any, Callable

import torch

from agoq_core.errors import RankMismatchError

if TYPE_CHECKING:
    from agoq_core.backend.protocol import Backend

__all__ = ["RankMismatchError", "HEADER_BYTES", "agree_across_ranks"]

HEADER_BYTES = 256
"""Fixed header size: every rank sends the same number of bytes, so the all-gather itself cannot
mismatch. A longer header is replaced by its sha256 (the message then says only that the headers differ)."""


def _encode(header: dict[str, Any]) -> bytes:
    blob = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    if len(blob) > HEADER_BYTES:
        blob = json.dumps({"sha256": hashlib.sha256(blob).hexdigest()}).encode()
    return blob.ljust(HEADER_BYTES, b"\0")


def _decode(row: bytes) -> dict[str, Any]:
    try:
        return json.loads(row.rstrip(b"\0").decode())
    except (UnicodeDecodeError, json.JSONDecodeError):  # a peer running another agoq version
        return {"header": row.rstrip(b"\0").hex()[:32] + "..."}


def agree_across_ranks(header: dict[str, Any], *, group: Any, device: torch.device, backend: "Backend | None",
                       what: str, fix: str,
                       special: "Callable[[list[dict[str, Any]]], Exception | None] | None" = None) -> None:
    """Collective: all-gather ``header`` (JSON-able, small) and raise ``RankMismatchError`` on every
    rank if any rank's header differs (or the exception ``special(headers)`` returns). ``what`` names the
    call, ``fix`` says what must agree.
    ``backend=None`` uses torch.distributed directly (for a rank whose backend selection failed)."""
    import torch.distributed as dist

    world = dist.get_world_size(group)
    mine = torch.frombuffer(bytearray(_encode(header)), dtype=torch.uint8).to(device)
    allh = torch.empty(world, HEADER_BYTES, dtype=torch.uint8, device=device)
    if backend is not None:
        backend.all_gather_bytes(allh, mine, group=group)
    else:
        fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        fn(allh.view(-1), mine, group=group)
    rows = [bytes(r.tolist()) for r in allh.cpu()]
    if all(r == rows[0] for r in rows):
        return
    heads = [_decode(r) for r in rows]
    exc = special(heads) if special is not None else None  # a more specific error for some fields
    if exc is not None:
        raise exc
    keys = sorted({k for h in heads for k in h})
    diffs = [f"{k}: " + ", ".join(f"rank {r}={h.get(k)!r}" for r, h in enumerate(heads))
             for k in keys if len({json.dumps(h.get(k), sort_keys=True) for h in heads}) > 1]
    raise RankMismatchError(f"{what}: the ranks' inputs disagree ({'; '.join(diffs)}). {fix}")
