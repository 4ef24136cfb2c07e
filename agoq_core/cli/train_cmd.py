"""``agoq train``: baseline vs AGoQ training on WikiText-2, side by side, with a table and a plot.

Options come from defaults < ``--config FILE`` < flags. ``--json`` prints the summary as JSON on
stdout (progress bars go to stderr). Launch under ``torchrun`` or with ``--nproc N`` for data
parallelism.
"""
from __future__ import annotations

import argparse
import dataclasses
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


_TYPES = {"int": int, "float": float, "int | None": int}


def register(parser: argparse.ArgumentParser) -> None:
    """``agoq train``'s options: ``--config``, ``--json``, ``--print-config``, then one flag per
    TrainConfig field that has one (its metadata: group, help, flag name, metavar)."""
    from agoq_core.train.config import OPTION_GROUPS, TrainConfig

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _EPILOG
    groups = {t: parser.add_argument_group(t) for t in OPTION_GROUPS}
    g = groups[OPTION_GROUPS[0]]
    g.add_argument("--config", metavar="FILE", default=None,
                   help="options file (.json, .toml, .yaml); keys are the long option names")
    g.add_argument("--json", action="store_true", help="print the summary as JSON on stdout instead of the table")
    g.add_argument("--print-config", action="store_true", help="print the resolved options and exit")
    flagged = [f for f in dataclasses.fields(TrainConfig) if "help" in f.metadata]
    for f in sorted(flagged, key=lambda f: list(groups).index(f.metadata["group"])):  # stable: field order
        # SUPPRESS: a flag that is not given does not override the config file
        kw: dict = {"dest": f.name, "default": argparse.SUPPRESS, "help": f.metadata["help"].replace("%", "%%")}
        if "metavar" in f.metadata:
            kw["metavar"] = f.metadata["metavar"]
        if f.type == "bool":  # a switch that turns the default off
            off = "--no-" if f.default else "--"
            name = f.metadata.get("name", off + f.name.replace("_", "-"))
            kw["action"] = "store_false" if f.default else "store_true"
        else:
            name = f.metadata.get("name", "--" + f.name.replace("_", "-"))
            if f.type.startswith("tuple"):
                kw["action"] = "append"
            elif f.type in _TYPES:
                kw["type"] = _TYPES[f.type]
        groups[f.metadata["group"]].add_argument(name, **kw)
    parser.set_defaults(func=run)


_NOT_OPTIONS = {"func", "command", "verbose", "config", "json", "print_config"}


def resolve(args: argparse.Namespace):
    """Merge defaults < config file < flags into a validated TrainConfig (derived defaults last)."""
    from agoq_core.train.config import load_config_file, merge_options

    sources = []
    if args.config:
        sources.append((f"config file {args.config!r}", load_config_file(args.config)))
    sources.append(("options", {k: v for k, v in vars(args).items() if k not in _NOT_OPTIONS}))
    return merge_options(*sources)


def run(args: argparse.Namespace) -> int:
    from agoq_core.train import run as train_run
    from agoq_core.train.report import render_table

    cfg = resolve(args)
    if args.print_config:
        print(json.dumps(cfg.to_dict(), indent=2))
        return 0
    try:
        summary = train_run(cfg)
    except KeyboardInterrupt as exc:  # SIGINT or SIGTERM (agoq_core.train.rundir): the folder says so
        sig = getattr(exc, "signame", "SIGINT")
        where = getattr(exc, "run_dir", None)
        print(f"agoq train: interrupted by {sig}" + (f"; {where}/status.json says 'interrupted', finished steps are in "
              f"{where}/metrics.jsonl.partial" if where else ""), file=sys.stderr)
        return 130 if sig == "SIGINT" else 143
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
