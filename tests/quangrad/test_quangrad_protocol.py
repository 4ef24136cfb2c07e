"""QuanGrad in one process: chunk plan, packing, the simulated protocol against an independent
reference, the naive FP8 baseline, bucket layout, 8-bit storage, config and input errors."""
from __future__ import annotations

import pytest
import torch

from agoq_core.formats import reference as ref
from agoq_core.formats.spec import get_format
from agoq_core.quangrad import QuanGradConfig, all_reduce_, baselines, simulate_all_reduce, simulate_reduce_scatter
from agoq_core.quangrad import protocol as P
from agoq_core.quangrad.config import resolve_spec
from agoq_core.quangrad.layout import plan_buckets
from agoq_core.quangrad.optim import optimizer_factory
from agoq_core.quangrad.storage import GradStorage

from . import qg_ref
from .qg_workers import FMTS, gradient_like, rank_input


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("n", [1, 255, 256, 257, 1031, 20011])
def test_chunk_plan_pads_to_whole_blocks_per_rank(world, n):
    spec = resolve_spec("fp8_e4m3", None)
    plan = P.ChunkPlan.for_numel(n, world, spec)
    assert plan.numel % (world * 256) == 0 and n <= plan.numel < n + world * 256
    assert plan.chunk * world == plan.numel and plan.chunk % 256 == 0
    assert plan.segment_bytes == plan.chunk + 4 * plan.chunk // 256
    assert plan.wire_bytes_per_rank()["total"] == 2 * (world - 1) * plan.segment_bytes


def test_chunk_plan_rejects_sizes_that_do_not_divide():
    with pytest.raises(ValueError, match=r"multiple of world_size x block = 3 x 256 = 768.*Pad it to .*= 1536"):
        P.ChunkPlan(spec=resolve_spec("int8", None), world_size=3, numel=1000)


def test_pack_and_scatter_segments_round_trip():
    spec = resolve_spec("int8", 64)
    plan = P.ChunkPlan.for_numel(1000, 3, spec)  # 1152 elements, chunks of 384, 6 scales each
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 256, (plan.code_bytes,), dtype=torch.uint8, generator=g)
    scales = torch.rand(plan.num_blocks, generator=g)
    buf = P.pack_segments(codes, scales, plan)
    assert buf.shape == (3, 384 + 24)
    for r in range(3):  # segment r = codes of chunk r, then its scales' little-endian bytes
        want = codes[r * 384:(r + 1) * 384].numpy().tobytes() + scales[r * 6:(r + 1) * 6].numpy().astype("<f4").tobytes()
        assert buf[r].numpy().tobytes() == want
    c2, s2 = torch.empty_like(codes), torch.empty_like(scales)
    P.scatter_segments(buf, plan, c2, s2)
    assert torch.equal(c2, codes) and torch.equal(s2, scales)
    c3, s3 = P.unpack_segments(buf, plan)
    assert torch.equal(c3.reshape(-1), codes) and torch.equal(s3.reshape(-1), scales)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [1, 255, 1031, 20011])
def test_simulated_all_reduce_matches_reference_bit_for_bit(fmt, world, n):
    spec = resolve_spec(fmt, None)
    ts = [rank_input(21, r, n) for r in range(world)]
    sim = simulate_all_reduce(ts, fmt)
    want = qg_ref.all_reduce(ts, spec)
    for r in range(world):
        assert qg_ref.bits_equal(sim.results[r], want)
        assert sim.payloads[r].all_to_all.numpy().tobytes() == qg_ref.a2a_payload(ts[r], world, spec)
        assert sim.payloads[r].all_gather.numpy().tobytes() == qg_ref.ag_payload(ts, r, spec)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_simulated_all_reduce_keeps_shape_and_dtype(dtype):
    ts = [rank_input(22, r, 3 * 5 * 7).view(3, 5, 7).to(dtype) for r in range(3)]
    sim = simulate_all_reduce(ts, "fp8_e5m2", block=64)
    want = qg_ref.all_reduce(ts, resolve_spec("fp8_e5m2", 64))
    assert sim.results[0].dtype == dtype and sim.results[0].shape == (3, 5, 7)
    assert qg_ref.bits_equal(sim.results[0], want)


@pytest.mark.parametrize("fmt", FMTS)
def test_simulated_reduce_scatter_is_the_fp32_sum_shard(fmt):
    spec = resolve_spec(fmt, None)
    ts = [rank_input(23, r, 1031) for r in range(3)]
    rs = simulate_reduce_scatter(ts, fmt)
    assert rs.chunk == 512
    for r in range(3):
        assert qg_ref.bits_equal(rs.shards[r], qg_ref.reduce_scatter_shard(ts, r, spec))
        assert rs.payloads[r].numpy().tobytes() == qg_ref.a2a_payload(ts[r], 3, spec)


def test_simulation_is_deterministic_and_rank_order_matters_only_through_the_fold():
    ts = [rank_input(24, r, 5000) for r in range(4)]
    a, b = simulate_all_reduce(ts), simulate_all_reduce([t.clone() for t in ts])
    assert all(qg_ref.bits_equal(x, y) for x, y in zip(a.results, b.results))


def test_nonfinite_marks_only_its_blocks_and_reaches_every_rank():
    ts = [rank_input(25, r, 1031) for r in range(2)]
    ts[1][300] = float("nan")   # block 1
    ts[0][1000] = float("-inf")  # block 3
    res = simulate_all_reduce(ts).results
    for y in res:
        bad = ~torch.isfinite(y)
        blocks_bad = [bool(bad[i * 256:(i + 1) * 256].all()) for i in range(5)]
        assert blocks_bad == [False, True, False, True, False]
        assert torch.isfinite(y[:256]).all()


def test_fp32_sum_beats_a_low_precision_sum():
    """A small addend that the naive FP8 sum loses (one shared scale, FP8 partial sums) survives
    QuanGrad's block scales and fp32 sum. Hand-checked numbers, E4M3 (qmax 448):
    naive: scale = 1.0 * 2 / 448; codes 224 and 0.03*224 = 6.72 -> 6.5; 224 + 6.5 = 230.5 -> 224
    (spacing 16 in [128, 256)); result 224 * scale = 1.0. QuanGrad: 1.0 and 0.03 are each their
    block's absmax (exact), the fp32 sum 1.03 is again a block absmax: 1.03 exactly (as fp32)."""
    spec = resolve_spec("fp8_e4m3", None)
    a = torch.zeros(512)
    b = torch.zeros(512)
    a[0], b[0] = 1.0, 0.03
    naive = baselines.simulate_naive_fp8_all_reduce([a, b])
    assert naive[0].item() == 1.0
    q = simulate_all_reduce([a, b]).results[0]
    assert q[0].item() == torch.tensor(1.0, dtype=torch.float32).add(torch.tensor(0.03)).item()
    assert q[0].item() == qg_ref.all_reduce([a, b], spec)[0].item()


def test_naive_fp8_uses_one_shared_prescaled_scale():
    ts = [torch.tensor([448.0, -1.0, 2.0**-20]), torch.tensor([448.0, 1.0, 0.0])]
    y = baselines.simulate_naive_fp8_all_reduce(ts)
    # scale = 448 * 2 / 448 = 2; 448/2 = 224 each, FP8 sum 448 -> 896; +-1 -> +-0.5 cancel; 2^-21 underflows
    assert y.tolist() == [896.0, 0.0, 0.0]
    nan = baselines.simulate_naive_fp8_all_reduce([torch.tensor([1.0, float("nan")]), torch.ones(2)])
    assert torch.isnan(nan).all()


def test_error_ordering_on_gradient_like_data():
    """SQNR against the exact sum, W=4, 12 "layers" whose magnitudes span 4 decades. Over the whole
    vector the large layers dominate; the worst layer shows what one shared scale does to the small
    ones (flushed towards zero), while block scales keep every layer at the format's precision."""
    ts = [gradient_like(5, r, n_segments=12, seg=2048) for r in range(4)]
    exact = torch.stack([t.double() for t in ts]).sum(0)
    res = {fmt: simulate_all_reduce(ts, fmt).results[0] for fmt in FMTS}
    res["naive"] = baselines.simulate_naive_fp8_all_reduce(ts)
    glob = {k: qg_ref.sqnr_db(y, exact) for k, y in res.items()}
    worst = {k: min(qg_ref.sqnr_db(y[i * 2048:(i + 1) * 2048], exact[i * 2048:(i + 1) * 2048]) for i in range(12))
             for k, y in res.items()}
    # E4M3 keeps 3 mantissa bits, E5M2 2: about 6 dB apart; both hold in the worst layer
    assert glob["fp8_e4m3"] > 27 and worst["fp8_e4m3"] > 27, (glob, worst)
    assert glob["fp8_e5m2"] > 21 and worst["fp8_e5m2"] > 21, (glob, worst)
    assert worst["int8"] > 27, worst
    assert worst["naive"] < worst["fp8_e5m2"] - 10, worst


# ---- layout and storage -------------------------------------------------------------------------------

def _named(shapes):
    return [(f"p{i}", torch.zeros(*s)) for i, s in enumerate(shapes)]


def test_bucket_layout_aligns_params_and_pads_buckets():
    spec = resolve_spec("fp8_e4m3", None)
    named = _named([(37, 61), (61,), (61,), (61, 61), (5, 61), (5,), (3000,)])
    lay = plan_buckets(named, world_size=3, spec=spec, cap_numel=4000)
    assert [s.name for s in lay.buckets[0].slots] == ["p6", "p5", "p4"]  # reverse order, up to the cap
    seen = []
    for b in lay.buckets:
        assert b.numel % (3 * 256) == 0
        assert sum(-(-s.numel // 256) * 256 for s in b.slots) <= b.numel
        for s in b.slots:
            assert s.offset % 256 == 0
            seen.append((s.bucket, s.offset, s.offset + s.numel))
        if len(b.slots) > 1:
            assert b.used <= 4000
    for (b1, lo1, hi1), (b2, lo2, hi2) in zip(sorted(seen), sorted(seen)[1:]):
        assert b1 != b2 or hi1 <= lo2  # no overlap inside a bucket
    assert [s.index for s in lay.slots] == list(range(7))


def test_a_parameter_larger_than_the_cap_gets_its_own_bucket():
    lay = plan_buckets(_named([(10,), (50000,), (10,)]), world_size=2, spec=resolve_spec("int8", None), cap_numel=1000)
    assert [[s.name for s in b.slots] for b in lay.buckets] == [["p2"], ["p1"], ["p0"]]


def test_layout_digest_covers_what_shapes_the_wire():
    spec = resolve_spec("fp8_e4m3", None)
    base = plan_buckets(_named([(10, 10), (7,)]), world_size=2, spec=spec, cap_numel=10**6)
    same = plan_buckets(_named([(10, 10), (7,)]), world_size=2, spec=spec, cap_numel=10**6)
    assert base.digest == same.digest
    others = [
        plan_buckets(_named([(10, 10), (8,)]), world_size=2, spec=spec, cap_numel=10**6),
        plan_buckets(_named([(10, 10), (7,)]), world_size=4, spec=spec, cap_numel=10**6),
        plan_buckets(_named([(10, 10), (7,)]), world_size=2, spec=resolve_spec("fp8_e5m2", None), cap_numel=10**6),
        plan_buckets(_named([(10, 10), (7,)]), world_size=2, spec=spec, cap_numel=100),
        plan_buckets(_named([(10, 10), (7,)]), world_size=2, spec=spec, cap_numel=10**6, sharded=True),
    ]
    assert len({base.digest, *[o.digest for o in others]}) == 6


def test_storage_folds_each_gradient_like_the_accumulate_reference():
    spec = resolve_spec("fp8_e4m3", None)
    named = _named([(37, 61), (61,), (300,)])
    lay = plan_buckets(named, world_size=2, spec=spec, cap_numel=10**6)
    st = GradStorage(lay, torch.device("cpu"), __import__("agoq_core").get_backend("reference"))
    assert st.nbytes == lay.numel + 4 * lay.numel // 256
    g = torch.Generator().manual_seed(1)
    grads = [[torch.randn(*p.shape, generator=g).to(torch.bfloat16) for _, p in named] for _ in range(3)]
    for mb in grads:
        for i, gi in enumerate(mb):
            st.fold_(i, gi)
    for i, (_, p) in enumerate(named):  # independent chain: Q(D(Q(D(Q(g0)) + g1)) + g2)
        c, s = ref.quantize_blocks(grads[0][i].float().reshape(-1), spec)
        for mb in grads[1:]:
            c, s = ref.accumulate(c, s, spec, p.numel(), mb[i])
        assert torch.equal(st.views[i].codes, c) and torch.equal(st.views[i].scales, s)
    # the padding between parameters is untouched zero codes
    slot = lay.slots[1]
    tail = st.codes[slot.bucket][slot.offset + slot.numel: -(-(slot.offset + slot.numel) // 256) * 256]
    assert (tail == spec.zero_code).all()
    assert not st.has_nonfinite()
    st.fold_(2, torch.full((300,), float("inf")))
    assert st.has_nonfinite() and st.nonfinite_params() == ["p2"]
    st.zero_()
    assert not st.has_nonfinite() and (st.codes[0] == 0).all()


# ---- config and input errors --------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    ({"fmt": "int4"}, "fp8_e4m3, fp8_e5m2, int8"),
    ({"fmt": "bf16"}, "fp8_e4m3, fp8_e5m2, int8"),
    ({"block": 100}, "not a positive multiple of 8"),
    ({"collective": "ring"}, "quangrad, fp32, bf16, naive_fp8"),
    ({"collective": "naive_fp8", "fmt": "int8"}, "needs an fp8 fmt"),
    ({"min_compress_bytes": -1}, "int >= 0"),
    ({"max_grad_norm": 0.0}, "> 0 or None"),
    ({"bucket_cap_mb": 0}, "positive number"),
    ({"on_nonfinite": "ignore"}, "'skip', 'raise' or 'apply'"),
    ({"fallback_dtype": "fp16"}, "'fp32' or 'bf16'"),
])
def test_config_validates(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        QuanGradConfig(**kwargs)


def test_config_defaults():
    cfg = QuanGradConfig()
    # "auto": fp8_e4m3 unless the device has no FP8 units (QuanGradDDP resolves it per backend; issue 20)
    assert (cfg.fmt, cfg.spec.name, cfg.block, cfg.collective, cfg.spec.block) == ("auto", "fp8_e4m3", 256, "quangrad", 256)
    assert QuanGradConfig(fmt="INT8").spec == get_format("int8", 256)
    with pytest.raises(Exception):
        cfg.fmt = "int8"  # frozen


def test_collectives_without_a_process_group_say_how_to_start_one():
    with pytest.raises(RuntimeError, match="init_process_group.*simulate_all_reduce"):
        all_reduce_(torch.ones(4))


def test_simulation_rejects_mismatched_ranks_and_bad_formats():
    with pytest.raises(ValueError, match="same shape and dtype"):
        simulate_all_reduce([torch.ones(4), torch.ones(5)])
    with pytest.raises(ValueError, match="non-empty list"):
        simulate_all_reduce([])
    with pytest.raises(ValueError, match="fp8_e4m3, fp8_e5m2, int8"):
        simulate_all_reduce([torch.ones(4)], "nf4")
    empty = simulate_all_reduce([torch.empty(0), torch.empty(0)])
    assert empty.results[0].numel() == 0 and empty.payloads[0].all_to_all.numel() == 0


def test_optimizer_factory():
    p = [torch.nn.Parameter(torch.zeros(5000))]
    assert isinstance(optimizer_factory("adamw", lr=1e-3)(p), torch.optim.AdamW)
    if __import__("importlib.util").util.find_spec("bitsandbytes") is not None:
        assert type(optimizer_factory("adamw8bit", lr=1e-3)(p)).__module__.startswith("bitsandbytes")
    with pytest.raises(ValueError, match="adamw8bit"):
        optimizer_factory("lion")
