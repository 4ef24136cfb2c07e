"""LAAQConfig: defaults = the paper, presets, per-layer overrides, and clear errors for bad input."""
from __future__ import annotations

import pytest

from agoq_core.errors import FormatError
from agoq_core.formats.spec import get_format
from agoq_core.laaq import NATIVE, ROLES, LAAQConfig


def test_default_is_the_paper_policy():
    plan = LAAQConfig().plan(0)
    for role in ("norm_input", "mlp_act_input", "attn_out_input"):
        assert plan[role].bits == 4 and plan[role].block == 128
    assert plan["attention_core"] is None  # left to the attention kernel (16-bit)
    assert LAAQConfig.paper() == LAAQConfig()


def test_uniform_and_naive_presets():
    naive = LAAQConfig.uniform("int4", include_attention=True).plan(3)
    assert all(naive[r].name == "int4" for r in ROLES)
    eight = LAAQConfig.uniform("int8").plan(None)
    assert eight["attention_core"] is None and eight["norm_input"].name == "int8"
    assert all(v == NATIVE for v in LAAQConfig.native().plan(0).names().values())


def test_layer_overrides_only_touch_their_layer_and_roles():
    cfg = LAAQConfig(layer_overrides={1: {"norm_input": "int8"}, 2: {"mlp_act_input": "int5", "norm_input": NATIVE}})
    assert cfg.plan(0)["norm_input"].name == "nf4"
    assert cfg.plan(1)["norm_input"].name == "int8" and cfg.plan(1)["mlp_act_input"].name == "nf4"
    assert cfg.plan(2)["norm_input"] is None and cfg.plan(2)["mlp_act_input"].name == "int5"
    assert cfg.plan(None)["norm_input"].name == "nf4"  # final norm: no override
    with pytest.raises(TypeError):
        cfg.layer_overrides[5] = {}  # frozen


def test_block_applies_to_named_formats_but_not_to_specs():
    cfg = LAAQConfig(block=64, mlp_act_input=get_format("int6", 256))
    assert cfg.plan(0)["norm_input"].block == 64
    assert cfg.plan(0)["mlp_act_input"].block == 256


@pytest.mark.parametrize("kwargs, match", [
    ({"norm_input": "int3"}, "not an activation format"),
    ({"norm_input": "fp8_e4m3"}, "not an activation format"),
    ({"norm_input": 4}, "must be a format name"),
    ({"block": 100}, "multiple of 8"),
    ({"block": True}, "multiple of 8"),
    ({"mlp_act_input": get_format("fp8_e5m2")}, "gradient format"),
])
def test_bad_formats_are_rejected(kwargs, match):
    with pytest.raises(FormatError, match=match):
        LAAQConfig(**kwargs)


@pytest.mark.parametrize("overrides, exc, match", [
    ({-1: {"norm_input": "int8"}}, ValueError, "layer index"),
    ({"0": {"norm_input": "int8"}}, ValueError, "layer index"),
    ({0: {"qkv": "int8"}}, ValueError, "unknown role 'qkv'"),
    ({0: "int8"}, TypeError, "must be a mapping"),
    ({0: {"norm_input": "int2"}}, FormatError, "not an activation format"),
])
def test_bad_overrides_are_rejected(overrides, exc, match):
    with pytest.raises(exc, match=match):
        LAAQConfig(layer_overrides=overrides)


def test_config_is_frozen_and_keyword_only():
    cfg = LAAQConfig()
    with pytest.raises(Exception):
        cfg.norm_input = "int8"
    with pytest.raises(TypeError):
        LAAQConfig("int8")  # keyword-only
    assert cfg.replace(norm_input="int8").plan(0)["norm_input"].name == "int8"
