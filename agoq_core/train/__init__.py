"""The training comparison behind ``agoq train``: baseline vs AGoQ on real text, side by side.

Quick start::

    from agoq_core.train import TrainConfig, run
    summary = run(TrainConfig(model="tiny", steps=300))     # writes runs/<timestamp>/
    print(summary["ratios_vs_baseline"]["agoq"])

Every arm trains a randomly initialised Hugging Face ``LlamaForCausalLM`` from the same seed on the
same WikiText-2 batches (shipped with agoq; nothing is downloaded). See docs/training.md.
"""
from agoq_core.train.config import ABLATIONS, ConfigError, TrainConfig, config_from_dict, load_config_file
from agoq_core.train.models import MODEL_SIZES
from agoq_core.train.run import TrainError, run

__all__ = [
    # the verb and its config
    "run",
    "TrainConfig",
    # config helpers
    "config_from_dict",
    "load_config_file",
    "MODEL_SIZES",
    "ABLATIONS",
    # errors
    "ConfigError",
    "TrainError",
]
