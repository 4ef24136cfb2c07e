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

from agoq_core import laaq
from agoq_core.models import ModelShape
from agoq_core.planner.errors import PlannerError
from agoq_core.planner.memory import ActivationCostTable, check_candidates

__all__ = ["measure_activation_costs", "hf_config", "laaq_policy"]

_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16",
           "float32": "float32", "fp32": "float32"}


def torch_dtype(name: str):
    import torch

    key = _DTYPES.get(str(name).lower())
    if key is None:
        raise PlannerError(f"dtype must be one of {sorted(set(_DTYPES.values()))}, got {name!r}")
    return getattr(torch, key)


def hf_config(shape: ModelShape, *, layers: int | None = None, seq_len: int = 2048) -> Any:
    """``shape.to_hf_config()`` with ``layers`` decoder layers and room for ``seq_len`` positions."""
    return shape.to_hf_config(num_hidden_layers=layers or shape.layers, max_position_embeddings=max(seq_len, 128))


def laaq_policy(fmt: str, base: Any = None) -> Any:
    """``base`` (default: LAAQ's paper policy) with every role it quantizes stored in ``fmt``."""
    base = base if base is not None else laaq.LAAQConfig()
    names = base.plan(None).names()
    changes = {r: fmt for r in laaq.ROLES if names[r] != laaq.NATIVE}
    return base.replace(**changes)


class _Probe:
    """A 2-layer model of the shape, cut as one pipeline stage (embedding, 2 layers, norm, head),
    built once; ``measure`` turns LAAQ on with a policy, runs forward + loss under LAAQ's
    SavedBytesMeter and turns LAAQ off again."""

    def __init__(self, cfg: Any, *, device: str, dtype: Any) -> None:
        import torch
        from transformers import LlamaForCausalLM

        from agoq_core.planner.apply import HFStageModule

        self.cfg, self.device = cfg, device
        with torch.device(device):
            model = LlamaForCausalLM(cfg).to(dtype)
        self.stage = HFStageModule(model, [0, 1], first=True, last=True)

    def measure(self, policy: Any, *, microbatch_size: int, seq_len: int) -> dict:
        import torch

        from agoq_core.planner.apply import causal_lm_loss

        report = laaq.apply(self.stage, policy)
        try:
            if self.device == "meta":
                ids = torch.empty((microbatch_size, seq_len), dtype=torch.long, device="meta")
            else:
                g = torch.Generator().manual_seed(0)
                ids = torch.randint(0, self.cfg.vocab_size, (microbatch_size, seq_len), generator=g).to(self.device)
            meter = laaq.SavedBytesMeter(self.stage)
            with torch.enable_grad(), meter:
                # targets are their own tensor, as in training (the loss keeps them on the last stage)
                loss = causal_lm_loss(self.stage(ids), ids.clone())
            res = meter.result()  # read while the graph (held by `loss`) is alive
            del loss
        finally:
            report.undo()
        if sorted(res.per_layer) != [0, 1]:
            raise PlannerError(f"LAAQ measured layers {sorted(res.per_layer)} of a 2-layer model; expected [0, 1]")
        l0, l1 = res.layer_total(0), res.layer_total(1)
        return {"layer": l1, "core": res.per_layer[1].get("attn_core", 0), "chunk": l0 - l1,
                "first": res.outside.get("embed", 0),
                "last": sum(v for k, v in res.outside.items() if k != "embed")}


#: Sequence lengths measured when extrapolating (see measure_activation_costs).
_PROBE_SEQ = 32


def measure_activation_costs(shape: ModelShape, *, microbatch_size: int, seq_len: int,
                             formats: Sequence[str], baseline_format: str = "nf4", block: int | None = None,
                             dtype: str = "bfloat16", device: str = "cpu", base: Any = None,
                             extrapolate: bool | None = None) -> ActivationCostTable:
    """Bytes per micro-batch per layer for each format, read from LAAQ's measurement.

    Every kept tensor grows linearly with the sequence (activations, RoPE tables, SDPA's logsumexp;
    whole 128-element blocks as long as ``microbatch_size x hidden`` is a multiple of the block).
    So long sequences are measured at 32, 64 and 96 tokens and extrapolated; the third point must lie
    exactly on the line through the first two (else PlannerError: measure at full length with
    ``extrapolate=False``). ``extrapolate=None``: only when ``seq_len`` > 96.
    """
    formats = check_candidates(formats, block)
    baseline_format = check_candidates([baseline_format], block)[0]
    tdtype = torch_dtype(dtype)
    extrapolate = seq_len > 3 * _PROBE_SEQ if extrapolate is None else extrapolate
    seqs = (_PROBE_SEQ, 2 * _PROBE_SEQ) if extrapolate else (seq_len,)
    cfg = hf_config(shape, layers=2, seq_len=max(seq_len, 3 * _PROBE_SEQ))
    what = f"{shape.name} ({microbatch_size} x {seq_len} tokens, {dtype}, device={device})"
    try:
        probe = _Probe(cfg, device=device, dtype=tdtype)
    except Exception as exc:
        raise PlannerError(f"cannot build a 2-layer {what} to measure: {type(exc).__name__}: {exc}") from exc

    def run(f: str, seq: int) -> dict:
        pol = laaq_policy(f, base)
        if block is not None:
            pol = pol.replace(block=block)
        try:
            return probe.measure(pol, microbatch_size=microbatch_size, seq_len=seq)
        except PlannerError:
            raise
        except Exception as exc:
            raise PlannerError(f"LAAQ could not measure {what} in {f}: {type(exc).__name__}: {exc}") from exc

    def at_len(points: list[dict]) -> dict:
        if len(points) == 1:
            return points[0]
        (a, b) = points
        # b - a is the cost of _PROBE_SEQ more tokens; the line through them, evaluated at seq_len
        out = {}
        for k in a:
            num = (b[k] - a[k]) * (seq_len - seqs[0])
            if num % _PROBE_SEQ:
                raise PlannerError(f"kept bytes of {what} ({k}) are not a whole number of bytes per token; "
                                   f"measure at full length (extrapolate=False)")
            out[k] = a[k] + num // _PROBE_SEQ
        return out

    results = {}
    for f in dict.fromkeys(formats + (baseline_format,)):
        pts = [run(f, s) for s in seqs]
        if extrapolate and f == baseline_format:
            third = run(f, 3 * _PROBE_SEQ)
            for k in third:
                if third[k] - pts[1][k] != pts[1][k] - pts[0][k]:
                    raise PlannerError(
                        f"kept bytes of {what} are not linear in the sequence length ({k}: "
                        f"{pts[0][k]}, {pts[1][k]}, {third[k]} at {seqs[0]}, {seqs[1]}, {3 * _PROBE_SEQ} tokens), "
                        f"so they cannot be extrapolated; measure at full length (extrapolate=False)")
        results[f] = at_len(pts)
    fixed = {f: r["core"] for f, r in results.items()}
    chunk = {f: r["chunk"] for f, r in results.items()}
    if len(set(fixed.values())) > 1 or len(set(chunk.values())) > 1:
        raise PlannerError(f"LAAQ measurement: the 16-bit part changed with the format (attention core {fixed}, "
                           f"layer-0 extra {chunk})")
    overhead = next(iter(chunk.values()))
    if overhead < 0:
        raise PlannerError(f"LAAQ measurement: layer 0 keeps less than layer 1 ({overhead} B)")
    T = microbatch_size * seq_len
    how = (f"extrapolated from {seqs[0]}/{seqs[1]}/{3 * _PROBE_SEQ}-token runs" if extrapolate
           else f"{T} tokens/micro-batch")
    return ActivationCostTable(
        layer_bytes={f: results[f]["layer"] for f in results},
        layer_fixed_bytes=next(iter(fixed.values())), quantized_numel=2 * T * shape.hidden + 2 * T * shape.intermediate,
        first_stage_bytes=results[baseline_format]["first"], last_stage_bytes=results[baseline_format]["last"],
        chunk_bytes=overhead, tokens=T,
        source=f"measured by LAAQ's SavedBytesMeter ({dtype}, {device}, {how})")
