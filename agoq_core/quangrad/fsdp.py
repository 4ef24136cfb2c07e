"""QuanGrad as FSDP2's gradient reduce-scatter.

Quick start (every rank, after ``fully_shard``)::

    from torch.distributed.fsdp import fully_shard
    from agoq_core.quangrad import fsdp as qg_fsdp
    for block in model.layers: fully_shard(block)
    fully_shard(model)
    state = qg_fsdp.enable(model)          # collective: every rank of the job calls it
    ... train as usual ...; print(state.summary())

Each FSDP module's flat gradient (FSDP2 lays it out as ``[world_size, shard]``, row r for rank r) is
block-quantized to 8 bits (``fmt``, block 256), sent with one byte all-to-all, dequantized and summed
in fp32 in rank order 0..W-1 (QuanGrad's protocol, ``protocol.py``), and the shard is written in the
dtype FSDP2 asks for. FSDP2's reduce op is honoured on the fp32 sum: SUM as is, AVG divided by the
group size, PREMUL_SUM(f) (what ``set_gradient_divide_factor`` produces) multiplied by f. The result is
deterministic, identical on every backend, and a rank sends ``(W-1) x (C + 4 C / 256)`` bytes for a
C-element shard: 0.254x an fp32 reduce-scatter, 0.508x a bf16 one.

Buckets whose fp32 size is below ``threshold_bytes`` go through the reduce-scatter FSDP had before
(counted, and logged once). Needs ``FSDPModule.set_custom_reduce_scatter``: torch >= 2.9 (checked
in 2.9.0, 2.11.0 and 2.13.0; absent in 2.8.0).
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn as nn

from agoq_core import api
from agoq_core.backend import check_same_backend_across_ranks, get_backend
from agoq_core.errors import AgoqError
from agoq_core.quangrad import protocol as P
from agoq_core.quangrad.collective import QuanGradOp
from agoq_core.quangrad.config import DEFAULT_MIN_COMPRESS_BYTES, resolve_spec
from agoq_core.quangrad.layout import LayoutMismatchError

if TYPE_CHECKING:
    from agoq_core.backend.protocol import Backend

try:  # torch >= 2.9
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _ReduceScatterBase
except ImportError:  # pragma: no cover - depends on the installed torch
    FSDPModule = None
    _ReduceScatterBase = object

__all__ = ["enable", "disable", "QuanGradReduceScatter", "QuanGradFSDPState", "supported", "MIN_TORCH"]

log = logging.getLogger("agoq")

MIN_TORCH = "2.9"
"""First torch release with ``FSDPModule.set_custom_reduce_scatter`` (pytorch PR 155189, July 2025)."""

_STATE_ATTR = "_agoq_quangrad_fsdp"
_REDUCE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def supported() -> tuple[bool, str]:
    """(True, "") if this torch has FSDP2's custom reduce-scatter, else (False, why)."""
    if FSDPModule is None or _ReduceScatterBase is object:
        return False, f"torch {torch.__version__} has no torch.distributed.fsdp FSDPModule/ReduceScatter comm API"
    if not hasattr(FSDPModule, "set_custom_reduce_scatter"):
        return False, f"torch {torch.__version__} has no FSDPModule.set_custom_reduce_scatter"
    return True, ""


# ---- state shared by the comms of one enable() call ---------------------------------------------------

@dataclass
class QuanGradFSDPState:
    """Counters of one ``enable`` call, across all its FSDP modules and steps.

    Bytes are what one rank sends to the other ranks: QuanGrad's all-to-all payload (codes + fp32
    scales), the fallback reduce-scatter's ``(W-1) x shard`` elements in their dtype, and for
    comparison what an fp32 ring reduce-scatter of the same compressed buckets would send.
    """

    fmt: str
    block: int
    threshold_bytes: int
    backend: str
    modules: dict[str, str] = field(default_factory=dict)
    """FSDP module fqn -> "quangrad" or the fallback reason (filled on each module's first call)."""
    compressed_calls: int = 0
    compressed_elements: int = 0
    fallback_calls: int = 0
    fallback_elements: int = 0
    wire_bytes: int = 0
    """QuanGrad all-to-all payload bytes sent by this rank."""
    fp32_equivalent_bytes: int = 0
    """Bytes an fp32 reduce-scatter would have sent for the compressed buckets."""
    fallback_bytes: int = 0
    """Bytes the fallback reduce-scatter sent (its own dtype)."""
    _expected: int = 0
    _logged: bool = False

    @property
    def compression_ratio(self) -> float | None:
        """wire_bytes / fp32_equivalent_bytes over the compressed buckets (0.254 with block 256)."""
        return self.wire_bytes / self.fp32_equivalent_bytes if self.fp32_equivalent_bytes else None

    def summary(self) -> str:
        ratio = self.compression_ratio
        s = (f"QuanGrad FSDP2 reduce-scatter ({self.fmt}, block {self.block}, backend {self.backend}, threshold "
             f"{self.threshold_bytes:,} B fp32): {self.compressed_calls} bucket reductions compressed "
             f"({self.compressed_elements:,} elements, {self.wire_bytes:,} B sent"
             + (f", {ratio:.3f}x of fp32's {self.fp32_equivalent_bytes:,} B" if ratio is not None else "")
             + f"), {self.fallback_calls} through FSDP's own reduce-scatter ({self.fallback_elements:,} elements, "
             f"{self.fallback_bytes:,} B sent)")
        fallbacks = {k: v for k, v in self.modules.items() if v != "quangrad"}
        if fallbacks:
            s += "\n" + "\n".join(f"  {k or '<root>'}: {v}" for k, v in sorted(fallbacks.items()))
        return s

    def _seen(self, fqn: str, path: str) -> None:
        if fqn in self.modules:
            return
        self.modules[fqn] = path
        if not self._logged and len(self.modules) >= self._expected:
            self._logged = True
            n_q = sum(v == "quangrad" for v in self.modules.values())
            log.info("agoq QuanGrad FSDP2: %d of %d FSDP buckets compressed, %d through FSDP's reduce-scatter "
                     "(below %s B); %s", n_q, len(self.modules), len(self.modules) - n_q,
                     f"{self.threshold_bytes:,}", self.summary())


class _DoneWork:
    """A finished collective, for callers that asked for ``async_op=True`` (the work ran synchronously)."""

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True


def _op_factor(op: Any, world: int) -> float:
    """The factor FSDP2's reduce op applies to the sum: SUM 1, AVG 1/W, PREMUL_SUM(f) f."""
    R = dist.ReduceOp
    kind = op
    factor: Any = None
    if isinstance(op, R) and not isinstance(op, R.RedOpType):  # PREMUL_SUM carries a factor
        kind, factor = op.__getstate__()
    if kind == R.SUM:
        return 1.0
    if kind == R.AVG:
        return 1.0 / world
    if kind == R.PREMUL_SUM:
        if isinstance(factor, torch.Tensor):
            if factor.numel() != 1:
                raise AgoqError(f"QuanGrad FSDP2 reduce-scatter: PREMUL_SUM with a {factor.numel()}-element factor")
            factor = factor.item()
        if not isinstance(factor, (int, float)):
            raise AgoqError(f"QuanGrad FSDP2 reduce-scatter: PREMUL_SUM without a scalar factor ({factor!r})")
        return float(factor)
    raise AgoqError(f"QuanGrad FSDP2 reduce-scatter supports SUM, AVG and PREMUL_SUM (gradient averaging); FSDP "
                    f"asked for {kind}. Call agoq_core.quangrad.fsdp.disable(model) for this reduction.")


class QuanGradReduceScatter(_ReduceScatterBase):  # type: ignore[misc, valid-type]
    """FSDP2 ``ReduceScatter`` comm: QuanGrad's 8-bit all-to-all with an fp32 rank-order sum.

    One instance per FSDP module (it knows its module's name for the report); buckets under
    ``state.threshold_bytes`` go to ``fallback``, the comm FSDP had before.
    """

    def __init__(self, *, fqn: str, spec: Any, backend: "Backend", state: QuanGradFSDPState, fallback: Any) -> None:
        self.fqn, self.spec, self.backend, self.state, self.fallback = fqn, spec, backend, state, fallback

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        # FSDP's buffers (the flat gradient, the shard) come from the comm it had, so a process-group or
        # symmetric-memory allocator the user set stays in force for them.
        return self.fallback.allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, op: Any,
                 async_op: bool = False) -> Any:
        world, rank = group.size(), group.rank()
        out, inp = output_tensor, input_tensor
        if inp.dtype != out.dtype or inp.dtype not in _REDUCE_DTYPES:
            raise AgoqError(f"QuanGrad FSDP2 reduce-scatter ({self.fqn or '<root>'}): input {inp.dtype} and output "
                            f"{out.dtype} must be one of float32/bfloat16/float16 and equal")
        if inp.numel() != out.numel() * world or not inp.is_contiguous() or not out.is_contiguous():
            raise AgoqError(f"QuanGrad FSDP2 reduce-scatter ({self.fqn or '<root>'}): want a contiguous input of "
                            f"world_size x output = {world} x {out.numel()} elements, got {inp.numel()}")
        shard = out.numel()
        if inp.numel() * 4 < self.state.threshold_bytes:
            st = self.state
            st.fallback_calls += 1
            st.fallback_elements += inp.numel()
            st.fallback_bytes += (world - 1) * shard * inp.element_size()
            st._seen(self.fqn, f"{inp.numel() * 4:,} B < threshold {st.threshold_bytes:,} B: FSDP's reduce-scatter "
                               f"in {inp.dtype}".replace("torch.", ""))
            return self.fallback(out, inp, group, op, async_op)
        factor = _op_factor(op, world)
        out.copy_(reduce_scatter_rows(inp, world, self.spec, group=group, backend=self.backend, state=self.state,
                                      factor=factor))
        self.state._seen(self.fqn, "quangrad")
        return _DoneWork() if async_op else None


def reduce_scatter_rows(inp: torch.Tensor, world: int, spec: Any, *, group: Any, backend: "Backend",
                        state: QuanGradFSDPState | None = None, factor: float = 1.0) -> torch.Tensor:
    """``inp`` laid out as ``[world, C]`` (row r for rank r) -> this rank's fp32 shard of the sum
    ``factor x sum_r inp_r[rank]``, summed in fp32 in rank order. Rows are zero-padded to whole blocks
    so that each rank's segment owns its blocks."""
    shard = inp.numel() // world
    cp = -(-shard // spec.block) * spec.block
    rows = inp.view(world, shard)
    if cp != shard:
        padded = torch.zeros(world, cp, dtype=inp.dtype, device=inp.device)
        padded[:, :shard].copy_(rows)
        rows = padded
    plan = P.ChunkPlan(spec=spec, world_size=world, numel=world * cp)
    q = api.quantize(rows.reshape(-1), spec, backend=backend)
    op = QuanGradOp(q.codes, q.scales, plan, group=group, backend=backend, sharded=True).run()
    if state is not None:
        state.compressed_calls += 1
        state.compressed_elements += inp.numel()
        state.wire_bytes += op.sent_bytes
        state.fp32_equivalent_bytes += (world - 1) * shard * 4
    res = op.shard[:shard]
    return res if factor == 1.0 else res.mul_(factor)


# ---- enable / disable -----------------------------------------------------------------------------------

def _param_groups(module: nn.Module) -> list[Any]:
    state = module._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None)  # torch 2.13: a list; 2.9-2.12: one or None
    if groups is None:
        groups = [g for g in (getattr(state, "_fsdp_param_group", None),) if g is not None]
    return list(groups)


def _grad_dtypes(pg: Any) -> set[torch.dtype]:
    mp = pg.mp_policy
    out = set()
    for fp in pg.fsdp_params:
        if not fp.sharded_param.requires_grad:
            continue
        orig = fp.sharded_param.dtype
        grad = mp.param_dtype if (mp.param_dtype is not None and orig.is_floating_point) else orig
        out.add(mp.reduce_dtype or grad)
    return out


def _describe(fqn: str, groups: list[Any]) -> dict[str, Any]:
    desc = []
    for pg in groups:
        mp = pg.mp_policy
        desc.append({
            "params": [[list(fp.sharded_param.shape), str(fp.sharded_param.dtype), bool(fp.sharded_param.requires_grad)]
                       for fp in pg.fsdp_params],
            "param_dtype": str(mp.param_dtype), "reduce_dtype": str(mp.reduce_dtype),
        })
    return {"fqn": fqn, "groups": desc}


def _check_ranks(header: dict[str, Any], groups: list[Any], device: torch.device, backend: "Backend") -> None:
    """Collective over each distinct reduce-scatter group: compare a sha256 of ``header`` (fixed 32 bytes,
    so it cannot hang on a mismatch); on a mismatch exchange the headers to say what differs."""
    digest = hashlib.sha256(json.dumps(header, sort_keys=True, separators=(",", ":")).encode()).digest()
    seen: set[tuple[int, ...]] = set()
    for pg in groups:
        g = pg._reduce_scatter_process_group
        ranks = tuple(dist.get_process_group_ranks(g))
        if ranks in seen or len(ranks) < 2:
            continue
        seen.add(ranks)
        mine = torch.frombuffer(bytearray(digest), dtype=torch.uint8).to(device)
        allh = torch.empty(len(ranks), mine.numel(), dtype=torch.uint8, device=device)
        backend.all_gather_bytes(allh, mine, group=g)
        if bool((allh == allh[0]).all()):
            continue
        headers: list[Any] = [None] * len(ranks)
        dist.all_gather_object(headers, header, group=g)
        diffs = []
        for r, h in enumerate(headers):
            if h == headers[0]:
                continue
            keys = [k for k in ("fmt", "block", "threshold_bytes", "backend", "world") if h.get(k) != headers[0].get(k)]
            what = (", ".join(f"{k}={h.get(k)!r} vs {headers[0].get(k)!r}" for k in keys) if keys else
                    _first_module_difference(headers[0]["modules"], h["modules"]))
            diffs.append(f"group rank {r} (global {ranks[r]}) differs from group rank 0: {what}")
        raise LayoutMismatchError(
            "QuanGrad FSDP2: ranks disagree on the reduce-scatter setup (checked before any gradient "
            "collective); " + "; ".join(diffs) + ". Every rank must wrap the same model with the same "
            "fully_shard calls and call enable() with the same fmt/block/threshold_bytes and AGOQ_BACKEND.")


def _first_module_difference(a: list[Any], b: list[Any]) -> str:
    for x, y in zip(a, b):
        if x != y:
            return f"FSDP module {x['fqn']!r}: {x['groups']} vs {y['fqn']!r}: {y['groups']}"
    return f"{len(b)} FSDP modules vs {len(a)}"


def enable(model: nn.Module, *, threshold_bytes: int = DEFAULT_MIN_COMPRESS_BYTES, fmt: str = "fp8_e4m3",
           block: int | None = None, backend: "str | Backend | None" = None, check_ranks: bool = True
           ) -> QuanGradFSDPState:
    """Make every FSDP2 module in ``model`` reduce-scatter its gradients with QuanGrad.

    ``model`` must already be wrapped by ``fully_shard`` (itself or its submodules). Collective when
    ``check_ranks``: every rank compares its setup (modules, parameter shapes and dtypes, fmt, block,
    threshold, backend) with one fixed-size all-gather and raises LayoutMismatchError on a mismatch,
    before any gradient collective. Returns the state whose counters and ``summary()`` say what went
    through QuanGrad and what through FSDP's own reduce-scatter.
    """
    ok, why = supported()
    if not ok:
        raise AgoqError(f"QuanGrad's FSDP2 reduce-scatter needs torch >= {MIN_TORCH} "
                        f"(FSDPModule.set_custom_reduce_scatter): {why}. Upgrade torch, or use "
                        "agoq_core.quangrad.QuanGradDDP / register_comm_hook with DDP.")
    if not isinstance(model, nn.Module):
        raise TypeError(f"enable expects the torch.nn.Module wrapped by fully_shard, got {type(model).__name__}")
    if isinstance(threshold_bytes, bool) or not isinstance(threshold_bytes, int) or threshold_bytes < 0:
        raise ValueError(f"threshold_bytes must be an int >= 0 (0 compresses every bucket), got {threshold_bytes!r}")
    spec = resolve_spec(fmt, block)
    if check_ranks and dist.is_available() and dist.is_initialized():
        check_same_backend_across_ranks(None, backend)  # first: a rank on another backend must not strand the rest
    be = get_backend(backend)
    mods = [(n, m) for n, m in model.named_modules() if isinstance(m, FSDPModule)]
    if not mods:
        kinds = sorted({type(m).__name__ for m in model.modules()
                        if type(m).__name__ in ("FullyShardedDataParallel", "DistributedDataParallel")})
        hint = (f" (found {', '.join(kinds)}: FSDP1/DDP have no custom reduce-scatter; use register_comm_hook for "
                "DDP)") if kinds else ""
        raise AgoqError(f"QuanGrad FSDP2: {type(model).__name__} is not wrapped by FSDP2{hint}. Call "
                        "torch.distributed.fsdp.fully_shard on its blocks and on the model first, then enable(model).")
    if not dist.is_available() or not dist.is_initialized():
        raise AgoqError("QuanGrad FSDP2: torch.distributed is not initialised (fully_shard needs a process group)")
    if any(_STATE_ATTR in m.__dict__ for _, m in mods):
        raise AgoqError("QuanGrad FSDP2 is already enabled on this model; call agoq_core.quangrad.fsdp.disable(model) "
                        "first")
    state = QuanGradFSDPState(fmt=spec.name, block=spec.block, threshold_bytes=threshold_bytes, backend=be.name)
    plan: list[tuple[str, nn.Module, list[Any]]] = []
    all_groups: list[Any] = []
    for name, m in mods:
        groups = _param_groups(m)
        if not groups:
            continue  # a wrapper with no parameters of its own: it never reduce-scatters
        if len(groups) > 1:
            raise AgoqError(f"QuanGrad FSDP2: module {name or '<root>'!r} has {len(groups)} parameter groups "
                            "(per-parameter meshes); torch's custom reduce-scatter takes one comm per module")
        for pg in groups:
            dtypes = _grad_dtypes(pg)
            if len(dtypes) > 1:
                raise AgoqError(
                    f"QuanGrad FSDP2: module {name or '<root>'!r} would reduce gradients of mixed dtypes "
                    f"{sorted(str(d) for d in dtypes)} in one bucket; give fully_shard a "
                    "MixedPrecisionPolicy(param_dtype=..., reduce_dtype=...) or wrap the differently typed "
                    "parameters in their own fully_shard call")
            bad = [d for d in dtypes if d not in _REDUCE_DTYPES]
            if bad:
                raise AgoqError(f"QuanGrad FSDP2: module {name or '<root>'!r} reduces {bad[0]} gradients; QuanGrad "
                                "takes float32, bfloat16 or float16")
        plan.append((name, m, groups))
        all_groups.extend(groups)
    if not plan:
        raise AgoqError(f"QuanGrad FSDP2: no FSDP module of {type(model).__name__} manages parameters")
    if check_ranks:
        world = dist.get_world_size()
        header = {"fmt": spec.name, "block": spec.block, "threshold_bytes": threshold_bytes, "backend": be.name,
                  "world": world, "modules": [_describe(n, g) for n, _, g in plan]}
        _check_ranks(header, all_groups, all_groups[0].device, be)
    for name, m, groups in plan:
        prev = groups[0]._reduce_scatter_comm
        comm = QuanGradReduceScatter(fqn=name, spec=spec, backend=be, state=state, fallback=prev)
        m.set_custom_reduce_scatter(comm)
        m.__dict__[_STATE_ATTR] = (state, prev)
    state._expected = len(plan)
    model.__dict__[_STATE_ATTR + "_root"] = state
    log.info("agoq QuanGrad FSDP2: enabled on %d FSDP modules (%s, block %d, backend %s, threshold %s B)",
             len(plan), spec.name, spec.block, be.name, f"{threshold_bytes:,}")
    return state


def disable(model: nn.Module) -> QuanGradFSDPState:
    """Give every FSDP module of ``model`` back the reduce-scatter it had before ``enable``."""
    state = model.__dict__.pop(_STATE_ATTR + "_root", None)
    if state is None:
        raise AgoqError(f"QuanGrad FSDP2 is not enabled on this {type(model).__name__}")
    for m in model.modules():
        entry = m.__dict__.pop(_STATE_ATTR, None)
        if entry is not None:
            m.set_custom_reduce_scatter(entry[1])
    return state
