#!/usr/bin/env python
"""LAAQ's gradient error per layer type at LLaMA-2-7B shapes on real text (the paper's Table 13).

The model is the registry's ``llama2-7b`` shape (width 4096, 32 heads, MLP 11008) with ``--layers``
decoder layers (default 4 of the 32: the error of a layer type is a property of one layer's shapes
and of the sequence length, and 4 layers train and compare in seconds; ``--layers 32`` runs the whole
body if memory allows) and the shipped 4,096-token tokenizer's embedding. bf16 weights, SDPA.

Phases: at random init, then after ``--train-steps`` AdamW steps on WikiText-2 (trained models have
larger attention logits, where quantizing Q/K hurts most). In each phase the same held-out WikiText-2
batch (test.txt windows of ``--seq-lens`` tokens) runs through the plain model and through the model
with each LAAQ policy, and ``agoq_core.laaq.gradient_errors`` compares every parameter gradient:
normalised L2 error ||g_LAAQ − g|| / ||g||, pooled per layer type.

Policies: the default (paper: 4-bit NF4 block 128, attention core kept), uniform 4-bit with the
attention core quantized too (the paper's non-converging ablation), int8 with and without the
attention core, every MX / NVFP4 activation format the format registry has, and ``native`` (nothing
quantized: the control, bit-exact recomputation, must be ~0).

    python benchmarks/bench_grad_error.py            # H200: < 3 minutes (no measurement starts after --budget-s 150)
    python benchmarks/bench_grad_error.py --smoke    # CPU, reduced size (tiny shape, fp32), ~1 minute
    python benchmarks/bench_grad_error.py --plot-from run.json --png docs/img/grad-error.png  # figure only

Writes $OUT/bench_grad_error.json (or --json) and prints markdown tables with the paper's row.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the shared harness beside this script
import harness  # noqa: E402

# Paper Table 13 (per-layer gradient error vs full precision, model trained on 10B tokens, normalised
# L2), from /work/shared/reference/agoq-paper-notes.md §3.3. The paper's rows are layer kinds, not
# parameters: "GEMM (weight grad)" and "SiLU" have no single parameter type here.
PAPER_TABLE_13 = {"LayerNorm": 0.003, "GEMM (weight grad)": 0.026, "SiLU": 0.051, "Attention Q": 0.14,
                  "Attention K": 0.15, "Attention V": 0.059}



def mx_formats() -> list[str]:
    """The OCP MX / NVFP4 formats the format registry has (mxfp4, mxfp8, nvfp4 today; none before them)."""
    try:
        from agoq_core.formats.spec import microscaling_formats
    except ImportError:
        return []
    return list(microscaling_formats())


def policies(fmt_names: list[str]):
    from agoq_core.laaq import LAAQConfig

    out = {"native (control)": LAAQConfig.native(), "default (nf4, attention kept)": LAAQConfig.paper(),
           "uniform 4-bit incl. attention": LAAQConfig.uniform("nf4", include_attention=True),
           "int8, attention kept": LAAQConfig.uniform("int8"),
           "int8 incl. attention": LAAQConfig.uniform("int8", include_attention=True)}
    for f in fmt_names:
        out[f"{f}, attention kept"] = LAAQConfig.uniform(f)
        out[f"{f} incl. attention"] = LAAQConfig.uniform(f, include_attention=True)
    return out


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="CPU, reduced size: tiny shape, fp32, 2 layers")
    ap.add_argument("--model", default=None, help="registry shape (default llama2-7b; smoke: tiny)")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default 4; smoke 2)")
    ap.add_argument("--seq-lens", default=None, help="probe sequence lengths (default 1024,4096; smoke 128)")
    ap.add_argument("--probe-batch", type=int, default=None, help="probe sequences (default 2; smoke 2)")
    ap.add_argument("--train-steps", type=int, default=None, help="AdamW steps before the second phase "
                    "(default 150; smoke 10; 0 = init only)")
    ap.add_argument("--train-seq", type=int, default=None, help="training window (default 1024; smoke 64)")
    ap.add_argument("--train-batch", type=int, default=None, help="training batch (default 8; smoke 4)")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--budget-s", type=float, default=150.0,
                    help="no new measurement starts after this many seconds (default 150: < 3 minutes in all)")
    ap.add_argument("--device", default=None, help="default cuda (smoke: cpu)")
    ap.add_argument("--dtype", default=None, choices=["bf16", "fp32"], help="default bf16 (smoke: fp32)")
    ap.add_argument("--png", default=None, help="also draw the last phase's tables as bar charts into this file")
    ap.add_argument("--plot-from", default=None, metavar="JSON", help="no run: draw --png from a saved report")
    harness.add_json_arg(ap, "bench_grad_error")
    a = ap.parse_args(argv)
    if a.plot_from and not a.png:
        ap.error("--plot-from needs --png")
    gpu = dict(model="llama2-7b", layers=4, seq_lens="1024,4096", probe_batch=2, train_steps=150, train_seq=1024,
               train_batch=8, device="cuda", dtype="bf16")
    smoke = dict(model="tiny", layers=2, seq_lens="128", probe_batch=2, train_steps=10, train_seq=64,
                 train_batch=4, device="cpu", dtype="fp32")
    for k, v in (smoke if a.smoke else gpu).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    a.seq_lens = [int(s) for s in str(a.seq_lens).split(",") if s.strip()]
    return a


def build_model(a: argparse.Namespace):
    import torch
    from transformers import LlamaForCausalLM

    from agoq_core.train.data import load_tokenizer

    vocab = load_tokenizer().get_vocab_size()
    cfg = harness.hf_config(a.model, num_hidden_layers=a.layers, vocab_size=vocab,
                            max_position_embeddings=max([*a.seq_lens, a.train_seq]))
    torch.manual_seed(0)
    with torch.device(a.device):  # initialise on the device: a 7B-wide layer on the CPU takes seconds each
        model = LlamaForCausalLM(cfg)
    if a.dtype == "bf16":
        model.to(torch.bfloat16)
    return model, cfg


def measure(model, probes: dict[int, "torch.Tensor"], pols: dict, deadline: float) -> dict:
    from agoq_core.laaq import gradient_errors

    out = {}
    for seq, ids in probes.items():
        rows = {}
        for name, pol in pols.items():
            t0 = time.perf_counter()
            if t0 > deadline:  # the whole script must fit its slot on the GPU machine: say what was left out
                print(f"  seq {seq:>5} {name:<34} skipped: --budget-s reached", flush=True)
                continue
            r = gradient_errors(model, pol, ids)
            rows[name] = {"loss_plain": r.loss_plain, "loss_laaq": r.loss_laaq, "seconds": time.perf_counter() - t0,
                          "by_type": r.by_type}
            print(f"  seq {seq:>5} {name:<34} " + " ".join(
                f"{t}={d['rel_l2']:.4f}" for t, d in r.by_type.items() if t != "embed"), flush=True)
        out[str(seq)] = rows
    return out


def train(model, corpus, a: argparse.Namespace) -> list[float]:
    import torch
    from transformers import get_cosine_schedule_with_warmup

    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    # bf16 weights stepped directly (no fp32 masters): enough to grow the attention logits the way
    # training does, which is all this phase is for; the loss curve is reported.
    sched = get_cosine_schedule_with_warmup(opt, max(1, a.train_steps // 10), a.train_steps)
    losses = []
    model.train()
    for step in range(a.train_steps):
        ids = corpus.step_batches(step, seed=0, micro_batch=a.train_batch, grad_accum=1, dp=1, rank=0)[0].to(a.device)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    del opt
    return losses


def markdown(phases: dict, types: list[str]) -> str:
    lines = []
    for phase, by_seq in phases.items():
        for seq, rows in by_seq.items():
            if not rows:
                lines += [f"**{phase}, {seq}-token sequences**: not measured (--budget-s reached)", ""]
                continue
            first = next(iter(rows.values()))
            lines += [f"**{phase}, {seq}-token sequences** (loss {first['loss_plain']:.3f}; normalised L2 error of "
                      "the parameter gradients, pooled per layer type)", "",
                      "| policy | " + " | ".join(types) + " |", "|---" * (len(types) + 1) + "|"]
            for name, r in rows.items():
                lines.append(f"| {name} | " + " | ".join(
                    f"{r['by_type'][t]['rel_l2']:.4f}" if t in r["by_type"] else "–" for t in types) + " |")
            lines.append("")
    lines.append("Paper Table 13 (10B-token model): " + ", ".join(f"{k} {v}" for k, v in PAPER_TABLE_13.items()))
    return "\n".join(lines)


#: The policies drawn by plot(): the paper's two policies and one 8-bit and one MX row for scale.
_PLOT_POLICIES = ("default (nf4, attention kept)", "uniform 4-bit incl. attention", "nvfp4, attention kept",
                  "mxfp8, attention kept", "int8, attention kept")
# Table 13's rows drawn beside our layer types (its GEMM row under the MLP, SiLU under mlp_gate).
_PAPER_AT = {"norm": "LayerNorm", "attn_q": "Attention Q", "attn_k": "Attention K", "attn_v": "Attention V",
             "mlp_gate": "SiLU", "mlp_up": "GEMM (weight grad)", "mlp_down": "GEMM (weight grad)"}


def plot(report: dict, png: str) -> None:
    """One panel per sequence length of the last phase: grouped bars per layer type, the paper's Table 13 as
    black ticks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phase, by_seq = list(report["phases"].items())[-1]
    by_seq = {k: v for k, v in by_seq.items() if v}
    if not by_seq:
        raise SystemExit(f"{png}: the report's last phase ({phase}) has no measurement to draw")
    types = [t for t in ("norm", "attn_q", "attn_k", "attn_v", "attn_o", "mlp_gate", "mlp_up", "mlp_down")]
    fig, axes = plt.subplots(1, len(by_seq), figsize=(6.5 * len(by_seq), 4.2), squeeze=False, sharey=True)
    pols = [p for p in _PLOT_POLICIES if any(p in rows for rows in by_seq.values())]
    width = 0.8 / max(1, len(pols))
    for ax, (seq, rows) in zip(axes[0], by_seq.items()):
        for i, pol in enumerate(pols):
            vals = [rows[pol]["by_type"][t]["rel_l2"] if pol in rows and t in rows[pol]["by_type"] else 0.0
                    for t in types]
            ax.bar([j + (i - (len(pols) - 1) / 2) * width for j in range(len(types))], vals, width, label=pol)
        paper = [(j, report["paper_table_13"][_PAPER_AT[t]]) for j, t in enumerate(types) if t in _PAPER_AT]
        ax.scatter([j for j, _ in paper], [v for _, v in paper], marker="_", s=400, color="black", zorder=3,
                   label="paper Table 13 (10B-token model)")
        ax.set_xticks(range(len(types)), types, rotation=30)
        ax.set_title(f"{phase}, {seq}-token sequences")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("normalised L2 gradient error")
    env, model = report["environment"], report["model"]
    fig.suptitle(f"LAAQ gradient error per layer type: {model['shape']} shapes, {model['layers']} of "
                 f"{model['of_layers']} layers, {model['dtype']}, {env.get('gpu') or env.get('device')}, "
                 f"{env['date'][:10]}", fontsize=10)
    axes[0][-1].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"wrote {png}")


def main(argv=None) -> int:
    a = parse(argv)
    if a.plot_from:
        import json

        with open(a.plot_from) as f:
            plot(json.load(f), a.png)
        return 0
    import torch

    from agoq_core.laaq.numerics import LAYER_TYPES
    from agoq_core.models import get_model_shape
    from agoq_core.train.data import load_corpus

    t_start = time.perf_counter()
    present = mx_formats()
    pols = policies(present)
    model, cfg = build_model(a)
    n_params = sum(p.numel() for p in model.parameters())
    shape = get_model_shape(a.model)
    print(f"{a.model} shape, {a.layers} of {shape.layers} layers, {n_params / 1e6:.0f}M parameters, {a.dtype}, "
          f"{a.device}; MX/NVFP4 formats in the registry: {present or 'none'}", flush=True)
    probes = {}
    for seq in a.seq_lens:
        c = load_corpus(seq_len=seq, eval_tokens=seq * a.probe_batch)
        probes[seq] = c.eval[: a.probe_batch].to(a.device)
    train_corpus = load_corpus(seq_len=a.train_seq, eval_tokens=a.train_seq)
    deadline = t_start + a.budget_s
    phases = {"at init": measure(model, probes, pols, deadline)}
    losses = []
    if a.train_steps and time.perf_counter() < deadline:
        t0 = time.perf_counter()
        losses = train(model, train_corpus, a)
        print(f"trained {a.train_steps} steps in {time.perf_counter() - t0:.1f} s: loss {losses[0]:.3f} -> "
              f"{losses[-1]:.3f}", flush=True)
        phases[f"after {a.train_steps} AdamW steps"] = measure(model, probes, pols, deadline)
    types = [t for t in LAYER_TYPES if t != "embed"]
    md = markdown(phases, types)
    print(md)
    report = {
        "environment": harness.environment(a.device),
        "options": vars(a), "model": {"shape": a.model, "layers": a.layers, "of_layers": shape.layers,
                                      "parameters": n_params, "vocab": cfg.vocab_size, "dtype": a.dtype},
        "mx_formats_present": present, "policies": list(pols), "train_losses": losses,
        "phases": phases, "paper_table_13": PAPER_TABLE_13, "markdown": md,
        "wall_seconds": time.perf_counter() - t_start,
    }
    if torch.cuda.is_available() and a.device.startswith("cuda"):
        report["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    harness.write_json(report, a.json, "bench_grad_error")
    if a.png:
        plot(report, a.png)
    print(f"total {report['wall_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
