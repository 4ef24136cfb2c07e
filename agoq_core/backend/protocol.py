"""The Backend object: what a plugin's ``load()`` returns.

Kernel-level and small on purpose: codecs on flat, contiguous buffers (the core allocates, checks
shapes/dtypes/devices and builds QuantizedTensor), byte collectives, and device services. Autograd,
policies and protocols live in the core and call these; a backend never defines autograd.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from agoq_core.errors import CapabilityError

if TYPE_CHECKING:
    from agoq_core.backend.types import Capabilities
    from agoq_core.formats.spec import FormatSpec

__all__ = ["Backend", "BackendBase"]


@runtime_checkable
class Backend(Protocol):
    name: str
    device_type: str
    dist_backend: str
    """torch.distributed backend to use with this device ("gloo", "nccl", "hccl")."""

    def capabilities(self) -> "Capabilities": ...

    # ---- codecs (flat contiguous buffers; the core validates before calling) ----------------------
    def quantize_into(self, x: torch.Tensor, spec: "FormatSpec", codes: torch.Tensor, scales: torch.Tensor) -> None:
        """x: flat float tensor of N elements -> codes uint8[spec.code_bytes(N)], scales fp32[NB]."""

    def dequantize_into(self, codes: torch.Tensor, scales: torch.Tensor, spec: "FormatSpec", out: torch.Tensor) -> None:
        """codes/scales of ``out.numel()`` elements -> out (flat; fp32, bf16 or fp16)."""

    def accumulate_(self, codes: torch.Tensor, scales: torch.Tensor, spec: "FormatSpec", g: torch.Tensor) -> None:
        """In place: (codes, scales) <- Q(D(codes, scales) + g) with the add in fp32. Op "accumulate"."""

    def reduce_requantize_into(self, codes: torch.Tensor, scales: torch.Tensor, spec: "FormatSpec", numel: int,
                               codes_out: torch.Tensor, scales_out: torch.Tensor) -> None:
        """codes uint8[W, code_bytes], scales fp32[W, NB] -> Q(sum_r D(r)) summed in fp32 in rank
        order. Op "reduce_requantize"."""

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


def _bytes_view(t: torch.Tensor) -> torch.Tensor:
    """View any contiguous tensor as flat uint8 (fp8 included: gloo/HCCL cannot move fp8 dtypes)."""
    if not t.is_contiguous():
        raise ValueError("byte collectives need contiguous tensors")
    return t.reshape(-1).view(torch.uint8)


class BackendBase:
    """Defaults shared by every backend: byte collectives through torch.distributed, device
    services through torch's device-generic modules, and loud errors for unclaimed ops."""

    name = "base"
    device_type = "cpu"
    dist_backend = "gloo"

    def capabilities(self) -> "Capabilities":  # pragma: no cover - abstract
        raise NotImplementedError

    def _unclaimed(self, op: str) -> CapabilityError:
        return CapabilityError(
            f"backend {self.name!r} does not provide {op!r} (its capabilities: "
            f"{sorted(self.capabilities().ops)}); choose a backend that does with AGOQ_BACKEND"
        )

    def quantize_into(self, x, spec, codes, scales):  # pragma: no cover - abstract
        raise self._unclaimed("quantize")

    def dequantize_into(self, codes, scales, spec, out):  # pragma: no cover - abstract
        raise self._unclaimed("dequantize")

    def accumulate_(self, codes, scales, spec, g):
        raise self._unclaimed("accumulate")

    def reduce_requantize_into(self, codes, scales, spec, numel, codes_out, scales_out):
        raise self._unclaimed("reduce_requantize")

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
