"""The codec fused into its memory-bound neighbours (docs/fusion.md, issue 17), on one GPU in one run:

1. RMSNorm + quantize of its input (op ``rmsnorm_quant``) vs the unfused pair (HF LlamaRMSNorm, eager and
   torch.compile'd, then the codec kernel), at 4K tokens x 4096; for every numerics variant: how many
   elements of y differ from HF's norm, whether LAAQ's run-time rule accepts it (codes exact; rows whose fp32
   inverse RMS is 1 ulp apart may differ by <= 2 steps: agoq_core.laaq.fusion.norm_within_tolerance), its time.
2. SiLU&Mul + quantize of gate and up (``silu_mul_quant``) vs the codec twice + F.silu(g) * u, and the
   SwiGLU backward with the decode inside (``silu_mul_backward``) vs decode twice + autograd's SiLU
   backward and the two products; [4096, 11008]; every variant's mismatches (and all 65,536 bf16 SiLU
   inputs for the forward).
3. A LLaMA-2-7B decoder layer (one HF LlamaDecoderLayer + final norm, bf16, SDPA, 4K tokens) forward +
   backward, timed with the default (flash) attention: plain vs LAAQ (nf4) unfused (AGOQ_FUSION=0) vs LAAQ
   with the default fusion (AGOQ_FUSION unset: the elementwise group on CUDA). Gradient checks with the
   deterministic math attention (flash's backward is not deterministic at 4K tokens): a control (unfused
   twice, also with flash), the bit-exact ops (silu_mul_quant, silu_mul_backward) vs unfused (must be
   bit-identical), and all three vs unfused (differs only through norm rows accepted within the tolerance);
   each names the tensors that differ and by how much.
4. torch.profiler of that layer step, plain vs LAAQ unfused vs LAAQ fused: device time by kernel category
   (GEMM / attention / codec / copies / elementwise+norm / other), top kernels, CUDA API calls (syncs,
   mallocs), copies by shape; and LAAQ's extra time per category (--no-profile skips it).

    source benchmarks/gpu_env.sh && python benchmarks/bench_fusion_elementwise.py     # H200, < 3 min
    python benchmarks/bench_fusion_elementwise.py --smoke                              # CPU, interpreter

Writes a table to stdout and $OUT/bench_fusion_elementwise.json; exits 1 if a check fails.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU through the Triton interpreter")
ap.add_argument("--tokens", type=int, default=4096)
ap.add_argument("--fmt", default="nf4")
ap.add_argument("--iters", type=int, default=20)
ap.add_argument("--no-profile", action="store_true", help="skip the torch.profiler breakdown (section 4)")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

harness.add_json_arg(ap, "bench_fusion_elementwise")
args = ap.parse_args()

import torch  # noqa: E402

if args.smoke and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
os.environ["AGOQ_BACKEND"] = "cuda"

import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402

from agoq_core.formats import reference as ref  # noqa: E402
from agoq_core.formats.spec import get_format  # noqa: E402
from agoq_cuda import fused_norm, fused_swiglu, launch  # noqa: E402

dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SMOKE = args.smoke
T = 16 if SMOKE else args.tokens
HID, INTER = (256, 512) if SMOKE else (4096, 11008)
ITERS = 2 if SMOKE else args.iters
spec = get_format(args.fmt)
report: dict = {"env": harness.environment(dev, smoke=SMOKE), "fmt": args.fmt, "tokens": T, "hidden": HID,
                "intermediate": INTER}
errors: list[str] = []
t_start = time.time()


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()


def bench(fn, iters=ITERS) -> float:
    """Median ms of ``fn`` (CUDA events on GPU)."""
    fn()
    sync()
    ts = []
    for _ in range(iters):
        if dev.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def ndiff(a: torch.Tensor, b: torch.Tensor) -> int:
    a, b = a.reshape(-1), b.reshape(-1)
    same = (a.view(torch.int16) == b.view(torch.int16)) | (torch.isnan(a) & torch.isnan(b))
    return int((~same).sum())


def codes_buf(n):
    return (torch.empty(spec.code_bytes(n), dtype=torch.uint8, device=dev),
            torch.empty(spec.num_blocks(n), dtype=torch.float32, device=dev))


g = torch.Generator(device="cpu").manual_seed(0)

# ---- 1. RMSNorm + quantize ------------------------------------------------------------------------------
from transformers.models.llama.modeling_llama import LlamaRMSNorm  # noqa: E402

x = (torch.randn(T, HID, generator=g) * torch.rand(T, 1, generator=g) * 4).to(torch.bfloat16).to(dev)
norm = LlamaRMSNorm(HID, eps=1e-5).to(dev, torch.bfloat16)
with torch.no_grad():
    norm.weight.copy_((1 + 0.1 * torch.randn(HID, generator=g)).to(torch.bfloat16))
n = x.numel()
c1, s1 = codes_buf(n)
c2, s2 = codes_buf(n)
rows = []
with torch.no_grad():
    y_hf = norm(x)
    t_unfused = bench(lambda: (norm(x), launch.quantize(x, spec, c2, s2)))
    cnorm = torch.compile(norm) if not SMOKE else norm
    cnorm(x)
    t_compiled = bench(lambda: (cnorm(x), launch.quantize(x, spec, c2, s2)))
    y_comp = cnorm(x)
    rc, rs = ref.quantize_blocks(x.cpu(), spec)
    from agoq_core.laaq.fusion import norm_within_tolerance  # noqa: E402

    for v in fused_norm.rmsnorm_quant_variants(dev):
        y = torch.empty_like(x)
        rinv = torch.empty(T, dtype=torch.float32, device=dev)
        fused_norm.rmsnorm_quant_into(x, norm.weight, 1e-5, spec, y, c1, s1, variant=v, rinv=rinv)
        exact = torch.equal(c1.cpu(), rc) and torch.equal(s1.cpu(), rs)
        tol: dict = {}
        within = norm_within_tolerance(x, norm.weight, y, rinv, y_hf, tol)  # LAAQ's run-time acceptance rule
        d = ndiff(y, y_hf)
        detail = []
        if d:  # what the differing elements look like: ULP steps apart, and in which rows
            bad = (y.view(torch.int16) != y_hf.view(torch.int16)).nonzero()[:5].tolist()
            for r, cc in bad:
                detail.append({"row": r, "col": cc, "x": float(x[r, cc]), "y": float(y[r, cc]),
                               "y_hf": float(y_hf[r, cc]),
                               "bits_apart": int(y[r, cc].view(torch.int16)) - int(y_hf[r, cc].view(torch.int16))})
        t = bench(lambda: fused_norm.rmsnorm_quant_into(x, norm.weight, 1e-5, spec, y, c1, s1, variant=v))
        rows.append({"variant": v, "fused_ms": t, "x_vs_eager_pair": t_unfused / t, "x_vs_compiled_pair": t_compiled / t,
                     "codes_exact": exact, "within_tolerance_of_hf": within, "tolerance_stats": tol,
                     "y_elements_differing_from_hf": d, "y_differing_from_compiled_hf":
                     ndiff(y, y_comp), "examples": detail})
        if not exact:
            errors.append(f"rmsnorm_quant {v}: codes differ from the reference")
passing = [r for r in rows if r["codes_exact"] and r["within_tolerance_of_hf"]]
report["rmsnorm_quant"] = {"unfused_eager_ms": t_unfused, "unfused_compiled_ms": t_compiled, "variants": rows,
                           "compiled_hf_vs_eager_hf_differing": ndiff(y_comp, y_hf),
                           "fastest_within_tolerance": min(passing, key=lambda r: r["fused_ms"])["variant"]
                           if passing else None}
if not passing:
    errors.append("rmsnorm_quant: no variant within the tolerance of HF's norm (docs/fusion.md)")
del x, y_hf

# ---- 2. SiLU&Mul + quantize, and its backward -------------------------------------------------------------
gate = (torch.randn(T, INTER, generator=g) * 2).to(torch.bfloat16).to(dev)
up = torch.randn(T, INTER, generator=g).to(torch.bfloat16).to(dev)
dh = torch.randn(T, INTER, generator=g).to(torch.bfloat16).to(dev)
n = gate.numel()
bg, bu = codes_buf(n), codes_buf(n)
cg, cu = codes_buf(n), codes_buf(n)
all_bf16 = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
all_bf16 = torch.where(torch.isfinite(all_bf16), all_bf16, torch.zeros_like(all_bf16)).to(dev)
ones = torch.ones_like(all_bf16)
i8 = get_format("int8")
i8bufs = [torch.empty(i8.code_bytes(all_bf16.numel()), dtype=torch.uint8, device=dev),
          torch.empty(i8.num_blocks(all_bf16.numel()), device=dev)] * 2
silu_all = F.silu(all_bf16)


def unfused_fwd():
    launch.quantize(gate, spec, *cg)
    launch.quantize(up, spec, *cu)
    return F.silu(gate) * up


def unfused_bwd():
    gd = torch.empty_like(gate)
    ud = torch.empty_like(up)
    launch.dequantize(*bg, spec, gd.view(-1))
    launch.dequantize(*bu, spec, ud.view(-1))
    gd.requires_grad_(True)
    with torch.enable_grad():
        a = F.silu(gd)
    ad = a.detach()
    du = dh * ad
    (dg,) = torch.autograd.grad(a, (gd,), dh * ud)
    return ad * ud, dg, du


h_ref = unfused_fwd()
t_fwd_unfused = bench(unfused_fwd)
fwd_rows = []
for v in fused_swiglu.silu_mul_quant_variants(dev):
    h = torch.empty_like(gate)
    fused_swiglu.silu_mul_quant_into(gate, up, spec, h, *bg, *bu, variant=v)
    exact = all(torch.equal(a, b) for a, b in zip((*bg, *bu), (*cg, *cu)))
    he = torch.empty_like(all_bf16)
    fused_swiglu.silu_mul_quant_into(all_bf16, ones, i8, he, *i8bufs, variant=v)
    t = bench(lambda: fused_swiglu.silu_mul_quant_into(gate, up, spec, h, *bg, *bu, variant=v))
    fwd_rows.append({"variant": v, "fused_ms": t, "x_vs_unfused": t_fwd_unfused / t, "codes_exact": exact,
                     "h_elements_differing": ndiff(h, h_ref), "silu_of_all_bf16_differing": ndiff(he, silu_all)})
    if not exact:
        errors.append(f"silu_mul_quant {v}: codes differ from the codec kernel's")
report["silu_mul_quant"] = {"unfused_ms": t_fwd_unfused, "variants": fwd_rows}

want = unfused_bwd()
t_bwd_unfused = bench(unfused_bwd)
bwd_rows = []
for v in fused_swiglu.silu_mul_backward_variants(dev):
    outs = [torch.empty_like(dh) for _ in range(3)]
    fused_swiglu.silu_mul_backward_into(dh, *bg, *bu, spec, *outs, variant=v)
    t = bench(lambda: fused_swiglu.silu_mul_backward_into(dh, *bg, *bu, spec, *outs, variant=v))
    bwd_rows.append({"variant": v, "fused_ms": t, "x_vs_unfused": t_bwd_unfused / t,
                     "differing": {k: ndiff(o, w) for k, o, w in zip(("h", "dgate", "dup"), outs, want)}})
report["silu_mul_backward"] = {"unfused_ms": t_bwd_unfused, "variants": bwd_rows}
del gate, up, dh, want, h_ref

# ---- 3. LLaMA-2-7B decoder layer forward + backward --------------------------------------------------------
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from agoq_core import laaq  # noqa: E402
from agoq_core.laaq import fusion  # noqa: E402

cfg = transformers.LlamaConfig(hidden_size=HID, intermediate_size=INTER, num_hidden_layers=1,
                               num_attention_heads=32 if not SMOKE else 4, num_key_value_heads=32 if not SMOKE else 4,
                               vocab_size=256, max_position_embeddings=max(T, 64), attn_implementation="sdpa")
torch.manual_seed(0)
model = transformers.LlamaModel(cfg).to(dev, torch.bfloat16)
emb = (torch.randn(1, T, HID, generator=g) * 0.5).to(torch.bfloat16).to(dev)
gout = torch.randn(1, T, HID, generator=g).to(torch.bfloat16).to(dev)
# AGOQ_FUSION unset is the default (the elementwise group on CUDA devices); the interpreter needs it explicitly
FUSED = "elementwise"


def step():
    e = emb.detach().requires_grad_(True)
    out = model(inputs_embeds=e).last_hidden_state
    out.backward(gout)
    return out.detach(), e.grad


def grads(fusion_env: str | None, math_attention: bool):
    """Output, input gradient and every parameter gradient of one step (after one warm-up step: the first
    call of each fused op compares its variants and returns the unfused result)."""
    set_fusion(fusion_env)
    with sdpa_kernel(SDPBackend.MATH) if math_attention else contextlib.nullcontext():
        for _ in range(2):
            model.zero_grad(set_to_none=True)
            out, ge = step()
    return [("output", out), ("d_inputs_embeds", ge)] + [(n, p.grad.detach().clone()) for n, p in
                                                         model.named_parameters() if p.grad is not None]


def set_fusion(value: str | None):
    if value is None:
        os.environ.pop("AGOQ_FUSION", None)
    else:
        os.environ["AGOQ_FUSION"] = value


def compare(a: list, b: list) -> dict:
    """Which tensors differ, and by how much: max |a-b| / max |b|, the normalised L2 difference
    ||a-b|| / ||b|| and the count of differing elements."""
    diff = {}
    for (n, x), (n2, y) in zip(a, b, strict=True):
        assert n == n2, (n, n2)
        if not torch.equal(x, y):
            d = (x.float() - y.float()).abs()
            diff[n] = {"elements": int((x != y).sum()), "max_abs": float(d.max()),
                       "rel": float(d.max() / y.float().abs().max().clamp_min(1e-30)),
                       "rel_l2": float(d.norm() / y.float().norm().clamp_min(1e-30))}
    return {"bit_identical": not diff, "differing": diff}


layer: dict = {}
layer["plain_ms"] = bench(step)
laaq.apply(model, laaq.LAAQConfig(norm_input=args.fmt, mlp_act_input=args.fmt))
set_fusion("0")
layer["laaq_unfused_ms"] = bench(step)
set_fusion(None if dev.type == "cuda" else FUSED)
step()  # first calls: the variants are checked against the unfused path
layer["laaq_fused_ms"] = bench(step)
layer["fusion_default_on_here"] = fusion.fusion_enabled("elementwise", dev)
layer["chosen_variants"] = {k[0]: (c.variants[0] if c.variants else None) for k, c in fusion._choices.items()}
layer["check_stats"] = {k[0]: c.stats for k, c in fusion._choices.items() if c.stats}
layer["laaq_unfused_vs_plain"] = layer["plain_ms"] / layer["laaq_unfused_ms"]
layer["laaq_fused_vs_plain"] = layer["plain_ms"] / layer["laaq_fused_ms"]

# Gradient checks. Flash/efficient SDPA backward is not deterministic at 4K tokens, so the fusion is
# checked with the math attention (deterministic); the flash control shows the attention's own noise.
EXACT_OPS = "silu_mul_quant,silu_mul_backward"  # the bit-exact fused ops (the norm has a tolerance)
checks = {}
ref_math = grads("0", True)
checks["control_math_unfused_twice"] = compare(grads("0", True), ref_math)
checks["control_flash_unfused_twice"] = compare(grads("0", False), grads("0", False))
checks["math_exact_ops_vs_unfused"] = compare(grads(EXACT_OPS, True), ref_math)
checks["math_all_elementwise_vs_unfused"] = compare(grads(FUSED if dev.type != "cuda" else None, True), ref_math)
norm_rows_differing = sum(c.stats.get("rows_differing", 0) for k, c in fusion._choices.items()
                          if k[0] == "rmsnorm_quant")
checks["norm_rows_differing_in_checks"] = norm_rows_differing
layer["checks"] = checks
if not checks["control_math_unfused_twice"]["bit_identical"]:
    errors.append("LAAQ layer: unfused LAAQ is not deterministic with the math attention")
if not checks["math_exact_ops_vs_unfused"]["bit_identical"]:
    errors.append(f"LAAQ layer: the bit-exact fused ops change gradients: "
                  f"{sorted(checks['math_exact_ops_vs_unfused']['differing'])}")
allv = checks["math_all_elementwise_vs_unfused"]
# The fused norm may move rows by <= 2 bf16 steps (its check ran on the flash run's inputs; the math run's
# differ, so it may differ in other rows here). Downstream, 4-bit codes of the MLP input flip wherever a
# value sits near a rounding boundary, so every gradient then differs at the level of LAAQ's own
# quantization noise (normalised L2 ~0.1 at nf4, docs/laaq.md): the bound is a fraction of that noise,
# not an element-wise one. Without the fused norm the gradients must be bit-identical.
NORM_FUSED_MAX_REL_L2 = 0.05
norm_fused = layer["chosen_variants"].get("rmsnorm_quant") is not None
if not allv["bit_identical"] and (not norm_fused or max(d["rel_l2"] for d in allv["differing"].values())
                                  > NORM_FUSED_MAX_REL_L2):
    errors.append("LAAQ layer: fused gradients differ from unfused beyond the norm's tolerance: "
                  f"{ {n: round(d['rel_l2'], 6) for n, d in allv['differing'].items()} } (normalised L2; bound "
                  f"{NORM_FUSED_MAX_REL_L2} with the fused norm)")
set_fusion(None if dev.type == "cuda" else FUSED)
report["decoder_layer"] = layer

# ---- 4. where the time goes: torch.profiler, plain vs LAAQ ---------------------------------------------------
CATS = (("attention", ("flash", "fmha", "attention", "sdpa", "cudnn", "softmax")),
        ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "sm90_", "sm80_", "splitk", "::mm", "::bmm",
                  "addmm")),
        ("codec", ("quantize", "dequantize", "rmsnorm_quant", "silu_mul", "_codec", "_kernel_nf", "triton")),
        ("copy", ("copy", "memcpy", "memset", "cat", "fill", "contiguous", "clone")),
        ("elementwise+norm", ("elementwise", "reduce", "vectorized", "mul", "add", "silu", "rsqrt", "pow",
                              "mean", "norm", "sum", "cos", "sin", "neg", "exp")))


def category(name: str) -> str:
    low = name.lower()
    for cat, keys in CATS:
        if any(k in low for k in keys):
            return cat
    return "other"


def profile(label: str, steps: int = 3) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprof

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    step()
    sync()
    t0 = time.perf_counter()
    with tprof(activities=acts, record_shapes=True) as prof:
        for _ in range(steps):
            step()
        sync()
    wall = (time.perf_counter() - t0) * 1e3 / steps
    by_cat: dict = {}
    kernels: dict = {}
    n_kernels = 0
    api: dict = {}
    ops: dict = {}
    copies: dict = {}
    for e in prof.key_averages():
        dt = str(getattr(e, "device_type", "")).upper()
        is_kernel = "CUDA" in dt if dev.type == "cuda" else False
        if is_kernel:
            us = e.self_device_time_total / steps
            by_cat[category(e.key)] = by_cat.get(category(e.key), 0.0) + us
            kernels[e.key[:120]] = (us, e.count // steps)
            n_kernels += e.count
        elif e.key.startswith("aten::") or e.key.startswith("cuda") or e.key.startswith("agoq"):
            dev_us = getattr(e, "self_device_time_total", 0) / steps
            ops[e.key] = {"count": e.count // steps, "self_device_us": round(dev_us, 1),
                          "self_cpu_us": round(e.self_cpu_time_total / steps, 1)}
            if e.key.startswith("cuda"):
                api[e.key] = e.count // steps
            if dev.type != "cuda":  # CPU run: the ops' own time stands for the kernels
                us = e.self_cpu_time_total / steps
                by_cat[category(e.key)] = by_cat.get(category(e.key), 0.0) + us
    for e in prof.key_averages(group_by_input_shape=True):
        if e.key in ("aten::copy_", "aten::cat", "aten::clone", "aten::contiguous", "aten::_to_copy"):
            k = f"{e.key} {e.input_shapes}"[:160]
            copies[k] = {"count": e.count // steps,
                         "self_device_us": round(getattr(e, "self_device_time_total", 0) / steps, 1)}
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:25]
    return {"label": label, "step_wall_ms": wall, "device_ms_by_category": {k: round(v / 1e3, 3) for k, v in
                                                                           sorted(by_cat.items())},
            "device_ms_total": round(sum(by_cat.values()) / 1e3, 3), "kernels_per_step": n_kernels // steps,
            "top_kernels_ms": [(k, round(v[0] / 1e3, 4), v[1]) for k, v in top],
            "cuda_api_calls_per_step": api,
            "top_ops": dict(sorted(ops.items(), key=lambda kv: -(kv[1]["self_device_us"] or kv[1]["self_cpu_us"]))[:30]),
            "copies_by_shape": dict(sorted(copies.items(), key=lambda kv: -kv[1]["count"])[:20])}


prof_report = {}
if not args.no_profile:
    laaq.remove(model)
    prof_report["plain"] = profile("plain")
    laaq.apply(model, laaq.LAAQConfig(norm_input=args.fmt, mlp_act_input=args.fmt))
    set_fusion("0")
    prof_report["laaq_unfused"] = profile("laaq_unfused")
    set_fusion(None if dev.type == "cuda" else FUSED)
    step()
    prof_report["laaq_fused"] = profile("laaq_fused")
    p0 = prof_report["plain"]["device_ms_by_category"]
    for arm in ("laaq_unfused", "laaq_fused"):
        c = prof_report[arm]["device_ms_by_category"]
        prof_report[arm]["extra_ms_vs_plain_by_category"] = {k: round(c.get(k, 0) - p0.get(k, 0), 3)
                                                             for k in sorted(set(c) | set(p0))}
report["profile"] = prof_report
report["errors"] = errors
report["seconds"] = time.time() - t_start

# ---- table --------------------------------------------------------------------------------------------------
print(f"\n{report['env'].get('gpu', dev)}  {args.fmt}  tokens {T}  hidden {HID}  intermediate {INTER}")
r = report["rmsnorm_quant"]
print(f"RMSNorm+quantize: unfused eager pair {r['unfused_eager_ms']:.3f} ms, compiled pair {r['unfused_compiled_ms']:.3f} ms")
for v in r["variants"]:
    print(f"  {v['variant']:14s} {v['fused_ms']:.3f} ms  x{v['x_vs_eager_pair']:.2f} eager  x{v['x_vs_compiled_pair']:.2f} "
          f"compiled  codes exact {v['codes_exact']}  y != HF: {v['y_elements_differing_from_hf']}  within tolerance "
          f"{v['within_tolerance_of_hf']} {v['tolerance_stats']}")
print(f"  fastest within tolerance: {r['fastest_within_tolerance']}")
for name in ("silu_mul_quant", "silu_mul_backward"):
    r = report[name]
    print(f"{name}: unfused {r['unfused_ms']:.3f} ms")
    for v in r["variants"]:
        print(f"  {v['variant']:14s} {v['fused_ms']:.3f} ms  x{v['x_vs_unfused']:.2f}  "
              f"{'codes exact ' + str(v['codes_exact']) + '  h differing ' + str(v['h_elements_differing']) if 'codes_exact' in v else v['differing']}")
print(f"decoder layer fwd+bwd: plain {layer['plain_ms']:.2f} ms, LAAQ {layer['laaq_unfused_ms']:.2f} ms "
      f"(x{layer['laaq_unfused_vs_plain']:.3f}), LAAQ fused {layer['laaq_fused_ms']:.2f} ms (x{layer['laaq_fused_vs_plain']:.3f}); "
      f"variants {layer['chosen_variants']}; check stats {layer['check_stats']}")
for name, c in layer["checks"].items():
    if isinstance(c, dict):
        print(f"  {name:34s} bit-identical {c['bit_identical']}"
              + ("  differing (elements, max rel, normalised L2): "
                 + str({n: (d["elements"], f"{d['rel']:.2e}", f"{d['rel_l2']:.2e}") for n, d in c["differing"].items()})
                 if c["differing"] else ""))
print(f"  norm rows accepted within tolerance during the checks: {layer['checks']['norm_rows_differing_in_checks']}")
for arm, pr in report["profile"].items():
    print(f"profile {arm:13s} wall {pr['step_wall_ms']:.2f} ms/step, device {pr['device_ms_total']:.2f} ms, "
          f"{pr['kernels_per_step']} kernels: {pr['device_ms_by_category']}")
    if "extra_ms_vs_plain_by_category" in pr:
        print(f"  extra vs plain: {pr['extra_ms_vs_plain_by_category']}")
    print(f"  cuda API calls/step: {pr['cuda_api_calls_per_step']}")
    for k, ms, cnt in pr["top_kernels_ms"][:12]:
        print(f"    {ms:8.3f} ms x{cnt:<3d} {k[:100]}")
print(f"errors: {errors or 'none'}  ({report['seconds']:.0f} s)")
harness.write_json(report, args.json, "bench_fusion_elementwise")
sys.exit(1 if errors else 0)
