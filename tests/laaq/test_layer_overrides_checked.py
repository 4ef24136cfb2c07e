"""A LAAQ layer override for a layer the model does not have is an error, not silently ignored
(issue 15 §9)."""
from __future__ import annotations

import pytest

from agoq_core.errors import AgoqError
from agoq_core.laaq import LAAQConfig, apply

from .conftest import tiny_model


def test_override_of_a_missing_layer_is_refused_and_nothing_is_converted():
    model = tiny_model(layers=2)
    cfg = LAAQConfig(layer_overrides={5: {"norm_input": "int8"}})
    with pytest.raises(AgoqError, match=r"layer\(s\) \[5\] but LlamaForCausalLM has decoder layers \[0, 1\]"):
        apply(model, cfg)
    assert "_agoq_laaq_report" not in model.__dict__  # refused before touching the model


def test_override_of_an_existing_layer_applies():
    model = tiny_model(layers=2)
    report = apply(model, LAAQConfig(layer_overrides={1: {"norm_input": "int8"}}))
    assert any(c.layer == 1 and "int8" in str(c.formats) for c in report.converted)
