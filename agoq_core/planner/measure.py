"""Activation cost tables from LAAQ's measured byte accounting.

``measure_activation_costs`` builds a two-layer model of the planned shape, runs one forward with the
LM loss under each candidate format (``agoq_core.laaq.measure_saved_bytes``: every tensor autograd or
LAAQ keeps, counted per unique storage from the live tensors), and reads:

- bytes per decoder layer: layer 1 (layer 0 also holds the RoPE cos/sin tables that every virtual
  stage computes once for all its layers: that difference is the per-chunk overhead);
- the 16-bit part: layer 1's attention core (no format changes it);
- first virtual stage: what the embedding keeps; last virtual stage: final norm + LM head + loss,
  measured under the baseline format (a plan leaves the final norm at LAAQ's base format).

On the ``meta`` device (default) the tensors have real sizes and no data, so a LLaMA-2-7B shape at
4K tokens costs nothing to measure. Nothing here is a formula; ``ActivationCostTable.from_formula``
is the cross-check (tests compare the two).
"""
from __future__ import annotations

from typing import Any, Sequence

from agoq_core.planner.errors import PlannerError
from agoq_core.planner.memory import ActivationCostTable, check_candidates
from agoq_core.planner.model import TransformerShape

__all__ = ["measure_activation_costs", "hf_config", "laaq_policy"]

_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16",
           "float32": "float32", "fp32": "float32"}


def _laaq():
    try:
        from agoq_core import laaq
        from agoq_core.laaq import LAAQConfig, measure_saved_bytes  # noqa: F401
    except ImportError as exc:
        raise PlannerError(
            f"activations='measured' needs LAAQ (agoq_core.laaq: LAAQConfig, measure_saved_bytes), which "
            f"cannot be imported here ({exc}); plan with activations='formula' instead") from None
    return laaq


def torch_dtype(name: str):
    import torch

    key = _DTYPES.get(str(name).lower())
    if key is None:
        raise PlannerError(f"dtype must be one of {sorted(set(_DTYPES.values()))}, got {name!r}")
    return getattr(torch, key)


def hf_config(shape: TransformerShape, *, layers: int | None = None, seq_len: int = 2048) -> Any:
    """A transformers LlamaConfig of ``shape`` (SDPA attention, no cache)."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                      num_hidden_layers=layers or shape.layers, num_attention_heads=shape.heads,
                      num_key_value_heads=shape.kv_heads, max_position_embeddings=max(seq_len, 128),
                      tie_word_embeddings=shape.tie_embeddings, use_cache=False, bos_token_id=None,
                      eos_token_id=None, pad_token_id=None, attention_dropout=0.0)
    cfg._attn_implementation = "sdpa"
    return cfg


def laaq_policy(fmt: str, base: Any = None) -> Any:
    """``base`` (default: LAAQ's paper policy) with every role it quantizes stored in ``fmt``."""
    laaq = _laaq()
    base = base if base is not None else laaq.LAAQConfig()
    names = base.plan(None).names()
    changes = {r: fmt for r in laaq.ROLES if names[r] != laaq.NATIVE}
    return base.replace(**changes)


def _measure_once(cfg: Any, policy: Any, *, microbatch_size: int, seq_len: int, device: str, dtype: Any) -> Any:
    """One forward + loss of a 2-layer model cut as a single pipeline stage, under LAAQ's meter."""
    import torch
    from transformers import LlamaForCausalLM

    from agoq_core.planner.apply import HFStageModule, causal_lm_loss

    laaq = _laaq()
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype)
    stage = HFStageModule(model, [0, 1], first=True, last=True)
    report = laaq.apply(stage, policy)
    try:
        if device == "meta":
            ids = torch.empty((microbatch_size, seq_len), dtype=torch.long, device="meta")
        else:
            ids = torch.randint(0, cfg.vocab_size, (microbatch_size, seq_len), generator=torch.Generator().manual_seed(0))
        meter = laaq.SavedBytesMeter(stage, label=str(policy.plan(None).names()["norm_input"]))
        with torch.enable_grad(), meter:
            # targets are their own tensor, as in training (the loss keeps them on the last stage)
            loss = causal_lm_loss(stage(ids), ids.clone())
        res = meter.result()  # read while the graph (held by `loss`) is alive
        del loss
        return res
    finally:
        report.undo()


def measure_activation_costs(shape: TransformerShape, *, microbatch_size: int, seq_len: int,
                             formats: Sequence[str], baseline_format: str = "int4", block: int | None = None,
                             dtype: str = "bfloat16", device: str = "meta", base: Any = None) -> ActivationCostTable:
    """Bytes per micro-batch per layer for each format, read from LAAQ's measurement."""
    formats = check_candidates(formats, block)
    baseline_format = check_candidates([baseline_format], block)[0]
    tdtype = torch_dtype(dtype)
    cfg = hf_config(shape, layers=2, seq_len=seq_len)
    per_fmt, fixed, overhead, outside = {}, None, None, None
    for f in dict.fromkeys(formats + (baseline_format,)):
        pol = laaq_policy(f, base)
        if block is not None:
            pol = pol.replace(block=block)
        try:
            res = _measure_once(cfg, pol, microbatch_size=microbatch_size, seq_len=seq_len, device=device,
                                dtype=tdtype)
        except PlannerError:
            raise
        except Exception as exc:
            raise PlannerError(f"LAAQ could not measure {shape.name} ({microbatch_size} x {seq_len} tokens, {f}, "
                               f"{dtype}, device={device}): {type(exc).__name__}: {exc}") from exc
        if sorted(res.per_layer) != [0, 1]:
            raise PlannerError(f"LAAQ measured layers {sorted(res.per_layer)} of a 2-layer model; expected [0, 1]")
        l0, l1 = res.layer_total(0), res.layer_total(1)
        per_fmt[f] = l1
        core = res.per_layer[1].get("attn_core", 0)
        if fixed is None:
            fixed, overhead = core, l0 - l1
        elif core != fixed or l0 - l1 != overhead:
            raise PlannerError(f"LAAQ measurement: the 16-bit part changed with the format ({f}: attention core "
                               f"{core} vs {fixed} B, layer-0 extra {l0 - l1} vs {overhead} B)")
        if f == baseline_format:
            outside = dict(res.outside)
    if overhead < 0:
        raise PlannerError(f"LAAQ measurement: layer 0 keeps less than layer 1 ({overhead} B)")
    T = microbatch_size * seq_len
    first = outside.get("embed", 0)
    last = sum(v for k, v in outside.items() if k != "embed")
    return ActivationCostTable(
        layer_bytes={f: per_fmt[f] for f in dict.fromkeys(formats + (baseline_format,))},
        layer_fixed_bytes=fixed, quantized_numel=2 * T * shape.hidden + 2 * T * shape.intermediate,
        first_stage_bytes=first, last_stage_bytes=last, chunk_bytes=overhead, tokens=T,
        source=f"measured by LAAQ's SavedBytesMeter ({dtype}, {device}, {T} tokens/micro-batch)")
