"""The Backend object: what a plugin's ``load()`` returns.

Kernel-level and small on purpose: codecs on flat, contiguous buffers (the core allocates, checks
shapes/dtypes/devices and builds QuantizedTensor), byte collectives, and device services. Autograd,
policies and protocols live in the core and call these; a backend never defines autograd.

What the core may call is declared here, once:

* :class:`Backend` — what every backend has: identity, ``capabilities()``, the two codecs, byte
  collectives, device services.
* One small protocol per optional operation (:data:`OPTIONAL_OPS` maps each op name a backend may claim
  in ``Capabilities.ops`` to it): :class:`SupportsAccumulate`, :class:`SupportsReduceRequantize`,
  :class:`SupportsGemmQuantEpilogue`, :class:`SupportsGemmDequantPrologue`. The core calls their methods
  only after checking the claim (``agoq_core.api.check_supported``, ``laaq.fusion``); the manager refuses
  to load a backend that claims an op without implementing it.

:class:`BackendBase` implements the required part where torch can (collectives, device services) and
every optional method with a default that raises :class:`~agoq_core.errors.CapabilityError` naming the
backend. docs/writing-a-backend.md documents each signature and its semantics.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from agoq_core.errors import CapabilityError

if TYPE_CHECKING:
    from agoq_core.backend.types import Capabilities
    from agoq_core.formats.spec import FormatSpec

__all__ = [
    "Backend", "BackendBase",
    "SupportsAccumulate", "SupportsReduceRequantize", "SupportsGemmQuantEpilogue", "SupportsGemmDequantPrologue",
    "SupportsRmsNormQuant", "SupportsSiluMulQuant", "SupportsSiluMulBackward", "OPTIONAL_OPS", "unimplemented_ops",
]


@runtime_checkable
class Backend(Protocol):
    name: str
    device_type: str
    """The torch device type this backend's kernels run on. Declared once, in the plugin's
    ``BackendInfo.device_type``; the manager sets it on the object when it loads the backend."""
    dist_backend: str
    """torch.distributed backend to use with this device ("gloo", "nccl", "hccl")."""

    def capabilities(self) -> "Capabilities": ...

    # ---- codecs (flat contiguous buffers; the core validates before calling) ----------------------
    def quantize_into(self, x: torch.Tensor, spec: "FormatSpec", codes: torch.Tensor, scales: torch.Tensor) -> None:
        """x: flat float tensor of N elements -> codes uint8[spec.code_bytes(N)], scales fp32[NB]."""

    def dequantize_into(self, codes: torch.Tensor, scales: torch.Tensor, spec: "FormatSpec", out: torch.Tensor) -> None:
        """codes/scales of ``out.numel()`` elements -> out (flat; fp32, bf16 or fp16)."""

    # ---- collectives on byte views ------------------------------------------------------------------
    def all_to_all_bytes(self, output: torch.Tensor, input: torch.Tensor, *, group: Any = None,
                         async_op: bool = False) -> Any: ...

    def all_gather_bytes(self, output: torch.Tensor, input: torch.Tensor, *, group: Any = None,
                         async_op: bool = False) -> Any: ...

    # ---- device services ---------------------------------------------------------------------------
    def synchronize(self, device: torch.device | None = None) -> None: ...

    def max_memory_allocated(self, device: torch.device | None = None) -> int: ...

    def reset_peak_memory_stats(self, device: torch.device | None = None) -> None: ...

    def known_deviations(self) -> dict[str, str]:
        """Conformance case-id patterns (fnmatch) this backend knowingly fails -> reason.
        They run as strict xfail: an unexpected pass fails the run."""
        ...


# ---- optional operations: one protocol per op a backend may claim ----------------------------------------
@runtime_checkable
class SupportsAccumulate(Protocol):
    """Op ``"accumulate"`` (QuanGrad's 8-bit gradient storage)."""

    def accumulate_(self, codes: torch.Tensor, scales: torch.Tensor, spec: "FormatSpec", g: torch.Tensor) -> None:
        """In place: (codes, scales) <- Q(D(codes, scales) + g), g flat [N] (fp32/bf16/fp16), the add in fp32."""


@runtime_checkable
class SupportsReduceRequantize(Protocol):
    """Op ``"reduce_requantize"`` (QuanGrad's all-reduce, after the all-to-all)."""

    def reduce_requantize_into(self, codes: torch.Tensor, scales: torch.Tensor, spec: "FormatSpec", numel: int,
                               codes_out: torch.Tensor, scales_out: torch.Tensor) -> None:
        """codes uint8[W, code_bytes(numel)], scales fp32[W, NB] -> codes_out, scales_out =
        Q(((D_0 + D_1) + D_2) + ...), the sum in fp32 in rank order."""


@runtime_checkable
class SupportsGemmQuantEpilogue(Protocol):
    """Op ``"gemm_quant_epilogue"`` (LAAQ kernel fusion, forward): a GEMM that also writes a quantized
    copy of its output."""

    def gemm_quant_epilogue_unsupported(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                                        spec: "FormatSpec") -> str | None:
        """Why ``y = x @ weight.T + bias`` with y quantized in ``spec`` cannot run fused (None: it can).
        x [M, K], weight [N, K], bias [N] or None. Must not launch anything."""

    def gemm_quant_epilogue_into(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                                 spec: "FormatSpec", out: torch.Tensor, codes: torch.Tensor,
                                 scales: torch.Tensor) -> None:
        """out[M, N] = x @ weight.T + bias rounded once to x.dtype, and (codes, scales) = Q_spec(out
        flattened), bit-exact with the reference quantizer applied to ``out``. out contiguous,
        codes uint8[spec.code_bytes(M*N)], scales fp32[spec.num_blocks(M*N)]."""


@runtime_checkable
class SupportsGemmDequantPrologue(Protocol):
    """Op ``"gemm_dequant_prologue"`` (LAAQ kernel fusion, backward): the weight-gradient GEMM that reads
    a kept quantized operand."""

    def gemm_dequant_prologue_unsupported(self, grad: torch.Tensor, spec: "FormatSpec", k: int,
                                          mul: torch.Tensor | None = None) -> str | None:
        """Why ``dW = grad.T @ (mul * D(X))`` cannot run fused (None: it can). grad [M, N], X [M, k] kept in
        ``spec``, mul [M, k] or None. Must not launch anything."""

    def gemm_dequant_prologue_into(self, grad: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                                   spec: "FormatSpec", k: int, out: torch.Tensor,
                                   mul: torch.Tensor | None = None) -> None:
        """out[N, k] = grad[M, N].T @ B with B = D(codes, scales)[M, k] rounded to grad.dtype, or
        B = round(mul * that) when ``mul`` is given; out contiguous, grad.dtype."""


@runtime_checkable
class SupportsRmsNormQuant(Protocol):
    """Op ``"rmsnorm_quant"`` (LAAQ fusion into a memory-bound neighbour, forward): RMSNorm that also writes
    the quantized copy of its input, reading x once.

    How torch sums the squares and takes the rsqrt differs between devices: the backend offers numerics
    *variants* (names of its choosing, fastest first), and LAAQ keeps the first one whose codes are
    bit-exact and whose ``y`` equals the model's norm output except in rows where the two inverse RMS are
    one fp32 ulp apart (agoq_core.laaq.fusion.norm_within_tolerance, checked with ``rinv`` on its first
    calls), else runs the norm unfused."""

    def rmsnorm_quant_unsupported(self, x: torch.Tensor, weight: torch.Tensor, spec: "FormatSpec") -> str | None:
        """Why the fused call cannot run for these arguments (None: it can). Must not launch anything."""

    def rmsnorm_quant_variants(self, device: torch.device) -> tuple[str, ...]:
        """The numerics variants of ``y`` runnable on ``device``, the likeliest to match torch first."""

    def rmsnorm_quant_into(self, x: torch.Tensor, weight: torch.Tensor, eps: float, spec: "FormatSpec",
                           y: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                           variant: str | None = None, rinv: torch.Tensor | None = None) -> None:
        """y = weight * round(x * r), r = rsqrt(mean(x**2) + eps) in fp32, in x.dtype (HF LlamaRMSNorm's
        recipe, the sum and rsqrt as ``variant`` computes them), and (codes, scales) = Q_spec(x flattened),
        bit-exact with quantize_into. x [M, H] contiguous. ``rinv``: None, or float32 [M] receiving r."""


@runtime_checkable
class SupportsSiluMulQuant(Protocol):
    """Op ``"silu_mul_quant"`` (LAAQ fusion into a memory-bound neighbour, forward): SwiGLU's
    ``h = silu(gate) * up`` that also writes the quantized copies of gate and up, reading each once.
    Numerics variants as for :class:`SupportsRmsNormQuant` (``exp`` differs between devices)."""

    def silu_mul_quant_unsupported(self, gate: torch.Tensor, up: torch.Tensor, spec: "FormatSpec") -> str | None:
        """Why the fused call cannot run for these arguments (None: it can). Must not launch anything."""

    def silu_mul_quant_variants(self, device: torch.device) -> tuple[str, ...]:
        """The numerics variants of ``h`` runnable on ``device``, the likeliest to match torch first."""

    def silu_mul_quant_into(self, gate: torch.Tensor, up: torch.Tensor, spec: "FormatSpec", h: torch.Tensor,
                            gate_codes: torch.Tensor, gate_scales: torch.Tensor, up_codes: torch.Tensor,
                            up_scales: torch.Tensor, variant: str | None = None) -> None:
        """h = round(round(silu(gate)) * up) in gate.dtype (torch's ``F.silu(gate) * up``) and the codes/
        scales of gate and of up (each flattened), bit-exact with quantize_into. gate, up contiguous."""


@runtime_checkable
class SupportsSiluMulBackward(Protocol):
    """Op ``"silu_mul_backward"`` (LAAQ fusion into a memory-bound neighbour, backward): the SwiGLU
    elementwise backward reading the kept codes of gate and up directly (no decoded 16-bit copies)."""

    def silu_mul_backward_unsupported(self, dh: torch.Tensor, spec: "FormatSpec") -> str | None:
        """Why the fused call cannot run for these arguments (None: it can). Must not launch anything."""

    def silu_mul_backward_variants(self, device: torch.device) -> tuple[str, ...]:
        """The numerics variants runnable on ``device``, the likeliest to match torch first."""

    def silu_mul_backward_into(self, dh: torch.Tensor, gate_codes: torch.Tensor, gate_scales: torch.Tensor,
                               up_codes: torch.Tensor, up_scales: torch.Tensor, spec: "FormatSpec", h: torch.Tensor,
                               dgate: torch.Tensor, dup: torch.Tensor, variant: str | None = None) -> None:
        """With g, u = the kept gate and up decoded to dh.dtype (what dequantize_into writes): h = silu(g) * u,
        dup = dh * silu(g), dgate = silu_backward(dh * u, g) (torch's SiLU derivative), each rounded to
        dh.dtype as torch's unfused ops round them. dh, h, dgate, dup contiguous, same shape and dtype."""


#: Every op a backend may claim beyond quantize/dequantize -> the protocol that declares its methods.
OPTIONAL_OPS: dict[str, type] = {
    "accumulate": SupportsAccumulate,
    "reduce_requantize": SupportsReduceRequantize,
    "gemm_quant_epilogue": SupportsGemmQuantEpilogue,
    "gemm_dequant_prologue": SupportsGemmDequantPrologue,
    "rmsnorm_quant": SupportsRmsNormQuant,
    "silu_mul_quant": SupportsSiluMulQuant,
    "silu_mul_backward": SupportsSiluMulBackward,
}


def _protocol_methods(proto: type) -> list[str]:
    return sorted(n for n, v in vars(proto).items() if callable(v) and not n.startswith("_"))


def unimplemented_ops(backend: object, ops) -> dict[str, list[str]]:
    """Claimed optional ops whose methods ``backend`` lacks or inherits from BackendBase's raising
    defaults: op -> the missing method names (empty when every claim is backed by code)."""
    missing: dict[str, list[str]] = {}
    for op in sorted(ops):
        proto = OPTIONAL_OPS.get(op)
        if proto is None:
            continue
        gone = [m for m in _protocol_methods(proto)
                if not callable(getattr(backend, m, None))
                or getattr(type(backend), m, None) is getattr(BackendBase, m, object())]
        if gone:
            missing[op] = gone
    return missing


def _bytes_view(t: torch.Tensor) -> torch.Tensor:
    """View any contiguous tensor as flat uint8 (fp8 included: gloo/HCCL cannot move fp8 dtypes)."""
    if not t.is_contiguous():
        raise ValueError("byte collectives need contiguous tensors")
    return t.reshape(-1).view(torch.uint8)


class BackendBase:
    """Defaults shared by every backend: byte collectives through torch.distributed, device
    services through torch's device-generic modules, and loud errors for every optional op that a
    subclass does not implement."""

    name = "base"
    device_type: str | None = None
    """Set by the manager from ``BackendInfo.device_type`` when it loads the backend; do not declare it
    again in the subclass (a backend built directly, e.g. in a test, is given it by assignment)."""
    dist_backend = "gloo"

    def capabilities(self) -> "Capabilities":  # pragma: no cover - abstract
        raise NotImplementedError

    def _unclaimed(self, op: str) -> CapabilityError:
        try:
            claimed = sorted(self.capabilities().ops)
        except Exception:  # pragma: no cover - the error must not hide behind a broken capabilities()
            claimed = ["?"]
        return CapabilityError(
            f"{op!r} is not supported by backend {self.name!r} (it provides {claimed}); choose a backend that "
            "does with AGOQ_BACKEND"
        )

    def quantize_into(self, x, spec, codes, scales):  # pragma: no cover - abstract
        raise self._unclaimed("quantize")

    def dequantize_into(self, codes, scales, spec, out):  # pragma: no cover - abstract
        raise self._unclaimed("dequantize")

    # ---- optional ops: SupportsAccumulate, SupportsReduceRequantize, SupportsGemm* -------------------
    def accumulate_(self, codes, scales, spec, g):
        raise self._unclaimed("accumulate")

    def reduce_requantize_into(self, codes, scales, spec, numel, codes_out, scales_out):
        raise self._unclaimed("reduce_requantize")

    def gemm_quant_epilogue_unsupported(self, x, weight, bias, spec):
        raise self._unclaimed("gemm_quant_epilogue")

    def gemm_quant_epilogue_into(self, x, weight, bias, spec, out, codes, scales):
        raise self._unclaimed("gemm_quant_epilogue")

    def gemm_dequant_prologue_unsupported(self, grad, spec, k, mul=None):
        raise self._unclaimed("gemm_dequant_prologue")

    def gemm_dequant_prologue_into(self, grad, codes, scales, spec, k, out, mul=None):
        raise self._unclaimed("gemm_dequant_prologue")

    def rmsnorm_quant_unsupported(self, x, weight, spec):
        raise self._unclaimed("rmsnorm_quant")

    def rmsnorm_quant_variants(self, device):
        raise self._unclaimed("rmsnorm_quant")

    def rmsnorm_quant_into(self, x, weight, eps, spec, y, codes, scales, variant=None, rinv=None):
        raise self._unclaimed("rmsnorm_quant")

    def silu_mul_quant_unsupported(self, gate, up, spec):
        raise self._unclaimed("silu_mul_quant")

    def silu_mul_quant_variants(self, device):
        raise self._unclaimed("silu_mul_quant")

    def silu_mul_quant_into(self, gate, up, spec, h, gate_codes, gate_scales, up_codes, up_scales, variant=None):
        raise self._unclaimed("silu_mul_quant")

    def silu_mul_backward_unsupported(self, dh, spec):
        raise self._unclaimed("silu_mul_backward")

    def silu_mul_backward_variants(self, device):
        raise self._unclaimed("silu_mul_backward")

    def silu_mul_backward_into(self, dh, gate_codes, gate_scales, up_codes, up_scales, spec, h, dgate, dup,
                               variant=None):
        raise self._unclaimed("silu_mul_backward")

    # all-to-all / all-gather of raw bytes; payloads are equal-sized per rank by protocol.
    def all_to_all_bytes(self, output, input, *, group=None, async_op=False):
        import torch.distributed as dist

        return dist.all_to_all_single(_bytes_view(output), _bytes_view(input), group=group, async_op=async_op)

    def all_gather_bytes(self, output, input, *, group=None, async_op=False):
        import torch.distributed as dist

        # all_gather_into_tensor is deprecated in newer torch in favour of all_gather_single, which
        # torch 2.11 lacks: use whichever exists.
        fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return fn(_bytes_view(output), _bytes_view(input), group=group, async_op=async_op)

    def _device_module(self, device: torch.device | None):
        dev_type = device.type if device is not None else self.device_type
        if dev_type is None:
            raise RuntimeError(
                f"backend {self.name!r} has no device type: it comes from its BackendInfo when "
                f"agoq_core.backend.get_backend({self.name!r}) loads it; pass a device, or set device_type on a "
                "backend built directly")
        if dev_type == "cpu":
            return None
        return torch.get_device_module(dev_type)

    def synchronize(self, device=None) -> None:
        mod = self._device_module(device)
        if mod is not None:
            mod.synchronize(device)

    def max_memory_allocated(self, device=None) -> int:
        mod = self._device_module(device)
        return 0 if mod is None else int(mod.max_memory_allocated(device))

    def reset_peak_memory_stats(self, device=None) -> None:
        mod = self._device_module(device)
        if mod is not None:
            mod.reset_peak_memory_stats(device)

    def known_deviations(self) -> dict[str, str]:
        return {}

    def __repr__(self) -> str:
        return f"<agoq backend {self.name!r} ({self.device_type})>"
