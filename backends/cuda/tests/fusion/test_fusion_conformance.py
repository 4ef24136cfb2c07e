"""The fused-GEMM conformance cases: pass on the real kernels, fail on broken ones, skip when unclaimed."""
from __future__ import annotations

import torch

from agoq_cuda.fusion import launch
from agoq_conformance.fused_gemm import OPS, fusion_cases, run_fusion_conformance
from fusion_helpers import fused_backend

# The record keys of conformance_tests/agoq_conformance/runner.py's run_case.
RUNNER_KEYS = {"id", "op", "fmt", "block", "level", "verdict", "detail", "output_sha256", "mismatches"}


def test_every_case_passes_on_the_fused_kernels(device):
    recs = run_fusion_conformance(fused_backend(), device=device)
    assert len(recs) == len(fusion_cases()) >= 20
    bad = [(r["id"], r["verdict"], r["detail"]) for r in recs if r["verdict"] != "pass"]
    assert not bad, bad
    for r in recs:
        assert RUNNER_KEYS <= set(r) and r["output_sha256"] is None and r["sqnr_db"] >= r["sqnr_floor_db"]
    assert {r["op"] for r in recs} == set(OPS)
    assert len({r["id"] for r in recs}) == len(recs)


def test_a_corrupted_code_or_a_noisy_gemm_fails(device, monkeypatch):
    be = fused_backend()
    real_epi, real_pro = launch.gemm_quant_epilogue_into, launch.gemm_dequant_prologue_into

    def flip_one_code(x, w, b, spec, out, codes, scales, **kw):
        real_epi(x, w, b, spec, out, codes, scales, **kw)
        codes.view(-1)[codes.numel() // 2] ^= 1           # one bit of one code

    def one_bf16_ulp_per_element(grad, codes, scales, spec, k, out, mul=None, **kw):
        real_pro(grad, codes, scales, spec, k, out, mul, **kw)
        bits = out.view(torch.int16)
        bits.add_(torch.randint(-40, 40, bits.shape, device=bits.device, dtype=torch.int16))  # ~40 ulp noise

    monkeypatch.setattr(launch, "gemm_quant_epilogue_into", flip_one_code)
    monkeypatch.setattr(launch, "gemm_dequant_prologue_into", one_bf16_ulp_per_element)
    recs = run_fusion_conformance(be, device=device, select="fusion/*/int4/b128/bf16/*")
    epi = [r for r in recs if r["op"] == "gemm_quant_epilogue"]
    pro = [r for r in recs if r["op"] == "gemm_dequant_prologue"]
    assert epi and all(r["verdict"] == "fail" and "codes: 1 mismatches" in r["detail"] for r in epi), epi
    assert pro and all(r["verdict"] == "fail" and "SQNR" in r["detail"] for r in pro), pro


def test_unclaimed_ops_skip(backend, device):
    recs = run_fusion_conformance(backend, device=device, select="fusion/gemm_quant_epilogue/int4/*")
    if not set(OPS) <= backend.capabilities().ops:
        assert recs and all(r["verdict"] == "skip" and "does not claim" in r["detail"] for r in recs)


def test_a_crash_is_an_error_record(device, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(launch, "gemm_dequant_prologue_into", boom)
    recs = run_fusion_conformance(fused_backend(), device=device, select="fusion/gemm_dequant_prologue/int8/*")
    assert recs and all(r["verdict"] == "error" and "kernel exploded" in r["detail"] for r in recs)
