"""The ``ascend`` Backend object: shared Triton kernel bodies with Ascend launchers, HCCL byte collectives.

Two modes, fixed when the backend is created:

* **NPU** (``device_type="npu"``, ``dist_backend="hccl"``): torch_npu + triton-ascend + CANN. The SoC is
  read once (``torch_npu.npu.get_soc_version()``, device name) and decides the capabilities (A2/A3:
  FP8 only as bytes; 950: FP8 units exist, but the kernels still encode FP8 with integer logic so that
  codes match every backend) and the UB size the planner budgets with.
* **Interpreter** (``AGOQ_ASCEND_INTERPRET=1`` with ``TRITON_INTERPRET=1``): the same kernel bodies
  and the same Ascend launch geometry (planner, padded lanes, NF4 select tree, a fake vector-core
  count) run on CPU tensors in upstream Triton's interpreter; collectives go through gloo. This is how
  CPU CI exercises the code an NPU would run. It proves the bodies and the geometry, not Triton-Ascend's
  compiler or the NPU's arithmetic.
"""
from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

import torch

from agoq_core.backend import BackendBase, Capabilities
from agoq_core.errors import BackendUnavailableError
from agoq_core.formats.spec import list_formats
from agoq_ascend import device as npu_device
from agoq_ascend import plugin, selftest, vendor
from agoq_ascend.geometry import DeviceProps, max_block
from agoq_ascend.launch import is_interpreted, launcher
from agoq_ascend.soc import INTERPRETER_SOC, SocInfo

log = logging.getLogger("agoq.ascend")

__all__ = ["AscendBackend", "INTERPRET_CORES_DEFAULT"]

_OPS = frozenset({"quantize", "dequantize", "accumulate", "reduce_requantize"})
# No float64: 910B's vector units have no fp64 and torch_npu's fp64 -> fp32 cast path is unverified;
# the core reports a clear CapabilityError for float64 inputs instead.
_INPUT_DTYPES = frozenset({torch.float32, torch.bfloat16, torch.float16})

INTERPRET_CORES_DEFAULT = 3
"""Fake vector cores in interpreter mode: each interpreted program costs ~8 ms of Python
(cpu-feasibility.md §2), and 3 programs (odd on purpose) make the persistent loop give some programs
more tiles than others."""


def _interpret_cores() -> int:
    raw = os.environ.get("AGOQ_ASCEND_INTERPRET_CORES", "").strip()
    if not raw:
        return INTERPRET_CORES_DEFAULT
    if not raw.isdigit() or int(raw) < 1:
        raise BackendUnavailableError(f"AGOQ_ASCEND_INTERPRET_CORES={raw!r} must be a positive integer")
    return int(raw)


class AscendBackend(BackendBase):
    name = "ascend"

    def __init__(self, *, soc: SocInfo, props: DeviceProps, interpreted: bool,
                 vendor_options: vendor.VendorOptions = vendor.VendorOptions(), torch_npu: Any = None):
        if interpreted and vendor_options.ops:
            raise BackendUnavailableError(
                f"AGOQ_ASCEND_VENDOR_OPS={','.join(sorted(vendor_options.ops))} needs torch_npu on an NPU; it cannot "
                "run in interpreter mode (unset it)")
        self.soc = soc
        self.props = props
        self.interpreted = interpreted
        self.vendor_options = vendor_options
        self._npu = torch_npu
        self.device_type = plugin.device_type(interpreted)  # what the plugin's BackendInfo declares
        self.dist_backend = "gloo" if interpreted else "hccl"
        self.launcher = launcher(props)
        self._max_block = max_block(props)  # ~10 ms of planner arithmetic; capabilities() runs per call
        self._caps: tuple[vendor.VendorOptions, Capabilities] | None = None  # (built for these vendor options, caps)

    # ---- construction --------------------------------------------------------------------------------
    @classmethod
    def create(cls) -> "AscendBackend":
        """Build the backend for this process (the probe only looked at files; this checks for real)."""
        if plugin.interpreter_requested():
            if not is_interpreted():
                raise BackendUnavailableError(
                    "AGOQ_ASCEND_INTERPRET=1 but the kernels were not decorated under TRITON_INTERPRET=1 (Triton "
                    "fixes the mode at import); set both variables before Python starts")
            props = DeviceProps(vector_cores=_interpret_cores(), ub_bytes=INTERPRETER_SOC.ub_bytes,
                                name=INTERPRETER_SOC.device_name)
            return cls(soc=INTERPRETER_SOC, props=props, interpreted=True, vendor_options=vendor.VendorOptions.from_env())
        torch_npu = npu_device.import_torch_npu()
        if is_interpreted():
            raise BackendUnavailableError(
                "TRITON_INTERPRET=1 is set but AGOQ_ASCEND_INTERPRET is not: on an NPU unset TRITON_INTERPRET; to run "
                "the kernels on CPU set AGOQ_ASCEND_INTERPRET=1 as well")
        index = torch_npu.npu.current_device()
        local_rank = os.environ.get("LOCAL_RANK", "").strip()
        if local_rank.isdigit() and int(local_rank) != index:
            log.warning("agoq-ascend: LOCAL_RANK=%s but the current NPU is %d: every rank of this node may be using "
                        "NPU %d. Call torch.npu.set_device(int(os.environ['LOCAL_RANK'])) before the first AGoQ call "
                        "(or before init_process_group)", local_rank, index, index)
        soc, props = npu_device.query_device(torch_npu, index)
        vopts = vendor.VendorOptions.from_env()
        vendor.check_available(torch_npu, vopts)
        backend = cls(soc=soc, props=props, interpreted=False, vendor_options=vopts, torch_npu=torch_npu)
        if selftest.self_test_enabled():
            selftest.run_self_test(backend, f"npu:{index}")
        return backend

    # ---- what it claims ------------------------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        """What the backend claims. The core asks before every codec call (LAAQ's store/load, QuanGrad's folds):
        built once, and again only if ``vendor_options`` is replaced (the rest is fixed at construction)."""
        if self._caps is None or self._caps[0] is not self.vendor_options:
            self._caps = (self.vendor_options, self._capabilities())
        return self._caps[1]

    def _capabilities(self) -> Capabilities:
        fam = self.soc.family
        notes = [f"device: {self.soc.describe()}; {self.props.vector_cores} vector cores, UB {self.props.ub_bytes} bytes",
                 "Triton kernel bodies shared with agoq-cuda (agoq_triton_kernels), Ascend launch geometry "
                 "(agoq_ascend.geometry); written to be bit-exact with the reference, verified only in Triton's CPU "
                 "interpreter: no NPU run is on record (agoq conformance run --backend ascend makes one)"]
        if fam in ("A2", "A3", "interpreter"):
            notes.append(f"{'Atlas ' + fam if fam != 'interpreter' else 'emulated A2'}: no FP8 units; fp8_e4m3/fp8_e5m2 "
                         "are stored as bytes, encoded and decoded with int32 logic, moved by HCCL as uint8")
        else:
            notes.append("Ascend 950: FP8 units exist, but FP8 codes are still produced with int32 logic so they "
                         "match every other backend bit for bit; HCCL moves them as uint8")
        if self.interpreted:
            notes.insert(0, "Triton interpreter (AGOQ_ASCEND_INTERPRET=1): CPU tensors, gloo collectives; proves the "
                            "kernel bodies and launch geometry, not Triton-Ascend's compiler or NPU arithmetic")
        if self.vendor_options.ops:
            notes.append("vendor operators on (tolerance level): " + ", ".join(sorted(self.vendor_options.ops)))
        return Capabilities(
            formats=frozenset(s.name for s in list_formats(microscaling=True)),
            device_types=frozenset({self.device_type}),
            ops=_OPS,
            collectives=frozenset({"all_to_all", "all_gather"}),
            input_dtypes=_INPUT_DTYPES,
            max_block=self._max_block,
            notes=tuple(notes),
            # A2/A3 (and the interpreter, which emulates an A2) have no FP8/FP4 units; the 950 has both
            native_float_formats=frozenset({"fp8_e4m3", "fp8_e5m2", "fp4_e2m1"}) if self.soc.fp8_native else frozenset(),
        )

    def known_deviations(self) -> dict[str, str]:
        return self.vendor_options.known_deviations()

    # ---- codecs --------------------------------------------------------------------------------------
    def _guard(self, t: torch.Tensor):
        """Launch on the tensor's NPU (Triton-Ascend launches on the current device)."""
        if self.interpreted or t.device.index is None:
            return contextlib.nullcontext()
        return self._npu.npu.device(t.device.index)

    def quantize_into(self, x, spec, codes, scales):
        with self._guard(x):
            if "npu_dynamic_block_quant" in self.vendor_options.ops and vendor.dynamic_block_quant_applies(spec, x):
                vendor.dynamic_block_quant_int8(self._npu, x, codes, scales)
                return
            self.launcher.quantize(x, spec, codes, scales)

    def dequantize_into(self, codes, scales, spec, out):
        with self._guard(out):
            self.launcher.dequantize(codes, scales, spec, out)

    def accumulate_(self, codes, scales, spec, g):
        with self._guard(g):
            self.launcher.accumulate(codes, scales, spec, g)

    def reduce_requantize_into(self, codes, scales, spec, numel, codes_out, scales_out):
        with self._guard(codes):
            self.launcher.reduce_requantize(codes, scales, spec, numel, codes_out, scales_out)

    # ---- collectives: bytes over HCCL (or gloo in interpreter mode) ----------------------------------
    def _check_collective(self, what: str, output: torch.Tensor, input: torch.Tensor,
                          group: Any) -> tuple[torch.Tensor, torch.Tensor]:
        import torch.distributed as dist

        for name, t in (("output", output), ("input", input)):
            if t.device.type != self.device_type:
                raise ValueError(f"{what}: {name} is on {t.device}, but the ascend backend moves {self.device_type} "
                                 f"tensors over {self.dist_backend}")
            if not t.is_contiguous():
                raise ValueError(f"{what}: {name} must be contiguous")
        pg_backend = str(dist.get_backend(group)).lower()
        if self.dist_backend not in pg_backend:
            raise ValueError(f"{what}: the process group uses {pg_backend!r}; {self.device_type} tensors need "
                             f"{self.dist_backend!r} (dist.init_process_group({self.dist_backend!r}, ...))")
        world = dist.get_world_size(group)
        out_b, in_b = output.reshape(-1).view(torch.uint8), input.reshape(-1).view(torch.uint8)
        if what == "all_to_all_bytes":
            if out_b.numel() != in_b.numel():
                raise ValueError(f"{what}: output holds {out_b.numel()} bytes but input {in_b.numel()}; they must match")
            if in_b.numel() % world:
                raise ValueError(f"{what}: {in_b.numel()} bytes do not split evenly over {world} ranks (HCCL's "
                                 "all_to_all_single needs size(0) % world_size == 0); pad the payload")
        elif out_b.numel() != world * in_b.numel():
            raise ValueError(f"{what}: output holds {out_b.numel()} bytes; {world} ranks x {in_b.numel()} input bytes "
                             f"need {world * in_b.numel()}")
        return out_b, in_b

    def all_to_all_bytes(self, output, input, *, group=None, async_op=False):
        """Equal byte chunks to every rank. uint8 views: HCCL (and gloo) cannot take fp8 dtypes, and
        uint8 needs no reduction, which HCCL could not do for it anyway."""
        import torch.distributed as dist

        out_b, in_b = self._check_collective("all_to_all_bytes", output, input, group)
        return dist.all_to_all_single(out_b, in_b, group=group, async_op=async_op)

    def all_gather_bytes(self, output, input, *, group=None, async_op=False):
        """Every rank's bytes, in rank order, into ``output`` (world x input bytes)."""
        import torch.distributed as dist

        out_b, in_b = self._check_collective("all_gather_bytes", output, input, group)
        # all_gather_into_tensor is deprecated in newer torch for all_gather_single, absent in older.
        fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return fn(out_b, in_b, group=group, async_op=async_op)

    # ---- device services -----------------------------------------------------------------------------
    def synchronize(self, device=None) -> None:
        if not self.interpreted:
            self._npu.npu.synchronize(device)

    def max_memory_allocated(self, device=None) -> int:
        return 0 if self.interpreted else int(self._npu.npu.max_memory_allocated(device))

    def reset_peak_memory_stats(self, device=None) -> None:
        if not self.interpreted:
            self._npu.npu.reset_peak_memory_stats(device)

    def __repr__(self) -> str:
        mode = "Triton interpreter, CPU tensors" if self.interpreted else self.soc.describe()
        return f"<agoq backend 'ascend' ({mode})>"
