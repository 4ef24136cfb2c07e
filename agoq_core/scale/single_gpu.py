"""The model against the one machine we measured: LLaMA-2-7B on one H200 (docs/benchmarks.md §1).

``fit_h200(runs)`` fits the H200's two free numbers (attention efficiency, fixed time per layer) to the
plain bf16 steps at 4K and 16K tokens; ``h200_check(runs)`` then predicts every row of the same run —
plain, full activation checkpointing and LAAQ at 4K and 16K: step time, tokens/s and the bytes the
decoder layers keep — and returns predicted vs measured. The benchmark is Hugging Face eager (memory-
bound ops as ``compute.ELEMENTWISE["hf"]``), batch 1, no optimizer step. Both use
``devices.H200_2026_11_29``: the H200 with the codec shares of 2026-11-29, the kernels that ran in that step
(the default H200 profile carries the newer kernels' shares).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from agoq_core.planner.memory import ActivationCostTable
from agoq_core.planner.model import model_shape
from agoq_core.scale import compute as C
from agoq_core.scale.devices import H200_2026_11_29, DeviceProfile
from agoq_core.scale.errors import ScaleError
from agoq_core.scale.memory import hf_plain_layer_bytes

__all__ = ["H200_RUN", "load_runs", "fit_h200", "h200_check", "CheckRow", "MARGINS"]

#: The measured run (2026-11-29 12:09 UTC, one H200, `python benchmarks/bench_laaq.py`, commit 6ecf806).
H200_RUN = Path(__file__).resolve().parents[2] / "docs" / "bench" / "h200-2026-11-29" / "run2" / "bench_laaq.json"

#: Documented margins of the single-GPU check (asserted by tests/scale/test_single_gpu.py).
MARGINS = {"step_time": 0.10, "saved_bytes": 0.01}


def load_runs(path: str | Path = H200_RUN) -> dict[tuple[str, int], dict]:
    p = Path(path)
    if not p.is_file():
        raise ScaleError(f"no benchmark result at {p} (expected docs/bench/h200-2026-11-29/run2/bench_laaq.json)")
    data = json.loads(p.read_text())
    return {(r["method"], r["seq"]): r for r in data["runs"] if not r.get("oom")}


def _parts(dev: DeviceProfile, seq: int) -> tuple[float, float, float]:
    """(seconds without attention and fixed overhead, attention seconds at efficiency 1, layers)."""
    shape = model_shape("llama2-7b")
    d1 = replace(dev, attention_efficiency=1.0)
    lc = C.layer_cost(shape, seq, seq, d1, elementwise="hf")
    hf, hb = C.head_cost(shape, seq, d1, elementwise="hf")
    rest = shape.layers * (3 * lc.gemm_fwd + 3 * lc.elementwise_fwd) + hf + hb
    attn = shape.layers * (1 + C.BACKWARD_ATTENTION) * lc.attention_fwd
    return rest, attn, float(shape.layers)


def fit_h200(runs: dict | None = None, dev: DeviceProfile | None = None) -> tuple[float, float]:
    """(attention efficiency, fixed seconds per layer) that make the plain 4K and 16K steps exact."""
    runs = runs if runs is not None else load_runs()
    dev = dev or H200_2026_11_29
    (r4, a4, L), (r16, a16, _) = _parts(dev, 4096), _parts(dev, 16384)
    t4, t16 = runs[("plain", 4096)]["step_s"], runs[("plain", 16384)]["step_s"]
    # t = rest + attn * x + L * c, with x = 1 / efficiency
    x = ((t16 - r16) - (t4 - r4)) / (a16 - a4)
    c = (t4 - r4 - a4 * x) / L
    if x <= 0 or c < 0:
        raise ScaleError(f"the plain steps cannot be fitted (1/efficiency {x}, overhead {c}): check the run")
    return 1.0 / x, c


@dataclass(frozen=True)
class CheckRow:
    method: str
    seq: int
    quantity: str
    measured: float
    predicted: float
    fitted_on: bool

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0


def h200_check(runs: dict | None = None) -> list[CheckRow]:
    runs = runs if runs is not None else load_runs()
    dev = H200_2026_11_29
    shape = model_shape("llama2-7b")
    out = []
    for seq in (4096, 16384):
        lc = C.layer_cost(shape, seq, seq, dev, elementwise="hf")
        hf, hb = C.head_cost(shape, seq, dev, elementwise="hf")
        plain = shape.layers * (lc.forward + lc.backward + dev.layer_overhead_s) + hf + hb
        # HF gradient checkpointing (non-reentrant) runs every layer's forward again in backward
        ckpt = plain + shape.layers * (lc.forward + dev.layer_overhead_s / 3)
        lf, lb = C.laaq_overhead(shape, seq, dev, "nf4", quantize_attn_out=False, elementwise="hf")
        laaq = plain + shape.layers * (lf + lb)
        for method, t in (("plain", plain), ("ckpt", ckpt), ("laaq", laaq)):
            r = runs[(method, seq)]
            out.append(CheckRow(method, seq, "step_s", r["step_s"], t, method == "plain"))
            out.append(CheckRow(method, seq, "tokens_per_s", r["tokens_per_s"], seq / t, method == "plain"))
        saved = {"plain": shape.layers * hf_plain_layer_bytes(shape, seq)}
        table = ActivationCostTable.from_formula(shape, tokens=seq, formats=["nf4"], seq_len=seq)
        # every layer computes RoPE once in HF (the planner's chunk_bytes, counted here per layer)
        saved["laaq"] = shape.layers * table.bytes_for("nf4") + table.chunk_bytes
        for method, b in saved.items():
            out.append(CheckRow(method, seq, "saved_layers_bytes", runs[(method, seq)]["saved_layers_bytes"], b, False))
    return out
