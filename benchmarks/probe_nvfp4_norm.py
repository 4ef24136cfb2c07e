"""Split the fused NVFP4 RMSNorm + quantize's time (16384 x 4096 bf16, H100): it measured 207.2 us on 2026-12-07 at
02:37 UTC and 370.9 us at 05:29 UTC, while the compiled norm + codec pair, which shares its tensor-scale pass, went from
297.6 to 214.9 us (docs/bench/codecs.md, sixteenth session). Times the tensor-scale pass, the fused norm and the codec
quantize with the persistent partials launch (CudaGeometry.partials_launch) and with the codec plan's, interleaved, and
profiles five fused calls (which kernels, how long each). GPU only (~1 minute):

    source benchmarks/gpu_env.sh; python3 benchmarks/probe_nvfp4_norm.py
"""
import sys

import torch
from triton.testing import do_bench, do_bench_cudagraph

from agoq_core.formats.spec import get_format
from agoq_cuda import launch as L
from agoq_cuda.fused_norm import rmsnorm_quant_into

if not torch.cuda.is_available():
    sys.exit("probe_nvfp4_norm.py needs a CUDA GPU")
torch.manual_seed(0)
dev = torch.device("cuda")
spec = get_format("nvfp4")
x = torch.randn(16384, 4096, device=dev, dtype=torch.bfloat16)
w = (1 + 0.1 * torch.randn(4096, device=dev)).to(torch.bfloat16)
y = torch.empty_like(x)
codes = torch.empty(spec.code_bytes(x.numel()), dtype=torch.uint8, device=dev)
scales = torch.empty(spec.num_blocks(x.numel()), dtype=torch.float32, device=dev)
c2, s2 = torch.empty_like(codes), torch.empty_like(scales)
orig = L.CudaGeometry.partials_launch


def B(f):  # noqa: N802 - microseconds, median, eager launches (host time included where the host is slower)
    return do_bench(f, warmup=25, rep=100, return_mode="median") * 1e3


def G(f):  # noqa: N802 - the same replayed from a CUDA graph (no host time): much less than B means host-bound
    try:
        return do_bench_cudagraph(f, rep=50, return_mode="median") * 1e3
    except Exception as exc:  # noqa: BLE001 - reported, not fatal
        print(f"  (CUDA graph timing failed: {type(exc).__name__}: {str(exc)[:120]})")
        return float("nan")


ref = None
for mode in ("persistent", "plan", "persistent", "plan"):
    L.CudaGeometry.partials_launch = orig if mode == "persistent" else (lambda self, d: (None, None))
    ts = B(lambda: L.LAUNCHER.tensor_scale(spec, x))
    fz = B(lambda: rmsnorm_quant_into(x, w, 1e-5, spec, y, codes, scales))
    qz = B(lambda: L.quantize(x, spec, c2, s2))
    fg = G(lambda: rmsnorm_quant_into(x, w, 1e-5, spec, y, codes, scales))
    s = L.LAUNCHER.tensor_scale(spec, x)
    ref = s if ref is None else ref
    print(f"{mode:10s} tensor_scale {ts:7.1f} us  fused norm {fz:7.1f} us (graph {fg:7.1f})  codec quantize {qz:7.1f} us  "
          f"scale same {bool(torch.equal(s, ref))}  codes same {bool(torch.equal(codes, c2))}", flush=True)
L.CudaGeometry.partials_launch = orig  # the profile is of the default (persistent) launch
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(5):
        rmsnorm_quant_into(x, w, 1e-5, spec, y, codes, scales)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=60))
