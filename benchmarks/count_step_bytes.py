"""Bytes of memory traffic per parameter that a QuanGrad step adds, counted op by op (device-independent): every
ATen op of the backward and of ``QuanGradDDP.step()`` under a ``TorchDispatchMode`` (inputs + outputs, views and
other aliases not counted), the codec calls at the backend boundary, against a plain optimizer step on the same
model with bf16 ``.grad``. What the FP8 gradient buffers must move by design, to compare with what a GPU measures
(docs/benchmarks.md §5.9: ~20 B counted, 71-81 B measured on an H100).

    python benchmarks/count_step_bytes.py                 # a 21M-parameter Llama, torch.optim.AdamW (~1 min, CPU)
    python benchmarks/count_step_bytes.py --tiny --json out.json
"""
from __future__ import annotations

import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

#: ATen ops that alias their input (no data moves).
ALIASES = frozenset({"t", "view", "slice", "detach", "split_with_sizes", "split", "empty", "empty_like",
                     "as_strided", "_unsafe_view", "expand", "alias", "transpose", "select", "unsqueeze", "squeeze",
                     "_reshape_alias", "permute", "reshape", "unbind", "lift_fresh"})


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="a 2-layer, 128-wide model (seconds; for tests)")
    ap.add_argument("--tokens", type=int, default=128)
    harness.add_json_arg(ap, "count_step_bytes")
    args = ap.parse_args(argv)
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from transformers import LlamaConfig, LlamaForCausalLM

    from agoq_core import quangrad

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.bytes, self.calls, self.inside_codec = collections.Counter(), collections.Counter(), 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not self.inside_codec and func.__name__.split(".")[0] not in ALIASES:
                self.add(str(func), tree_flatten((args, kwargs, out))[0])
            return out

        def add(self, what, tensors):
            self.bytes[what] += sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
            self.calls[what] += 1

    size = dict(hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=4, vocab_size=1000) if args.tiny else dict(
        hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
        vocab_size=8000)
    cfg = LlamaConfig(**size)

    def model():
        torch.manual_seed(0)
        return LlamaForCausalLM(cfg).to(torch.bfloat16)

    def adamw(ps):
        return torch.optim.AdamW(ps, lr=1e-5, foreach=False)

    mode = Count()
    qg = quangrad.QuanGradDDP(model(), adamw, config=quangrad.QuanGradConfig(
        fmt="fp8_e4m3", master_weights="off", on_nonfinite="raise"))
    params = sum(p.numel() for p in qg.module.parameters())
    for name in ("dequantize_into", "quantize_into", "accumulate_"):  # codecs counted at the backend boundary
        orig = getattr(qg.backend, name)

        def counted(*a, _orig=orig, _name=name, **k):
            mode.inside_codec += 1
            try:
                return _orig(*a, **k)
            finally:
                mode.inside_codec -= 1
                mode.add(f"codec {_name}", a)
        setattr(qg.backend, name, counted)
    ids = torch.randint(0, cfg.vocab_size, (1, args.tokens))
    report = {"env": harness.environment(None), "params": params, "model": size}

    def phase(key, fn):
        mode.bytes.clear()
        mode.calls.clear()
        with mode:
            fn()
        report[key] = {"bytes_per_param": sum(mode.bytes.values()) / params,
                       "ops": {k: {"bytes_per_param": v / params, "calls": mode.calls[k]}
                               for k, v in mode.bytes.most_common()}}

    qg(input_ids=ids, labels=ids).loss.backward()  # one step first: the optimizer's state exists before counting
    qg.step()
    loss = qg(input_ids=ids, labels=ids).loss
    phase("quangrad_backward", loss.backward)
    phase("quangrad_step", qg.step)
    plain = model()
    opt = adamw(list(plain.parameters()))
    for count in (False, True):
        plain(input_ids=ids, labels=ids).loss.backward()
        if count:
            phase("plain_step", lambda: (opt.step(), opt.zero_grad(set_to_none=True)))
        else:
            opt.step()
            opt.zero_grad(set_to_none=True)
    extra = report["quangrad_step"]["bytes_per_param"] - report["plain_step"]["bytes_per_param"]
    report["step_extra_bytes_per_param"] = extra
    print(f"{params:,} parameters, {args.tokens} tokens, bytes per parameter (views not counted):")
    for key in ("quangrad_backward", "quangrad_step", "plain_step"):
        r = report[key]
        print(f"  {key:18s} {r['bytes_per_param']:6.1f}")
        for k, v in list(r["ops"].items())[:8]:
            print(f"      {k:48s} {v['bytes_per_param']:6.2f}  x{v['calls']}")
    codec_bw = report["quangrad_backward"]["ops"]
    fold = sum(v["bytes_per_param"] for k, v in codec_bw.items() if k.startswith("codec"))
    print(f"QuanGrad's step moves {extra:.1f} B/param more than the plain step; its backward's codec calls {fold:.1f}")
    harness.write_json(report, args.json, "count_step_bytes")
    return report


if __name__ == "__main__":
    main()
