"""Launch the fused RMSNorm + quantize (agoq_cuda.fused_norm) a few times at LLaMA-2-7B's norm shape, nothing else:
the target for Nsight Compute (stage ``ncu-norm`` of benchmarks/gpu_session.sh profiles it in this tree and in a
base tree, to see which pipe or stall bounds the kernel; issue 17, the mxfp4 fused norm of 2026-12-06).

    source benchmarks/gpu_env.sh && ncu --clock-control none -k regex:rmsnorm_quant --launch-skip 3 --launch-count 1 \\
        --section ComputeWorkloadAnalysis --section WarpStateStats python benchmarks/run_fused_norm.py --format mxfp4
    python benchmarks/run_fused_norm.py --smoke --format mxfp4      # CPU, interpreter: checks the script
"""
from __future__ import annotations

import argparse
import os


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", default="mxfp4")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--calls", type=int, default=5, help="launches (ncu: skip a few, profile one)")
    ap.add_argument("--prefetch", action="store_true", help="the generic tile's next-row prefetch (fused_norm)")
    ap.add_argument("--smoke", action="store_true", help="tiny shape on CPU through the Triton interpreter")
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    from agoq_core.formats.spec import get_format
    from agoq_cuda.fused_norm import rmsnorm_quant_into

    dev = torch.device("cpu" if args.smoke else "cuda")
    tok, hid = (8, 256) if args.smoke else (args.tokens, args.hidden)
    spec = get_format(args.format)
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(tok, hid, generator=gen).to(torch.bfloat16).to(dev)
    w = (1 + 0.1 * torch.randn(hid, generator=gen)).to(torch.bfloat16).to(dev)
    y = torch.empty_like(x)
    codes = torch.empty(spec.code_bytes(x.numel()), dtype=torch.uint8, device=dev)
    scales = torch.empty(spec.num_blocks(x.numel()), dtype=torch.float32, device=dev)
    for _ in range(args.calls):
        rmsnorm_quant_into(x, w, 1e-5, spec, y, codes, scales, **({"prefetch": True} if args.prefetch else {}))
    if dev.type == "cuda":
        torch.cuda.synchronize()
    print(f"rmsnorm_quant {args.format} {tok}x{hid}: {args.calls} launches; y[0, :4] = {y[0, :4].tolist()}")


if __name__ == "__main__":
    main()
