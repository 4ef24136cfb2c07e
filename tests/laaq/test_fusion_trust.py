"""fusion._checked_call: the trusted (check-free) form of a variant runs once when the variant becomes trusted
-- so its kernel is compiled in the warm-up step, not in the next one -- and must give the checked bits."""
from __future__ import annotations

import types

import torch

from agoq_core.laaq import fusion


def _call(run, monkeypatch, want):
    monkeypatch.setattr(fusion, "TRUST_ELEMENTS", 8)
    be = types.SimpleNamespace(name="fake")
    return fusion._checked_call("op", be, ("op", "k"), ("v0", "v1"), 8, run, lambda: (want,))


def test_trusted_form_runs_once_at_the_trust_call(monkeypatch):
    monkeypatch.setattr(fusion, "_choices", {})
    want = torch.arange(8.0)
    calls = []

    def run(v, check):
        calls.append((v, check))
        return (want.clone(), torch.ones(1) if check else None)  # the check adds an output the trusted form lacks

    out = _call(run, monkeypatch, want)
    assert calls == [("v0", True), ("v0", False)] and torch.equal(out[0], want)
    calls.clear()
    _call(run, monkeypatch, want)  # trusted: the check-free form alone
    assert calls == [("v0", False)]


def test_a_trusted_form_with_other_bits_is_dropped(monkeypatch):
    monkeypatch.setattr(fusion, "_choices", {})
    want = torch.arange(8.0)

    def run(v, check):
        return (want.clone() if check or v == "v1" else want + 1,)  # v0 differs without its check outputs

    out = _call(run, monkeypatch, want)
    assert torch.equal(out[0], want)  # the unfused result
    ch = fusion._choices[("op", "k")]
    assert ch.variants == ["v1"] and ch.checked == 0
    _call(run, monkeypatch, want)  # v1 checked, then trusted in its check-free form (same bits)
    assert ch.variants == ["v1"] and ch.checked == 8
