"""QuanGradDDP in one process without a process group (world size 1): 8-bit gradient storage, hooks,
accumulation, clipping, master weights and the step, checked against independent references."""
from __future__ import annotations

import contextlib

import pytest
import torch

from agoq_core.errors import NonFiniteError
from agoq_core.formats import reference as ref
from agoq_core.quangrad import QuanGradConfig, QuanGradDDP, optimizer_factory
from agoq_core.quangrad.config import resolve_spec

from . import qg_ref
from .qg_workers import TinyNet, batches


def _grads(model, mbs, dtype=torch.float32):
    """Per-micro-batch gradients of a plain copy of the model (independent of QuanGrad)."""
    out = []
    for x, y in mbs:
        model.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x.to(dtype)).float(), y).backward()
        out.append([p.grad.detach().clone() for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "int8"])
def test_accumulated_storage_and_sgd_step_match_the_reference(fmt):
    spec = resolve_spec(fmt, None)
    torch.manual_seed(0)
    model = TinyNet()
    plain = TinyNet()
    plain.load_state_dict(model.state_dict())
    mbs = next(batches(7, 0, 1, 3))
    grads = _grads(plain, mbs)
    qg = QuanGradDDP(model, optimizer_factory("sgd", lr=0.1), config=QuanGradConfig(fmt=fmt, bucket_cap_mb=0.002))
    assert qg.world_size == 1 and {b["path"] for b in qg.report.buckets} == {"local"}
    assert len(qg.layout.buckets) > 1
    p0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    for k, (x, y) in enumerate(mbs):
        with qg.no_sync() if k < len(mbs) - 1 else contextlib.nullcontext():
            torch.nn.functional.mse_loss(qg(x), y).backward()
        assert all(p.grad is None for p in model.parameters())  # the 16-bit grads are freed at once
    for i, (name, p) in enumerate(model.named_parameters()):
        c, s = ref.quantize_blocks(grads[0][i].reshape(-1), spec)
        for mb in grads[1:]:
            c, s = ref.accumulate(c, s, spec, p.numel(), mb[i])
        assert torch.equal(qg.storage.views[i].codes, c) and qg_ref.bits_equal(qg.storage.views[i].scales, s)
        assert qg_ref.bits_equal(qg.gradient(name).reshape(-1), ref.dequantize_blocks(c, s, spec, p.numel()))
    want = {n: p0[n] - 0.1 * qg.gradient(n) for n in p0}
    rep = qg.step()
    assert not rep.skipped and rep.wire_bytes == 0 and rep.step == 0
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), want[n], rtol=1e-6, atol=1e-7)


def test_grad_norm_and_clipping_match_torch_on_the_stored_gradient():
    torch.manual_seed(0)
    model = TinyNet()
    qg = QuanGradDDP(model, optimizer_factory("sgd", lr=0.0), config=QuanGradConfig(max_grad_norm=0.01))
    x, y = next(batches(8, 0, 1, 1))[0]
    torch.nn.functional.mse_loss(qg(x), y).backward()
    stored = [qg.gradient(n).clone() for n in qg.param_names]
    rep = qg.step()
    want = torch.linalg.vector_norm(torch.cat([g.reshape(-1).double() for g in stored]))
    # fp32 sums of squares per bucket on the device (no float64 there: Ascend), combined in fp64 on the host
    assert rep.grad_norm == pytest.approx(float(want), rel=1e-6)
    assert rep.clip_coef == pytest.approx(0.01 / (float(want) + 1e-6))


def test_bf16_model_with_fp32_masters_and_sharded_world_one_agree():
    torch.manual_seed(0)
    base = TinyNet().to(torch.bfloat16)
    runs = {}
    for sharded in (False, True):
        model = TinyNet().to(torch.bfloat16)
        model.load_state_dict(base.state_dict())
        qg = QuanGradDDP(model, optimizer_factory("adamw", lr=1e-2),
                         config=QuanGradConfig(sharded=sharded, bucket_cap_mb=0.002))
        assert qg.use_master or sharded
        for mbs in batches(9, 0, 3, 2):
            for i, (x, y) in enumerate(mbs):
                with qg.no_sync() if i == 0 else contextlib.nullcontext():
                    torch.nn.functional.mse_loss(qg(x.bfloat16()).float(), y).backward()
            assert not qg.step().skipped
        runs[sharded] = {n: p.detach().clone() for n, p in model.named_parameters()}
        assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    # replicated steps D(storage) (requantized per bucket), the world-1 shard is D(storage) too: same bits
    assert all(qg_ref.bits_equal(runs[False][n], runs[True][n]) for n in runs[False])


def test_nonfinite_is_reported_and_the_step_skipped_or_raised():
    torch.manual_seed(0)
    model = TinyNet()
    qg = QuanGradDDP(model, optimizer_factory("sgd", lr=0.1))
    x, y = next(batches(10, 0, 1, 1))[0]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.fc1.weight.register_hook(lambda g: g.index_put((torch.tensor([3]), torch.tensor([5])),
                                                         torch.tensor(float("nan"))))
    torch.nn.functional.mse_loss(qg(x), y).backward()
    rep = qg.step()
    assert rep.skipped and rep.nonfinite_params == ("fc1.weight",) and "fc1.weight" in rep.reason
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    assert not qg.storage.has_nonfinite()  # the window was dropped
    qg2 = QuanGradDDP(TinyNet(), optimizer_factory("sgd", lr=0.1), config=QuanGradConfig(on_nonfinite="raise"))
    x2 = x.clone()
    x2[0, 0] = float("inf")
    torch.nn.functional.mse_loss(qg2(x2), y).backward()
    with pytest.raises(NonFiniteError, match="not applied"):
        qg2.step()


def _syncs_before_the_optimizer(qg, monkeypatch):
    """Count host synchronisations (Tensor.item / __bool__ / tolist / __float__) made before the inner optimizer's
    first step() call of the next qg.step(); returns a dict filled in when that happens."""
    seen = {"syncs": 0, "at_optimizer": None}
    for name in ("item", "__bool__", "tolist", "__float__"):
        orig = getattr(torch.Tensor, name)

        def counted(self, *a, _orig=orig, **k):
            seen["syncs"] += 1
            return _orig(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, counted)
    inner = qg.optimizer.step

    def step(*a, **k):
        if seen["at_optimizer"] is None:
            seen["at_optimizer"] = seen["syncs"]
        return inner(*a, **k)
    monkeypatch.setattr(qg.optimizer, "step", step)
    return seen


def test_apply_mode_steps_without_looking_first_and_reports_afterwards(monkeypatch, caplog):
    """on_nonfinite="apply": the same step as "skip" for a finite gradient, with no host synchronisation before the
    optimizer runs ("skip" makes one); a NaN gradient is applied (as plain training would), and the report and a
    warning say so and name the parameter; with clipping the norm is known first and the step still applies."""
    torch.manual_seed(0)
    base = TinyNet()
    x, y = next(batches(10, 0, 1, 1))[0]
    states, syncs = {}, {}
    for mode in ("skip", "apply"):
        model = TinyNet()
        model.load_state_dict(base.state_dict())
        qg = QuanGradDDP(model, optimizer_factory("sgd", lr=0.1), config=QuanGradConfig(on_nonfinite=mode))
        torch.nn.functional.mse_loss(qg(x), y).backward()
        with monkeypatch.context() as m:
            seen = _syncs_before_the_optimizer(qg, m)
            rep = qg.step()
        assert not rep.skipped and rep.reason is None and rep.nonfinite_params == () and rep.grad_norm > 0
        states[mode], syncs[mode] = {n: p.detach().clone() for n, p in model.named_parameters()}, seen["at_optimizer"]
    assert syncs == {"skip": 1, "apply": 0}
    assert all(torch.equal(states["skip"][n], states["apply"][n]) for n in states["skip"])

    for clip in (None, 1.0):
        model = TinyNet()
        model.load_state_dict(base.state_dict())
        qg = QuanGradDDP(model, optimizer_factory("sgd", lr=0.1),
                         config=QuanGradConfig(on_nonfinite="apply", max_grad_norm=clip))
        model.fc1.weight.register_hook(lambda g: g.index_put((torch.tensor([3]), torch.tensor([5])),
                                                             torch.tensor(float("nan"))))
        torch.nn.functional.mse_loss(qg(x), y).backward()
        with caplog.at_level("WARNING", logger="agoq"):
            rep = qg.step()
        assert not rep.skipped and rep.grad_norm != rep.grad_norm and rep.clip_coef == 1.0, rep
        assert rep.nonfinite_params == ("fc1.weight",) and "applied" in rep.reason and "fc1.weight" in rep.reason
        assert torch.isnan(model.fc1.weight).any() and qg.skipped_steps == 0 and qg._steps == 1
        assert any("applied (on_nonfinite='apply')" in r.getMessage() for r in caplog.records)
        caplog.clear()
        assert not qg.storage.has_nonfinite()  # the window was zeroed after the step
    with pytest.raises(ValueError, match="'skip', 'raise' or 'apply'"):
        QuanGradConfig(on_nonfinite="ignore")


def test_consecutive_skipped_steps_log_one_numbered_line_each(caplog):
    # Regression (GPU convergence run): after the first skip every later skip was logged as the same
    # step number, which read as one step printed many times.
    torch.manual_seed(0)
    model = TinyNet()
    qg = QuanGradDDP(model, optimizer_factory("sgd", lr=0.1))
    x, y = next(batches(10, 0, 1, 1))[0]
    x = x.clone()
    x[0, 0] = float("nan")
    with caplog.at_level("WARNING", logger="agoq"):
        for _ in range(3):
            torch.nn.functional.mse_loss(qg(x), y).backward()
            assert qg.step().skipped
    lines = [r.getMessage() for r in caplog.records if "skipping step" in r.getMessage()]
    assert [ln.split(":")[1].strip() for ln in lines] == [
        "skipping step 1 (1 skipped so far)", "skipping step 2 (2 skipped so far)", "skipping step 3 (3 skipped so far)"]
    assert qg.skipped_steps == 3


def test_report_and_memory_accounting():
    qg = QuanGradDDP(TinyNet(), optimizer_factory("adamw", lr=1e-3))
    rep = qg.report
    n = sum(p.numel() for p in qg.module.parameters())
    assert rep.param_numel == n and rep.num_params == 8
    assert qg.gradient_bytes == rep.gradient_bytes == sum(t.numel() * t.element_size() for t in qg.gradient_buffers())
    # 1 byte per element + 4 bytes per 256, plus block alignment of each of the 8 parameters
    assert n * (1 + 4 / 256) <= rep.gradient_bytes < (n + 8 * 256) * (1 + 4 / 256)
    assert "gradient memory" in str(rep) and rep.master_weight_bytes == 0


def test_bad_arguments():
    with pytest.raises(TypeError, match="callable params -> torch.optim.Optimizer"):
        QuanGradDDP(TinyNet(), torch.optim.SGD(TinyNet().parameters(), lr=0.1))
    with pytest.raises(TypeError, match="QuanGradConfig"):
        QuanGradDDP(TinyNet(), optimizer_factory("sgd", lr=0.1), config={"fmt": "int8"})
    frozen = TinyNet().requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        QuanGradDDP(frozen, optimizer_factory("sgd", lr=0.1))
    with pytest.raises(TypeError, match="must return a torch.optim.Optimizer"):
        QuanGradDDP(TinyNet(), lambda ps: None)
    qg = QuanGradDDP(TinyNet(), optimizer_factory("sgd", lr=0.1))
    with pytest.raises(RuntimeError, match="no gradient was accumulated"):
        qg.step()
    with pytest.raises(KeyError, match="no trainable parameter"):
        qg.gradient("nope")
    emb = torch.nn.Embedding(10, 4, sparse=True)
    qs = QuanGradDDP(emb, optimizer_factory("sgd", lr=0.1))
    with pytest.raises(TypeError, match="sparse gradient"):
        qs(torch.tensor([1, 2])).sum().backward()


def test_optimizer_calls_grouped_by_step_group_mb_give_the_same_weights():
    """step_group_mb groups consecutive buckets into one optimizer call (fewer calls, host time); AdamW is
    element-wise, so one call per bucket, grouped calls and a single call give the same bits."""
    torch.manual_seed(0)
    base = TinyNet().to(torch.bfloat16)
    runs, calls = {}, {}
    kib = 1 / 1024
    for name, kw in {"per-bucket": dict(step_group_mb=0), "grouped": dict(step_group_mb=3 * kib),
                     "one call": dict(step_per_bucket=False)}.items():
        model = TinyNet().to(torch.bfloat16)
        model.load_state_dict(base.state_dict())
        qg = QuanGradDDP(model, optimizer_factory("adamw", lr=1e-2),
                         config=QuanGradConfig(bucket_cap_mb=0.25 * kib, max_grad_norm=0.5, **kw))
        n = [0]
        qg.optimizer.register_step_pre_hook(lambda *a: n.__setitem__(0, n[0] + 1))
        for mbs in batches(9, 0, 2, 1):
            for x, y in mbs:
                torch.nn.functional.mse_loss(qg(x.bfloat16()).float(), y).backward()
            assert not qg.step().skipped
        runs[name] = {k: p.detach().clone() for k, p in model.named_parameters()}
        calls[name] = n[0] // 2
        buckets = len(qg.layout.buckets)
        groups = qg._step_groups()
        assert sorted(b for g in groups for b in g) == list(range(buckets))
        if name == "grouped":
            assert all(4 * sum(qg.layout.buckets[b].numel for b in g) <= 3 * 1024 or len(g) == 1 for g in groups)
    assert calls["per-bucket"] == buckets > calls["grouped"] > calls["one call"] == 1, calls
    for name in ("grouped", "one call"):
        assert all(qg_ref.bits_equal(runs["per-bucket"][k], runs[name][k]) for k in runs[name]), name
    with pytest.raises(ValueError, match="step_group_mb"):
        QuanGradConfig(step_group_mb=-1)


@pytest.mark.parametrize("group_mb", [0.0, 512.0])
def test_without_clipping_one_dequantize_per_bucket_same_step_and_norm(monkeypatch, group_mb):
    """max_grad_norm=None: the reported norm is summed from the gradient the optimizer step dequantizes (one
    dequantize per bucket, not two), the same float and the same weights as the two-pass path (forced here by a
    clip threshold no norm reaches); a NaN gradient is still found first and the step skipped, reported alike.
    The two-pass path keeps the last step group's fp32 gradient from the norm pass and steps it first: with every
    bucket in one group (512 MiB) it too dequantizes each bucket once; with one bucket per group (0) all but one
    bucket twice."""
    from agoq_core.quangrad.storage import GradStorage

    torch.manual_seed(0)
    base = TinyNet().to(torch.bfloat16)
    runs = {}
    real = GradStorage.group_fp32
    for name, clip in (("one pass", None), ("two passes", 1e30)):
        model = TinyNet().to(torch.bfloat16)
        model.load_state_dict(base.state_dict())
        qg = QuanGradDDP(model, optimizer_factory("adamw", lr=1e-2),
                         config=QuanGradConfig(bucket_cap_mb=0.25 / 1024, max_grad_norm=clip, step_group_mb=group_mb))
        calls = [0]

        def counted(self, bis, _calls=calls):
            _calls[0] += len(bis)  # buckets dequantized
            return real(self, bis)

        monkeypatch.setattr(GradStorage, "group_fp32", counted)
        reports = []
        for mbs in batches(9, 0, 3, 1):
            for x, y in mbs:
                torch.nn.functional.mse_loss(qg(x.bfloat16()).float(), y).backward()
            reports.append(qg.step())
        x, y = next(batches(9, 1, 1, 1))[0]
        (torch.nn.functional.mse_loss(qg(x.bfloat16()).float(), y) * float("nan")).backward()
        bad = qg.step()
        monkeypatch.setattr(GradStorage, "group_fp32", real)
        runs[name] = ({k: p.detach().clone() for k, p in model.named_parameters()}, reports, bad,
                      calls[0], len(qg.layout.buckets), len(qg._groups[-1]))
    (w1, r1, bad1, c1, nb, _), (w2, r2, bad2, c2, _, kept) = runs["one pass"], runs["two passes"]
    # 3 finite steps: the two-pass path dequantizes every bucket outside the kept group twice; the NaN step takes
    # the two-pass path in both runs
    assert nb > 1 and c2 - c1 == 3 * (nb - kept)
    assert kept == (1 if group_mb == 0 else nb)
    assert [r.grad_norm for r in r1] == [r.grad_norm for r in r2] and all(r.clip_coef == 1.0 for r in r1 + r2)
    assert all(qg_ref.bits_equal(w1[k], w2[k]) for k in w1)
    assert bad1.skipped and bad2.skipped and bad1.reason == bad2.reason and bad1.nonfinite_params == bad2.nonfinite_params


def test_bf16_parameters_without_masters_step_on_their_dequantized_gradient_cast_to_bf16():
    """master_weights="off" with bf16 parameters: the step group's fp32 gradient reaches the optimizer cast to the
    parameter's dtype (one round-to-nearest-even). Checked against torch's SGD run on a copy of the parameters with
    .grad = the wrapper's own dequantized gradient cast to bf16, with and without a clip coefficient."""
    for clip in (None, 1e-3):
        torch.manual_seed(0)
        model = TinyNet().to(torch.bfloat16)
        twin = TinyNet().to(torch.bfloat16)
        twin.load_state_dict(model.state_dict())
        qg = QuanGradDDP(model, optimizer_factory("sgd", lr=0.5),
                         config=QuanGradConfig(bucket_cap_mb=0.25 / 1024, step_group_mb=0, master_weights="off",
                                               max_grad_norm=clip))
        assert not qg.use_master
        (x, y), = next(batches(9, 0, 1, 1))
        torch.nn.functional.mse_loss(qg(x.bfloat16()).float(), y).backward()
        grads = {n: qg.gradient(n) for n, _ in model.named_parameters()}  # fp32, before the step
        rep = qg.step()
        coef = rep.clip_coef
        assert (coef < 1.0) == (clip is not None)
        for n, p in twin.named_parameters():
            g = grads[n]
            p.grad = (g * coef if coef != 1.0 else g).to(torch.bfloat16)
        torch.optim.SGD(twin.parameters(), lr=0.5).step()
        for (n, a), (_, b) in zip(model.named_parameters(), twin.named_parameters()):
            assert a.dtype == torch.bfloat16 and qg_ref.bits_equal(a.detach(), b.detach()), n
