"""Measure the bytes autograd keeps for backward, per decoder layer and per part, from live tensors.

Two channels see everything that is kept:

* ``torch.autograd.graph.saved_tensors_hooks``: every tensor an autograd node saves (PyTorch's own
  ops and the plain model), attributed to the innermost module being run (a part of a layer);
* LAAQ's own storage listener: every tensor LAAQ keeps (QuantizedTensor codes and scales, or native
  tensors) with its role.

Bytes are counted per unique storage (a tensor saved by Q, K and V projections counts once; a view
counts its whole storage), parameters are excluded, and only storages still alive when the result
is read count (a tensor saved by a branch that was freed in forward is not kept for backward).
Nothing is computed from shapes: on the ``meta`` device the storages are real objects with real
sizes and no data, which makes measuring full-size models cheap (there SDPA is made to keep what the
flash kernels keep, see :func:`flash_layout_sdpa`).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import torch
import torch.nn as nn
from torch.multiprocessing.reductions import StorageWeakRef

from agoq_core.laaq import storage
from agoq_core.laaq.config import LAAQConfig
from agoq_core.laaq.families import FAMILIES, LayerFamily, match_family

__all__ = ["PARTS", "SavedBytes", "SavedBytesMeter", "StorageLedger", "measure_saved_bytes", "flash_layout_sdpa"]

#: Parts of a decoder layer, in forward order. LAAQ roles land in: norm_input -> norm,
#: attention_core -> attn_core, attn_out_input -> o_in, mlp_act_input -> act.
PARTS: tuple[str, ...] = ("norm", "qkv_in", "attn_core", "o_in", "mlp_in", "act", "down_in", "other")
_PART_DOC = {
    "norm": "both RMSNorms (plain: fp32 input copy + normalized; LAAQ: the kept input)",
    "qkv_in": "input of the Q/K/V GEMMs (the RMSNorm output)",
    "attn_core": "Q, K, V, softmax state, output, RoPE tables",
    "o_in": "input of the attention out-projection",
    "mlp_in": "input of the gate/up GEMMs (the RMSNorm output)",
    "act": "SiLU&Mul: gate/up outputs and SiLU output",
    "down_in": "input of the down GEMM (the SwiGLU output)",
    "other": "anything else inside the layer",
}
_ROLE_PART = {"norm_input": "norm", "attention_core": "attn_core", "attn_out_input": "o_in",
              "mlp_act_input": "act"}
_OUTSIDE = ("embed", "norm", "head", "other")


@dataclass
class SavedBytes:
    """Bytes kept for backward: ``per_layer[layer][part]`` and ``outside[part]`` (embedding, final
    norm, LM head, loss)."""

    per_layer: dict[int, dict[str, int]] = field(default_factory=dict)
    outside: dict[str, int] = field(default_factory=dict)
    label: str = ""

    def layer_total(self, layer: int) -> int:
        return sum(self.per_layer[layer].values())

    @property
    def layers_total(self) -> int:
        return sum(self.layer_total(i) for i in self.per_layer)

    @property
    def total(self) -> int:
        return self.layers_total + sum(self.outside.values())

    def mean_layer(self) -> dict[str, float]:
        """Average bytes per layer and part (what one more layer would add)."""
        n = max(1, len(self.per_layer))
        return {p: sum(d.get(p, 0) for d in self.per_layer.values()) / n for p in PARTS}

    def to_dict(self) -> dict:
        return {"label": self.label, "per_layer": {str(k): v for k, v in sorted(self.per_layer.items())},
                "outside": dict(self.outside), "layers_total": self.layers_total, "total": self.total}

    def table(self, other: "SavedBytes | None" = None, unit: int = 1 << 20) -> str:
        """Per-layer table in MiB; with ``other`` (e.g. LAAQ), both side by side and their ratio."""
        uname = {1: "B", 1 << 10: "KiB", 1 << 20: "MiB", 1 << 30: "GiB"}.get(unit, f"x{unit}B")
        runs = [self] + ([other] if other is not None else [])
        head = f"{'layer':>6} {'run':<10}" + "".join(f"{p:>11}" for p in PARTS) + f"{'total':>12}"
        lines = [f"bytes kept for backward ({uname})", head]
        for layer in sorted(set().union(*(r.per_layer for r in runs))):
            for r in runs:
                d = r.per_layer.get(layer, {})
                lines.append(f"{layer:>6} {r.label[:10]:<10}" + "".join(f"{d.get(p, 0) / unit:>11.3f}" for p in PARTS)
                             + f"{sum(d.values()) / unit:>12.3f}")
        for r in runs:
            lines.append(f"{'rest':>6} {r.label[:10]:<10} " + ", ".join(
                f"{k}={v / unit:.3f}" for k, v in sorted(r.outside.items())) + f"  (total {r.total / unit:.3f})")
        if other is not None and self.layers_total:
            lines.append(f"decoder layers: {other.label} keeps {other.layers_total / self.layers_total:.1%} of "
                         f"{self.label} ({other.layers_total / unit:.3f} vs {self.layers_total / unit:.3f} {uname}); "
                         f"whole model {other.total / max(1, self.total):.1%}")
        return "\n".join(lines)


def _skey(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


class StorageLedger:
    """The distinct tensor storages seen, each with its size and a tag, counted only while alive.

    The bookkeeping of every saved-bytes meter in agoq (this module's, ``agoq train``'s and the
    planner's pipeline check): a storage is keyed by its identity, so a view or a tensor saved twice
    counts once and whole; ``exclude`` storages (parameters) never count; a storage freed since it was
    seen drops out (a weak reference), and a new storage at a recycled address is a new entry.
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self.excluded: set[int] = {_skey(t) for t in exclude}
        self.entries: dict[int, tuple[StorageWeakRef, int, Any]] = {}

    def add(self, t: Any, tag: Any) -> Any:
        """Record ``t``'s storage under ``tag``; returns the tag of the live entry already holding it
        (then nothing changes), else None."""
        if not isinstance(t, torch.Tensor) or t.is_nested:
            return None
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # e.g. a tensor subclass without storage
            return None
        key = st._cdata
        if key in self.excluded:
            return None
        old = self.entries.get(key)
        if old is not None and not old[0].expired():
            return old[2]
        self.entries[key] = (StorageWeakRef(st), st.nbytes(), tag)
        return None

    def retag(self, t: torch.Tensor, tag: Any) -> None:
        ref, nbytes, _ = self.entries[_skey(t)]
        self.entries[_skey(t)] = (ref, nbytes, tag)

    def alive(self) -> list[tuple[int, Any]]:
        """(bytes, tag) of every recorded storage still alive; forgets the dead ones."""
        out, dead = [], []
        for key, (ref, nbytes, tag) in self.entries.items():
            if ref.expired():
                dead.append(key)
            else:
                out.append((nbytes, tag))
        for key in dead:
            del self.entries[key]
        return out

    def clear(self) -> None:
        self.entries.clear()


class SavedBytesMeter:
    """Context manager: while active, records what autograd keeps in ``model``; read ``result()``
    after the forward (before backward frees it)."""

    def __init__(self, model: nn.Module, *, families: Iterable[LayerFamily] | None = None, label: str = "") -> None:
        self.model = model
        self.label = label
        rows = list(families) if families is not None else list(FAMILIES.values())
        self._by_class = {c: r for r in rows for c in r.layer_classes}
        self._rows = rows
        self._ledger = StorageLedger()
        self._scope: list[tuple[int | None, str]] = []
        self._handles: list[Any] = []
        self._hooks: Any = None

    # ---- scopes -------------------------------------------------------------------------------------
    def _watch(self, m: Any, layer: int | None, part: str) -> None:
        if not isinstance(m, nn.Module):
            return
        scope = (layer, part)
        self._handles.append(m.register_forward_pre_hook(lambda *_: self._scope.append(scope)))
        self._handles.append(m.register_forward_hook(lambda *_: self._pop(), always_call=True))

    def _pop(self) -> None:
        if self._scope:
            self._scope.pop()

    def _install_scopes(self) -> None:
        from agoq_core.laaq.integrate import _get, _layer_index  # same discovery as apply()

        last_row = None
        order = 0
        for _, m in self.model.named_modules():
            row = match_family(m, self._rows)  # by class hierarchy (FSDP2 subclasses)
            if row is None:
                continue
            last_row = row
            i = _layer_index(m, row, order)
            order += 1
            attn, mlp = _get(m, row.attention), _get(m, row.mlp)
            self._watch(m, i, "other")
            for name in (row.input_norm, row.post_norm, *row.extra_norms):
                self._watch(_get(m, name), i, "norm")
            self._watch(attn, i, "attn_core")
            if attn is not None:
                for name in row.attn_in:
                    self._watch(_get(attn, name), i, "qkv_in")
                self._watch(_get(attn, row.o_proj), i, "o_in")
            self._watch(mlp, i, "act")
            if mlp is not None:
                for name in (row.gate_proj, row.up_proj, row.gate_up_proj):
                    self._watch(_get(mlp, name), i, "mlp_in")
                self._watch(_get(mlp, row.down_proj), i, "down_in")
        if last_row is not None:
            for p in last_row.final_norm:
                if isinstance(_get(self.model, p), nn.Module):
                    self._watch(_get(self.model, p), None, "norm")
                    break
            for p in last_row.lm_head:
                if isinstance(_get(self.model, p), nn.Module):
                    self._watch(_get(self.model, p), None, "head")
                    break
        emb = getattr(self.model, "get_input_embeddings", None)
        if callable(emb) and isinstance(emb(), nn.Module):
            self._watch(emb(), None, "embed")

    # ---- recording ----------------------------------------------------------------------------------
    def _record(self, t: torch.Tensor, layer: int | None, part: str) -> None:
        self._ledger.add(t, (layer, part))

    def _where(self) -> tuple[int | None, str]:
        return self._scope[-1] if self._scope else (None, "other")

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        layer, part = self._where()
        self._record(t, layer, part)
        return t

    def _listen(self, role: str, layer: int | None, s: storage.Stored) -> None:
        slayer, spart = self._where()
        part = _ROLE_PART.get(role, spart)
        for t in storage.stored_tensors(s):
            self._record(t, slayer if self._scope else layer, part)

    def __enter__(self) -> "SavedBytesMeter":
        self._ledger = StorageLedger(exclude=self.model.parameters())
        self._install_scopes()
        storage.add_listener(self._listen)
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)
        storage.remove_listener(self._listen)
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._scope.clear()

    def result(self) -> SavedBytes:
        """Bytes of the recorded storages that are still alive."""
        out = SavedBytes(label=self.label)
        for nbytes, (layer, part) in self._ledger.alive():
            if layer is None:
                key = part if part in _OUTSIDE else "other"
                out.outside[key] = out.outside.get(key, 0) + nbytes
            else:
                d = out.per_layer.setdefault(layer, {p: 0 for p in PARTS})
                d[part] = d.get(part, 0) + nbytes
        return out


class _MetaFlashAttention(torch.autograd.Function):
    """On meta tensors: what a flash-attention kernel keeps (Q, K, V, output, fp32 logsumexp), with
    its output in the (batch, seq, heads, dim) memory layout HF's out-projection then reads."""

    @staticmethod
    def forward(ctx, q, k, v):
        b, h, s, d = q.shape
        out = torch.empty(b, s, h, v.shape[-1], dtype=q.dtype, device=q.device).transpose(1, 2)
        lse = torch.empty(b, h, s, dtype=torch.float32, device=q.device)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx._saved_output = out.detach()  # as the real SDPA nodes expose it (LAAQ's kept-by-reference check)
        return out

    @staticmethod
    def backward(ctx, grad):  # pragma: no cover - meta measurements never run backward
        raise RuntimeError("meta-device attention is for measuring saved bytes only")


@contextlib.contextmanager
def flash_layout_sdpa():
    """While active, ``F.scaled_dot_product_attention`` on *meta* tensors keeps what the flash kernels
    keep. On meta, SDPA otherwise runs its math path, which keeps the seq x seq probabilities
    (32 GiB per LLaMA-2-7B layer at 64K tokens) instead. Other devices are untouched."""
    import torch.nn.functional as F

    orig = F.scaled_dot_product_attention

    def sdpa(query, key, value, *args, **kwargs):
        if query.device.type == "meta":
            return _MetaFlashAttention.apply(query, key, value)
        return orig(query, key, value, *args, **kwargs)

    F.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = orig


def _forward_stack(model: nn.Module, input_ids: torch.Tensor, with_loss: bool) -> Any:
    """The HF LLaMA-family forward, written out (embedding, RoPE, layers, norm, head, loss).

    Used on the meta device, where HF's own forward cannot run: its mask preprocessing reads data
    (packed-sequence detection, ``mask.all()``). With no mask, SDPA runs causal exactly as in
    training without padding.
    """
    inner = getattr(model, "model", None)
    needed = ("embed_tokens", "rotary_emb", "layers", "norm")
    if inner is None or not all(hasattr(inner, n) for n in needed) or not hasattr(model, "lm_head"):
        raise ValueError(f"measuring on the meta device needs an HF causal LM with model.{{{', '.join(needed)}}} and "
                         f"lm_head; {type(model).__name__} is not one: measure on a real device instead")
    h = inner.embed_tokens(input_ids)
    pos = torch.arange(input_ids.shape[1], device=input_ids.device)[None].expand(input_ids.shape[0], -1)
    pe = inner.rotary_emb(h, pos)
    for layer in inner.layers:
        h = layer(h, attention_mask=None, position_ids=pos, position_embeddings=pe)
        h = h[0] if isinstance(h, tuple) else h
    logits = model.lm_head(inner.norm(h))
    if not with_loss:
        return logits
    return model.loss_function(logits=logits, labels=input_ids, vocab_size=logits.shape[-1])


def _build_model(cfg: Any, device: torch.device | str, dtype: torch.dtype) -> nn.Module:
    from transformers import AutoModelForCausalLM

    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model


def measure_saved_bytes(model_or_config: Any, policy: "LAAQConfig | Mapping[str, str] | None" = None, *,
                        batch: int = 1, seq: int = 512, input_ids: torch.Tensor | None = None,
                        device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                        with_loss: bool = True, families: Iterable[LayerFamily] | None = None,
                        label: str | None = None) -> SavedBytes:
    """Run one forward (with the LM loss) and return the bytes kept for backward.

    ``model_or_config``: a model (used as is, LAAQ applied temporarily if ``policy`` is given and the
    model is not already converted) or a transformers config (a model is built on ``device``,
    default ``"meta"``: sizes without data, so full-size configs cost nothing). ``policy``: None =
    the model as it is; an LAAQConfig; or ``{role: format}`` for LAAQConfig(**mapping).
    The planner uses ``.per_layer[i]`` or ``.mean_layer()`` for bytes per micro-batch per layer.
    """
    from agoq_core.laaq.integrate import _REPORT_ATTR, apply

    if isinstance(policy, Mapping):
        policy = LAAQConfig(**policy)
    if policy is not None and not isinstance(policy, LAAQConfig):
        raise TypeError(f"policy must be None, an LAAQConfig or a mapping role -> format, got {type(policy).__name__}")
    if isinstance(model_or_config, nn.Module):
        model = model_or_config
    else:
        if not hasattr(model_or_config, "model_type"):
            raise TypeError(f"measure_saved_bytes takes an nn.Module or a transformers config, got "
                            f"{type(model_or_config).__name__}")
        model = _build_model(model_or_config, device or "meta", dtype or torch.bfloat16)
    try:
        p0 = next(model.parameters())
    except StopIteration:
        raise ValueError("measure_saved_bytes: the model has no parameters") from None
    dev = p0.device
    if input_ids is None:
        if batch < 1 or seq < 1:
            raise ValueError(f"batch and seq must be >= 1, got batch={batch}, seq={seq}")
        vocab = getattr(getattr(model, "config", None), "vocab_size", 32)
        g = torch.Generator().manual_seed(0)
        input_ids = torch.randint(0, vocab, (batch, seq), generator=g).to(dev)
    report = None
    if policy is not None and _REPORT_ATTR not in model.__dict__:
        report = apply(model, policy, families=families)
    lbl = label if label is not None else ("LAAQ" if (policy is not None or _REPORT_ATTR in model.__dict__)
                                           else "plain")
    try:
        meter = SavedBytesMeter(model, families=families, label=lbl)
        with torch.enable_grad(), meter:
            kwargs = {"labels": input_ids} if with_loss else {}
            if hasattr(getattr(model, "config", None), "use_cache"):
                kwargs["use_cache"] = False  # a KV cache would hold K/V beyond the graph
            if dev.type == "meta":
                with flash_layout_sdpa():
                    out = _forward_stack(model, input_ids, with_loss)
            else:
                out = model(input_ids=input_ids, **kwargs)
        res = meter.result()  # read while `out` (and so the graph) is alive
        del out
        return res
    finally:
        if report is not None:
            report.undo()
