"""The table and ratios, on a summary written by hand (independent of the loop)."""
from __future__ import annotations

from agoq_core.train.report import compare_arms, render_table


def _arm(name, status="ok", **kw):
    a = {"name": name, "status": status, "reason": kw.pop("reason", ""), "params": 1_000_000,
         "final_train_loss": kw.get("train"), "final_val_loss": kw.get("val"), "tokens_per_s": kw.get("tps"),
         "memory": kw.get("memory", {})}
    return a


def _summary(arms):
    return {"arms": arms, "config": {"model": "tiny", "steps": 3}, "tokens_per_step": 256,
            "environment": {"device": "cpu", "dtype": "fp32", "world": 1, "agoq_backend": "reference"}}


def test_ratios_and_cells():
    mem_b = {"activations": 4 * 2**20, "activations_decoder_layers": 3 * 2**20, "gradients": 2**20,
             "optimizer_state": 2 * 2**20}
    mem_a = {"activations": 2**20, "activations_decoder_layers": 2**19, "gradients": 2**18,
             "optimizer_state": 2 * 2**20}
    s = _summary([_arm("baseline", train=4.0, val=5.0, tps=1000.0, memory=mem_b),
                  _arm("agoq", train=4.04, val=5.02, tps=500.0, memory=mem_a),
                  _arm("uniform4-attn", "unavailable", reason="LAAQ is missing")])
    r = compare_arms(s)["agoq"]
    assert abs(r["final_val_loss"] - 5.02 / 5.0) < 1e-12
    assert r["tokens_per_s"] == 0.5
    assert r["activations"] == 0.25 and r["gradients"] == 0.25 and r["optimizer_state"] == 1.0
    assert r["act+grad+opt"] == (2**20 + 2**18 + 2 * 2**20) / (7 * 2**20)
    assert "uniform4-attn" not in compare_arms(s)
    t = render_table(s)
    lines = t.splitlines()
    assert lines[0] == "| metric | baseline | agoq | agoq / baseline | uniform4-attn |"
    row = next(l for l in lines if l.startswith("| validation loss"))
    assert row.split(" | ")[1:4] == ["5.0000", "5.0200", "1.004"]
    row = next(l for l in lines if l.startswith("| activations (saved"))
    assert "4.00 MiB" in row and "1.00 MiB" in row and "0.250" in row and row.endswith("| unavailable |")
    assert "uniform4-attn: unavailable: LAAQ is missing" in t
    assert "peak device memory" not in t  # not measured on CPU: no row


def test_no_baseline_no_ratios():
    s = _summary([_arm("agoq", train=1.0, val=1.0, tps=1.0)])
    assert compare_arms(s) == {}
    assert render_table(s).splitlines()[0] == "| metric | agoq |"
