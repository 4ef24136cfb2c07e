"""What ``agoq train`` needs beyond agoq's core dependencies (torch, pluggy, numpy), checked before
any work starts: the training app sits on top of the library and brings its own extras.

Without this check a missing matplotlib crashed *after* training, when the plot was drawn, and the
summary was lost. ``pip install 'agoq[train]'`` installs every extra.
"""
from __future__ import annotations

import importlib.util

from agoq_core.errors import AgoqError
from agoq_core.train.config import TrainConfig

__all__ = ["MissingExtraError", "missing_extras", "check_extras"]

INSTALL = "pip install 'agoq[train]'"


class MissingExtraError(AgoqError, ImportError):
    """A package the asked-for run needs is not installed (the message names it and the install command)."""


def missing_extras(cfg: TrainConfig) -> list[tuple[str, str]]:
    """``(module, what needs it)`` for every package the run ``cfg`` needs that is not installed."""
    needed = [("transformers", "the models (HF LlamaForCausalLM) and the lr schedule"),
              ("tokenizers", "the shipped WikiText-2 tokenizer")]
    if cfg.plot:
        needed.append(("matplotlib", "curves.png (or pass --no-plot)"))
    if cfg.progress:
        needed.append(("tqdm", "the progress bars (or pass --no-progress)"))
    if cfg.agoq_optimizer == "adamw8bit":
        needed.append(("bitsandbytes", "--agoq-optimizer adamw8bit"))
    return [(m, why) for m, why in needed if not _installed(m)]


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or half-removed installation, or a None in sys.modules
        return False


def check_extras(cfg: TrainConfig) -> None:
    """Raise MissingExtraError naming every missing package, what needs it and the install command."""
    missing = missing_extras(cfg)
    if missing:
        lines = "; ".join(f"{m} (for {why})" for m, why in missing)
        raise MissingExtraError(f"agoq train needs packages that are not installed: {lines}. "
                                f"Install them with: {INSTALL}  (or: pip install {' '.join(m for m, _ in missing)})")
