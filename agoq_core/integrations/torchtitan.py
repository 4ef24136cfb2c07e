"""AGoQ as a torchtitan model converter: LAAQ on torchtitan's Llama blocks, QuanGrad on its FSDP2.

Checked with torchtitan 0.3.0 (whose converters are config objects passed to ``model_registry``)::

    from torchtitan.models.llama3 import model_registry
    from torchtitan.models.llama3.config_registry import llama3_8b
    from agoq_core.integrations.torchtitan import AgoqConverter

    def llama3_8b_agoq():                      # a torchtitan config function
        config = llama3_8b()
        config.model_spec = model_registry("8B", converters=[AgoqConverter.Config(quangrad=True)])
        config.activation_checkpoint = None    # LAAQ replaces activation checkpointing
        return config

or, with the ready-made config functions of this module,
``torchrun ... -m torchtitan.train --module agoq_core.integrations.torchtitan --config llama3_debugmodel_agoq``.

What the converter does: ``convert(model_config)`` returns the model config wrapped in a subclass of its
model class (``AgoqLlama3Model``; state_dict keys, parameters and checkpoints unchanged) whose
constructor applies LAAQ to every ``Llama3TransformerBlock`` (both RMSNorms keep only their input at 4
bits, ``wqkv`` and ``feed_forward.w1/w3`` recompute the norm output, ``feed_forward`` keeps only the
SiLU&Mul input, ``attention.wo`` keeps its input at 4 bits; the attention core is untouched) and, with
``quangrad=True``, installs QuanGrad as FSDP2's reduce-scatter (``agoq_core.quangrad.fsdp.enable``) on
the first forward, after torchtitan's ``parallelize_fn`` has applied ``fully_shard``.

This module imports torchtitan only when one of its torchtitan classes or config functions is used.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
import torch.nn as nn

from agoq_core.errors import AgoqError
from agoq_core.laaq import LAAQConfig, LayerFamily
from agoq_core.laaq import apply as laaq_apply
from agoq_core.quangrad.config import DEFAULT_MIN_COMPRESS_BYTES, resolve_spec

__all__ = ["AgoqConverter", "TORCHTITAN_LLAMA3", "TORCHTITAN_LLAMA3_UNFUSED", "apply_laaq", "llama3_family",
           "AgoqOptions", "TESTED_TORCHTITAN", "llama3_debugmodel_agoq", "llama3_8b_agoq", "torch_compat"]

log = logging.getLogger("agoq")

TESTED_TORCHTITAN = ("0.3.0",)
"""torchtitan releases this module was tested with (its converter API changed in 0.3)."""

# torchtitan 0.3.0 models/llama3 + models/common: Llama3TransformerBlock(attention_norm, attention, ffn_norm,
# feed_forward); GQAttention(qkv_linear.{wqkv | wq, wk, wv}, wo); FeedForward: w2(F.silu(w1(x)) * w3(x)).
TORCHTITAN_LLAMA3 = LayerFamily(
    name="torchtitan_llama3", layer_classes=("Llama3TransformerBlock",),
    input_norm="attention_norm", post_norm="ffn_norm", attention="attention",
    q_proj="qkv_linear.wqkv", k_proj="qkv_linear.wqkv", v_proj="qkv_linear.wqkv", o_proj="wo",
    mlp="feed_forward", gate_proj="w1", up_proj="w3", down_proj="w2", act_fn="silu",
    layer_index_attr="", final_norm=("norm",), lm_head=("lm_head",))
TORCHTITAN_LLAMA3_UNFUSED = replace(TORCHTITAN_LLAMA3, name="torchtitan_llama3_unfused",
                                    q_proj="qkv_linear.wq", k_proj="qkv_linear.wk", v_proj="qkv_linear.wv")


def torch_compat() -> list[str]:
    """Let torchtitan 0.3.0 import on torch 2.9-2.11; call it before the first torchtitan import.

    torchtitan 0.3.0 imports ``torch.distributed.fsdp.DataParallelMeshDims`` (in torch 2.12.0 and 2.13.0,
    not in 2.11.0) at module level, for its full-DTensor mode only. Where torch lacks it, this installs a
    placeholder of that name that refuses to be instantiated (so the full-DTensor mode fails with a clear
    error instead of running wrong). Idempotent; does nothing where torch has the name. Returns what it
    installed. It does not make all of torchtitan 0.3.0 work on an older torch: its trainer's chunked
    loss under ``fully_shard([norm, lm_head])`` needs torch 2.13's FSDP2 (docs/integrations.md, torchtitan).
    """
    import torch.distributed.fsdp as fsdp

    if hasattr(fsdp, "DataParallelMeshDims"):
        return []

    class DataParallelMeshDims:  # placeholder type: the name torchtitan 0.3.0 imports
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise AgoqError("DataParallelMeshDims (torchtitan's full-DTensor mode) needs torch >= 2.12; this is "
                            "agoq's import placeholder for an older torch (agoq_core.integrations.torchtitan."
                            "torch_compat)")

    DataParallelMeshDims.__module__ = __name__
    fsdp.DataParallelMeshDims = DataParallelMeshDims  # type: ignore[attr-defined]
    return ["torch.distributed.fsdp.DataParallelMeshDims (import placeholder)"]


def llama3_family(model: nn.Module) -> LayerFamily:
    """The row that fits ``model``'s blocks: fused ``wqkv`` (torchtitan's Llama 3 default) or not."""
    for m in model.modules():
        if type(m).__name__ in TORCHTITAN_LLAMA3.layer_classes:
            qkv = getattr(getattr(m, "attention", None), "qkv_linear", None)
            return TORCHTITAN_LLAMA3 if hasattr(qkv, "wqkv") else TORCHTITAN_LLAMA3_UNFUSED
    return TORCHTITAN_LLAMA3


@dataclass(frozen=True, kw_only=True)
class AgoqOptions:
    """The converter's options, validated (the torchtitan ``AgoqConverter.Config`` carries the same fields)."""

    laaq: bool = True
    """Apply LAAQ (4-bit saved activations + recomputation) to every Llama3TransformerBlock."""
    laaq_format: str = "nf4"
    """Activation format of the saved roles ("nf4", "int4", "fp4_e2m1", "int8", ... or "native")."""
    laaq_block: int = 128
    convert_final_norm: bool = False
    """Off by default: torchtitan's ChunkedLossWrapper detaches the final norm output and runs lm_head
    per chunk, so LAAQ's norm -> lm_head recomputation link cannot hold there."""
    quangrad: bool = False
    """QuanGrad's 8-bit all-to-all reduce-scatter for FSDP2 (installed on the first forward)."""
    quangrad_format: str = "fp8_e4m3"
    quangrad_threshold_bytes: int = DEFAULT_MIN_COMPRESS_BYTES
    """FSDP buckets smaller than this (fp32 bytes) keep FSDP's own reduce-scatter."""
    backend: str | None = None
    """agoq backend name; None = the selected one (AGOQ_BACKEND or auto)."""

    def __post_init__(self) -> None:
        self.laaq_config()  # validates format and block
        resolve_spec(self.quangrad_format, None)
        t = self.quangrad_threshold_bytes
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ValueError(f"agoq converter: quangrad_threshold_bytes must be an int >= 0, got {t!r}")
        if not (self.laaq or self.quangrad):
            raise ValueError("agoq converter: laaq=False and quangrad=False would change nothing; drop the converter")

    def laaq_config(self) -> LAAQConfig:
        if self.laaq_format.strip().lower() == "native":
            return LAAQConfig.native(block=self.laaq_block, convert_final_norm=self.convert_final_norm,
                                     backend=self.backend)
        return LAAQConfig.uniform(self.laaq_format, block=self.laaq_block, convert_final_norm=self.convert_final_norm,
                                  backend=self.backend)


def _options(cfg: Any) -> AgoqOptions:
    return AgoqOptions(**{f.name: getattr(cfg, f.name) for f in fields(AgoqOptions)})


def apply_laaq(model: nn.Module, config: LAAQConfig | None = None):
    """LAAQ on a torchtitan Llama model you built yourself (before ``parallelize_fn``); returns the report."""
    return laaq_apply(model, config, families=[llama3_family(model)])


# ---- the model wrapper (installed by the converter) ------------------------------------------------------

_HOOK_ATTR = "_agoq_first_forward_hook"
STATE_ATTR = "agoq_quangrad_state"


def _first_forward(model: nn.Module, args: Any) -> None:
    """Runs once, on the first forward (after parallelize_fn): refuse LAAQ under activation
    checkpointing, then install QuanGrad on FSDP2 (a collective: every rank runs its first forward)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    handle = model.__dict__.pop(_HOOK_ATTR, None)
    if handle is not None:
        handle.remove()
    opts: AgoqOptions = model.__dict__["_agoq_options"]
    if opts.laaq and any(isinstance(m, CheckpointWrapper) for m in model.modules()):
        raise AgoqError("agoq converter: LAAQ replaces activation checkpointing and does not compose with it "
                        "(the checkpointed blocks would re-run LAAQ's forwards in backward for no saving). Turn "
                        "torchtitan's off: config.activation_checkpoint = None, or --activation_checkpoint none")
    if opts.quangrad:
        from agoq_core.quangrad import fsdp as qg_fsdp

        state = qg_fsdp.enable(model, threshold_bytes=opts.quangrad_threshold_bytes, fmt=opts.quangrad_format,
                               backend=opts.backend)
        model.__dict__[STATE_ATTR] = state


@functools.lru_cache(maxsize=None)
def _agoq_model_cls(owner: type) -> type:
    parent_config = owner.Config

    class AgoqModel(owner):  # type: ignore[misc, valid-type]
        @dataclass(kw_only=True, slots=True)
        class Config(parent_config):  # type: ignore[misc, valid-type]
            agoq: Any = None
            """The agoq converter's config."""

        def __init__(self, config: Any) -> None:
            super().__init__(config)
            opts = _options(config.agoq)
            self.__dict__["_agoq_options"] = opts
            if opts.laaq:
                self.__dict__["agoq_laaq_report"] = apply_laaq(self, opts.laaq_config())
            self.__dict__[_HOOK_ATTR] = self.register_forward_pre_hook(_first_forward)

    AgoqModel.__name__ = AgoqModel.__qualname__ = f"Agoq{owner.__name__}"
    AgoqModel.Config.__qualname__ = f"Agoq{owner.__name__}.Config"
    return AgoqModel


def _converter_classes() -> dict[str, type]:
    from torchtitan.protocols.model import ModelConfigConverter

    defaults = AgoqOptions.__dataclass_fields__

    class AgoqConverter(ModelConfigConverter):
        """torchtitan model converter: LAAQ on the Llama blocks, QuanGrad on FSDP2 (see the module docstring)."""

        @dataclass(kw_only=True, slots=True)
        class Config(ModelConfigConverter.Config):
            """Options of the ``agoq`` converter (same fields and meaning as ``AgoqOptions``)."""

            laaq: bool = defaults["laaq"].default
            """Apply LAAQ (4-bit saved activations + recomputation) to every Llama3TransformerBlock."""
            laaq_format: str = defaults["laaq_format"].default
            """Activation format of the saved roles ("nf4", "int4", "fp4_e2m1", "int8", ... or "native")."""
            laaq_block: int = defaults["laaq_block"].default
            convert_final_norm: bool = defaults["convert_final_norm"].default
            """Also convert the final norm and lm_head (off: torchtitan's chunked loss detaches between them)."""
            quangrad: bool = defaults["quangrad"].default
            """QuanGrad's 8-bit all-to-all reduce-scatter for FSDP2."""
            quangrad_format: str = defaults["quangrad_format"].default
            quangrad_threshold_bytes: int = defaults["quangrad_threshold_bytes"].default
            """FSDP buckets smaller than this (fp32 bytes) keep FSDP's own reduce-scatter."""
            backend: str | None = defaults["backend"].default

            def __post_init__(self) -> None:
                _options(self)  # fail at config time, with AgoqOptions' messages

        def __init__(self, config: Any) -> None:
            self.config = config
            self.options = _options(config)

        def convert(self, model_config: Any) -> Any:
            owner = getattr(type(model_config), "_owner", None)
            if owner is None or not isinstance(owner, type) or not issubclass(owner, nn.Module):
                raise AgoqError(f"agoq converter: {type(model_config).__name__} does not build a torch module")
            if getattr(owner, "__name__", "").startswith("Agoq"):
                raise AgoqError("agoq converter: the model config is already converted; list the converter once")
            cls = _agoq_model_cls(owner)
            kw = {f.name: getattr(model_config, f.name) for f in fields(model_config) if f.init}
            log.info("agoq converter: %s -> %s (%s)", owner.__name__, cls.__name__, self.options)
            return cls.Config(**kw, agoq=self.config)

    return {"AgoqConverter": AgoqConverter}


@functools.lru_cache(maxsize=1)
def _classes() -> dict[str, type]:
    try:
        return _converter_classes()
    except ImportError as e:
        if "DataParallelMeshDims" in str(e):
            raise AgoqError(f"torchtitan 0.3.0 does not import on torch {torch.__version__} ({e}); call "
                            "agoq_core.integrations.torchtitan.torch_compat() before the first torchtitan import, "
                            "or use torch >= 2.12") from e
        raise AgoqError(f"agoq's torchtitan converter needs torchtitan (tested: {', '.join(TESTED_TORCHTITAN)}); "
                        f"pip install torchtitan: {e}") from e


def __getattr__(name: str) -> Any:  # PEP 562: build the torchtitan classes on first use
    if name == "AgoqConverter":
        return _classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---- torchtitan config functions (``--module agoq_core.integrations.torchtitan --config NAME``) -------------

def _with_agoq(config: Any, flavor: str, **options: Any) -> Any:
    from torchtitan.models.llama3 import model_registry

    config.model_spec = model_registry(flavor, converters=[_classes()["AgoqConverter"].Config(**options)])
    config.activation_checkpoint = None
    return config


def llama3_debugmodel_agoq() -> Any:
    """torchtitan's llama3_debugmodel with the agoq converter (LAAQ + QuanGrad), checkpointing off."""
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    return _with_agoq(llama3_debugmodel(), "debugmodel", quangrad=True)


def llama3_8b_agoq() -> Any:
    """torchtitan's llama3_8b with the agoq converter (LAAQ + QuanGrad), checkpointing off."""
    from torchtitan.models.llama3.config_registry import llama3_8b

    return _with_agoq(llama3_8b(), "8B", quangrad=True)
