"""The training comparison behind ``agoq train``: baseline vs AGoQ on real text, side by side.

Quick start::

    from agoq_core.train import TrainConfig, run
    summary = run(TrainConfig(model="tiny", steps=300))     # writes runs/<timestamp>/
    print(summary["ratios_vs_baseline"]["agoq"])

Every arm trains a randomly initialised Hugging Face ``LlamaForCausalLM`` from the same seed on the
same WikiText-2 batches (shipped with agoq; nothing is downloaded). See docs/training.md.

This is an application on top of the library: it needs the ``[train]`` extra (transformers,
tokenizers, matplotlib, tqdm), which ``run`` checks before any work starts (``MissingExtraError``
names what is missing and the install command). The model shapes are agoq_core.models'; the arms are
the table in agoq_core/train/recipes.py.
"""
from agoq_core.train.config import ConfigError, TrainConfig
from agoq_core.train.extras import MissingExtraError
from agoq_core.train.run import TrainError, run

__all__ = [
    # the verb and its config
    "run",
    "TrainConfig",
    # errors
    "ConfigError",
    "MissingExtraError",
    "TrainError",
]
