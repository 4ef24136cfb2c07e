"""Entry point of the ``agoq`` command.

Subcommands are modules of this package listed in ``_SUBCOMMANDS``; each defines
``register(subparsers) -> None`` and sets ``func`` (taking the parsed args, returning an exit code).
Modules are imported lazily, only for the command being run, so ``agoq backends`` never pays for
transformers or matplotlib.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

# name -> (module, one-line help). Add a subcommand by adding a module and a line here.
_SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "backends": ("agoq_core.cli.backends_cmd", "list installed backends and which one is selected"),
    "formats": ("agoq_core.cli.formats_cmd", "list formats with bits/element and measured SQNR"),
    "conformance": ("agoq_core.cli.conformance_cmd", "run the conformance suite or compare two reports"),
    "train": ("agoq_core.cli.train_cmd", "train baseline vs AGoQ side by side on WikiText-2: table + plot"),
    "plan": ("agoq_core.cli.plan_cmd", "DBCA-PP: activation formats per pipeline stage from the schedule"),
    "memory": ("agoq_core.cli.memory_cmd", "LAAQ: bytes kept for backward per layer and part, plain vs LAAQ"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    from agoq_core import __version__

    parser = argparse.ArgumentParser(prog="agoq", description="AGoQ: activation and gradient quantization.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument("--version", action="version", version=f"agoq {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_) in _SUBCOMMANDS.items():
        if name != only:  # listed in --help without importing the module
            sub.add_parser(name, help=help_, add_help=False)
            continue
        sp = sub.add_parser(name, help=help_, description=help_)
        importlib.import_module(module).register(sp)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(only=command if command in _SUBCOMMANDS else None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from agoq_core.errors import AgoqError

    try:
        return int(args.func(args) or 0)
    except AgoqError as exc:
        print(f"agoq {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
