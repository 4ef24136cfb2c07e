"""`agoq plan --cluster`: the table, --json schema, bad input; plain `agoq plan` unchanged."""
from __future__ import annotations

import json

import pytest

from agoq_core.cli.main import main

ISSUE_CMD = ["--cluster", "64xA6000", "--inter", "200Gbps", "--tp", "8", "--pp", "4", "--dp", "2",
             "--model", "llama2-13b", "--seq-len", "65536"]


def run(capsys, *args):
    code = main(["plan", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_issue_command_table(capsys):
    code, out, _ = run(capsys, *ISSUE_CMD)
    assert code == 0
    assert "llama2-13b on 64xA6000 (8 node(s) x 8), tp 8 x pp 4 x dp 2" in out
    assert "PREDICTION of a cost model" in out
    rows = [l for l in out.splitlines() if l[:1].isdigit()]
    assert [r.split()[0] for r in rows] == ["0", "1", "2", "3"]      # one memory row per stage
    for label in ("compute", "recompute", "TP communication", "pipeline bubble", "DP gradient sync", "total"):
        assert any(l.startswith(label) for l in out.splitlines()), label
    assert "predicted speedup of AGoQ" in out


def test_json_schema(capsys):
    code, out, _ = run(capsys, *ISSUE_CMD, "--schedule", "1f1b", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["schema"] == 1 and d["kind"] == "agoq-cluster-prediction"
    assert set(d) >= {"model", "cluster", "parallel", "seq_len", "accounting", "baseline", "agoq", "speedup", "notes"}
    assert d["parallel"] == {"tp": 8, "pp": 4, "dp": 2, "schedule": "1f1b", "chunks": 1, "microbatches": 8,
                             "microbatch_size": 1, "zero": 0}
    assert d["cluster"]["network"]["inter"]["line_rate"] == 25e9
    for arm in ("baseline", "agoq"):
        a = d[arm]
        assert set(a) >= {"fits", "recompute_layers_per_virtual_stage", "peak_bytes", "stages", "step_s", "tokens_per_s"}
        assert len(a["stages"]) == 4
        assert set(a["step_s"]) == {"compute", "recompute", "tp_comm", "bubble", "dp_comm", "optimizer", "total"}
        assert a["peak_bytes"] == max(s["total_bytes"] for s in a["stages"])
        for s in a["stages"]:
            assert s["total_bytes"] == sum(s["static_bytes"].values()) + s["activation_peak_bytes"]
    assert sum(d["agoq"]["stages"][0]["formats"].values()) == 10  # 40 layers / 4 stages
    assert d["speedup"] == pytest.approx(d["baseline"]["step_s"]["total"] / d["agoq"]["step_s"]["total"])


def test_network_profile_file(capsys, tmp_path):
    from agoq_core.scale.network import network_for

    network_for("nvlink4", "eth-25", nics_per_node=8, name="mine").to_json(tmp_path / "n.json")
    code, out, _ = run(capsys, "--cluster", "16xH100", "--network", str(tmp_path / "n.json"), "--tp", "8", "--pp",
                       "1", "--dp", "2", "--schedule", "1f1b", "--model", "llama3-8b", "--seq-len", "8192", "--json")
    assert code == 0
    assert json.loads(out)["cluster"]["network"]["name"] == "mine"


@pytest.mark.parametrize("args,msg", [
    (["--cluster", "64xA6000", "--tp", "8", "--pp", "4", "--dp", "4"],
     "tp(8) * pp(4) * dp(4) = 128 != 64 devices of 64xA6000"),
    (["--cluster", "64xB300"], "unknown device 'B300'"),
    (["--cluster", "64xA6000", "--inter", "fast", "--tp", "8", "--pp", "4", "--dp", "2"], "cannot read 'fast' as a rate"),
    (["--cluster", "sixty-four"], "write DEVICESxTYPE"),
    (["--tp", "8"], "--tp describe a cluster prediction and need --cluster"),
    (["--cluster", "8xH100", "--tp", "8"], "not a multiple of tp(8) * pp(4) = 32; give --tp, --pp and --dp"),
    (["--cluster", "8xH100", "--tp", "8", "--pp", "1", "--dp", "1", "--network", "nope"], "no network profile 'nope'"),
    (["--cluster", "64xA6000", "--tp", "8", "--pp", "4", "--dp", "2", "--schedule", "interleaved-1f1b",
      "--microbatches", "9"], "nearest that work: 8 or 10"),
])
def test_bad_input(capsys, args, msg):
    code, _, err = run(capsys, *args)
    assert code == 2
    assert err.startswith("agoq plan: error:") and msg in err, err


def test_dp_is_the_rest_of_the_devices(capsys):
    code, out, _ = run(capsys, "--cluster", "64xA6000", "--tp", "8", "--pp", "4", "--schedule", "1f1b", "--json")
    assert code == 0 and json.loads(out)["parallel"]["dp"] == 2


def test_plain_plan_unchanged(capsys):
    code, out, _ = run(capsys, "--stages", "4", "--microbatches", "8", "--activations", "bits")
    assert code == 0 and "DBCA-PP plan: llama2-7b, interleaved-1f1b, 4 stages" in out
