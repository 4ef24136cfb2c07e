"""The fused RMSNorm's run-time check (agoq_core.laaq.fusion.norm_within_tolerance) on the cuda backend (the
interpreter on CPU): a y that differs from the model's norm only in rows whose fp32 inverse RMS is one ulp
apart is accepted (and bounded: <= 2 steps), a kernel with a wrong rsqrt, a wrong eps or wrong codes is
rejected and the norm runs unfused."""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from agoq_core.formats.spec import get_format

H = 256
SPEC = get_format("nf4")


def _flip_prone_rows(lo_ulps: int = 0, n_rows: int = 8) -> torch.Tensor:
    """bf16 rows [n_rows, H] where moving torch's fp32 inverse RMS from ``lo_ulps`` to ``lo_ulps + 1`` ulps up
    changes HF's output (found by search: ~0.5% of random rows; fixed seed, so deterministic)."""
    from agoq_core.laaq.fusion import norm_rows

    g = torch.Generator().manual_seed(3)
    x = (torch.randn(8000, H, generator=g) * torch.rand(8000, 1, generator=g) * 4).to(torch.bfloat16)
    w = torch.ones(H, dtype=torch.bfloat16)
    r = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-5)
    for _ in range(lo_ulps):
        r = torch.nextafter(r, torch.full_like(r, float("inf")))
    prone = (norm_rows(x, w, r) != norm_rows(x, w, torch.nextafter(r, torch.full_like(r, float("inf"))))).any(1)
    prone = prone.nonzero().flatten()
    assert prone.numel() >= n_rows, prone.numel()
    return x[prone[:n_rows]].contiguous()


class _NudgedNorm(torch.nn.Module):
    """A LLaMA RMSNorm (weight, variance_epsilon) whose inverse RMS is ``ulps`` fp32 ulps above ``r_of(x)``: a
    model norm summing the squares in another order."""

    def __init__(self, w, eps, r_of, ulps):
        super().__init__()
        self.weight = torch.nn.Parameter(w)
        self.variance_epsilon = eps
        self.r_of, self.ulps = r_of, ulps

    def forward(self, x):
        from agoq_core.laaq.fusion import norm_rows

        r = self.r_of(x)
        for _ in range(self.ulps):
            r = torch.nextafter(r, torch.full_like(r, float("inf")))
        return norm_rows(x.reshape(-1, x.shape[-1]), self.weight, r).view(x.shape)


@triton.jit
def _rsqrt_4ulp(v, RSQRT: tl.constexpr):
    return tl.math.div_rn(1.0, tl.math.sqrt_rn(v)) * 1.0000004768371582  # 1 + 2**-21: ~4 ulps off


@triton.jit
def _rsqrt_bf16(v, RSQRT: tl.constexpr):
    return tl.math.div_rn(1.0, tl.math.sqrt_rn(v)).to(tl.bfloat16).to(tl.float32)


def _kernel_r(x, w, eps, variant):
    from agoq_cuda import fused_norm

    r = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    fused_norm.rmsnorm_quant_into(x, w, eps, SPEC, torch.empty_like(x), torch.empty(SPEC.code_bytes(x.numel()),
                                  dtype=torch.uint8, device=x.device), torch.empty(SPEC.num_blocks(x.numel()),
                                  device=x.device), variant=variant, rinv=r)
    return r


@pytest.fixture
def fresh(monkeypatch):
    from agoq_core.laaq import fusion

    monkeypatch.setenv("AGOQ_BACKEND", "cuda")
    monkeypatch.setenv("AGOQ_FUSION", "elementwise")
    monkeypatch.setattr(fusion, "TRUST_ELEMENTS", 1)
    monkeypatch.setattr(fusion, "_choices", {})
    return fusion


def _run(fusion, norm, x):
    """norm_and_quantize twice (check, then trusted); the choice record."""
    outs = [fusion.norm_and_quantize(x, norm, norm.forward, SPEC, role="norm_input", layer=0, backend=None)
            for _ in range(2)]
    (ch,) = fusion._choices.values()
    return outs, ch


def test_rows_one_ulp_apart_are_accepted_and_bounded(device, fresh):
    x = _flip_prone_rows().to(device)
    w = (1 + 0.1 * torch.randn(H, generator=torch.Generator().manual_seed(1))).to(torch.bfloat16).to(device)
    variant = fresh.get_backend("cuda").rmsnorm_quant_variants(device)[0]
    norm = _NudgedNorm(w, 1e-5, lambda t: _kernel_r(t.reshape(-1, H), w, 1e-5, variant), 1).to(device)
    (checked, trusted), ch = _run(fresh, norm, x)
    assert ch.variants and ch.variants[0] == variant, ch.variants
    assert ch.stats["rows_differing"] > 0, ch.stats          # the test exercises the tolerance, not equality
    assert 1 <= ch.stats["max_steps"] <= fresh.NORM_MAX_STEPS, ch.stats
    y_model = norm(x)
    assert torch.equal(checked[0], y_model)                  # the checking call returns the model's own y
    y, kept = trusted
    from agoq_core.formats import reference as ref

    rc, rs = ref.quantize_blocks(x.cpu(), SPEC)               # codes exact, always
    assert torch.equal(kept.codes.cpu(), rc) and torch.equal(kept.scales.cpu(), rs)
    diff = (y != y_model).any(1)
    assert 0 < int(diff.sum()) <= x.shape[0]
    steps = (fresh._ordered(y) - fresh._ordered(y_model)).abs().max()
    assert int(steps) <= fresh.NORM_MAX_STEPS


def test_two_ulps_apart_is_rejected(device, fresh):
    """Teeth for the ulp bound: rows whose output changes between 1 and 2 ulps of the inverse RMS, with the
    model's inverse RMS 2 ulps away, are not explained (1 ulp away: they are)."""
    x = _flip_prone_rows(1).to(device)
    w = torch.ones(H, dtype=torch.bfloat16, device=device)
    variant = fresh.get_backend("cuda").rmsnorm_quant_variants(device)[0]
    ok = []
    r = _kernel_r(x, w, 1e-5, variant)
    y = fresh.norm_rows(x, w, r)
    for ulps in (1, 2):
        r2 = r
        for _ in range(ulps):
            r2 = torch.nextafter(r2, torch.full_like(r2, float("inf")))
        stats: dict = {}
        ok.append(fresh.norm_within_tolerance(x, w, y, r, fresh.norm_rows(x, w, r2), stats))
    assert stats["rows_differing"] > 0 and stats["max_steps"] <= fresh.NORM_MAX_STEPS  # only the ulp rule fails
    assert ok == [True, False]


def _hf_norm(device, w, eps=1e-5):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    m = LlamaRMSNorm(H, eps=eps).to(device, torch.bfloat16)
    with torch.no_grad():
        m.weight.copy_(w)
    return m


def _x_and_w(device):
    g = torch.Generator().manual_seed(9)
    x = (torch.randn(64, H, generator=g) * torch.logspace(-3, 1, 64)[:, None]).to(torch.bfloat16).to(device)
    w = (1 + 0.1 * torch.randn(H, generator=g)).to(torch.bfloat16).to(device)
    return x, w


def test_hf_norm_is_accepted(device, fresh):
    x, w = _x_and_w(device)
    norm = _hf_norm(device, w)
    (_, trusted), ch = _run(fresh, norm, x)
    assert ch.variants, "the fused norm should pass against HF's LlamaRMSNorm"
    y, _ = trusted
    assert int((fresh._ordered(y) - fresh._ordered(norm(x))).abs().max()) <= fresh.NORM_MAX_STEPS


@pytest.mark.parametrize("broken", ["rsqrt_4ulp", "rsqrt_bf16", "eps", "codes"])
def test_a_broken_kernel_is_rejected(device, fresh, monkeypatch, broken):
    """A kernel whose rsqrt is off (by 4 fp32 ulps, or to bf16 precision), whose eps is wrong, or whose codes
    are wrong fails the check: the norm runs unfused (the model's own output) from then on."""
    from agoq_cuda import backend as cuda_backend
    from agoq_cuda import fused_norm

    if broken.startswith("rsqrt") and device.type != "cpu":
        pytest.skip("the kernel's _rsqrt is replaced by monkeypatching, which only the interpreter sees")
    if broken == "rsqrt_4ulp":
        x = _flip_prone_rows(2).to(device)
        w = torch.ones(H, dtype=torch.bfloat16, device=device)
        monkeypatch.setattr(fused_norm, "_rsqrt", _rsqrt_4ulp)
    else:
        x, w = _x_and_w(device)
        if broken == "rsqrt_bf16":
            monkeypatch.setattr(fused_norm, "_rsqrt", _rsqrt_bf16)
        else:
            real = cuda_backend.CudaBackend.rmsnorm_quant_into

            def bad(self, x_, w_, eps, spec, y, codes, scales, variant=None, rinv=None):
                real(self, x_, w_, eps * 10 if broken == "eps" else eps, spec, y, codes, scales, variant, rinv)
                if broken == "codes":
                    codes[5] ^= 1

            monkeypatch.setattr(cuda_backend.CudaBackend, "rmsnorm_quant_into", bad)
    norm = _hf_norm(device, w)
    (checked, third), ch = _run(fresh, norm, x)
    assert not ch.variants, (broken, ch.stats)
    assert torch.equal(checked[0], norm(x))
    assert third is None  # from then on the caller runs the norm unfused
