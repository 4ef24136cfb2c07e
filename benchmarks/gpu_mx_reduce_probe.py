#!/usr/bin/env python
"""Probe the two mxfp8 reduce_requantize conformance cases that miss on the H200 (issue 17).

Runs the golden MX cases through the shared Triton launcher with the device default (HW fp8
conversions) and with hw=False (integer encode), and prints every element that differs from the
reference: the input codes and scales per rank, the decoded fp32 sum, the expected and the got code.

    python benchmarks/gpu_mx_reduce_probe.py            # GPU
"""
from __future__ import annotations

import torch

from agoq_conformance.golden_mx import load_golden_mx
from agoq_core.formats import reference as ref
from agoq_core.formats import get_format
from agoq_cuda.launch import LAUNCHER


def main() -> None:
    gold = load_golden_mx()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for case in gold["cases"]:
        if case["op"] != "reduce_requantize":
            continue
        k, n = case["input"], case["numel"]
        spec = get_format(case["fmt"], block=case["block"])
        codes, scales = gold["tensors"][f"{k}/codes_in"], gold["tensors"][f"{k}/scales_in"]
        want_c, want_s = gold["tensors"][f"{k}/codes"], gold["tensors"][f"{k}/scales"]
        dec = torch.stack([ref.dequantize_blocks(codes[r], scales[r], spec, n, torch.float32) for r in range(codes.shape[0])])
        for hw in (None, False):
            co = torch.zeros_like(want_c, device=dev)
            so = torch.zeros_like(want_s, device=dev)
            LAUNCHER.reduce_requantize(codes.to(dev), scales.to(dev), spec, n, co, so, hw=hw)
            co, so = co.cpu(), so.cpu()
            bad = (co != want_c).nonzero().flatten().tolist()
            sbad = (so.view(torch.int32) != want_s.view(torch.int32)).nonzero().flatten().tolist()
            print(f"{case['id']} hw={hw}: {len(bad)} code bytes differ, {len(sbad)} scales differ")
            for i in bad[:8]:
                print(f"  byte {i}: inputs {codes[:, i].tolist()} scales(blk) {scales[:, i // spec.block].tolist()} "
                      f"decoded {dec[:, i].tolist()} sum {dec[:, i].sum().item()!r} want {want_c[i].item()} "
                      f"got {co[i].item()} scale want {want_s[i // spec.block].item()!r} got {so[i // spec.block].item()!r}")


if __name__ == "__main__":
    main()
