"""Expected quantization error of each candidate format, measured with the real codecs.

The solver minimises the summed expected squared error of the stored activations. For one element
stored in format ``f`` that is ``NSR(f) * E[x^2]``, with ``NSR = 10^(-SQNR/10)`` measured by
quantizing representative data with ``agoq_core.quantize`` / ``dequantize`` (the selected backend's
codecs, so the numbers are those of the bits that would be stored). Summed over a layer's stored
elements this is the layer's cost; the error is relative to signal power, so layers of different
scale count alike.

Representative data, by default: three fixed-seed samples of 2^16 elements, a Gaussian, a Laplace and
a Student-t with 3 degrees of freedom (activations of LLaMA residual streams are heavy-tailed: a few
outlier channels hold most of the absmax, which is what hurts 4-bit block codes). The NSR is the mean
over the samples. Pass real activations (e.g. captured by LAAQ) with ``samples=`` to use those.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Sequence

import torch

from agoq_core.errors import FormatError
from agoq_core.formats.spec import activation_formats, get_format
from agoq_core.planner.errors import PlannerError

__all__ = ["FidelityTable", "measure_fidelity", "default_samples"]

_SAMPLE_NUMEL = 1 << 16  # 512 blocks of 128: SQNR stable to ~0.05 dB between seeds


def default_samples(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n = _SAMPLE_NUMEL
    gauss = torch.randn(n, generator=g)
    u = torch.rand(n, generator=g).clamp_min(1e-12)
    laplace = -torch.log(u) * torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    # Student-t(3) = N(0,1) / sqrt(chi2_3 / 3)
    chi2 = (torch.randn(3, n, generator=g) ** 2).sum(0)
    student = torch.randn(n, generator=g) / torch.sqrt(chi2 / 3.0)
    return {"gaussian": gauss, "laplace": laplace, "student_t3": student}


@dataclass(frozen=True, kw_only=True)
class FidelityTable:
    """Noise-to-signal ratio (mean squared error / mean square) of each format, measured."""

    nsr: Mapping[str, float]
    source: str
    per_sample: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, v in self.nsr.items():
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise PlannerError(f"FidelityTable: NSR of {name} must be a finite number >= 0, got {v!r}")
        object.__setattr__(self, "nsr", MappingProxyType(dict(self.nsr)))

    def sqnr_db(self, fmt: str) -> float:
        v = self[fmt]
        return math.inf if v == 0 else -10.0 * math.log10(v)

    def __getitem__(self, fmt: str) -> float:
        try:
            return self.nsr[fmt]
        except KeyError:
            raise PlannerError(f"no fidelity measured for format {fmt!r}; measured: {sorted(self.nsr)}") from None


def measure_fidelity(formats: Sequence[str], *, samples: Mapping[str, torch.Tensor] | None = None,
                     block: int | None = None, backend: str | None = None) -> FidelityTable:
    """Quantize each sample in each format and return the mean NSR per format.

    With the default samples the result depends only on the formats, the block and the backend, so it
    is computed once per process for each of those (about 1 s on 2 CPU cores for six formats)."""
    if samples is None:
        from agoq_core.backend import get_backend

        return _measure_default(tuple(formats), block, get_backend(backend).name)
    return _measure(formats, samples=samples, block=block, backend=backend)


@functools.lru_cache(maxsize=32)
def _measure_default(formats: tuple[str, ...], block: int | None, backend: str) -> FidelityTable:
    return _measure(formats, samples=None, block=block, backend=backend)


def _measure(formats: Sequence[str], *, samples: Mapping[str, torch.Tensor] | None,
             block: int | None, backend: str | None) -> FidelityTable:
    from agoq_core.api import dequantize, quantize

    names = []
    for f in formats:
        try:
            spec = get_format(f, block)
        except FormatError as exc:
            raise PlannerError(f"candidate format: {exc}") from None
        if spec.name not in activation_formats():
            raise PlannerError(f"candidate format {f!r} is a gradient format; activation formats: "
                               f"{activation_formats()}")
        names.append(spec.name)
    data = default_samples() if samples is None else dict(samples)
    if not data:
        raise PlannerError("measure_fidelity: samples is empty")
    per_sample: dict[str, dict[str, float]] = {n: {} for n in names}
    for sname, x in data.items():
        x = x.detach().float().reshape(-1)
        if x.numel() == 0 or not torch.isfinite(x).all():
            raise PlannerError(f"measure_fidelity: sample {sname!r} is empty or not finite")
        power = float((x.double() ** 2).mean())
        if power == 0:
            raise PlannerError(f"measure_fidelity: sample {sname!r} is all zeros")
        for n in names:
            xh = dequantize(quantize(x, n, block=block, backend=backend), torch.float32, backend=backend)
            per_sample[n][sname] = float(((xh.double() - x.double()) ** 2).mean()) / power
    nsr = {n: sum(v.values()) / len(v) for n, v in per_sample.items()}
    src = "default samples (gaussian, laplace, student-t3; 2^16 each)" if samples is None else \
        f"given samples ({', '.join(data)})"
    return FidelityTable(nsr=nsr, source=src, per_sample={k: MappingProxyType(v) for k, v in per_sample.items()})
