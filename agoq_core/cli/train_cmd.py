"""``agoq train``: baseline vs AGoQ training on WikiText-2, side by side, with a table and a plot.

Options come from defaults < ``--config FILE`` < flags. ``--json`` prints the summary as JSON on
stdout (progress bars go to stderr). Launch under ``torchrun`` or with ``--nproc N`` for data
parallelism.
"""
from __future__ import annotations

import argparse
import json
import sys

_EPILOG = """\
examples:
  agoq train                                   # tiny model, baseline vs AGoQ on 2 CPU cores (minutes)
  agoq train --ablation uniform4-attn --steps 600
  agoq train --nproc 2 --grad-accum 2          # data parallel (gloo on CPU), 2 micro-batches per step
  torchrun --nproc-per-node 8 -m agoq_core.cli.main train --model llama-1b --device cuda --seq-len 2048
  agoq train --config my_run.toml --json > summary.json
"""


def register(parser: argparse.ArgumentParser) -> None:
    from agoq_core.train.config import ABLATIONS
    from agoq_core.train.models import MODEL_SIZES

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _EPILOG
    S = argparse.SUPPRESS  # flags that are not given do not override the config file
    g = parser.add_argument_group("run")
    g.add_argument("--config", metavar="FILE", default=None,
                   help="options file (.json, .toml, .yaml); keys are the long option names")
    g.add_argument("--json", action="store_true", help="print the summary as JSON on stdout instead of the table")
    g.add_argument("--print-config", action="store_true", help="print the resolved options and exit")
    g.add_argument("--out-dir", default=S, help="where run folders go (default: runs)")
    g.add_argument("--run-name", default=S, help="run folder name (default: a timestamp)")
    g.add_argument("--no-plot", dest="plot", action="store_false", default=S, help="skip curves.png")
    g.add_argument("--no-progress", dest="progress", action="store_false", default=S, help="no progress bar")

    g = parser.add_argument_group("model and data")
    g.add_argument("--model", default=S, metavar="SIZE",
                   help=f"model size: {', '.join(MODEL_SIZES)} (default: tiny)")
    g.add_argument("--seq-len", type=int, default=S, help="tokens per sequence (default: 128)")
    g.add_argument("--micro-batch", type=int, default=S, help="sequences per micro-batch per rank (default: 8)")
    g.add_argument("--grad-accum", type=int, default=S, help="micro-batches per optimizer step (default: 1)")
    g.add_argument("--steps", type=int, default=S, help="optimizer steps per arm (default: 300)")
    g.add_argument("--seed", type=int, default=S, help="init and data-order seed, shared by all arms (default: 0)")
    g.add_argument("--eval-every", type=int, default=S, help="evaluate every N steps, 0 = only at the end (50)")
    g.add_argument("--eval-tokens", type=int, default=S, help="held-out tokens per evaluation (default: 16384)")

    g = parser.add_argument_group("optimisation (same for every arm)")
    g.add_argument("--lr", type=float, default=S, help="peak learning rate (default: 2e-3)")
    g.add_argument("--min-lr-ratio", type=float, default=S, help="final lr / peak lr (default: 0.1)")
    g.add_argument("--warmup-steps", type=int, default=S, help="linear warm-up steps (default: 10%% of --steps)")
    g.add_argument("--weight-decay", type=float, default=S, help="AdamW weight decay (default: 0.1)")
    g.add_argument("--grad-clip", type=float, default=S, help="global-norm clipping, 0 = off (default: 1.0)")
    g.add_argument("--agoq-optimizer", default=S, metavar="NAME",
                   help="AGoQ arms' optimizer: adamw or adamw8bit (bitsandbytes) (default: adamw)")

    g = parser.add_argument_group("arms")
    g.add_argument("--ablation", dest="ablations", action="append", default=S, metavar="NAME",
                   help="add an ablation arm (repeatable or comma-separated): " + "; ".join(
                       f"{k}: {v}" for k, v in ABLATIONS.items()))
    g.add_argument("--no-baseline", dest="baseline", action="store_false", default=S, help="skip the baseline arm")
    g.add_argument("--no-agoq", dest="agoq", action="store_false", default=S, help="skip the AGoQ arm")

    g = parser.add_argument_group("hardware and parallelism")
    g.add_argument("--device", default=S, help="auto (default), cpu, cuda, npu, ...")
    g.add_argument("--dtype", default=S,
                   help="auto (default: fp32 on CPU, bf16 on accelerators), fp32, bf16 (bf16 weights, fp32 masters)")
    g.add_argument("--nproc", type=int, default=S,
                   help="processes (data parallel x pipeline); spawned unless under torchrun (default: 1)")
    g.add_argument("--pp", type=int, default=S, help="pipeline stages (DBCA-PP plan for the AGoQ arm) (default: 1)")
    g.add_argument("--pp-microbatches", type=int, default=S, help="pipeline micro-batches per step (default: 2*pp)")
    g.add_argument("--pp-schedule", default=S, help="gpipe, 1f1b (default) or interleaved-1f1b")
    g.add_argument("--threads", type=int, default=S, help="torch threads per process, 0 = cores / processes")
    parser.set_defaults(func=run)


_NOT_OPTIONS = {"func", "command", "verbose", "config", "json", "print_config"}


def resolve(args: argparse.Namespace):
    """Merge defaults < config file < flags into a validated TrainConfig."""
    from agoq_core.train.config import config_from_dict, load_config_file

    values = load_config_file(args.config) if args.config else {}
    source = f"config file {args.config!r}" if args.config else "options"
    cfg = config_from_dict(values, source=source) if values else None
    flags = {k: v for k, v in vars(args).items() if k not in _NOT_OPTIONS}
    if cfg is None:
        return config_from_dict(flags, source="options")
    return config_from_dict({**cfg.to_dict(), **flags}, source="options")


def run(args: argparse.Namespace) -> int:
    from agoq_core.train import run as train_run
    from agoq_core.train.report import render_table

    cfg = resolve(args)
    if args.print_config:
        print(json.dumps(cfg.to_dict(), indent=2))
        return 0
    summary = train_run(cfg)
    if summary is None or summary.get("environment", {}).get("world", 1) > 1 and _rank() not in (None, 0):
        return 0  # under torchrun only rank 0 reports
    if args.json:
        json.dump(summary, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render_table(summary))
        print(f"\nrun folder: {summary['run_dir']}" + (f"  (plot: {summary['plot']})" if summary.get("plot") else ""))
    failed = [a["name"] for a in summary["arms"] if a["status"] == "failed"]
    return 1 if failed else 0


def _rank() -> int | None:
    import os

    return int(os.environ["RANK"]) if "RANK" in os.environ else None
