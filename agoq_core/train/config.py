"""The configuration of an ``agoq train`` run: one frozen, keyword-only, validated dataclass.

Values come from three layers, later ones winning: the defaults below, a ``--config`` file
(JSON, TOML or YAML, keys named like the fields), and command-line flags. The layers are merged as
plain values first (:func:`merge_options`); derived defaults (``warmup_steps`` = 10% of the final
``steps``) are computed once, from the merged values, when the TrainConfig is built.

Each field's ``metadata`` holds its command-line flag: ``agoq train``'s options are generated from
this class (agoq_core/cli/train_cmd.py), so a new option is one field here.

The defaults are sized so that the whole comparison (two arms) finishes in a few minutes on a
2-core CPU: see docs/training.md for the measured times.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agoq_core.errors import AgoqError
from agoq_core.models import MODELS
from agoq_core.train.recipes import ABLATIONS

__all__ = ["TrainConfig", "ConfigError", "ABLATIONS", "load_config_file", "config_from_dict", "merge_options"]


class ConfigError(AgoqError, ValueError):
    """A training option has a bad value, or a config file cannot be read."""


_DEVICES_HINT = "'auto', 'cpu', or an accelerator type torch knows ('cuda', 'npu', 'xpu', 'mps', ...)"

# Option groups of ``agoq train --help``, in the order they are shown.
OPTION_GROUPS = RUN, DATA, OPTIM, ARMS, HARDWARE = (
    "run", "model and data", "optimisation (same for every arm)", "arms", "hardware and parallelism")


def _opt(default: Any, group: str, help: str, **flag: Any) -> Any:
    """A field with its command-line flag: ``help`` and ``group``; ``flag`` may give ``name`` (default
    ``--field-name``; ``--no-x`` for a True boolean), ``metavar``."""
    return field(default=default, metadata={"group": group, "help": help, **flag})


#: torch.compile backends ``--compile`` takes ("" = eager).
COMPILE_BACKENDS = ("", "inductor", "aot_eager", "eager")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything that defines a run. ``agoq train --help`` documents each field."""

    # what is trained
    model: str = _opt("tiny", DATA, f"model size: {', '.join(MODELS)} (default: tiny)", metavar="SIZE")
    seq_len: int = _opt(128, DATA, "tokens per sequence (default: 128)")
    micro_batch: int = _opt(8, DATA, "sequences per micro-batch per rank (default: 8)")
    grad_accum: int = _opt(1, DATA, "micro-batches per optimizer step (default: 1)")
    # 300 steps: 1.05 epochs of valid.txt at the defaults
    steps: int = _opt(300, DATA, "optimizer steps per arm (default: 300)")
    seed: int = _opt(0, DATA, "init and data-order seed, shared by all arms (default: 0)")
    # optimisation (same for every arm)
    lr: float = _opt(2e-3, OPTIM, "peak learning rate (default: 2e-3)")
    min_lr_ratio: float = _opt(0.1, OPTIM, "final lr / peak lr (default: 0.1)")
    warmup_steps: int | None = _opt(None, OPTIM, "linear warm-up steps (default: 10% of --steps)")
    weight_decay: float = _opt(0.1, OPTIM, "AdamW weight decay (default: 0.1)")
    grad_clip: float = _opt(1.0, OPTIM, "global-norm clipping, 0 = off (default: 1.0)")
    optimizer: str = "adamw"        # baseline's optimizer: adamw (fp32 states); no flag
    agoq_optimizer: str = _opt("adamw", OPTIM, "AGoQ arms' optimizer: adamw or adamw8bit (bitsandbytes) "
                               "(default: adamw)", metavar="NAME")
    # arms
    ablations: tuple[str, ...] = _opt((), ARMS, "add an ablation arm (repeatable or comma-separated): " + "; ".join(
        f"{k}: {v}" for k, v in ABLATIONS.items()), name="--ablation", metavar="NAME")
    baseline: bool = _opt(True, ARMS, "skip the baseline arm")
    agoq: bool = _opt(True, ARMS, "skip the AGoQ arm")
    # hardware and parallelism
    device: str = _opt("auto", HARDWARE, "auto (default), cpu, cuda, npu, ...")
    dtype: str = _opt("auto", HARDWARE, "auto (default: fp32 on CPU, bf16 on accelerators), fp32, bf16 (bf16 "
                      "weights, fp32 masters)")
    nproc: int = _opt(1, HARDWARE, "processes (data parallel x pipeline); spawned unless under torchrun (default: 1)")
    pp: int = _opt(1, HARDWARE, "pipeline stages (DBCA-PP plan for the AGoQ arm) (default: 1)")
    pp_microbatches: int = _opt(0, HARDWARE, "pipeline micro-batches per step (default: 2*pp)")
    pp_schedule: str = _opt("1f1b", HARDWARE, "gpipe, 1f1b (default) or interleaved-1f1b")
    threads: int = _opt(0, HARDWARE, "torch threads per process, 0 = cores / processes")
    compile: str = _opt("", HARDWARE, "torch.compile every decoder layer in every arm with this backend (inductor, "
                        "aot_eager, eager; LAAQ runs its traceable path inside): the comparison a compiling user "
                        "makes; empty = eager (default)", metavar="BACKEND")
    virtual_ranks: int = _opt(0, HARDWARE, "simulate W data-parallel ranks in this one process (a numerics tool, "
                              "not a speed model): each step runs the W ranks' micro-batches, split as --nproc W "
                              "splits the data, and reduces their gradients with the collective's own arithmetic; "
                              "0 = off (default: 0)", metavar="W")
    grad_error_every: int = _opt(0, HARDWARE, "with --virtual-ranks: every N steps, record each parameter's "
                                 "reduced-gradient error against the exact fp32 sum of the ranks' gradients "
                                 "(QuanGrad arms; 'grad_error' records in metrics.jsonl); 0 = off (default: 0)",
                                 metavar="N")
    gc_every: int = _opt(0, HARDWARE, "Python garbage collection: 0 = automatic (default); N = automatic collection "
                         "off while training and a young-generation collection every N steps (torchtitan's gc_freq, "
                         "Megatron's --manual-gc), for every arm", metavar="N")
    # evaluation and output
    eval_every: int = _opt(50, DATA, "evaluate every N steps, 0 = only at the end (50)")
    eval_tokens: int = _opt(16384, DATA, "held-out tokens per evaluation (default: 16384)")
    out_dir: str = _opt("runs", RUN, "where run folders go (default: runs)")
    run_name: str = _opt("", RUN, "run folder name (default: a timestamp)")
    plot: bool = _opt(True, RUN, "skip curves.png")
    progress: bool = _opt(True, RUN, "no progress bar")

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ConfigError(f"unknown model size {self.model!r}; choose one of {sorted(MODELS)}")
        for name in ("seq_len", "micro_batch", "grad_accum", "steps", "nproc", "pp", "eval_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")
        if self.warmup_steps is None:  # derived last: from the merged steps, whatever set them
            object.__setattr__(self, "warmup_steps", self.steps // 10)
            object.__setattr__(self, "_derived", frozenset({"warmup_steps"}))
        for name in ("warmup_steps", "eval_every", "threads", "pp_microbatches", "seed", "virtual_ranks",
                     "grad_error_every", "gc_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"{name} must be an integer >= 0, got {v!r}")
        if self.warmup_steps >= self.steps and self.steps > 1:
            raise ConfigError(f"warmup_steps ({self.warmup_steps}) must be smaller than steps ({self.steps})")
        for name in ("lr", "min_lr_ratio", "weight_decay", "grad_clip"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ConfigError(f"{name} must be a finite number, got {v!r}")
        if not self.lr > 0:
            raise ConfigError(f"lr must be a positive number, got {self.lr!r}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}")
        if self.weight_decay < 0 or self.grad_clip < 0:
            raise ConfigError(f"weight_decay and grad_clip must be >= 0, got {self.weight_decay}, {self.grad_clip}")
        if self.optimizer != "adamw":
            raise ConfigError(f"optimizer must be 'adamw' (the baseline a user would run), got {self.optimizer!r}")
        if self.agoq_optimizer not in ("adamw", "adamw8bit"):
            raise ConfigError(f"agoq_optimizer must be 'adamw' or 'adamw8bit', got {self.agoq_optimizer!r}")
        if isinstance(self.ablations, str) or not isinstance(self.ablations, tuple):
            raise ConfigError(f"ablations must be a tuple of names, got {self.ablations!r}")
        for a in self.ablations:
            if a not in ABLATIONS:
                raise ConfigError(f"unknown ablation {a!r}; choose from {sorted(ABLATIONS)}")
        if len(set(self.ablations)) != len(self.ablations):
            raise ConfigError(f"ablation listed twice: {list(self.ablations)}")
        if not (self.baseline or self.agoq or self.ablations):
            raise ConfigError("nothing to train: baseline and agoq are both off and no ablation was given")
        if not isinstance(self.device, str) or not self.device:
            raise ConfigError(f"device must be {_DEVICES_HINT}, got {self.device!r}")
        from agoq_core.train.rundir import RunDirError, check_run_name

        try:
            check_run_name(self.run_name)
        except RunDirError as exc:
            raise ConfigError(str(exc)) from None
        if not isinstance(self.out_dir, str) or not self.out_dir:
            raise ConfigError(f"out_dir must be a folder path, got {self.out_dir!r}")
        if self.dtype not in ("auto", "fp32", "bf16"):
            raise ConfigError(f"dtype must be 'auto', 'fp32' or 'bf16', got {self.dtype!r}")
        if self.nproc % self.pp:
            raise ConfigError(
                f"nproc ({self.nproc}) must be a multiple of pp ({self.pp}): nproc = pp * data-parallel size"
            )
        if self.virtual_ranks and (self.nproc > 1 or self.pp > 1):
            raise ConfigError(
                f"--virtual-ranks {self.virtual_ranks} simulates the data-parallel ranks in one process; it does "
                f"not combine with --nproc {self.nproc} / --pp {self.pp}: use --nproc 1 --pp 1"
            )
        if self.grad_error_every and not self.virtual_ranks:
            raise ConfigError("--grad-error-every needs --virtual-ranks W (the exact sum needs every rank's "
                              "gradient in one process)")
        if self.pp > 1 and self.dp > 1:
            raise ConfigError(
                f"--pp {self.pp} with --nproc {self.nproc} would mean {self.dp} data-parallel pipeline replicas, "
                f"which agoq train does not run yet; use --nproc {self.pp}"
            )
        if self.compile not in COMPILE_BACKENDS:
            raise ConfigError(f"compile must be one of {', '.join(b for b in COMPILE_BACKENDS if b)} (or empty: "
                              f"eager), got {self.compile!r}")
        if self.compile and self.pp > 1:
            raise ConfigError("--compile with --pp is not supported yet (the pipeline stages run eagerly); drop one")
        if self.pp_schedule not in ("gpipe", "1f1b", "interleaved-1f1b"):
            raise ConfigError(f"pp_schedule must be gpipe, 1f1b or interleaved-1f1b, got {self.pp_schedule!r}")
        if self.pp > 1 and self.pp_microbatches and self.pp_microbatches < self.pp:
            raise ConfigError(f"pp_microbatches ({self.pp_microbatches}) must be >= pp ({self.pp})")
        if self.pp > 1 and self.micro_batch % self.num_pp_microbatches:
            raise ConfigError(
                f"micro_batch ({self.micro_batch}) must divide into pp_microbatches "
                f"({self.num_pp_microbatches}) equal pipeline micro-batches"
            )

    # derived quantities
    @property
    def dp(self) -> int:
        """Data-parallel ranks: processes, or the simulated ranks of ``--virtual-ranks``."""
        return self.virtual_ranks or self.nproc // self.pp

    @property
    def num_pp_microbatches(self) -> int:
        return self.pp_microbatches or 2 * self.pp

    @property
    def tokens_per_step(self) -> int:
        """Tokens consumed by one optimizer step, all data-parallel ranks together."""
        return self.seq_len * self.micro_batch * self.grad_accum * self.dp

    @property
    def arms(self) -> tuple[str, ...]:
        return (("baseline",) if self.baseline else ()) + (("agoq",) if self.agoq else ()) + self.ablations

    def to_dict(self) -> dict[str, Any]:
        """Every option as resolved (derived defaults filled in)."""
        d = dataclasses.asdict(self)
        d["ablations"] = list(self.ablations)
        return d

    def given(self) -> dict[str, Any]:
        """The options as given: derived defaults left unset, so they follow a later change."""
        return {k: v for k, v in self.to_dict().items() if k not in getattr(self, "_derived", ())}

    def replace(self, **changes: Any) -> "TrainConfig":
        return config_from_dict({**self.given(), **changes})


_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def merge_options(*sources: tuple[str, dict[str, Any]]) -> TrainConfig:
    """One TrainConfig from ``(source name, values)`` pairs, later ones winning (a config file, then
    flags). Each source's values are checked and named in errors; derived defaults are computed once,
    after the merge."""
    merged: dict[str, Any] = {}
    for source, values in sources:
        merged.update(_clean(values, source))
    try:
        return TrainConfig(**merged)
    except TypeError as exc:  # e.g. a string where a number is needed, from a config file
        raise ConfigError(f"{' + '.join(s for s, _ in sources) or 'options'}: {exc}") from exc


def config_from_dict(values: dict[str, Any], *, source: str = "options") -> TrainConfig:
    """Build a TrainConfig from plain values (a parsed file or flags), with clear errors for typos."""
    return merge_options((source, values))


def _clean(values: dict[str, Any], source: str) -> dict[str, Any]:
    clean: dict[str, Any] = {}
    for key, v in values.items():
        name = key.replace("-", "_")
        if name not in _FIELDS:
            close = [f for f in _FIELDS if f.startswith(name[:3])]
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{source}: unknown option {key!r}{hint}; known options: {sorted(_FIELDS)}")
        if name == "ablations":
            v = _as_ablations(v, source)
        elif _FIELDS[name].type == "float" and isinstance(v, str):
            try:  # PyYAML reads 1e-3 (no dot) as a string
                v = float(v)
            except ValueError:
                raise ConfigError(f"{source}: {name} must be a number, got {v!r}") from None
        elif _FIELDS[name].type in ("int", "float", "int | None") and v is not None and (
                not isinstance(v, (int, float)) or isinstance(v, bool)):
            raise ConfigError(f"{source}: {name} must be a number, got {v!r}")
        elif _FIELDS[name].type == "bool" and not isinstance(v, bool):
            raise ConfigError(f"{source}: {name} must be true or false, got {v!r}")
        elif _FIELDS[name].type == "str" and not isinstance(v, str):
            raise ConfigError(f"{source}: {name} must be a string, got {v!r}")
        clean[name] = v
    return clean


def _as_ablations(v: Any, source: str) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, (list, tuple)):
        raise ConfigError(f"{source}: ablations must be a list of names, got {v!r}")
    out: list[str] = []
    for item in v:
        out += [p.strip() for p in str(item).split(",") if p.strip()]
    return tuple(out)


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a config file into a dict: ``.json``, ``.toml`` or ``.yaml``/``.yml``.

    A TOML or YAML file may put the options at the top level or under a ``[train]`` / ``train:`` table.
    """
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    if p.is_dir():
        raise ConfigError(f"config file {str(p)!r} is a directory; give the options file inside it")
    try:
        text = p.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"config file {str(p)!r} cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {str(p)!r} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                          f"{exc.start}); save it as UTF-8") from None
    suffix = p.suffix.lower()
    try:
        if suffix == ".json":
            data = json.loads(text)
        elif suffix == ".toml":
            try:
                import tomllib
            except ModuleNotFoundError:  # Python 3.10
                try:
                    import tomli as tomllib  # type: ignore[no-redef]
                except ModuleNotFoundError as exc:
                    raise ConfigError("reading TOML on Python 3.10 needs `pip install tomli`; "
                                      "or use a .json or .yaml config") from exc
            data = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ModuleNotFoundError as exc:
                raise ConfigError("reading YAML needs PyYAML (`pip install pyyaml`); or use .json/.toml") from exc
            data = yaml.safe_load(text)
        else:
            raise ConfigError(f"config file {str(p)!r}: unknown extension {suffix!r}; use .json, .toml or .yaml")
    except ConfigError:
        raise
    except Exception as exc:  # the parser's own message says where the syntax error is
        raise ConfigError(f"config file {str(p)!r} could not be parsed: {exc}") from exc
    if isinstance(data, dict) and set(data) == {"train"} and isinstance(data["train"], dict):
        data = data["train"]
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a mapping of options, got {type(data).__name__}")
    return data
