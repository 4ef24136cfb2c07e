"""A LAAQ layer override for a layer the model does not have is never silently ignored (issue 15 §9):
it is a skipped entry of the report, with the model's layers, and a warning. (Not an error: a pipeline
stage applies the whole model's config to the layers it holds.)"""
from __future__ import annotations

import logging

from agoq_core.laaq import LAAQConfig, apply

from .conftest import tiny_model


def test_override_of_a_missing_layer_is_reported(caplog):
    model = tiny_model(layers=2)
    with caplog.at_level(logging.WARNING, logger="agoq.laaq"):
        report = apply(model, LAAQConfig(layer_overrides={5: {"norm_input": "int8"}}))
    skip = [s for s in report.skipped if s.path == "layer_overrides"]
    assert len(skip) == 1 and "layer(s) [5] match no decoder layer" in skip[0].reason and "[0, 1]" in skip[0].reason
    assert "layer(s) [5] match no decoder layer" in caplog.text
    assert "layer(s) [5]" in str(report)


def test_override_of_an_existing_layer_applies_without_a_skip():
    model = tiny_model(layers=2)
    report = apply(model, LAAQConfig(layer_overrides={1: {"norm_input": "int8"}}))
    assert any(c.layer == 1 and "int8" in str(c.formats) for c in report.converted)
    assert not [s for s in report.skipped if s.path == "layer_overrides"]
