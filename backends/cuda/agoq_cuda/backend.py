"""The ``cuda`` Backend object: Triton codecs (agoq_triton_kernels) and NCCL byte collectives.

In interpreter mode (TRITON_INTERPRET=1 when the kernels were imported) the same kernels run on CPU
tensors through Triton's interpreter and collectives go through gloo: that is how CPU CI runs the
real kernel code.
"""
from __future__ import annotations

import torch

from agoq_core.backend import BackendBase, Capabilities
from agoq_core.errors import BackendUnavailableError
from agoq_core.formats.spec import list_formats
from agoq_cuda import launch, plugin
from agoq_triton_kernels.layout import MAX_BLOCK

__all__ = ["CudaBackend"]

_OPS = frozenset({"quantize", "dequantize", "accumulate", "reduce_requantize",
                  "gemm_quant_epilogue", "gemm_dequant_prologue",   # fused GEMMs: agoq_cuda.fusion
                  "rmsnorm_quant",                                  # fused norm + codec: agoq_cuda.fused_norm
                  "silu_mul_quant", "silu_mul_backward"})           # fused SiLU&Mul + codec: agoq_cuda.fused_swiglu


class CudaBackend(BackendBase):
    name = "cuda"

    def __init__(self, *, interpreted: bool):
        self.interpreted = interpreted
        self.device_type = plugin.device_type(interpreted)  # what the plugin's BackendInfo declares
        self.dist_backend = "gloo" if interpreted else "nccl"
        self._caps: Capabilities | None = None  # built on first use: every fused LAAQ call asks (host time, issue 17)

    @classmethod
    def create(cls) -> "CudaBackend":
        """Check the runtime for real (the probe only looked at files) and build the backend."""
        interpreted = launch.is_interpreted()
        if interpreted != plugin.interpreter_requested():
            raise BackendUnavailableError(
                "TRITON_INTERPRET changed after the agoq kernels were imported (Triton fixes interpreter mode "
                "when a kernel is decorated); set it before importing agoq_cuda, e.g. in the environment")
        if not interpreted and not torch.cuda.is_available():
            raise BackendUnavailableError(
                f"torch {torch.__version__} (CUDA {torch.version.cuda}) cannot use a GPU here "
                "(torch.cuda.is_available() is False: driver missing or too old?); set TRITON_INTERPRET=1 to "
                "run the kernels on CPU instead")
        return cls(interpreted=interpreted)

    def capabilities(self) -> Capabilities:
        if self._caps is None:
            self._caps = self._capabilities()
        return self._caps

    def _capabilities(self) -> Capabilities:
        notes = ["Triton kernels shared with agoq-ascend (agoq_triton_kernels); bit-exact with the reference",
                 "float64 inputs are rounded to float32 by torch before the kernel (as the reference does)",
                 "fused GEMMs (LAAQ): bf16/fp16 operands, power-of-two blocks <= 256 that divide the row; other "
                 "calls run unfused (docs/fusion.md)"]
        if self.interpreted:
            notes.insert(0, "Triton interpreter (TRITON_INTERPRET=1): CPU tensors, gloo collectives, slow")
        return Capabilities(
            formats=frozenset(s.name for s in list_formats(microscaling=True)),
            device_types=frozenset({self.device_type}),
            ops=_OPS,
            collectives=frozenset({"all_to_all", "all_gather"}),
            input_dtypes=frozenset({torch.float32, torch.bfloat16, torch.float16, torch.float64}),
            max_block=MAX_BLOCK,
            notes=tuple(notes),
        )

    def quantize_into(self, x, spec, codes, scales):
        launch.quantize(x, spec, codes, scales)

    def dequantize_into(self, codes, scales, spec, out):
        launch.dequantize(codes, scales, spec, out)

    def accumulate_(self, codes, scales, spec, g):
        launch.accumulate(codes, scales, spec, g)

    def reduce_requantize_into(self, codes, scales, spec, numel, codes_out, scales_out):
        launch.reduce_requantize(codes, scales, spec, numel, codes_out, scales_out)

    # ---- fused GEMMs for LAAQ (docs/fusion.md); imported lazily: they compile only when used ----------
    def gemm_quant_epilogue_unsupported(self, x, weight, bias, spec):
        from agoq_cuda.fusion import launch as fused

        return fused.epilogue_unsupported(x, weight, bias, spec)

    def gemm_quant_epilogue_into(self, x, weight, bias, spec, out, codes, scales):
        from agoq_cuda.fusion import launch as fused

        fused.gemm_quant_epilogue_into(x, weight, bias, spec, out, codes, scales)

    def gemm_dequant_prologue_unsupported(self, grad, spec, k, mul=None):
        from agoq_cuda.fusion import launch as fused

        return fused.prologue_unsupported(grad, spec, k, mul)

    def gemm_dequant_prologue_into(self, grad, codes, scales, spec, k, out, mul=None):
        from agoq_cuda.fusion import launch as fused

        fused.gemm_dequant_prologue_into(grad, codes, scales, spec, k, out, mul)

    # ---- RMSNorm writing its output and its input's codes in one pass (agoq_cuda.fused_norm) ------------
    def rmsnorm_quant_unsupported(self, x, weight, spec):
        from agoq_cuda import fused_norm

        return fused_norm.rmsnorm_quant_unsupported(x, weight, spec)

    def rmsnorm_quant_variants(self, device):
        from agoq_cuda import fused_norm

        return fused_norm.rmsnorm_quant_variants(torch.device(device))

    def rmsnorm_quant_into(self, x, weight, eps, spec, y, codes, scales, variant=None, rinv=None):
        from agoq_cuda import fused_norm

        fused_norm.rmsnorm_quant_into(x, weight, eps, spec, y, codes, scales, variant=variant, rinv=rinv)

    # ---- SiLU&Mul with its codec inside, forward and backward (agoq_cuda.fused_swiglu) --------------------
    def silu_mul_quant_unsupported(self, gate, up, spec):
        from agoq_cuda import fused_swiglu

        return fused_swiglu.silu_mul_quant_unsupported(gate, up, spec)

    def silu_mul_quant_variants(self, device):
        from agoq_cuda import fused_swiglu

        return fused_swiglu.silu_mul_quant_variants(torch.device(device))

    def silu_mul_quant_into(self, gate, up, spec, h, gate_codes, gate_scales, up_codes, up_scales, variant=None):
        from agoq_cuda import fused_swiglu

        fused_swiglu.silu_mul_quant_into(gate, up, spec, h, gate_codes, gate_scales, up_codes, up_scales,
                                         variant=variant)

    def silu_mul_backward_unsupported(self, dh, spec):
        from agoq_cuda import fused_swiglu

        return fused_swiglu.silu_mul_backward_unsupported(dh, spec)

    def silu_mul_backward_variants(self, device):
        from agoq_cuda import fused_swiglu

        return fused_swiglu.silu_mul_backward_variants(torch.device(device))

    def silu_mul_backward_into(self, dh, gate_codes, gate_scales, up_codes, up_scales, spec, h, dgate, dup,
                               variant=None):
        from agoq_cuda import fused_swiglu

        fused_swiglu.silu_mul_backward_into(dh, gate_codes, gate_scales, up_codes, up_scales, spec, h, dgate, dup,
                                            variant=variant)

    def __repr__(self) -> str:
        mode = "Triton interpreter, CPU tensors" if self.interpreted else "CUDA"
        return f"<agoq backend 'cuda' ({mode})>"
