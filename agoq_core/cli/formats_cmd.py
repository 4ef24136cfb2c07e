"""``agoq formats``: each format's storage cost and its measured SQNR on the selected backend."""
from __future__ import annotations

import argparse
import json

import torch


def measure(numel: int = 1 << 20, seed: int = 0, backend: str | None = None) -> list[dict]:
    import agoq_core
    from agoq_core.backend import get_backend
    from agoq_core.testing.tolerances import sqnr_db

    be = get_backend(backend)
    dev = next((t for t in sorted(be.capabilities().device_types) if t != "*"), "cpu")
    g = torch.Generator().manual_seed(seed)
    gauss = torch.randn(numel, generator=g)
    # heavy-tailed: Student-t with 3 degrees of freedom, the shape of LLM activation outliers
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        heavy = torch.distributions.StudentT(3.0).sample((numel,))
    rows = []
    for spec in agoq_core.list_formats():
        row = {"format": spec.name, "role": spec.role, "bits": spec.bits, "block": spec.block,
               "bits_per_element": spec.bits_per_element,
               "bytes_per_1M": spec.storage_bytes(1 << 20)}
        for name, x in (("gauss", gauss), ("heavy_tailed", heavy)):
            xd = x.to(dev)
            q = agoq_core.quantize(xd, spec, backend=be)
            row[f"sqnr_{name}_db"] = round(sqnr_db(agoq_core.dequantize(q, backend=be).cpu(), x), 2)
        rows.append(row)
    return rows


def _run(args: argparse.Namespace) -> int:
    from agoq_core.backend import get_backend

    be = get_backend(args.backend)
    rows = measure(args.numel, args.seed, be.name)
    if args.json:
        print(json.dumps({"backend": be.name, "numel": args.numel, "formats": rows}, indent=2))
        return 0
    print(f"formats on backend {be.name!r} ({args.numel} elements; SQNR = signal / quantization noise)")
    hdr = f"{'format':<10} {'role':<10} {'bits':>4} {'block':>5} {'bits/elem':>9} {'SQNR gauss':>11} {'SQNR heavy':>11}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['format']:<10} {r['role']:<10} {r['bits']:>4} {r['block']:>5} {r['bits_per_element']:>9.3f} "
              f"{r['sqnr_gauss_db']:>9.2f}dB {r['sqnr_heavy_tailed_db']:>9.2f}dB")
    return 0


def register(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true")
    p.add_argument("--backend", default=None, help="backend to measure on (default: selected)")
    p.add_argument("--numel", type=int, default=1 << 20)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_run)
