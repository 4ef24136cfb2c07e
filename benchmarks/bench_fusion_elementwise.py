"""The codec fused into its memory-bound neighbours (docs/fusion.md, issue 17), on one GPU in one run:

1. RMSNorm + quantize of its input (op ``rmsnorm_quant``) vs the unfused pair (HF LlamaRMSNorm, eager and
   torch.compile'd, then the codec kernel), at 4K tokens x 4096; for every numerics variant: how many
   elements of y differ from HF's norm (the investigation of "559 of 67M differ"), and its time.
2. SiLU&Mul + quantize of gate and up (``silu_mul_quant``) vs the codec twice + F.silu(g) * u, and the
   SwiGLU backward with the decode inside (``silu_mul_backward``) vs decode twice + autograd's SiLU
   backward and the two products; [4096, 11008]; every variant's mismatches (and all 65,536 bf16 SiLU
   inputs for the forward).
3. A LLaMA-2-7B decoder layer (one HF LlamaDecoderLayer + final norm, bf16, SDPA, 4K tokens) forward +
   backward: plain vs LAAQ (nf4) unfused vs LAAQ with AGOQ_FUSION=elementwise (loss and gradients must
   be bit-identical between the two LAAQ runs).

    source benchmarks/gpu_env.sh && python benchmarks/bench_fusion_elementwise.py     # H200, < 3 min
    python benchmarks/bench_fusion_elementwise.py --smoke                              # CPU, interpreter

Writes a table to stdout and $OUT/bench_fusion_elementwise.json.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU through the Triton interpreter")
ap.add_argument("--tokens", type=int, default=4096)
ap.add_argument("--fmt", default="nf4")
ap.add_argument("--iters", type=int, default=20)
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
    for v in fused_norm.rmsnorm_quant_variants(dev):
        y = torch.empty_like(x)
        fused_norm.rmsnorm_quant_into(x, norm.weight, 1e-5, spec, y, c1, s1, variant=v)
        exact = torch.equal(c1.cpu(), rc) and torch.equal(s1.cpu(), rs)
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
                     "codes_exact": exact, "y_elements_differing_from_hf": d, "y_differing_from_compiled_hf":
                     ndiff(y, y_comp), "examples": detail})
        if not exact:
            errors.append(f"rmsnorm_quant {v}: codes differ from the reference")
report["rmsnorm_quant"] = {"unfused_eager_ms": t_unfused, "unfused_compiled_ms": t_compiled, "variants": rows,
                           "compiled_hf_vs_eager_hf_differing": ndiff(y_comp, y_hf)}
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
from agoq_core import laaq  # noqa: E402
from agoq_core.laaq import fusion  # noqa: E402

cfg = transformers.LlamaConfig(hidden_size=HID, intermediate_size=INTER, num_hidden_layers=1,
                               num_attention_heads=32 if not SMOKE else 4, num_key_value_heads=32 if not SMOKE else 4,
                               vocab_size=256, max_position_embeddings=max(T, 64), attn_implementation="sdpa")
torch.manual_seed(0)
model = transformers.LlamaModel(cfg).to(dev, torch.bfloat16)
emb = (torch.randn(1, T, HID, generator=g) * 0.5).to(torch.bfloat16).to(dev)
gout = torch.randn(1, T, HID, generator=g).to(torch.bfloat16).to(dev)


def step():
    e = emb.detach().requires_grad_(True)
    out = model(inputs_embeds=e).last_hidden_state
    out.backward(gout)
    return out.detach(), e.grad


def grads():
    model.zero_grad(set_to_none=True)
    out, ge = step()
    return [out, ge] + [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


layer = {}
layer["plain_ms"] = bench(step)
laaq.apply(model, laaq.LAAQConfig(norm_input=args.fmt, mlp_act_input=args.fmt))
os.environ["AGOQ_FUSION"] = "0"
ref_g = grads()
layer["laaq_unfused_ms"] = bench(step)
os.environ["AGOQ_FUSION"] = "elementwise"
grads()  # first calls: the variants are checked against the unfused path
fused_g = grads()
layer["laaq_fused_ms"] = bench(step)
layer["fused_bit_identical_to_unfused"] = all(torch.equal(a, b) for a, b in zip(ref_g, fused_g))
layer["chosen_variants"] = {k[0]: (c.variants[0] if c.variants else None) for k, c in fusion._choices.items()}
layer["laaq_unfused_vs_plain"] = layer["plain_ms"] / layer["laaq_unfused_ms"]
layer["laaq_fused_vs_plain"] = layer["plain_ms"] / layer["laaq_fused_ms"]
if not layer["fused_bit_identical_to_unfused"]:
    errors.append("LAAQ layer: fused gradients differ from unfused")
report["decoder_layer"] = layer
report["errors"] = errors
report["seconds"] = time.time() - t_start

# ---- table --------------------------------------------------------------------------------------------------
print(f"\n{report['env'].get('gpu', dev)}  {args.fmt}  tokens {T}  hidden {HID}  intermediate {INTER}")
r = report["rmsnorm_quant"]
print(f"RMSNorm+quantize: unfused eager pair {r['unfused_eager_ms']:.3f} ms, compiled pair {r['unfused_compiled_ms']:.3f} ms")
for v in r["variants"]:
    print(f"  {v['variant']:14s} {v['fused_ms']:.3f} ms  x{v['x_vs_eager_pair']:.2f} eager  x{v['x_vs_compiled_pair']:.2f} "
          f"compiled  codes exact {v['codes_exact']}  y != HF: {v['y_elements_differing_from_hf']}")
for name in ("silu_mul_quant", "silu_mul_backward"):
    r = report[name]
    print(f"{name}: unfused {r['unfused_ms']:.3f} ms")
    for v in r["variants"]:
        print(f"  {v['variant']:14s} {v['fused_ms']:.3f} ms  x{v['x_vs_unfused']:.2f}  "
              f"{'codes exact ' + str(v['codes_exact']) + '  h differing ' + str(v['h_elements_differing']) if 'codes_exact' in v else v['differing']}")
print(f"decoder layer fwd+bwd: plain {layer['plain_ms']:.2f} ms, LAAQ {layer['laaq_unfused_ms']:.2f} ms "
      f"(x{layer['laaq_unfused_vs_plain']:.3f}), LAAQ fused {layer['laaq_fused_ms']:.2f} ms (x{layer['laaq_fused_vs_plain']:.3f}); "
      f"bit-identical {layer['fused_bit_identical_to_unfused']}; variants {layer['chosen_variants']}")
print(f"errors: {errors or 'none'}  ({report['seconds']:.0f} s)")
harness.write_json(report, args.json, "bench_fusion_elementwise")
sys.exit(1 if errors else 0)
