"""Host time of LAAQ's decoder layers (issue 17's end-to-end goal): what eager LAAQ costs the Python side.

At a few hundred tokens a layer's kernels take microseconds, so a forward+backward step's wall time is the
host's: HF's modules, autograd, LAAQ's functions, the backend's launches. This script builds a real HF
``LlamaModel`` (registry shape ``--model``, ``--layers`` decoder layers, bf16, SDPA) and measures per step:

* ``host_ms``: ``time.perf_counter`` around N back-to-back steps without a device sync, / N;
* ``synced_ms``: median of single steps each followed by a sync;

for the plain model and the same model after ``laaq.apply`` (nf4 by default, fusion as the environment says:
``AGOQ_FUSION`` unset = the elementwise group on CUDA), then profiles the LAAQ steps with cProfile and prints
the functions with the most own time and the cumulative time of agoq's own functions.

    python3 benchmarks/profile_layer_host.py                       # GPU: llama-1b body, 2 layers, 256 tokens
    python3 benchmarks/profile_layer_host.py --smoke               # CPU: checks the script, measures nothing

Writes ``$OUT/profile_layer_host.json`` and ``.md``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

def _parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-1b", help="registry shape (agoq_core.models)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--fmt", default="nf4")
    ap.add_argument("--iters", type=int, default=30, help="steps per timing")
    ap.add_argument("--cprofile", type=int, default=10, help="steps under cProfile")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU: checks the script")
    harness.add_json_arg(ap, "profile_layer_host")
    return ap.parse_args(argv)


def main(argv=None) -> dict:
    args = _parse(argv)
    import torch
    import transformers

    from agoq_core import laaq
    from agoq_core.laaq import fusion

    dev = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    iters = 2 if args.smoke else args.iters
    prof_steps = 1 if args.smoke else args.cprofile
    over = dict(num_hidden_layers=args.layers, vocab_size=256, attn_implementation="sdpa",
                max_position_embeddings=max(args.tokens, 64))
    if args.smoke:
        over.update(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=4)
    cfg = harness.hf_config(args.model, **over)
    torch.manual_seed(0)
    model = transformers.LlamaModel(cfg).to(dev, torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    t = 16 if args.smoke else args.tokens
    emb = (torch.randn(1, t, cfg.hidden_size, generator=g) * 0.5).to(torch.bfloat16).to(dev)
    gout = torch.randn(1, t, cfg.hidden_size, generator=g).to(torch.bfloat16).to(dev)

    def step():
        e = emb.detach().requires_grad_(True)
        model(inputs_embeds=e).last_hidden_state.backward(gout)
        model.zero_grad(set_to_none=True)

    def measure() -> dict:
        for _ in range(3):
            step()
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        host = (time.perf_counter() - t0) * 1e3 / iters
        sync()
        synced = []
        for _ in range(iters):
            t0 = time.perf_counter()
            step()
            sync()
            synced.append((time.perf_counter() - t0) * 1e3)
        return {"host_ms": host, "synced_ms": statistics.median(synced)}

    report: dict = {"env": harness.environment(dev, smoke=args.smoke), "model": args.model, "layers": args.layers,
                    "tokens": t, "fmt": args.fmt, "fusion_env": os.environ.get("AGOQ_FUSION")}
    report["plain"] = measure()
    laaq.apply(model, laaq.LAAQConfig(norm_input=args.fmt, mlp_act_input=args.fmt))
    report["laaq"] = measure()
    report["chosen_variants"] = {k[0]: (c.variants[0] if c.variants else None) for k, c in fusion._choices.items()}
    report["cprofile"] = cp = harness.cprofile_steps(step, prof_steps, sync, args.top)

    p, q = report["plain"], report["laaq"]
    lines = [f"# LAAQ host time per step ({report['env'].get('date', '')}, {dev})", "",
             f"`{' '.join(['python3'] + sys.argv)}`", "",
             f"{args.model} body, {args.layers} decoder layers, {t} tokens, {args.fmt}, AGOQ_FUSION="
             f"{report['fusion_env']!r}; variants {report['chosen_variants']}", "",
             "| model | host ms/step | synced ms/step |", "|---|---:|---:|",
             f"| plain | {p['host_ms']:.2f} | {p['synced_ms']:.2f} |",
             f"| LAAQ | {q['host_ms']:.2f} | {q['synced_ms']:.2f} |",
             f"| LAAQ - plain | {q['host_ms'] - p['host_ms']:+.2f} | {q['synced_ms'] - p['synced_ms']:+.2f} |", "",
             f"agoq's own Python time under cProfile: {cp['agoq_own_ms']:.2f} ms/step"]
    lines += harness.cprofile_md(cp, "LAAQ")
    md = "\n".join(lines) + "\n"
    print(md)
    path = harness.write_json(report, args.json, "profile_layer_host")
    if path:
        with open(os.path.splitext(path)[0] + ".md", "w") as f:
            f.write(md)
    return report


if __name__ == "__main__":
    main()
