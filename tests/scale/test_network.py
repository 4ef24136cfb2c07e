"""Rates, link presets and network profile files."""
from __future__ import annotations

import json

import pytest

from agoq_core.scale import ScaleError
from agoq_core.scale.network import INTER_LINKS, NetworkProfile, load_profile, network_for, parse_rate


@pytest.mark.parametrize("text,bytes_per_s", [
    ("200Gbps", 25e9), ("200Gb/s", 25e9), ("200 Gbps", 25e9), ("25GbE", 3.125e9), ("400G", 50e9),
    ("900GB/s", 900e9), ("100Mbps", 12.5e6), ("1.5Tbps", 187.5e9), (5e9, 5e9), ("10gbps", 1.25e9),
])
def test_parse_rate(text, bytes_per_s):
    assert parse_rate(text) == pytest.approx(bytes_per_s)


@pytest.mark.parametrize("text", ["fast", "200 Gbps please", "-5Gbps", "0Gbps", ""])
def test_parse_rate_bad(text):
    with pytest.raises(ScaleError, match="rate"):
        parse_rate(text)


def test_network_for_rate_and_preset():
    n = network_for("pcie4", "200Gbps")
    assert n.inter.line_rate == 25e9 and n.inter.alpha == INTER_LINKS["ib-200"].alpha
    assert network_for("nvlink4", "eth-25").inter is INTER_LINKS["eth-25"]
    with pytest.raises(ScaleError, match="unknown intra-node link 'nvlink9'; known: nvlink4"):
        network_for("nvlink9", "200Gbps")


def test_profile_json_round_trip(tmp_path):
    n = network_for("nvlink4", "ib-400", nics_per_node=8, name="x")
    n.to_json(tmp_path / "x.json")
    assert load_profile(tmp_path / "x.json") == n
    assert NetworkProfile.from_dict(json.loads((tmp_path / "x.json").read_text())).inter_bandwidth_per_gpu(8) == \
        n.inter.bandwidth


def test_load_profile_errors(tmp_path):
    with pytest.raises(ScaleError, match="no network profile 'nope'"):
        load_profile("nope")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ScaleError, match="not valid JSON"):
        load_profile(tmp_path / "bad.json")
    (tmp_path / "wrong.json").write_text("{}")
    with pytest.raises(ScaleError, match="not a network profile"):
        load_profile(tmp_path / "wrong.json")


def test_shipped_gloo_profile_is_measured():
    p = load_profile("gloo-localhost")
    assert p.source == "measured" and p.fitted["backend"] == "gloo" and p.fitted["world"] >= 2
    assert p.intra.alpha > 0 and p.intra.bandwidth > 0
