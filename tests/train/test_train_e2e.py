"""``agoq train`` end to end on the tiny model: run folder, table, JSON, plot, DP and accumulation."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agoq_core.cli.main import main
from agoq_core.train.report import render_table

# A few steps of the tiny model on 32-token windows: seconds per arm on 2 CPU cores.
SMALL = ["--steps", "3", "--eval-every", "2", "--seq-len", "32", "--eval-tokens", "128", "--no-progress"]


def _run(tmp_path: Path, name: str, *extra: str, capsys=None) -> dict:
    rc = main(["train", *SMALL, "--out-dir", str(tmp_path), "--run-name", name, "--json", *extra])
    assert rc == 0
    if capsys is not None:
        return json.loads(capsys.readouterr().out)
    return json.loads((tmp_path / name / "summary.json").read_text())


def _steps(run_dir: Path, arm: str) -> list[dict]:
    recs = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if r["arm"] == arm and r["kind"] == "step"]


def test_default_comparison_end_to_end(tmp_path, capsys):
    s = _run(tmp_path, "e2e", "--micro-batch", "4", capsys=capsys)
    run_dir = tmp_path / "e2e"
    for f in ("config.json", "metrics.jsonl", "summary.json", "table.md", "curves.png"):
        assert (run_dir / f).is_file(), f
    assert json.loads((run_dir / "summary.json").read_text()) == s      # --json prints what is saved
    assert (run_dir / "table.md").read_text() == render_table(s) + "\n"
    png = (run_dir / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert json.loads((run_dir / "config.json").read_text())["steps"] == 3

    arms = {a["name"]: a for a in s["arms"]}
    assert list(arms) == ["baseline", "agoq"] and all(a["status"] == "ok" for a in arms.values())
    recs = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for name, arm in arms.items():
        steps = [r for r in recs if r["arm"] == name and r["kind"] == "step"]
        evals = [r for r in recs if r["arm"] == name and r["kind"] == "eval"]
        assert [r["step"] for r in steps] == [1, 2, 3] and [r["step"] for r in evals] == [2, 3]
        assert arm["final_val_loss"] == evals[-1]["val_loss"]
        assert arm["final_train_loss"] == pytest.approx(sum(r["loss"] for r in steps) / 3, rel=1e-12)
        assert steps[-1]["tokens"] == 3 * 4 * 32
        assert all(r["grad_norm"] > 0 for r in steps)
    # Same seed and data, and neither LAAQ nor QuanGrad changes the forward pass: step 1 agrees.
    b, a = _steps(run_dir, "baseline"), _steps(run_dir, "agoq")
    assert a[0]["loss"] == pytest.approx(b[0]["loss"], rel=1e-6)
    # Measured memory: 4-bit activations, 8-bit gradients (1 byte + a 4-byte scale per 256), same AdamW.
    mb, ma = arms["baseline"]["memory"], arms["agoq"]["memory"]
    assert ma["activations_decoder_layers"] < 0.4 * mb["activations_decoder_layers"]
    assert 0.25 <= ma["gradients"] / mb["gradients"] <= 0.26
    assert ma["optimizer_state"] == mb["optimizer_state"]
    assert s["ratios_vs_baseline"]["agoq"]["gradients"] == ma["gradients"] / mb["gradients"]


def test_progress_bar_goes_to_stderr_and_table_to_stdout(tmp_path, capsys):
    rc = main(["train", "--steps", "2", "--seq-len", "32", "--eval-tokens", "64", "--no-agoq", "--no-plot",
               "--out-dir", str(tmp_path), "--run-name", "p"])
    out, err = capsys.readouterr()
    assert rc == 0
    assert out.startswith("| metric | baseline |") and "run folder:" in out
    assert "baseline" in err and "2/2" in err          # tqdm's bar
    assert not (tmp_path / "p" / "curves.png").exists()


def test_gradient_accumulation_matches_one_big_micro_batch(tmp_path):
    # 2 micro-batches of 2 windows == 1 micro-batch of 4 (same windows, mean loss): same trajectory.
    big = _run(tmp_path, "mb4", "--micro-batch", "4", "--no-agoq", "--no-plot")
    acc = _run(tmp_path, "acc2", "--micro-batch", "2", "--grad-accum", "2", "--no-agoq", "--no-plot")
    lb = [r["loss"] for r in _steps(tmp_path / "mb4", "baseline")]
    la = [r["loss"] for r in _steps(tmp_path / "acc2", "baseline")]
    assert la == pytest.approx(lb, rel=1e-5)
    assert acc["tokens_per_step"] == big["tokens_per_step"]


def test_an_arm_that_cannot_mean_anything_is_reported_not_replaced(tmp_path, capsys):
    # one process: the naive FP8 all-reduce has nothing to reduce, so it would be the agoq arm again
    rc = main(["train", "--steps", "1", "--seq-len", "32", "--eval-tokens", "64", "--no-progress", "--no-plot",
               "--no-agoq", "--ablation", "naive-fp8-allreduce", "--out-dir", str(tmp_path), "--run-name", "u"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "naive-fp8-allreduce: unavailable: the naive FP8 all-reduce differs from QuanGrad's only" in out
    s = json.loads((tmp_path / "u" / "summary.json").read_text())
    assert [a["status"] for a in s["arms"]] == ["ok", "unavailable"]


@pytest.mark.parametrize("argv,needle", [
    (["--model", "huge"], "unknown model size 'huge'; choose one of"),
    (["--nproc", "0"], "nproc must be a positive integer, got 0"),
    (["--nproc", "3", "--pp", "2"], "nproc (3) must be a multiple of pp (2)"),
    (["--ablation", "fp4-everything"], "unknown ablation 'fp4-everything'; choose from"),
    (["--device", "cuda"], "torch sees no cuda device here"),
    (["--config", "/nonexistent/run.toml"], "does not exist"),
])
def test_bad_input_exits_2_with_a_clear_message(argv, needle, capsys):
    assert main(["train", *argv]) == 2
    assert needle in capsys.readouterr().err


def test_non_integer_nproc_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["train", "--nproc", "two"])
    assert exc.value.code == 2
    assert "--nproc: invalid int value: 'two'" in capsys.readouterr().err


def test_existing_named_run_folder_is_not_overwritten(tmp_path, capsys):
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "summary.json").write_text("{}")
    assert main(["train", "--out-dir", str(tmp_path), "--run-name", "keep", "--steps", "1"]) == 2
    assert "already exists and is not empty" in capsys.readouterr().err


@pytest.mark.dist
def test_nproc2_gloo_matches_one_process(tmp_path):
    """--nproc 2 spawns 2 gloo ranks; each takes half of the global batch, so the baseline follows the
    1-process run on the same 4 windows per step, and both arms finish on both ranks."""
    one = _run(tmp_path, "one", "--micro-batch", "4", "--no-agoq", "--no-plot", "--ablation", "naive-fp8-allreduce")
    two = _run(tmp_path, "two", "--micro-batch", "2", "--nproc", "2", "--ablation", "naive-fp8-allreduce")
    assert two["environment"]["world"] == 2 and two["environment"]["dist_backend"] == "gloo"
    assert two["tokens_per_step"] == one["tokens_per_step"]
    assert [a["status"] for a in two["arms"]] == ["ok", "ok", "ok"]
    # one process: nothing is reduced, so the naive all-reduce arm would be the agoq arm; it says so
    assert one["arms"][1]["status"] == "unavailable" and "--nproc 2 or more" in one["arms"][1]["reason"]
    # two processes: the naive FP8 sum (one shared scale, FP8 partial sums) changes the trajectory
    la = [r["loss"] for r in _steps(tmp_path / "two", "agoq")]
    ln = [r["loss"] for r in _steps(tmp_path / "two", "naive-fp8-allreduce")]
    assert la[0] == ln[0] and la[-1] != ln[-1]
    l1 = [r["loss"] for r in _steps(tmp_path / "one", "baseline")]
    l2 = [r["loss"] for r in _steps(tmp_path / "two", "baseline")]
    assert l2 == pytest.approx(l1, rel=1e-5)
    qg = next(a for a in two["arms"] if a["name"] == "agoq")
    assert any("2 ranks" in n for n in qg["notes"])       # QuanGrad reduced over both ranks


@pytest.mark.dist
@pytest.mark.slow
def test_torchrun_launch(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "agoq_core.cli.main", "train", *SMALL, "--micro-batch", "2", "--no-agoq", "--no-plot",
           "--out-dir", str(tmp_path), "--run-name", "tr", "--json"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    s = json.loads(out.stdout)                             # only rank 0 prints
    assert s["environment"]["world"] == 2
    assert json.loads((tmp_path / "tr" / "summary.json").read_text())["run_dir"] == s["run_dir"]


@pytest.mark.dist
@pytest.mark.slow
def test_pipeline_two_stages_with_dbca_pp_plan(tmp_path):
    """--pp 2: 1F1B over 2 gloo ranks; the AGoQ stage policies come from the DBCA-PP plan; the
    pipelined baseline follows the 1-process baseline on the same batches."""
    one = _run(tmp_path, "one", "--micro-batch", "4", "--no-agoq", "--no-plot")
    pp = _run(tmp_path, "pp", "--micro-batch", "4", "--nproc", "2", "--pp", "2", "--no-plot")
    assert [a["status"] for a in pp["arms"]] == ["ok", "ok"], [a["reason"] for a in pp["arms"]]
    l1 = [r["loss"] for r in _steps(tmp_path / "one", "baseline")]
    lp = [r["loss"] for r in _steps(tmp_path / "pp", "baseline")]
    assert lp == pytest.approx(l1, rel=1e-4)
    agoq = next(a for a in pp["arms"] if a["name"] == "agoq")
    assert any(n.startswith("DBCA-PP plan") for n in agoq["notes"])
    assert len(agoq["memory_per_rank"]) == 2
    for s in range(2):
        assert agoq["memory"][f"planned_activations_stage{s}"] > 0
        assert 0 < agoq["memory"][f"activations_stage{s}"] < pp["arms"][0]["memory"][f"activations_stage{s}"]
    eval_b = pp["arms"][0]["final_val_loss"]
    assert eval_b == pytest.approx(one["arms"][0]["final_val_loss"], rel=1e-4)  # gathered stages evaluate right


def test_compile_every_arm(tmp_path):
    """--compile BACKEND: every arm's decoder layers torch.compile'd (LAAQ's traceable path inside, QuanGrad's hooks
    around); the same losses as the eager run; the activation meter reads the second step (the first traces)."""
    eager = _run(tmp_path, "eager", "--micro-batch", "2", "--steps", "2")
    comp = _run(tmp_path, "compiled", "--micro-batch", "2", "--steps", "2", "--compile", "eager")
    a0, a1 = ({a["name"]: a for a in s["arms"]} for s in (eager, comp))
    assert list(a1) == ["baseline", "agoq"] and all(a["status"] == "ok" for a in a1.values()), a1
    for name in a1:
        assert any("torch.compile'd (backend eager)" in n for n in a1[name]["notes"]), a1[name]["notes"]
        assert a1[name]["final_train_loss"] == pytest.approx(a0[name]["final_train_loss"], rel=1e-6)
        assert a1[name]["memory"]["activations_decoder_layers"] > 0
    assert a1["agoq"]["memory"]["activations_decoder_layers"] < 0.4 * a1["baseline"]["memory"]["activations_decoder_layers"]


def test_compile_option_is_checked():
    from agoq_core.train.config import ConfigError, TrainConfig

    with pytest.raises(ConfigError, match="compile must be one of inductor, aot_eager, eager"):
        TrainConfig(compile="tensorrt-ish")
    with pytest.raises(ConfigError, match="--compile with --pp"):
        TrainConfig(compile="inductor", nproc=2, pp=2)
