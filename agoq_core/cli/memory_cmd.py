"""``agoq memory``: bytes kept for backward per decoder layer and part, plain vs LAAQ, measured.

Builds a randomly initialised HF model of the given family and shape (no download), runs one
forward with the LM loss under agoq_core.laaq's meter, without and with LAAQ, and prints both.
``--device meta`` measures full-size shapes (e.g. ``--preset llama2-7b --seq 4096``) without data.
Presets are agoq_core.models' shapes; ``--hidden``/``--layers``/... replace a preset's fields.
"""
from __future__ import annotations

import argparse
import json

_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_OVERRIDES = ("hidden", "intermediate", "layers", "heads", "kv_heads", "vocab")


def _policy(name: str, attention_core: str | None, block: int):
    from agoq_core.laaq import LAAQConfig

    if name == "paper":
        cfg = LAAQConfig(block=block)
    elif name == "naive":
        cfg = LAAQConfig.uniform("int4", include_attention=True, block=block)
    elif name == "native":
        cfg = LAAQConfig.native(block=block)
    else:  # a format name: every role but the attention core in it
        cfg = LAAQConfig.uniform(name, block=block)
    return cfg.replace(attention_core=attention_core) if attention_core else cfg


def _device(text: str):
    import torch

    from agoq_core.errors import UsageError

    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError) as exc:
        raise UsageError(f"--device {text!r} is not a torch device ({exc}); "
                         "use cpu, meta, cuda, cuda:1, npu ...") from None
    if dev.type not in ("cpu", "meta"):
        mod = getattr(torch, dev.type, None)
        if mod is None or not hasattr(mod, "is_available") or not mod.is_available():
            raise UsageError(f"--device {text!r}: no {dev.type} device is available here; use --device cpu, or "
                             "--device meta for sizes without data")
    return dev


def build_model(args: argparse.Namespace):
    import torch
    from transformers import AutoModelForCausalLM

    from agoq_core.models import get_model_shape

    shape = get_model_shape(args.preset)
    changes = {k: getattr(args, k) for k in _OVERRIDES if getattr(args, k) is not None}
    if args.heads is not None and args.kv_heads is None:
        changes["kv_heads"] = args.heads  # --heads alone: plain multi-head attention
    shape = shape.replace(**changes)  # validated: ModelShapeError names a bad size
    cfg = shape.to_hf_config(args.model, max_position_embeddings=max(args.seq, 128))
    cfg._attn_implementation = args.attn
    dtype = getattr(torch, _DTYPES[args.dtype])
    torch.manual_seed(0)
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model


def _run(args: argparse.Namespace) -> int:
    from agoq_core.laaq import measure_saved_bytes

    _device(args.device)
    model = build_model(args)
    policy = _policy(args.policy, args.attention_core, args.block)
    plain = measure_saved_bytes(model, None, batch=args.batch, seq=args.seq, label="plain")
    laaq = measure_saved_bytes(model, policy, batch=args.batch, seq=args.seq, label="LAAQ")
    if args.json:
        print(json.dumps({"model": args.model, "preset": args.preset, "batch": args.batch, "seq": args.seq,
                          "dtype": args.dtype, "device": args.device, "policy": policy.describe(),
                          "plain": plain.to_dict(), "laaq": laaq.to_dict(),
                          "layers_ratio": laaq.layers_total / max(1, plain.layers_total),
                          "total_ratio": laaq.total / max(1, plain.total)}, indent=2))
        return 0
    n = sum(p.numel() for p in model.parameters())
    print(f"{type(model).__name__} ({n / 1e6:.1f}M params, {args.dtype}, {args.device}), batch {args.batch} x "
          f"seq {args.seq}, {args.attn} attention")
    print(f"policy: {policy.describe()}")
    print(plain.table(laaq, unit=1 << 20))
    return 0


def register(p: argparse.ArgumentParser) -> None:
    from agoq_core.cli.argtypes import positive_int
    from agoq_core.models import MODELS

    p.add_argument("--model", default="llama", choices=["llama", "mistral", "qwen2", "qwen3"],
                   help="HF model family (default llama)")
    p.add_argument("--preset", default="tiny", choices=list(MODELS),
                   help="shape preset (agoq_core.models); --hidden/--layers/... override its fields (default tiny)")
    p.add_argument("--layers", type=int, default=None)  # checked by ModelShape
    p.add_argument("--hidden", type=int, default=None)  # checked by ModelShape
    p.add_argument("--intermediate", type=int, default=None)  # checked by ModelShape
    p.add_argument("--heads", type=int, default=None)  # checked by ModelShape
    p.add_argument("--kv-heads", type=int, default=None)  # checked by ModelShape
    p.add_argument("--vocab", type=int, default=None)  # checked by ModelShape
    p.add_argument("--batch", type=positive_int, default=1)
    p.add_argument("--seq", type=positive_int, default=512)
    p.add_argument("--dtype", default="bf16", choices=sorted(_DTYPES))
    p.add_argument("--device", default="cpu", help="cpu, meta (sizes only: full-size shapes for free), cuda ...")
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"], help="attention implementation")
    p.add_argument("--policy", default="paper",
                   help="paper (default), naive (all 4-bit incl. attention), native, or a format name for every role")
    p.add_argument("--attention-core", default=None, help="format for the attention core (default: the policy's)")
    p.add_argument("--block", type=positive_int, default=128, help="block size of the role formats (default 128)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.set_defaults(func=_run)
