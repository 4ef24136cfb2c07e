"""Start-up self-test: does this device's arithmetic give the contract's bits? Refuse the backend if not.

The kernels are written so that their results depend on nothing a device may do differently (no division
instruction, no contractible multiply-add, no float max on NaN, integer logic for FP8/bf16), and that has
been checked in Triton's interpreter and with the Triton-Ascend frontend -- but never on an NPU. So before
the backend serves anything, it quantizes (and accumulates into) a small set of adversarial vectors on the
device and compares codes and scales bit for bit with the pure-torch reference on the CPU: scaled values next
to rounding midpoints (a reciprocal that is not correctly rounded, or a product fused into the rounding add,
shows here), products that an FMA would round differently, subnormals, a NaN and an Inf block, ragged tails. Any difference refuses the backend
with a message naming the failing checks. ``AGOQ_ASCEND_SELF_TEST=0`` skips it (at your own risk).
"""
from __future__ import annotations

import os

import torch

from agoq_core.errors import BackendUnavailableError
from agoq_core.formats import reference as ref
from agoq_core.formats.spec import get_format

__all__ = ["self_test_vectors", "run_self_test", "self_test_enabled"]

_CHECK_FORMATS = ("int8", "int4", "nf4", "fp4_e2m1", "fp8_e4m3", "fp8_e5m2", "int6", "int5", "mxfp8", "nvfp4")
"""Every code kind and width, and the microscaling scales: mxfp8 (E8M0, power-of-two: exact), nvfp4 (its tensor
scale and per-block divisions, division-free on this path; quantize only: NVFP4 cannot be requantized
blockwise, so it has no accumulate)."""


def self_test_enabled() -> bool:
    return os.environ.get("AGOQ_ASCEND_SELF_TEST", "1").strip() not in ("0", "false", "no", "off")


def self_test_vectors(block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, g) on the CPU: 4 blocks and a ragged tail; deterministic."""
    g = torch.Generator().manual_seed(20)
    n = 4 * block + 37
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-20, 20, (n,), generator=g).float())
    # block 0: scaled values next to rounding midpoints: x = (k + 1/2 +- tiny) * scale for an odd-ish scale
    s = 1.2345678 / 127.0
    k = torch.arange(block, dtype=torch.float64) % 120 - 60
    x[:block] = ((k + 0.5) * s * (1 + torch.randn(block, generator=g, dtype=torch.float64) * 1e-7)).float()
    x[0] = 1.2345678  # the block's absmax: scale = RN(1.2345678 / qmax)
    x[block + 3] = 2.0 ** -127  # subnormal: flushed
    x[2 * block + 5] = float("nan")
    x[3 * block + 7] = float("-inf")
    gx = torch.randn(n, generator=g) * 0.3
    return x, gx


def run_self_test(backend, device: "torch.device | str") -> None:
    """Raise BackendUnavailableError if the backend's kernels on ``device`` differ from the reference."""
    failed = []
    for name in _CHECK_FORMATS:
        spec = get_format(name)
        x, gx = self_test_vectors(spec.block)
        n = x.numel()
        want_c, want_s = ref.quantize_blocks(x, spec)
        checks = [("quantize", want_c, want_s)]
        if not spec.tensor_scaled:
            checks.append(("accumulate", *ref.accumulate(want_c, want_s, spec, n, gx)))
        codes = torch.empty(spec.code_bytes(n), dtype=torch.uint8, device=device)
        scales = torch.empty(spec.num_blocks(n), dtype=torch.float32, device=device)
        got = []
        try:
            backend.quantize_into(x.to(device), spec, codes, scales)
            got.append((codes.cpu().clone(), scales.cpu().clone()))  # .cpu() is no copy on a CPU device
            if len(checks) > 1:
                backend.accumulate_(codes, scales, spec, gx.to(device))
                got.append((codes.cpu(), scales.cpu()))
        except Exception as exc:  # noqa: BLE001  (a compile or launch failure is a failed self-test)
            failed.append(f"{name}: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        for (what, wc, ws), (got_c, got_s) in zip(checks, got):
            bad_c = int((got_c != wc).sum())
            same_s = torch.equal(got_s.isnan(), ws.isnan()) and torch.equal(
                got_s.view(torch.int32).masked_fill(ws.isnan(), 0), ws.view(torch.int32).masked_fill(ws.isnan(), 0))
            if bad_c or not same_s:
                failed.append(f"{name} {what}: {bad_c} code bytes differ" + ("" if same_s else ", scales differ"))
    if failed:
        raise BackendUnavailableError(
            "the agoq-ascend kernels failed the start-up self-test on this device: their codes are not bit-exact "
            "with the reference, so every backend would disagree with this one (" + "; ".join(failed[:6])
            + "). Please report it with the output of `agoq conformance run --backend ascend --report ascend.json` "
            "(docs/backends/ascend.md); meanwhile use AGOQ_BACKEND=reference, or set AGOQ_ASCEND_SELF_TEST=0 to "
            "use the kernels anyway")
