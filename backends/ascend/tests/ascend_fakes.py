"""A fake ``torch_npu`` for CPU tests: the real API surface the plugin calls, recording every call and
asserting argument types, put in ``sys.modules`` only for the duration of a test.

Only the boundary is faked (agoq_ascend.device, agoq_ascend.vendor and the backend's device services
call it); everything behind it (launch geometry, the launcher, the interpreted kernels, the core) is real.
"""
from __future__ import annotations

import contextlib
import types

import torch


class FakeNpu:
    """torch_npu.npu: device queries and services (names and signatures as in torch_npu/npu/__init__.py)."""

    def __init__(self, *, soc_version: int = 223, name: str = "Ascend910B3", vector_cores: int = 48,
                 count: int = 2, available: bool = True):
        self.calls: list[tuple] = []
        self._soc, self._name, self._cores, self._count, self._avail = soc_version, name, vector_cores, count, available

    def is_available(self) -> bool:
        self.calls.append(("is_available",))
        return self._avail

    def device_count(self) -> int:
        self.calls.append(("device_count",))
        return self._count

    def current_device(self) -> int:
        self.calls.append(("current_device",))
        return 0

    def get_device_properties(self, index):
        assert isinstance(index, int) and 0 <= index < self._count, index
        self.calls.append(("get_device_properties", index))
        # torch_npu's _NPUDeviceProperties fields (torch_npu/csrc/npu/Module.cpp)
        return types.SimpleNamespace(name=self._name, total_memory=64 << 30, cube_core_num=self._cores // 2,
                                     vector_core_num=self._cores, L2_cache_size=192 << 20)

    def get_soc_version(self) -> int:
        self.calls.append(("get_soc_version",))
        return self._soc

    def get_device_name(self, index=None) -> str:
        self.calls.append(("get_device_name", index))
        return self._name

    @contextlib.contextmanager
    def device(self, index):
        assert isinstance(index, int), index
        self.calls.append(("device", index))
        yield

    def synchronize(self, device=None):
        self.calls.append(("synchronize", device))

    def max_memory_allocated(self, device=None) -> int:
        self.calls.append(("max_memory_allocated", device))
        return 12345

    def reset_peak_memory_stats(self, device=None):
        self.calls.append(("reset_peak_memory_stats", device))


def documented_dynamic_block_quant(x2d: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """The formula of torch_npu-npu_dynamic_block_quant.md for int8, min_scale=0, round_mode='rint':
    scale = max|x| / 127 per 1 x block piece of each row, y = rint(x / scale), in fp32."""
    rows, cols = x2d.shape
    xf = x2d.float()
    nb = -(-cols // block)
    pad = torch.zeros(rows, nb * block)
    pad[:, :cols] = xf
    pieces = pad.view(rows, nb, block)
    scale = pieces.abs().amax(dim=2) / 127.0
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    y = torch.round(pieces / safe[:, :, None]).clamp(-127, 127)  # torch.round is half-to-even, like rint
    return y.reshape(rows, nb * block)[:, :cols].to(torch.int8), scale


class FakeTorchNpu(types.ModuleType):
    """The ``torch_npu`` module: ``.npu`` plus the custom operator the vendor path calls."""

    def __init__(self, **npu_kwargs):
        super().__init__("torch_npu")
        self.npu = FakeNpu(**npu_kwargs)
        self.op_calls: list[dict] = []

    def npu_dynamic_block_quant(self, x, *, min_scale=0.0, round_mode="rint", dst_type=1, row_block_size=1,
                                col_block_size=128, dst_type_max=0.0):
        # The A2/A3 envelope of the op's documentation: fp16/bf16, 2-D or 3-D, non-empty, rint, int8, 1x128.
        assert isinstance(x, torch.Tensor) and x.dtype in (torch.float16, torch.bfloat16), x.dtype
        assert x.dim() in (2, 3) and x.numel() > 0, x.shape
        assert round_mode == "rint" and dst_type == 1 and row_block_size == 1 and col_block_size == 128
        assert min_scale == 0.0 and dst_type_max == 0.0
        self.op_calls.append({"shape": tuple(x.shape), "dtype": x.dtype})
        return documented_dynamic_block_quant(x)
