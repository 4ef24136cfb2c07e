"""QuanGrad on real gloo process groups (2 and 4 CPU processes, torch.multiprocessing spawn).

Each fixture runs one spawned session per module and the tests check what the ranks returned against
the single-process simulation and independent references (qg_ref)."""
from __future__ import annotations

import pytest
import torch

from agoq_core.quangrad import baselines, simulate_all_reduce, simulate_reduce_scatter
from agoq_core.quangrad.config import resolve_spec

from . import qg_ref, qg_workers as W

pytestmark = pytest.mark.dist


@pytest.fixture(params=[2, 4], ids=["w2", "w4"])
def coll(request):
    world = request.param
    res = request.getfixturevalue(f"qg_w{world}")
    return world, (W.SIZES if world == 2 else (1, 1031, 20011)), [r["collectives"] for r in res]


@pytest.fixture
def err4(qg_w4):
    return [r["error_table"] for r in qg_w4]


@pytest.fixture
def wrap2(qg_w2):
    return [r["wrapper"] for r in qg_w2]


@pytest.fixture
def hook2(qg_w2):
    return [r["ddp_hook"] for r in qg_w2]


# ---- the collective ----------------------------------------------------------------------------------

def test_all_reduce_is_identical_on_every_rank_and_matches_the_reference(coll):
    world, sizes, res = coll
    checked = 0
    for fmt in W.FMTS:
        spec = resolve_spec(fmt, None)
        for n in sizes:
            for dtype in (torch.float32, torch.bfloat16):
                key = (fmt, n, str(dtype))
                ins = [W.rank_input(11, r, n, dtype) for r in range(world)]
                want = qg_ref.all_reduce(ins, spec)
                sim = simulate_all_reduce(ins, fmt).results[0]
                for r in range(world):
                    assert qg_ref.bits_equal(res[r]["all_reduce"][key], want), (key, r)
                assert qg_ref.bits_equal(sim, want)
                checked += 1
    assert checked == len(W.FMTS) * len(sizes) * 2


def test_all_reduce_is_deterministic_across_runs(coll):
    _, _, res = coll
    for r in res:
        assert all(r["rerun_equal"].values())


def test_wire_payloads_equal_the_simulation(coll):
    world, _, res = coll
    for key, (fmt, block, seed) in {"fp8_e4m3": ("fp8_e4m3", None, 12), "int8/64": ("int8", 64, 12)}.items():
        ins = [W.rank_input(seed, r, 1031) for r in range(world)]
        sim = simulate_all_reduce(ins, fmt, block)
        spec = resolve_spec(fmt, block)
        for r in range(world):
            a2a, ag = res[r]["payloads"][key]
            # (the 256-byte agreement header goes through torch.distributed itself, not the backend)
            assert len(a2a) == 1 and len(ag) == 1
            assert torch.equal(a2a[0], sim.payloads[r].all_to_all)
            assert torch.equal(ag[0], sim.payloads[r].all_gather)
            assert a2a[0].numpy().tobytes() == qg_ref.a2a_payload(ins[r], world, spec)


def test_reduce_scatter_keeps_the_fp32_shard(coll):
    world, _, res = coll
    for fmt in W.FMTS:
        ins = [W.rank_input(13, r, 1031) for r in range(world)]
        sim = simulate_reduce_scatter(ins, fmt)
        spec = resolve_spec(fmt, None)
        for r in range(world):
            shard, start, stop, numel = res[r]["reduce_scatter"][fmt]
            assert (start, stop, numel) == (r * sim.chunk, (r + 1) * sim.chunk, 1031)
            assert shard.dtype == torch.float32
            assert qg_ref.bits_equal(shard, qg_ref.reduce_scatter_shard(ins, r, spec))
            assert qg_ref.bits_equal(shard, sim.shards[r])


def test_baselines(coll):
    world, _, res = coll
    ins = [W.rank_input(14, r, 1031) for r in range(world)]
    exact = torch.stack([t.double() for t in ins]).sum(0)
    for name in ("fp32", "bf16", "naive_fp8"):
        for r in range(1, world):
            assert qg_ref.bits_equal(res[r]["baselines"][name], res[0]["baselines"][name]), name
    assert qg_ref.sqnr_db(res[0]["baselines"]["fp32"], exact) > 120
    assert 35 < qg_ref.sqnr_db(res[0]["baselines"]["bf16"], exact) < 60
    assert qg_ref.bits_equal(res[0]["baselines"]["naive_fp8"], baselines.simulate_naive_fp8_all_reduce(ins))


def test_nonfinite_poisons_exactly_its_blocks_on_every_rank(coll):
    world, _, res = coll
    ins = [W.rank_input(15, r, 1031) for r in range(world)]
    ins[1][300] = float("nan")
    ins[1][1000] = float("inf")
    want = qg_ref.all_reduce(ins, resolve_spec("fp8_e4m3", None))
    for r in range(world):
        y = res[r]["nonfinite"]
        assert qg_ref.bits_equal(y, want)
        assert [bool(torch.isnan(y[b * 256:(b + 1) * 256]).all()) for b in range(5)] == [False, True, False, True, False]
        assert res[r]["empty"] == 0


def test_error_table_against_the_exact_fp32_sum(err4):
    """Relative error and SQNR of each all-reduce (4 ranks) on gradient-like data; printed as a table."""
    ins = [W.gradient_like(5, r) for r in range(4)]
    exact = torch.stack([t.double() for t in ins]).sum(0)
    seg = 4096
    rows = {}
    for name, y in err4[0].items():
        for r in range(1, 4):
            assert qg_ref.bits_equal(err4[r][name], y), name
        rel = float((y.double() - exact).norm() / exact.norm())
        worst = min(qg_ref.sqnr_db(y[i * seg:(i + 1) * seg], exact[i * seg:(i + 1) * seg]) for i in range(24))
        rows[name] = (rel, qg_ref.sqnr_db(y, exact), worst)
    print("\nall-reduce error vs exact sum, 4 gloo ranks, 24 x 4096 gradient-like elements")
    print(f"{'method':>10} {'rel L2':>10} {'SQNR dB':>8} {'worst layer dB':>15}")
    for k, (rel, s, w) in rows.items():
        print(f"{k:>10} {rel:10.2e} {s:8.1f} {w:15.1f}")
    assert rows["fp32"][1] > 120
    assert rows["bf16"][2] > 40
    assert rows["fp8_e4m3"][2] > 27 and rows["int8"][2] > 27 and rows["fp8_e5m2"][2] > 21
    assert rows["naive_fp8"][2] < rows["fp8_e5m2"][2] - 10


# ---- the data-parallel wrapper -----------------------------------------------------------------------

def _same_params(a, b):
    return a.keys() == b.keys() and all(qg_ref.bits_equal(a[k], b[k]) for k in a)


def test_wrapper_reduces_exactly_the_8bit_gradients(wrap2):
    """One window, SGD(lr=0.1), 4 buckets: every rank's storage after the collective is
    Q(sum_r D(local_r)) (independent reference), and the update is p - lr * D(reduced) / W."""
    spec = resolve_spec("fp8_e4m3", None)
    lay = wrap2[0]["inspect"]["layout"]
    assert len(lay["buckets"]) == 4
    for bi in range(len(lay["buckets"])):
        local = [ref_codes_to_fp32(wrap2[r]["inspect"]["before"], bi, spec) for r in range(2)]
        total = local[0] + local[1]
        from agoq_core.formats import reference as ref
        c, s = ref.quantize_blocks(total, spec)
        for r in range(2):
            after_c, after_s = wrap2[r]["inspect"]["after"][0][bi], wrap2[r]["inspect"]["after"][1][bi]
            assert torch.equal(after_c, c) and qg_ref.bits_equal(after_s, s), (bi, r)
    # the SGD update from the reduced gradient (average over 2 ranks)
    from agoq_core.formats import reference as ref
    p0, p1 = wrap2[0]["inspect"]["p0"], wrap2[0]["inspect"]["p1"]
    for b in lay["buckets"]:
        bi = b["index"]
        g = ref.dequantize_blocks(wrap2[0]["inspect"]["after"][0][bi], wrap2[0]["inspect"]["after"][1][bi], spec, b["numel"])
        for name, shape, _, off in b["params"]:
            n = torch.Size(shape).numel()
            want = p0[name] - 0.1 * (g[off:off + n] / 2).view(shape)
            torch.testing.assert_close(p1[name], want, rtol=1e-6, atol=1e-7)
    assert _same_params(wrap2[0]["inspect"]["p1"], wrap2[1]["inspect"]["p1"])
    rep = wrap2[0]["inspect"]["report"]
    assert not rep.skipped and rep.wire_bytes == sum(2 * (b["numel"] // 2 + 4 * b["numel"] // 2 // 256)
                                                     for b in lay["buckets"])


def test_sharded_wrapper_keeps_the_fp32_sum_shard_and_gathers_parameters(wrap2):
    """ZeRO-1 mode, one window, SGD(lr=0.1): rank r's shard of bucket b is elements [r*C, (r+1)*C) of
    D(local_0) + D(local_1) (fp32, no requantization), storage untouched, and after the parameter
    all-gather every rank holds p - lr * sum / 2."""
    spec = resolve_spec("fp8_e4m3", None)
    ins = [wrap2[r]["inspect_sharded"] for r in range(2)]
    lay = ins[0]["layout"]
    assert lay["sharded"] and len(lay["buckets"]) == 4
    full = {}
    for b in lay["buckets"]:
        bi, c = b["index"], b["numel"] // 2
        total = ref_codes_to_fp32(ins[0]["before"], bi, spec) + ref_codes_to_fp32(ins[1]["before"], bi, spec)
        for r in range(2):
            assert qg_ref.bits_equal(ins[r]["after"][2][bi], total[r * c:(r + 1) * c]), (bi, r)
            assert torch.equal(ins[r]["after"][0][bi], ins[r]["before"][0][bi])
        full[bi] = total
        for name, shape, _, off in b["params"]:
            n = torch.Size(shape).numel()
            want = ins[0]["p0"][name] - 0.1 * (total[off:off + n] / 2).view(shape)
            torch.testing.assert_close(ins[0]["p1"][name], want, rtol=1e-6, atol=1e-7)
    assert _same_params(ins[0]["p1"], ins[1]["p1"])
    assert ins[0]["report"].wire_bytes == sum(b["numel"] // 2 + 4 * b["numel"] // 2 // 256 for b in lay["buckets"])


def ref_codes_to_fp32(storage, bi, spec):
    from agoq_core.formats import reference as ref
    codes, scales = storage[0][bi], storage[1][bi]
    return ref.dequantize_blocks(codes, scales, spec, codes.numel())


VARIANTS = ("overlap", "no_overlap", "sharded", "fallback", "clip", "e5m2", "int8", "naive_fp8", "fp32", "bf16",
            "sharded_fallback", "sharded_naive_fp8", "bf16_master", "adamw8bit")


@pytest.mark.parametrize("name", VARIANTS)
def test_wrapper_ranks_end_bit_identical_and_track_fp32_ddp(wrap2, name):
    if name not in wrap2[0]:
        pytest.skip(f"{name} did not run (bitsandbytes is not installed)")
    a, b = wrap2[0][name], wrap2[1][name]
    assert _same_params(a["params"], b["params"])
    ddp_losses = wrap2[0]["ddp"][0]
    tol = 0.01 if name not in ("bf16_master",) else 0.02
    for lq, ld in zip(a["losses"], ddp_losses):
        assert abs(lq - ld) / ld < tol, (name, a["losses"], ddp_losses)


def test_overlap_does_not_change_a_bit(wrap2):
    assert _same_params(wrap2[0]["overlap"]["params"], wrap2[0]["no_overlap"]["params"])
    assert wrap2[0]["overlap"]["losses"] == wrap2[0]["no_overlap"]["losses"]


def test_fallback_buckets_are_reported_not_silent(wrap2):
    rep = wrap2[0]["fallback"]["setup"]
    fb = rep.fallback_buckets
    assert fb and all(b["path"] == "fp32" and "min_compress_bytes=8,000" in b["reason"] for b in fb)
    assert len(fb) < len(rep.buckets)
    assert "use another collective" in str(rep)
    assert not wrap2[0]["overlap"]["setup"].fallback_buckets


def test_clipping_uses_the_global_norm(wrap2):
    for rep in wrap2[0]["clip"]["reports"]:
        assert rep.grad_norm > 0.05 and rep.clip_coef == pytest.approx(0.05 / (rep.grad_norm + 1e-6))
    for rep in wrap2[0]["overlap"]["reports"]:
        assert rep.clip_coef == 1.0
    assert [r.grad_norm for r in wrap2[0]["clip"]["reports"]] == [r.grad_norm for r in wrap2[1]["clip"]["reports"]]


def test_gradient_memory_is_one_byte_per_element_plus_scales(wrap2):
    rep = wrap2[0]["overlap"]["setup"]
    assert rep.gradient_bytes == sum(b["numel"] * (1 + 4 / 256) for b in rep.buckets)
    assert rep.fp32_gradient_bytes == 4 * rep.param_numel and rep.bf16_gradient_bytes == 2 * rep.param_numel
    assert wrap2[0]["overlap"]["gradient_bytes"] == rep.gradient_bytes


def test_bf16_model_steps_fp32_master_weights(wrap2):
    out = wrap2[0]["bf16_master"]
    assert out["setup"].master_weight_bytes == 4 * out["setup"].param_numel
    for m, (n, p) in zip(out["masters"], out["params"].items()):
        assert p.dtype == torch.bfloat16 and m.dtype == torch.float32
        assert torch.equal(m.to(torch.bfloat16), p)  # the model holds the RNE cast of the masters


def test_eight_bit_adam_from_bitsandbytes_runs_on_cpu(wrap2):
    pytest.importorskip("bitsandbytes")
    assert wrap2[0]["adamw8bit"]["opt"].startswith("bitsandbytes")


def test_nonfinite_gradient_skips_the_step_on_every_rank(wrap2):
    for r in range(2):
        (rep0, unchanged0), (rep1, unchanged1), (rep2, unchanged2) = wrap2[r]["nonfinite"]
        assert not rep0.skipped and not unchanged0
        assert rep1.skipped and unchanged1 and "non-finite" in rep1.reason and rep1.nonfinite_params
        assert not rep2.skipped and not unchanged2 and rep2.step == 1
    assert "NonFiniteError" in wrap2[0]["nonfinite_raise"] and "not applied" in wrap2[0]["nonfinite_raise"]


def test_apply_mode_applies_a_nonfinite_step_on_every_rank_and_reports_it(wrap2):
    for r in range(2):
        for sharded in (False, True):
            rep, unchanged = wrap2[r]["nonfinite_apply"][sharded]
            assert not rep.skipped and not unchanged and rep.step == 0, (r, sharded, rep)
            assert rep.grad_norm != rep.grad_norm and "applied" in rep.reason and rep.nonfinite_params, (r, sharded)


def test_misuse_gets_clear_errors(wrap2):
    assert "no_sync" in wrap2[0]["second_backward"] and "already all-reduced" in wrap2[0]["second_backward"]
    assert "no gradient was accumulated" in wrap2[0]["empty_step"]


def test_mismatched_layouts_fail_at_setup_on_every_rank(wrap2):
    for r in range(2):
        msg = wrap2[r]["mismatch"]
        assert msg and "rank 1 differs from rank 0" in msg and "extra" in msg
        assert "block is 256 on rank 0 but 512" in wrap2[r]["mismatch_block"]


def test_wrapper_on_four_ranks_tracks_the_fp32_reference(qg_w4):
    res = [r["wrapper_w4"] for r in qg_w4]
    for name in ("replicated", "sharded"):
        assert all(n % (4 * 256) == 0 for n in res[0][name]["buckets"]) and len(res[0][name]["buckets"]) > 1
        for r in range(1, 4):
            assert _same_params(res[0][name]["params"], res[r][name]["params"]), (name, r)
        for r in range(4):
            for lq, lr in zip(res[r][name]["losses"], res[r]["ref"]["losses"]):
                assert abs(lq - lr) / lr < 0.01, (name, r, res[r][name]["losses"], res[r]["ref"]["losses"])
        # Adam turns small gradient differences into full-size steps, so compare the parameters' distance
        # to the reference with the distance the reference itself travelled from the initialisation.
        torch.manual_seed(0)
        init = dict(W.TinyNet().named_parameters())
        ref = res[0]["ref"]["params"]
        dist_qg = sum(float((res[0][name]["params"][k] - ref[k]).pow(2).sum()) for k in ref) ** 0.5
        travelled = sum(float((ref[k] - init[k].detach()).pow(2).sum()) for k in ref) ** 0.5
        print(f"{name}: |p - p_ref| / |p_ref - p_init| = {dist_qg / travelled:.3f}")
        assert dist_qg < 0.25 * travelled


# ---- DDP comm hook -----------------------------------------------------------------------------------

def test_ddp_hook_compresses_and_tracks_ddp(hook2):
    for name in ("hook", "hook_fallback"):
        assert _same_params(hook2[0][name]["params"], hook2[1][name]["params"])
    h = hook2[0]["hook"]
    assert h["compressed"] > 0 and h["fallback"] == 0
    ddp_losses, ddp_params = hook2[0]["ddp"]
    for lq, ld in zip(h["losses"], ddp_losses):
        assert abs(lq - ld) / ld < 0.01
    fb = hook2[0]["hook_fallback"]
    assert fb["compressed"] == 0 and fb["fallback"] > 0 and "vendor all-reduce" in fb["summary"]
    # below the crossover the hook is DDP's own (grad / W, fp32 all-reduce): bit-identical to DDP
    assert _same_params(fb["params"], ddp_params)
