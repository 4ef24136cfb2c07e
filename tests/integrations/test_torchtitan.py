"""The agoq torchtitan converter on torchtitan's own Llama 3 model (torchtitan 0.3.0, CPU).

Tolerances: the converter changes no forward value (loss bit-identical); weight gradients with LAAQ's
4-bit policy within 0.16 relative L2 of the plain model's, with int8 within 0.012, with "native" storage
within 1e-5 (the limits tests/laaq/test_numerics.py holds HF models to; docs/laaq.md explains them).
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchtitan")

from agoq_core.errors import AgoqError  # noqa: E402
from agoq_core.integrations import torchtitan as tt  # noqa: E402

tt.torch_compat()  # torch < 2.13 (the GPU machine's 2.11): torchtitan 0.3.0 imports only with it

from .tt_helpers import build, loss_of, tiny_spec, tokens  # noqa: E402

REL_TOL = {"nf4": 0.16, "int8": 0.012, "native": 1e-5}


def _grads(model, tok):
    loss = loss_of(model, tok)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def plain():
    model = build(tiny_spec())
    return model, _grads(model, tokens(1))


@pytest.mark.parametrize("fmt", ["nf4", "int8", "native"])
def test_converter_keeps_the_loss_and_gradients_within_tolerance(plain, fmt):
    ref_model, (ref_loss, ref_grads) = plain
    model = build(tiny_spec([tt.AgoqConverter.Config(laaq_format=fmt)]))
    assert type(model).__name__ == "AgoqLlama3Model"
    assert model.state_dict().keys() == ref_model.state_dict().keys()
    model.load_state_dict(ref_model.state_dict())
    loss, grads = _grads(model, tokens(1))
    assert torch.equal(loss, ref_loss)
    for name, g in ref_grads.items():
        rel = float((grads[name] - g).norm() / g.norm())
        assert rel <= REL_TOL[fmt], (name, rel)
        if name.startswith(("norm.", "lm_head.")) or fmt == "native":
            continue
        if ".feed_forward." in name or ".wqkv." in name or "_norm." in name:
            assert rel > 0, name  # these really went through LAAQ's 4/8-bit storage


def test_converter_converts_torchtitans_llama_modules():
    model = build(tiny_spec([tt.AgoqConverter.Config()], layers=3))
    rep = model.agoq_laaq_report
    paths = {c.path: c.kind for c in rep.converted}
    for i in range(3):
        p = f"layers.{i}."
        assert paths[p + "attention_norm"] == paths[p + "ffn_norm"] == "norm"
        assert paths[p + "attention.qkv_linear.wqkv"] == paths[p + "attention.wo"] == "linear"
        assert paths[p + "feed_forward"] == "swiglu"
    assert len(paths) == 3 * 5 and not rep.skipped  # final norm / lm_head stay plain by default
    fmts = {c.path: c.formats for c in rep.converted}
    assert fmts["layers.0.attention.wo"] == {"attn_out_input": "nf4"}
    assert rep.layers == [0, 1, 2]


def test_unfused_qkv_family_row():
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import _build_llama3_layers, model_registry
    from torchtitan.models.common import ComplexRoPE

    spec = model_registry("debugmodel", converters=[tt.AgoqConverter.Config()])
    spec.model.layers = _build_llama3_layers(
        n_layers=1, dim=256, n_heads=16, hidden_dim=768, fuse_qkv=False, attn_backend="flex",
        rope=ComplexRoPE.Config(dim=16, max_seq_len=256, theta=500000, scaling="llama"))
    spec.model.layers[0].attention.inner_attention = ScaledDotProductAttention.Config()
    model = build(spec)
    paths = {c.path for c in model.agoq_laaq_report.converted}
    assert {"layers.0.attention.qkv_linear.wq", "layers.0.attention.qkv_linear.wk",
            "layers.0.attention.qkv_linear.wv"} <= paths
    loss_of(model, tokens(2)).backward()


def test_activation_checkpointing_is_refused_on_first_forward():
    from torchtitan.distributed.activation_checkpoint import FullAC

    model = build(tiny_spec([tt.AgoqConverter.Config()]))
    FullAC.Config().build().apply(model)
    with pytest.raises(AgoqError, match="activation_checkpoint"):
        model(tokens(3)[:, :-1])


def test_quangrad_without_fsdp_is_a_clear_error():
    model = build(tiny_spec([tt.AgoqConverter.Config(quangrad=True)]))
    with pytest.raises(AgoqError, match="not wrapped by FSDP2"):
        model(tokens(3)[:, :-1])


@pytest.mark.parametrize("kw, match", [
    ({"laaq_format": "fp8_e4m3"}, "activation format"),
    ({"quangrad_format": "nf4"}, "8-bit gradients"),
    ({"laaq": False, "quangrad": False}, "change nothing"),
    ({"quangrad_threshold_bytes": -1}, "threshold"),
])
def test_bad_options_fail_at_config_time(kw, match):
    with pytest.raises(Exception, match=match):
        tt.AgoqConverter.Config(**kw)


def test_converter_listed_twice_is_refused():
    conv = tt.AgoqConverter.Config()
    with pytest.raises(AgoqError, match="once"):
        tiny_spec([conv, conv])


def test_config_functions_build_torchtitan_trainer_configs():
    cfg = tt.llama3_debugmodel_agoq()
    assert cfg.activation_checkpoint is None
    assert type(cfg.model_spec.model).__name__ == "Config"
    assert cfg.model_spec.model.agoq.quangrad is True
    assert "agoq" in cfg.model_spec.model.to_dict()


@pytest.mark.dist
def test_fsdp2_with_quangrad_on_two_gloo_ranks():
    from tests.quangrad.qg_dist import run_ranks

    from .tt_workers import STEPS, session

    res = run_ranks(session, 2)
    for rank in range(2):
        calls, fallbacks, wire, fp32_eq, modules = res[rank]["laaq_quangrad"]["state"]
        assert set(modules.values()) == {"quangrad"} and {"layers.0", "layers.1"} <= set(modules)
        assert calls == len(modules) * STEPS and fallbacks == 0
        assert 0.25 <= wire / fp32_eq <= 0.27
        assert res[rank]["laaq"]["state"] is None
        # the first step's loss is before any reduction: identical; later ones within 0.1%
        a, b = res[rank]["laaq"]["losses"], res[rank]["laaq_quangrad"]["losses"]
        assert a[0] == b[0]
        assert all(abs(x - y) <= 1e-3 * abs(x) for x, y in zip(a, b))
    for name, p in res[0]["laaq_quangrad"]["params"].items():
        assert torch.equal(p, res[1]["laaq_quangrad"]["params"][name])


@pytest.mark.dist
def test_bench_fsdp_grouping_keeps_chunked_loss_training_identical():
    """benchmarks/bench_torchtitan.py splits torchtitan's fully_shard([norm, lm_head]) on a torch whose
    FSDP2 lacks partial-forward groups (torch 2.11: the chunked loss then frees norm.weight before the
    decoder's backward). At world size 1 the split changes no bit: same losses and parameters as
    torchtitan's own grouping where that runs (torch >= 2.13), and as the unsharded model."""
    from tests.quangrad.qg_dist import run_ranks

    from .tt_workers import chunked_session

    res = run_ranks(chunked_session, 1)[0]
    split = res["split"]
    refs = ["none"] + (["grouped"] if res["partial_forward_groups"] else [])
    for mode in refs:
        assert split["losses"] == res[mode]["losses"], mode
        for name, p in res[mode]["params"].items():
            assert torch.equal(split["params"][name], p), (mode, name)


@pytest.mark.dist
def test_bench_script_ladder_on_cpu(tmp_path):
    """benchmarks/bench_torchtitan.py --smoke end to end for one configuration: the longest length first,
    its (fake) out-of-memory ends that process, a fresh one measures the shorter length; results written."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, OUT=str(tmp_path), OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_torchtitan.py"), "--smoke", "--configs",
                        "tt_ac_none", "--seqs", "32,64", "--fake-oom-above", "32", "--budget-s", "300"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads((tmp_path / "bench_torchtitan.json").read_text())["results"][0]
    assert "error" not in res, res
    assert [(r["seq"], r["status"]) for r in res["runs"]] == [(64, "oom"), (32, "ok")]
    ok = res["runs"][1]
    assert ok["tokens_per_s"] > 0 and len(ok["losses"]) == 3 and all(6 < x < 9 for x in ok["losses"])
    assert res["loss"].startswith("torchtitan ChunkedLossWrapper")
    assert "| tt_ac_none | " in (tmp_path / "bench_torchtitan.md").read_text()
