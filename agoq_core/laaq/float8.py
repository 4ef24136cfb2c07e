"""float8 GEMMs behind LAAQ's GEMM seams: a torchao ``Float8Linear`` converted by LAAQ keeps LAAQ's storage
(its input rebuilt from a converted norm's 4-bit copy, or kept in ``linear_input``'s format) and runs its three
GEMMs as torchao's float8 training recipe does.

torchao's ``Float8Linear`` keeps its bf16 input for backward and casts it again there; under LAAQ that input is
not kept but recomputed (a norm output) or decoded (a kept copy) in backward, then cast exactly as torchao
casts it. :class:`Float8Gemms` re-states ``torchao.float8.float8_linear.matmul_with_hp_or_float8_args``'s three
products with torchao's own casting function and configuration (taken from the module), so with native
storage the forward and every gradient equal torchao's bit for bit (``tests/laaq/test_float8.py``, torchao's
CPU emulation), and with 4-8 bit storage they differ from it only by LAAQ's storage error.

Opt in with ``LAAQConfig(float8_gemms=True)`` (default off: ``Float8Linear`` modules are then skipped, as
before). The float8 path is the compiled one (``torch.compile`` of the decoder layers, as torchao's float8
needs for speed anyway); a converted float8 linear run eagerly raises a clear error.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

__all__ = ["Float8Gemms", "is_float8_linear"]


def is_float8_linear(m: Any) -> bool:
    """A torchao ``Float8Linear`` (by class name and the attributes the recipe needs: no torchao import)."""
    return isinstance(m, nn.Linear) and any(k.__name__ == "Float8Linear" for k in type(m).__mro__) \
        and hasattr(m, "config") and hasattr(m, "linear_mm_config")


@dataclass(frozen=True)
class Float8Gemms:
    """The float8 recipe of one ``Float8Linear``: forward ``x Wᵀ (+ b)``, ``dX = dY W``, ``dW = dYᵀ X``."""

    config: Any          # torchao.float8.Float8LinearConfig
    mm_config: Any       # torchao.float8.float8_training_tensor.LinearMMConfig

    @classmethod
    def of(cls, m: nn.Module) -> "Float8Gemms":
        return cls(m.config, m.linear_mm_config)

    def _cast(self, t: torch.Tensor, cast_config, role: str, axis: int) -> torch.Tensor:
        from torchao.float8.config import ScalingType
        from torchao.float8.float8_scaling_utils import get_maybe_axiswise_dim, hp_tensor_to_float8_dynamic
        from torchao.float8.float8_training_tensor import GemmInputRole

        if cast_config.scaling_type is ScalingType.DISABLED:
            return t
        return hp_tensor_to_float8_dynamic(
            t, cast_config.target_dtype, self.mm_config, gemm_input_role=getattr(GemmInputRole, role),
            scaling_granularity=cast_config.scaling_granularity,
            axiswise_dim=get_maybe_axiswise_dim(axis, cast_config.scaling_granularity),
            round_scales_to_power_of_2=self.config.round_scales_to_power_of_2)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        c = self.config
        if torch.is_autocast_enabled(x.device.type):  # as Float8Linear.forward
            x = x.to(torch.get_autocast_dtype(x.device.type))
        xq = self._cast(x, c.cast_config_input, "INPUT", -1)
        wq = self._cast(weight.t(), c.cast_config_weight, "WEIGHT", 0)
        shape = xq.shape
        y = torch.mm(xq.reshape(-1, shape[-1]), wq)
        y = y.reshape(*shape[:-1], y.shape[-1])
        return y + bias.to(y.dtype) if bias is not None else y

    def input_grad(self, grad_out: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        c = self.config
        g2 = grad_out.reshape(-1, grad_out.shape[-1])
        gq = self._cast(g2, c.cast_config_grad_output, "GRAD_OUTPUT", -1)
        wq = self._cast(weight.t(), c.cast_config_weight_for_grad_input, "WEIGHT", -1)
        dx = torch.mm(gq, wq.t())
        return dx.reshape(*grad_out.shape[:-1], dx.shape[-1])

    def weight_grad(self, grad_out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        c = self.config
        g2 = grad_out.reshape(-1, grad_out.shape[-1])
        gq = self._cast(g2, c.cast_config_grad_output_for_grad_weight, "GRAD_OUTPUT", 0)
        xq = self._cast(x.reshape(-1, x.shape[-1]), c.cast_config_input_for_grad_weight, "INPUT", 0)
        return torch.mm(gq.t(), xq)
