"""`agoq plan`: the table, --json, and bad input as users see them."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agoq_core.cli.main import main


def run(capsys, *args):
    code = main(["plan", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_paper_example_table(capsys):
    code, out, _ = run(capsys, "--stages", "4", "--microbatches", "8", "--schedule", "interleaved-1f1b",
                       "--activations", "bits")
    assert code == 0
    plan_table = out.split("paper closed form")[0]
    rows = {line.split()[0]: line for line in plan_table.splitlines() if line[:1].isdigit()}
    assert [rows[str(i)].split()[1] for i in range(4)] == ["11", "9", "7", "5"]
    assert "(8+4)" in rows["0"] and "(5+1)" in rows["3"]
    assert "45 vs 44 OVER" in out and "NO (+4 bit)" in out   # the closed form's stage 2
    assert "action lists identical to torch" in out or "not checked against torch" in out
    for i in range(4):  # the plan itself never goes over: used <= 100%
        used = float(rows[str(i)].split("%")[0].split()[-1])
        assert used <= 100.0


def test_json_output(capsys):
    code, out, _ = run(capsys, "--stages", "2", "--microbatches", "4", "--schedule", "1f1b", "--model", "tiny",
                       "--seq-len", "64", "--activations", "formula", "--json")
    assert code == 0
    d = json.loads(out)
    assert [s["inflight_peak"] for s in d["stages_plan"]] == [2, 1]
    assert d["budget"]["kind"] == "uniform-baseline"
    assert all(s["activation_peak"] <= s["activation_cap"] for s in d["stages_plan"])
    assert d["closed_form"][1]["bits"] == 8


def test_hf_config_file(capsys, tmp_path):
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2).save_pretrained(tmp_path)
    code, out, _ = run(capsys, "--model", str(tmp_path), "--stages", "2", "--microbatches", "2", "--schedule",
                       "gpipe", "--seq-len", "32", "--activations", "formula", "--json")
    assert code == 0
    assert json.loads(out)["shape"] == {"hidden": 128, "layers": 4, "heads": 4, "kv_heads": 2,
                                        "intermediate": 352, "vocab": 512}


@pytest.mark.parametrize("args,msg", [
    (["--schedule", "interleaved-1f1b", "--microbatches", "9"], "nearest that work: 8 or 10"),
    (["--schedule", "1f1b", "--stages", "4", "--microbatches", "2"], "microbatches >= stages"),
    (["--candidates", "int4,int7"], "unknown format 'int7'"),
    (["--model", "gpt5"], "unknown model 'gpt5'"),
    (["--activations", "formula", "--budget-bytes", "20GiB"], "Smallest budget that fits every stage"),
    (["--activations", "formula", "--budget-bytes", "lots"], "cannot read 'lots' as bytes"),
])
def test_bad_input_exits_2_with_the_reason(capsys, args, msg):
    code, out, err = run(capsys, *args)
    assert code == 2
    assert msg in err and err.startswith("agoq plan: error:")


def test_console_script_runs():
    env = {k: v for k, v in os.environ.items() if k != "AGOQ_BACKEND"}
    out = subprocess.run([sys.executable, "-m", "agoq_core.cli.main", "plan", "--activations", "bits",
                          "--schedule", "1f1b", "--stages", "3", "--microbatches", "6"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "DBCA-PP plan: llama2-7b, 1f1b, 3 stages" in out.stdout
