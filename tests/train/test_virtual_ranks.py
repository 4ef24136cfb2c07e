"""``agoq train --virtual-ranks W`` against a real ``--nproc W`` gloo run: the same parameters, bit for bit.

Both runs use one torch thread per process so that every matmul runs the same kernel; the arms
share the seed and the data split, so any difference comes from the gradient reduction.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agoq_core.cli.main import main

# The tiny model, 3 steps of 2 x 32-token windows per rank, two micro-batches per step (accumulation).
SMALL = ["--steps", "3", "--eval-every", "0", "--seq-len", "32", "--micro-batch", "2", "--grad-accum", "2",
         "--eval-tokens", "128", "--threads", "1", "--no-progress", "--no-plot",
         "--ablation", "naive-fp8-allreduce"]


def _run(tmp_path: Path, name: str, *extra: str) -> dict:
    assert main(["train", *SMALL, "--out-dir", str(tmp_path), "--run-name", name, *extra]) == 0
    return json.loads((tmp_path / name / "summary.json").read_text())


def _records(tmp_path: Path, name: str, kind: str) -> list[dict]:
    recs = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if r["kind"] == kind]


@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 4])
def test_virtual_ranks_train_the_parameters_of_a_real_gloo_run(tmp_path, world):
    # W = 4: no baseline arm (gloo's own ring order is not modelled, see below), to keep the test short.
    arms = [] if world == 2 else ["--no-baseline"]
    real = _run(tmp_path, "real", "--nproc", str(world), *arms)
    virt = _run(tmp_path, "virt", "--virtual-ranks", str(world), *arms)
    r_arms = {a["name"]: a for a in real["arms"]}
    v_arms = {a["name"]: a for a in virt["arms"]}
    assert list(v_arms) == ["baseline", "agoq", "naive-fp8-allreduce"][0 if world == 2 else 1:]
    assert all(a["status"] == "ok" for a in [*r_arms.values(), *v_arms.values()])
    assert virt["tokens_per_step"] == real["tokens_per_step"] == world * 2 * 2 * 32
    digests = {n: a["param_digest"] for n, a in v_arms.items()}
    assert len(set(digests.values())) == len(digests), "the arms must train different parameters"
    # QuanGrad and the naive FP8 all-reduce sum in rank order by construction: bit-identical at any W.
    for name in ("agoq", "naive-fp8-allreduce"):
        assert v_arms[name]["param_digest"] == r_arms[name]["param_digest"], f"{name} at W={world}"
    # DDP's gloo all-reduce: two fp32 addends commute, so W = 2 is bit-identical; from W = 3 gloo's ring
    # adds each quarter of a bucket in another rotation of the ranks (agoq_core/quangrad/virtual.py).
    if world == 2:
        assert v_arms["baseline"]["param_digest"] == r_arms["baseline"]["param_digest"]
    r_steps, v_steps = _records(tmp_path, "real", "step"), _records(tmp_path, "virt", "step")
    for r, v in zip(r_steps, v_steps):
        assert (r["arm"], r["step"]) == (v["arm"], v["step"])
        assert v["loss"] == pytest.approx(r["loss"], rel=1e-6)
        assert v["grad_norm"] == pytest.approx(r["grad_norm"], rel=1e-12)


def test_grad_error_records(tmp_path):
    _run(tmp_path, "err", "--virtual-ranks", "2", "--grad-error-every", "2", "--no-baseline")
    recs = _records(tmp_path, "err", "grad_error")
    assert [(r["arm"], r["step"]) for r in recs] == [("agoq", 1), ("agoq", 3), ("naive-fp8-allreduce", 1),
                                                     ("naive-fp8-allreduce", 3)]
    q, n = recs[0]["errors"], recs[2]["errors"]
    assert recs[0]["fields"] == ["error", "collective_error", "exact_norm"]
    assert len(q) == 39 and set(q) == set(n)  # every parameter of the tiny model (4 layers x 9 + 3)
    for name in q:
        assert 0 < q[name][0] < 0.06 and q[name][2] > 0
        assert n[name][1] > q[name][1]   # one shared scale and FP8 partial sums lose more than QuanGrad


@pytest.mark.parametrize("argv,needle", [
    (["--virtual-ranks", "2", "--nproc", "2"], "does not combine with --nproc 2"),
    (["--grad-error-every", "5"], "--grad-error-every needs --virtual-ranks"),
    (["--virtual-ranks", "-1"], "virtual_ranks must be an integer >= 0"),
])
def test_bad_virtual_rank_options_exit_2(argv, needle, capsys):
    assert main(["train", *argv]) == 2
    assert needle in capsys.readouterr().err
