#!/usr/bin/env python
"""Equal-memory comparison on one GPU: every single-GPU alternative vs AGoQ (LAAQ, the memory-budget policy).

LLaMA-2-7B shapes, HF transformers, bf16 weights, batch 1, random init, a full training step (forward,
backward, torchao AdamW8bit step; gradients zeroed in place, not freed), SDPA attention. Each configuration
runs in its own process (one per configuration and memory cap) and climbs its sequence ladder until the
first OOM (recorded, the ladder stops, the next process starts clean). Budgets: the whole device and an
80 GiB cap (torch.cuda.set_per_process_memory_fraction).

Configurations (``--configs``; ``-c`` = every decoder layer torch.compile'd, as torchtitan does):
  plain[-c]         the model as is, HF's loss
  ckpt[-c]          full activation checkpointing (torch checkpoint_wrapper, non-reentrant, every layer)
  partial[-c]       the fewest checkpointed layers that fit (first guess from agoq_core.planner.budget with
                    bf16/ckpt only, then more layers on OOM, in the same process)
  sac[-c]           op-level selective checkpointing as torchtitan 0.3 configures it (save mm -- every other
                    one -- and SDPA/_scaled_mm outputs; agoq_core.laaq.policy.sac_context_fn)
  offload           saved tensors on the CPU (torch.autograd.graph.save_on_cpu, pinned)
  liger             Liger-Kernel (RMSNorm, SwiGLU, RoPE, fused linear CE) + the fastest of none/sac/partial/ckpt
                    that fits (needs liger_kernel + CUDA)
  fp8-c             torchao float8 (tensorwise) on the decoder Linears, compiled, + fastest of none/sac/partial/ckpt
                    that fits (partial: planned from the measured fp8-bf16-c/fp8-ckpt-c costs when --layer-costs has
                    them, then more checkpointed layers on OOM; needs CUDA, SM89+), HF's loss
  fp8-ce-c          the same with the chunked linear cross-entropy (no logits: what a float8 user who also takes
                    Liger's fused linear CE gets; the strongest float8 alternative)
  laaq[-c]          agoq_core.laaq.apply (nf4, paper policy) + the chunked linear cross-entropy
  laaq-hf[-c]       the same with HF's loss (the logits kept, as plain's): LAAQ's own cost against plain, one
                    variable changed (the chunked loss recomputes the LM head's GEMM in backward)
  laaq-liger        Liger's RMSNorm + RoPE kernels under LAAQ (LAAQ keeps the norms' 4-bit inputs and calls
                    Liger's norm; Liger's SwiGLU is left out: LAAQ's SwiGLU keeps gate/up at 4 bits where
                    Liger's keeps them in bf16) + chunked CE (needs liger_kernel + CUDA)
  policy[-c]        agoq_core.planner.budget.plan_budget for the cap, applied with agoq_core.laaq.apply_policy
                    + chunked CE; -c compiles the layers the plan leaves bf16/checkpointed
  policy-fp8-c      the same with float8 Linears in every layer the plan does not give to LAAQ (GPU only)
  policy-m-fp8-qg   policy-m-fp8 with QuanGrad: gradients stored in FP8 (QuanGradDDP on one process, no master
                    weights, the same AdamW8bit stepped bucket by bucket), planned with QuanGrad's gradient bytes
  policy-m-fp8-auto policy-m-fp8 with the gradient storage chosen by the planner too (plan_budget(grads="auto"):
                    QuanGrad's FP8 buffers where that plan is predicted faster, else bf16 .grad)
  policy-m          the policy planned from *measured* per-layer costs (benchmarks/bench_layer_profile.py, run
                    first in the same session: bytes and ms of one layer per option, compiled options included:
                    bf16-c, sac-c, laaq-c:nf4, ...), applied with apply_policy (compiling the -c layers); at a
                    length the profile did not measure, the analytic eager options (= policy)

Per-layer explanation: ``--quick`` first runs benchmarks/bench_layer_profile.py (one decoder layer, 32K then 16K:
plain, compiled plain, compiled SAC, full checkpointing, LAAQ eager/compiled, ...: forward/backward ms, kernel
groups, saved and transient bytes) in its own process; its table and JSON go with this report
(``layer_profile``), and its measured costs feed ``policy-m``.

  python benchmarks/bench_equal_memory.py --quick   # H200, < 4 minutes: the most informative subset
  python benchmarks/bench_equal_memory.py           # the full matrix (~1 hour)
  python benchmarks/bench_equal_memory.py --smoke   # tiny shapes on CPU: tests the logic (a few minutes)

Writes $OUT/bench_equal_memory.json (or --json), prints the table, saves the Pareto plot
(tokens/s vs sequence length, one panel per budget) next to the JSON.

On a GPU: AGOQ_BENCH_PROFILE=DIR profiles one more step per cell (kernel groups); AGOQ_BENCH_MEMHIST=DIR records
the allocator's history over the timed steps and writes what is alive at their peak and at an out-of-memory,
grouped by the code that allocated it (benchmarks/mem_peak.py; the row's step times then include the recorder's cost).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30
K = 1024

#: The float8 budget policies planned from measured costs (a new variant is added here only).
POLICY_M_FP8 = ("policy-m-fp8", "policy-m-fp8-qg", "policy-m-fp8-auto")
#: Every budget policy's base name (the configuration without "-c"): their plans carry a predicted peak.
POLICY_BASES = ("policy", "policy-fp8", "policy-m", *POLICY_M_FP8)
ALL_CONFIGS = ("plain", "plain-c", "ckpt", "ckpt-c", "ckpt-ce", "ckpt-ce-c", "partial", "partial-c", "sac", "sac-c",
               "offload", "liger", "fp8-c", "laaq", "laaq-c", "laaq-hf", "laaq-hf-c", "laaq-fp8-c", "laaq-liger", "qckpt", "qckpt-c", "policy",
               "policy-c", "policy-fp8-c", "policy-m", *POLICY_M_FP8, "fp8-ce-c")
AGOQ = ("laaq", "laaq-c", "laaq-hf", "laaq-hf-c", "laaq-fp8-c", "laaq-liger", "qckpt", "qckpt-c", "policy", "policy-c", "policy-fp8-c",
        "policy-m", *POLICY_M_FP8)
#: Plain bf16 (eager, compiled) and the budget policies of the matrix: issue 18's goal where plain fits compares them.
_PLAINS, _POLICIES = ("plain", "plain-c"), ("policy-m", *POLICY_M_FP8)
#: The longest-sequence pair (issue 18's third goal): the alternative that reaches furthest -- full checkpointing,
#: compiled, with the chunked linear cross-entropy (no logits: as Liger's fused linear CE; the bench's ``ckpt``
#: keeps HF's fp32 logits, which alone need 4 x T x vocab bytes) -- against AGoQ's longest reach, every layer
#: quantized-checkpointed at nf4 (compiled inside, ``qckpt-c:nf4``) with the same loss. One primed step per
#: length (--steps 0): at 192K+ a LLaMA-2-7B step takes minutes, so the pair is the decisive one: AGoQ at 320K,
#: the alternative at 320K / 1.25 = 256K (if it runs out of memory there, its longest is < 256K and AGoQ's > 1.25x
#: it). Chosen from the 64K per-layer profile of 2026-12-02 (compiled, H200): qckpt-c:nf4 keeps 0.143 GB and needs
#: 11.2 GB on top in backward, ckpt-c 0.537 and 13.0 GB; scaled linearly (flash attention) that predicts ~112 GiB
#: for AGoQ at 320K and ~150 GiB for the alternative at 256K. --seqs overrides both ladders.
LONGEST = (("qckpt-c", (320 * K,)), ("ckpt-ce-c", (256 * K,)))
#: The --quick run (2026-12-02 re-plan, issue 18; < 8 minutes on one H200 with --layer-costs, i.e. without the
#: per-layer profile): (config, cap GiB) -> sequences, most informative first; the time guard starts no process
#: after 205 s (--budget-s). Already measured and not repeated: plain 16K, full checkpointing and LAAQ at 32K,
#: the analytic policy at 16K/32K (2026-12-01 06:51), compiled SAC at 32K on the whole device (7,521 tokens/s,
#: 104.3 GiB, 09:27).
QUICK_CELLS = (
    (("policy-m", 0), (32 * K,)),          # the measured-cost policy: 3 x OOM on 2026-12-01 (24 of 32 layers ran
                                           # eager past dynamo's recompile limit; fixed), now its prediction
    (("sac-c", 80), (32 * K,)),            # an H100-class budget (set_per_process_memory_fraction on cuda:N):
                                           # SAC needed 104.3 GiB uncapped, so expected OOM
    (("ckpt-c", 80), (32 * K,)),           # the alternative that fits 32K under 80 GiB
    (("policy-m", 80), (32 * K, 64 * K)),  # the policy under the cap (64K: analytic options, not profiled there)
    (("partial-c", 80), (32 * K,)),        # fewest checkpointed layers under 80 GiB (if the guard leaves time)
)
QUICK_PROFILE = dict(seqs="32K,16K", budget_s=75.0)



def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny LLaMA on CPU, all configurations (logic only)")
    ap.add_argument("--quick", action="store_true",
                    help="the < 4.5 minute H200 subset: per-layer profile, then QUICK_CELLS")
    ap.add_argument("--longest", action="store_true",
                    help="the longest-sequence pair (LONGEST: every layer qckpt-c:nf4 at 320K, compiled full "
                         "checkpointing with the chunked loss at 256K), whole device, one primed step each")
    ap.add_argument("--merge", default=None,
                    help="no run: read the rows of earlier bench_equal_memory JSONs (comma-separated; a later file's "
                         "row replaces an earlier one for the same configuration, cap and length), print the table "
                         "and summary, write the merged JSON and the Pareto plot (--json)")
    ap.add_argument("--matrix", action="store_true",
                    help="with --merge: print which cells of issue 18's matrix (MATRIX_CONFIGS x MATRIX_SEQS x the two "
                         "budgets) the rows cover, and the cells-stage commands that would measure the rest")
    ap.add_argument("--matrix-caps", default="0,80",
                    help="with --matrix: the budgets of the matrix in GiB [0,80]; on an 80 GB card the merged 80 GiB "
                         "rows are its whole device, so give 0")
    ap.add_argument("--configs", default=None, help=f"comma-separated, from {','.join(ALL_CONFIGS)}")
    ap.add_argument("--seqs", default=None, help="ladder (default 8K,16K,32K,64K,96K,128K,160K,192K,256K)")
    ap.add_argument("--caps", default=None, help="memory caps in GiB, 0 = whole device (default 0,80)")
    ap.add_argument("--cap-gib", type=float, default=None,
                    help="one memory cap (e.g. 80: an H100-class budget): every configuration climbs its ladder "
                         "under it, the report compares tokens/s at each length and the longest length per "
                         "configuration (= --caps N)")
    ap.add_argument("--batch", type=int, default=1, help="micro-batch (sequences per step) [1]")
    ap.add_argument("--layer-costs", default=None,
                    help="bench_layer_profile.py JSON(s), comma-separated, whose measured costs policy-m plans with "
                         "(--quick runs the profile unless given)")
    ap.add_argument("--no-layer-profile", action="store_true", help="--quick without the per-layer profile")
    ap.add_argument("--steps", type=int, default=2,
                    help="timed steps per point after one warm-up [2]; 0 = one step only, with gradients and optimizer "
                         "state allocated before it (its tokens/s includes compilation) [--longest: 0]")
    ap.add_argument("--warmup", type=int, default=1,
                    help="untimed steps before the timed ones [1]: the first compiles and allocates the optimizer "
                         "state; more exclude other one-time costs of later steps")
    ap.add_argument("--qg-nonfinite", choices=("raise", "apply"), default="raise",
                    help="QuanGrad's on_nonfinite in the *-qg configurations: raise (check before every step, one host "
                         "synchronisation) or apply (no check, as the plain configurations) [raise]")
    ap.add_argument("--layers", type=int, default=None, help="override the 32 decoder layers")
    ap.add_argument("--budget-s", type=float, default=None, help="start no process after this many seconds")
    ap.add_argument("--cell-timeout-s", type=float, default=None,
                    help="kill a configuration's process after this many seconds [900; --quick 150]")
    ap.add_argument("--json", default=None, help="output (default $OUT/bench_equal_memory.json)")
    ap.add_argument("--compile-backend", default=None, help="torch.compile backend (default inductor; eager with --smoke)")
    ap.add_argument("--fake-oom-above", type=int, default=None, help="testing: simulated OOM above this many tokens")
    ap.add_argument("--cell", default=None, help=argparse.SUPPRESS)  # internal: run one configuration's ladder
    args = ap.parse_args(argv)
    for name in ("budget_s", "cell_timeout_s"):  # a negative budget would start nothing and report an empty run
        v = getattr(args, name)
        if v is not None and not v > 0:
            ap.error(f"--{name.replace('_', '-')} must be > 0 seconds, got {v:g}")
    return args


# ============================================================ child: one configuration, one cap, its ladder
def _use_checkout():
    for sub in ("", "backends/triton_common", "backends/cuda"):
        p = str(_ROOT / sub) if sub else str(_ROOT)
        if Path(p).is_dir() and p not in sys.path:
            sys.path.insert(0 if not sub else len(sys.path), p)


def _shape(smoke, layers):
    """LLaMA-2-7B, or for --smoke the registry's micro shape with 4 layers and a 352-wide MLP."""
    from agoq_core.models import get_model_shape

    shape = get_model_shape("micro").replace(layers=4, intermediate=352) if smoke else get_model_shape("llama2-7b")
    return shape.replace(layers=layers) if layers else shape


def build(cell, device):
    import torch
    from transformers import AutoModelForCausalLM

    cfg = _shape(cell["smoke"], cell["layers"]).to_hf_config(max_position_embeddings=max(cell["seqs"]))
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.train()
    return model


def _layers(model):
    return model.model.layers


def _wrap(model, idx, context_fn=None):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    kw = {"context_fn": context_fn} if context_fn is not None else {}
    for i in idx:
        _layers(model)[i] = checkpoint_wrapper(_layers(model)[i], checkpoint_impl=CheckpointImpl.NO_REENTRANT, **kw)


def _sac_context_fn():
    """torchtitan's op-level SAC policy (agoq_core.laaq.policy.sac_context_fn, the one copy)."""
    from agoq_core.laaq.policy import sac_context_fn

    return sac_context_fn()


def _compile_layers(model, backend, only=None):
    for i, layer in enumerate(_layers(model)):
        if only is None or i in only:
            layer.compile(backend=backend)


def _float8(model, only=None, emulate=False):
    """torchao float8 training (tensorwise) on the decoder layers' Linears; ``emulate``: torchao's CPU emulation
    (--smoke: the logic, no float8 hardware)."""
    import torch.nn as nn
    from torchao.float8 import convert_to_float8_training

    kw = {"config": _emulated_float8()} if emulate else {}
    for i, layer in enumerate(_layers(model)):
        if only is None or i in only:
            convert_to_float8_training(layer, module_filter_fn=lambda m, fqn: isinstance(m, nn.Linear), **kw)


def _emulated_float8():
    """torchao's float8 config with its CPU emulation (--smoke: the logic, no float8 hardware)."""
    from torchao.float8 import Float8LinearConfig

    return Float8LinearConfig(emulate=True)


class _QuanGradStep:
    """QuanGrad on one process as the bench's optimizer: backward folds every gradient into its FP8 buffer (the
    16-bit .grad is freed at once), ``step()`` dequantizes bucket by bucket and steps the 8-bit AdamW on the bf16
    weights (no master copy, as the other configurations), then zeroes the buffers."""

    def __init__(self, model, factory, on_nonfinite="raise"):
        from agoq_core import quangrad

        self.qg = quangrad.QuanGradDDP(model, factory, config=quangrad.QuanGradConfig(
            fmt="fp8_e4m3", master_weights="off", on_nonfinite=on_nonfinite))

    def step(self):
        self.qg.step()

    def zero_grad(self, set_to_none=True):  # step() has zeroed the FP8 buffers
        pass

    def prime(self):
        """The optimizer state before the first step (as _prime): one zero-gradient step of the inner optimizer."""
        import torch

        ps = [p for p in self.qg.module.parameters() if p.requires_grad]
        for p in ps:
            p.grad = torch.zeros_like(p)
        self.qg.optimizer.step()
        for p in ps:
            p.grad = None


def _optimizer(model, device, quangrad=False, on_nonfinite="raise"):
    """``on_nonfinite``: QuanGrad's (--qg-nonfinite): "raise" checks the gradient before every step (one host
    synchronisation), "apply" does not, as the plain configurations do not."""
    import torch

    if quangrad:
        from torchao.optim import AdamW8bit

        return (_QuanGradStep(model, lambda ps: AdamW8bit(ps, lr=1e-5), on_nonfinite),
                f"QuanGrad fp8_e4m3 (on_nonfinite={on_nonfinite}) + torchao.optim.AdamW8bit")
    try:
        from torchao.optim import AdamW8bit

        return AdamW8bit(model.parameters(), lr=1e-5), "torchao.optim.AdamW8bit"
    except Exception as exc:  # noqa: BLE001 - recorded
        if device.type == "cuda":
            try:
                import bitsandbytes as bnb

                return bnb.optim.AdamW8bit(model.parameters(), lr=1e-5), "bitsandbytes.optim.AdamW8bit"
            except Exception:  # noqa: BLE001
                pass
        return torch.optim.AdamW(model.parameters(), lr=1e-5), f"torch.optim.AdamW (no 8-bit optimizer: {exc})"


#: The measured-cost policies choose the loss too (planner.budget.plan_budget(loss="auto")): the model's own where
#: its fp32 logits fit and that plan is predicted faster (8K, 16K on the whole device: then the plan is plain's),
#: else the chunked one. Until 2026-12-02 they always used the chunked loss.
POLICY_M_LOSS = "auto"


def _profile(cell, device) -> str:
    """The planner's device profile: the cell's, else the card's by name (an H100 plans with the H100 profile; until
    2026-12-06 every cell planned with the H200's), else the H200 (CPU smoke runs, cards without a profile)."""
    if cell.get("profile"):
        return cell["profile"]
    import torch

    from agoq_core.scale.devices import profile_name_for

    if device is not None and torch.device(device).type == "cuda":
        return profile_name_for(torch.cuda.get_device_name(device)) or "H200"
    return "H200"


def _plan(cell, model, seq, options, loss, device, measured=None, headroom=0.02, grads=None):
    """``grads``: the gradient storage planned (plan_budget's: None = bf16 .grad, "quangrad", "auto")."""
    from agoq_core.planner.budget import plan_budget

    import torch

    from agoq_core.planner.errors import BudgetError

    kw = dict(seq_len=seq, batch=cell.get("batch", 1), options=options, loss=loss, device=_profile(cell, device),
              measured=measured, headroom=headroom, grads=grads)
    if cell["smoke"]:  # a tiny model fits any real budget: plan to the smallest of 16 budgets that fits
        hi = plan_budget(model.config, budget=1 << 50, **kw).peak_bytes
        plan = None
        for f in [1 - i / 16 for i in range(16)]:
            try:
                plan = plan_budget(model.config, budget=int(hi * f / (1 - headroom)) + 1, **kw)
            except BudgetError:
                break
        return plan
    budget = cell["cap_bytes"]
    if not budget or (device is not None and torch.device(device).type == "cuda"):
        total = torch.cuda.get_device_properties(device).total_memory
        budget = min(budget, total) if budget else total  # an 80 GiB cap on a 79.2 GiB H100: the card's memory
    return plan_budget(model.config, budget=budget, **kw)


def _partial_guess(cell, model, seq, loss, device, prefix):
    """Partial checkpointing's first guess of how many layers to checkpoint: the planner with bf16/ckpt only, from
    the measured costs of the same kind of layer (``prefix`` "fp8-": fp8-bf16-c and fp8-ckpt-c) when --layer-costs
    has them at this length, else its analytic eager costs; every layer if nothing fits."""
    from agoq_core.planner.budget import plan_options

    measured = {k: c for k, c in plan_options((cell.get("measured") or {}).get(str(seq)) or {}, prefix=prefix).items()
                if k in ("bf16-c", "ckpt-c")} if prefix else {}
    try:
        if len(measured) == 2:
            p = _plan(cell, model, seq, "bf16-c,ckpt-c", loss, device, measured=measured)
            return len(p.layers_with("ckpt-c"))
        p = _plan(cell, model, seq, "bf16,ckpt", loss, device)
        return len(p.layers_with("ckpt"))
    except Exception:  # noqa: BLE001 - the planner says nothing fits: start from all
        return len(_layers(model))


def _plan_desc(plan) -> dict:
    """What a policy row records of its plan: the mix, the predicted peak by component, step time, budget."""
    d = plan.to_dict()
    return dict(mix=plan.mix, choices=list(plan.choices), predicted_peak_bytes=plan.peak_bytes,
                predicted_parts=d["peak_parts"], budget_bytes=plan.budget_bytes,
                predicted_step_s=plan.step_time_s, predicted_tokens_per_s=plan.tokens_per_s,
                predicted_time_parts=d["time_parts"], planner_profile=plan.device)


class _FakeOOM(Exception):
    pass


def _setup(model, config, seq, cell, device, state):
    """Turn ``model`` (fresh) into ``config`` at sequence ``seq``; returns (loss kind, description)."""
    base = config[:-2] if config.endswith("-c") else config
    compiled = config.endswith("-c")
    be = cell["compile_backend"]
    L = len(_layers(model))
    desc = {}
    if base == "plain":
        pass
    elif base == "ckpt":
        _wrap(model, range(L))
    elif base == "ckpt-ce":  # full checkpointing with the chunked loss (the longest reach of the alternatives)
        _wrap(model, range(L))
        if compiled:
            _compile_layers(model, be)
        return "chunked", desc
    elif base == "qckpt":  # AGoQ's longest reach: every layer keeps its input in nf4 and is recomputed
        from agoq_core.laaq.policy import apply_policy

        desc["policy"] = str(apply_policy(model, [config + ":nf4"] * L,
                                          convert_final_norm=True, compile_backend=be))
        return "chunked", desc
    elif base == "partial":
        n = state.get("partial_n")
        if n is None:
            n = _partial_guess(cell, model, seq, "hf", device, "")
        state["partial_n"] = n
        _wrap(model, range(n))
        desc["ckpt_layers"] = n
    elif base == "sac":
        _wrap(model, range(L), _sac_context_fn())
    elif base == "offload":
        pass  # the step runs under save_on_cpu
    elif base == "laaq-fp8":  # float8 on every decoder Linear, LAAQ running their GEMMs in float8 (compiled)
        from agoq_core import laaq
        from agoq_core.laaq import LAAQConfig

        if not compiled:
            raise ValueError("laaq-fp8 runs compiled only: use laaq-fp8-c")
        _float8(model)
        desc["laaq"] = str(laaq.apply(model, LAAQConfig(float8_gemms=True)))
        _compile_layers(model, be)
        return "chunked", desc
    elif base in ("laaq", "laaq-hf", "laaq-liger"):
        from agoq_core import laaq

        if base == "laaq-liger":
            from liger_kernel.transformers import apply_liger_kernel_to_llama

            apply_liger_kernel_to_llama(rope=True, rms_norm=True, swiglu=False, cross_entropy=False,
                                        fused_linear_cross_entropy=False, model=model)
        desc["laaq"] = str(laaq.apply(model))
        if compiled:
            _compile_layers(model, be)
        return ("hf" if base == "laaq-hf" else "chunked"), desc
    elif base == "policy-m":
        from agoq_core.laaq.policy import apply_policy

        from agoq_core.planner.budget import plan_options

        at, scaled = _costs_at(cell, model, seq)
        measured = plan_options(at)  # float8 variants left out
        if state.get("analytic"):  # two measured-cost plans ran out of memory: the analytic eager options
            measured = {}
        analytic = "bf16,laaq:nf4,laaq:int8,sac,ckpt,qckpt:nf4,qckpt:int8"
        options = ",".join(dict.fromkeys(list(measured) + analytic.split(","))) if measured else analytic
        headroom = state.setdefault("headroom", POLICY_HEADROOM[0])
        plan = _plan(cell, model, seq, options, POLICY_M_LOSS, device, measured=measured or None, headroom=headroom)
        desc["headroom"] = headroom
        if scaled and measured:
            desc["costs_scaled"] = scaled
        desc.update(_plan_desc(plan), costs="measured (bench_layer_profile) + analytic for the rest" if measured else (
            "analytic (fallback after 2 measured-cost plans ran out of memory)" if state.get("analytic") else "analytic"))
        apply_policy(model, plan, compile_backend=be)
        return plan.loss, desc
    elif base in POLICY_M_FP8:  # float8 Linears, LAAQ with float8 GEMMs
        from agoq_core.laaq.policy import apply_policy, float8_plan_options

        at, scaled = _costs_at(cell, model, seq)
        measured = float8_plan_options(at)
        if scaled and measured:
            desc["costs_scaled"] = scaled
        if not measured:
            raise ValueError(f"policy-m-fp8 plans from measured float8 per-layer costs (bench_layer_profile methods "
                             f"fp8-..., e.g. fp8-laaq-c:nf4, fp8-sac-c) at {seq} tokens; --layer-costs has none")
        headroom = state.setdefault("headroom", POLICY_HEADROOM[0])
        grads = "quangrad" if base.endswith("-qg") else "auto" if base.endswith("-auto") else None
        plan = _plan(cell, model, seq, ",".join(measured), POLICY_M_LOSS, device, measured=measured, headroom=headroom,
                     grads=grads)
        qg = state["quangrad"] = plan.grads == "quangrad"
        desc["headroom"] = headroom
        desc.update(_plan_desc(plan), costs="measured float8 (bench_layer_profile fp8-*)", quangrad=qg)
        apply_policy(model, plan, compile_backend=be, float8=True if device.type == "cuda" else _emulated_float8())
        return plan.loss, desc
    elif base in ("policy", "policy-fp8"):
        from agoq_core.laaq.policy import apply_policy

        headroom = state.setdefault("headroom", POLICY_HEADROOM[0])
        plan = _plan(cell, model, seq, "bf16,laaq:nf4,laaq:int5,laaq:int6,laaq:int8,sac,ckpt,qckpt:nf4,qckpt:int8",
                     "chunked", device, headroom=headroom)
        desc["headroom"] = headroom
        desc.update(_plan_desc(plan))
        not_laaq = {i for i, c in enumerate(plan.choices) if not c.startswith("laaq")}
        if base == "policy-fp8":
            _float8(model, not_laaq)
        if compiled:  # the inner layers the plan leaves bf16 / checkpointed (LAAQ's own forwards run eager)
            _compile_layers(model, be, not_laaq)
        apply_policy(model, plan)
        return "chunked", desc
    elif base in ("liger", "fp8", "fp8-ce"):
        chain = state.setdefault("chain", ["none", "sac", "partial", "ckpt"])
        mode = chain[0]
        loss = "liger" if base == "liger" else "chunked" if base == "fp8-ce" else "hf"
        if base == "liger":
            from liger_kernel.transformers import apply_liger_kernel_to_llama

            apply_liger_kernel_to_llama(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                        fused_linear_cross_entropy=True, model=model)
        else:
            _float8(model, emulate=device.type != "cuda")
        if mode == "sac":
            _wrap(model, range(L), _sac_context_fn())
        elif mode == "ckpt":
            _wrap(model, range(L))
        elif mode == "partial":  # the fewest checkpointed layers that fit: planned, then more on OOM (run_cell)
            n = state.get("partial_n")
            if n is None:
                n = _partial_guess(cell, model, seq, "chunked" if loss == "liger" else loss, device,
                                   "fp8-" if base != "liger" else "")
                state["partial_n"] = n
            _wrap(model, range(n))
            desc["ckpt_layers"] = n
        desc["checkpointing"] = mode
        if compiled:
            _compile_layers(model, be)
        return loss, desc
    else:
        raise ValueError(f"unknown configuration {config!r}; known: {', '.join(ALL_CONFIGS)}")
    if compiled:
        _compile_layers(model, be)
    return "hf", desc


def _profile_step(model, ids, loss_kind, opt, offload, tag):
    """Kernel time of one step by kind, against its wall time (where a whole model's time goes that the per-layer
    profile does not show); the top kernels go to $AGOQ_BENCH_PROFILE/profile_<tag>.txt."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        _step(model, ids, loss_kind, opt, offload)
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    if str(Path(__file__).resolve().parent) not in sys.path:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_layer_profile import is_kernel

    groups: dict = {}
    total = 0.0
    top = []
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", 0.0) or 0.0
        if t <= 0 or e.device_type != torch.autograd.DeviceType.CUDA or not is_kernel(e):
            continue  # not device work (an annotation's span or a host-stall marker would count kernels twice)
        top.append((t / 1e3, e.count, e.key))
        n = e.key.lower()
        # attention first: cuDNN's flash kernels are named ..._sdpa_sm90_flash_... (2026-12-02 profiles counted
        # them as GEMM time)
        g = ("attention" if any(k in n for k in ("flash", "fmha", "attention", "sdpa")) else
             "gemm" if any(k in n for k in ("gemm", "cutlass", "sm90", "nvjet", "matmul", "scaled_mm")) else
             "codec" if any(k in n for k in ("quant", "_codec", "agoq")) else
             "copy" if any(k in n for k in ("copy", "memcpy", "memset", "fill")) else "elementwise/other")
        groups[g] = groups.get(g, 0.0) + t / 1e3
        total += t / 1e3
    out = Path(os.environ["AGOQ_BENCH_PROFILE"]) / f"profile_{tag}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=40))
    top.sort(reverse=True)
    return {"wall_ms": round(wall * 1e3, 1), "kernel_ms": round(total, 1), "idle_ms": round(wall * 1e3 - total, 1),
            "groups_ms": {k: round(v, 1) for k, v in sorted(groups.items(), key=lambda kv: -kv[1])},
            "top_kernels": [{"ms": round(ms, 2), "calls": n, "name": k[:120]} for ms, n, k in top[:30]]}


def _prime(model, opt):
    """Allocate the gradients and the optimizer state before the first step (a zero-gradient AdamW step moves
    no weight but decays them by lr x weight_decay, 1e-7 here), so a single step meets the memory of a
    steady one."""
    import torch

    if isinstance(opt, _QuanGradStep):
        opt.prime()
        return
    for p in model.parameters():
        if p.requires_grad and p.grad is None:
            p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=False)


PHASES = ("forward", "backward", "optimizer")


class _PhaseMarks:
    """Where one step's time goes without a profiler (whose per-op host cost skews the arm with more host-side ops:
    docs/benchmarks.md §5.11): a CUDA event and a host clock reading at each phase boundary. ``gpu`` is the stream's
    time between boundaries, idle gaps included (a phase the host cannot feed fast enough shows up there); ``host``
    is when the host got past each boundary (it runs ahead of the GPU while the queue holds work)."""

    def __init__(self, device):
        import torch

        self.cuda = device.type == "cuda"
        self.events, self.host = [], []
        self._event = (lambda: torch.cuda.Event(enable_timing=True)) if self.cuda else None
        self.mark()

    def mark(self):
        if self.cuda:
            e = self._event()
            e.record()
            self.events.append(e)
        self.host.append(time.perf_counter())

    def finish(self):
        """{"gpu": {phase: ms} or None, "host": {phase: ms}}; call after a synchronisation (the step's float(loss))."""
        host = {ph: (b - a) * 1e3 for ph, a, b in zip(PHASES, self.host, self.host[1:])}
        gpu = None
        if self.cuda:
            self.events[-1].synchronize()
            gpu = {ph: a.elapsed_time(b) for ph, a, b in zip(PHASES, self.events, self.events[1:])}
        return {"gpu": gpu, "host": host}


def _median_phases(marks):
    """Per phase, the median over the timed steps of :meth:`_PhaseMarks.finish`'s ms (rounded; gpu None on CPU)."""
    out = {}
    for side in ("gpu", "host"):
        if marks and all(m[side] is not None for m in marks):
            out[side] = {ph: round(statistics.median(m[side][ph] for m in marks), 2) for ph in PHASES}
        else:
            out[side] = None
    return out


def _step(model, ids, loss_kind, opt, offload, phases=None):
    """One training step; ``phases``: a list that gets this step's :class:`_PhaseMarks` times appended."""
    import contextlib

    import torch

    from agoq_core.laaq import chunked_linear_cross_entropy

    marks = _PhaseMarks(ids.device) if phases is not None else None
    mark = marks.mark if marks else (lambda: None)
    ctx = torch.autograd.graph.save_on_cpu(pin_memory=True) if offload else contextlib.nullcontext()
    with ctx:
        if loss_kind == "chunked":
            hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
            loss = chunked_linear_cross_entropy(hidden, model.lm_head.weight, ids)
            del hidden
        else:  # HF's loss; Liger's patched forward computes its fused linear CE from labels
            out = model(input_ids=ids, labels=ids, use_cache=False)
            loss = out.loss
            del out
    mark()
    loss.backward()
    mark()
    opt.step()
    opt.zero_grad(set_to_none=False)  # gradients stay allocated (the planner's static memory counts them)
    mark()
    value = float(loss.detach())  # a synchronisation: every event above has completed after it
    if marks:
        phases.append(marks.finish())
    return value


def _apply_cap(cell, device):
    """(device with an index, fraction set or None): the cap is ``cell["cap_bytes"]`` of the device's memory,
    set with torch.cuda.set_per_process_memory_fraction on an indexed device (torch 2.11 refuses a bare
    ``"cuda"``: the 2026-12-01 80 GiB cells failed on it). The planner budgets against the same cap (_plan)."""
    import torch

    if device.type != "cuda":
        return device, None
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if not cell["cap_bytes"]:
        return device, None
    total = torch.cuda.get_device_properties(device).total_memory
    frac = min(1.0, cell["cap_bytes"] / total)
    torch.cuda.set_per_process_memory_fraction(frac, device)
    return device, frac


class _CompileWatch:
    """Collects Dynamo's "hit config.recompile_limit" warnings: past the limit a frame runs eagerly without an
    error (2026-12-01: 24 of 32 compiled layers of policy-m), so a row records it (``compile_fallbacks``)."""

    def __init__(self):
        import logging

        self.seen: list[str] = []
        watch = self

        class _H(logging.Handler):
            def emit(self, record):
                try:
                    msg = record.getMessage()
                except Exception:  # noqa: BLE001
                    return
                if "recompile_limit" in msg or "cache_size_limit" in msg:
                    watch.seen.append(" ".join(msg.split())[:240])

        self.handler = _H(level=logging.WARNING)
        self.loggers = [logging.getLogger(n) for n in ("torch._dynamo.convert_frame", "torch._dynamo")]
        for lg in self.loggers:
            lg.addHandler(self.handler)

    def take(self) -> list[str]:
        out, self.seen = list(dict.fromkeys(self.seen)), []
        return out

    def close(self):
        for lg in self.loggers:
            lg.removeHandler(self.handler)


#: Planner headroom of the first policy attempt and the largest the retries go to.
POLICY_HEADROOM = (0.02, 0.45)


def _memhist_start(device):
    """$AGOQ_BENCH_MEMHIST=DIR: record the allocator's history over the timed steps (benchmarks/mem_peak.py)."""
    if str(Path(__file__).resolve().parent) not in sys.path:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
    from mem_peak import Recorder

    rec = Recorder(device.index or 0)
    rec.start()
    return rec


def _memhist_stop(rec, tag) -> dict:
    """Stop the recording, write the whole breakdown to $AGOQ_BENCH_MEMHIST/memhist_<tag>.json and print it;
    the row keeps the path and the first groups. A failure here does not lose the cell's measurement."""
    from mem_peak import format_report

    try:
        rep = rec.stop()
    except Exception as exc:  # noqa: BLE001
        return {"failed": f"{type(exc).__name__}: {exc}"[:300]}
    out = Path(os.environ["AGOQ_BENCH_MEMHIST"]) / f"memhist_{tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rep, indent=1))
    print(f"memory at the timed peak ({tag}):\n{format_report(rep)}", file=sys.stderr, flush=True)
    first = (rep["ooms"] or [rep["peak"]])[-1] or {}
    return {"path": str(out), "recorded_peak_bytes": rep["recorded_peak_bytes"], "truncated": rep["truncated"],
            "at": "oom" if rep["ooms"] else "peak", "groups": first.get("groups", [])[:8],
            "note": "the timed steps ran under the allocator's recorder: their times include its cost"}


def _policy_retry(state, res, static_late):
    """After a policy plan ran out of memory: the next attempt's settings in ``state``; False = give up.

    Attempt 2 plans with more headroom: when the first step completed (the OOM came later, with gradients and
    optimizer state allocated), by what that step's measured peak (``first_step_peak_bytes``; rows before
    2026-12-07 have only ``warmup_peak_bytes``) exceeded the plan's prediction for it (predicted peak minus
    gradients and optimizer state, ``static_late``), plus 1% (at least 3% more); otherwise 5% more.
    Attempt 3 (policy-m only) plans from the analytic eager options, checked on the H200 within 1.1%.
    Then the ladder ends."""
    n = state["attempts"] = state.get("attempts", 1) + 1
    h = state.get("headroom", POLICY_HEADROOM[0])
    budget, pred = res.get("budget_bytes"), res.get("predicted_peak_bytes")
    if n == 2:  # the first step's own peak where recorded: later warm-up steps hold gradients and optimizer state
        warm = res.get("first_step_peak_bytes") or res.get("warmup_peak_bytes")
        if warm and budget and pred:
            under = warm - (pred - static_late)
            state["headroom"] = min(POLICY_HEADROOM[1], max(h + 0.03, h + under / budget + 0.01))
        else:
            state["headroom"] = min(POLICY_HEADROOM[1], h + 0.05)
        return state["headroom"] > h
    if n == 3 and res.get("config") == "policy-m" and not state.get("analytic"):
        state["analytic"], state["headroom"] = True, POLICY_HEADROOM[0]
        return True
    return False


def run_cell(cell):
    import torch

    _use_checkout()
    device, frac = _apply_cap(cell, torch.device(cell["device"]))
    cuda = device.type == "cuda"
    config = cell["config"]
    results = []
    state: dict = {}
    watch = _CompileWatch()
    for seq in cell["seqs"]:
        state.pop("attempts", None)  # a longer sequence starts from the headroom / costs the last one ended with
        while True:  # retries: partial with more layers, liger/fp8 with the next checkpointing, policy re-planned
            res = {"config": config, "seq": seq, "cap_gib": cell["cap_bytes"] / GIB if cell["cap_bytes"] else 0}
            if frac is not None:
                res["memory_fraction"] = frac
            model = opt = rec = None
            oom = None
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            try:
                model = build(cell, device)
                loss_kind, desc = _setup(model, config, seq, cell, device, state)
                res.update(desc, loss_kind=loss_kind)
                opt, res["optimizer"] = _optimizer(model, device, state.get("quangrad", False),
                                                   cell.get("qg_nonfinite", "raise"))
                if cell["fake_oom_above"] is not None and seq > cell["fake_oom_above"]:
                    raise _FakeOOM(f"simulated OOM above {cell['fake_oom_above']} tokens")
                gen = torch.Generator().manual_seed(seq)
                ids = torch.randint(0, model.config.vocab_size, (cell.get("batch", 1), seq), generator=gen).to(device)
                offload = config == "offload"
                if not cell["steps"]:  # one step, primed: gradients and optimizer state exist before it, as in
                    _prime(model, opt)  # every later step, so its peak is a steady step's peak
                res["steps_done"] = 0

                def step(marks=None):  # counts the steps that completed: where an OOM came (oom_phase)
                    if cell.get("fake_oom_at_step") == res["steps_done"]:
                        raise _FakeOOM(f"simulated OOM in step {res['steps_done'] + 1}")
                    value = _step(model, ids, loss_kind, opt, offload, marks)
                    res["steps_done"] += 1
                    return value

                t0 = time.perf_counter()
                res["loss"] = step()  # warm-up: compile, optimizer states
                res["first_step_s"] = time.perf_counter() - t0
                if cuda:  # unprimed, the first step runs without optimizer state (created by its opt.step()):
                    res["first_step_peak_bytes"] = torch.cuda.max_memory_allocated(device)  # _policy_retry
                for _ in range(cell.get("warmup", 1) - 1 if cell["steps"] else 0):  # --warmup N: more untimed steps
                    step()
                if cuda:
                    torch.cuda.synchronize()
                    res["warmup_peak_bytes"] = torch.cuda.max_memory_allocated(device)
                    torch.cuda.reset_peak_memory_stats(device)
                    if os.environ.get("AGOQ_BENCH_MEMHIST") and cell["steps"]:  # what is alive at the timed peak
                        rec = _memhist_start(device)
                t0 = time.perf_counter()
                each, t_prev, marks = [], t0, []
                for _ in range(cell["steps"]):
                    step(marks)  # float(loss) syncs: per-step wall times
                    t_now = time.perf_counter()
                    each.append(round(t_now - t_prev, 4))
                    t_prev = t_now
                res["step_times_s"] = each
                if rec is not None:
                    res["memhist"], rec = _memhist_stop(rec, f"{config}_{seq}_{len(results)}"), None
                if marks:  # median ms per phase (forward, backward, optimizer) on the GPU's stream and the host
                    res["phases_ms"] = _median_phases(marks)
                if cuda:
                    torch.cuda.synchronize()
                if cell["steps"]:
                    dt = (time.perf_counter() - t0) / cell["steps"]
                    peak = torch.cuda.max_memory_allocated(device) if cuda else None
                else:  # the primed step: its time includes compilation (a lower bound of tokens/s)
                    dt, peak = res["first_step_s"], res.get("warmup_peak_bytes")
                    res["tokens_per_s_includes_compile"] = True
                if each:  # beside the mean: one slow step (a collection, a stray recompile) moves the mean only
                    med = statistics.median(each)
                    res.update(step_median_s=med, tokens_per_s_median=seq * cell.get("batch", 1) / med)
                res.update(step_s=dt, tokens_per_s=seq * cell.get("batch", 1) / dt, oom=False,
                           batch=cell.get("batch", 1), peak_bytes=peak,
                           reserved_peak_bytes=torch.cuda.max_memory_reserved(device) if cuda else None)
                if cuda and os.environ.get("AGOQ_BENCH_PROFILE"):  # one more step under torch.profiler
                    try:
                        res["profile"] = _profile_step(model, ids, loss_kind, opt, offload, f"{config}_{seq}")
                    except Exception as exc:  # noqa: BLE001 - the measurement above stands
                        res["profile"] = f"failed: {type(exc).__name__}: {exc}"[:300]
            except (torch.OutOfMemoryError, _FakeOOM) as exc:
                oom = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            except ImportError as exc:
                res.update(oom=False, unavailable=f"{type(exc).__name__}: {exc}"[:300])
            except Exception as exc:  # noqa: BLE001 - a failing cell must not lose the run
                import traceback

                res.update(oom=False, failed=f"{type(exc).__name__}: {str(exc)[:300]}",
                           traceback=traceback.format_exc()[-1500:])
            if rec is not None:  # the recording ends with the OOM (the live set at each oom event) or a failure
                res["memhist"], rec = _memhist_stop(rec, f"{config}_{seq}_{len(results)}"), None
            if oom is not None:  # "timed" only past every warm-up step (until 2026-12-07: past the first one)
                warm_steps = cell.get("warmup", 1) if cell["steps"] else 1
                res.update(oom=True, error=oom, oom_phase="timed" if res.get("steps_done", 0) >= warm_steps else "warm-up")
                if cuda:  # since the attempt's start or the end of its warm-up: a lower bound of what it needed
                    res["oom_max_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
            fell = watch.take()
            if fell:
                res["compile_fallbacks"] = fell
            del model, opt
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
            print("CELL " + json.dumps(res, default=str), flush=True)
            retry = False
            if res.get("oom"):
                base = config[:-2] if config.endswith("-c") else config
                L = cell["layers"] or (4 if cell["smoke"] else 32)  # noqa: N806
                if base == "partial" and state.get("partial_n", L) < L:
                    state["partial_n"] = min(L, state["partial_n"] + max(1, L // 8))
                    retry = True
                elif base in ("liger", "fp8", "fp8-ce") and state.get("chain", [None])[0] == "partial" \
                        and state.get("partial_n", L) < L:  # partial: more checkpointed layers first
                    state["partial_n"] = min(L, state["partial_n"] + max(1, L // 8))
                    retry = True
                elif base in ("liger", "fp8", "fp8-ce") and len(state.get("chain", [])) > 1:
                    state["chain"].pop(0)
                    retry = True
                elif base in POLICY_BASES and res.get("predicted_peak_bytes"):
                    late = sum((res.get("predicted_parts") or {}).get(k, 0) for k in ("grads", "optimizer"))
                    retry = _policy_retry(state, res, late)
            results.append(res)
            if not retry:
                break
        last = results[-1]
        if last.get("oom") or last.get("unavailable") or last.get("failed"):
            break  # longer sequences need more memory: the ladder ends here
    watch.close()
    return results


# ============================================================ parent: one process per configuration and cap
def _seqs(text, smoke):
    if text:
        return tuple(int(x[:-1]) * K if x.lower().endswith("k") else int(x) for x in text.split(","))
    return (64, 128, 256) if smoke else tuple(k * K for k in (8, 16, 32, 64, 96, 128, 160, 192, 256))


def _cells(args, measured=None):
    dev = "cpu" if args.smoke else "cuda"
    common = dict(device=dev, smoke=args.smoke, layers=args.layers, steps=args.steps, warmup=args.warmup,
                  batch=args.batch, qg_nonfinite=args.qg_nonfinite,
                  fake_oom_above=args.fake_oom_above, measured=measured,
                  compile_backend=args.compile_backend or ("eager" if args.smoke else "inductor"))
    configs = args.configs.split(",") if args.configs else None
    unknown = [c for c in configs or () if c not in ALL_CONFIGS]
    if unknown:
        raise SystemExit(f"unknown configuration(s) {unknown}; known: {', '.join(ALL_CONFIGS)}")
    if args.cap_gib is not None and args.caps is not None:
        raise SystemExit("give --cap-gib or --caps, not both")
    caps_arg = f"{args.cap_gib:g}" if args.cap_gib is not None else args.caps
    out = []
    if args.warmup < 1:
        raise SystemExit("--warmup must be >= 1 (the first step compiles and allocates the optimizer state)")
    if args.longest:
        if configs is not None or args.quick:
            raise SystemExit("--longest runs its own configurations; drop --configs / --quick")
        steps = 0 if args.steps == 2 else args.steps  # the default becomes one primed step
        for c, seqs in LONGEST:
            seqs = _seqs(args.seqs, args.smoke) if (args.seqs or args.smoke) else seqs
            out.append(dict(common, steps=steps, config=c, seqs=list(seqs), cap_bytes=int(float(caps_arg or 0) * GIB)))
        return out
    if args.quick and configs is None and caps_arg is None:
        for (c, cap), seqs in QUICK_CELLS:
            seqs = _seqs(args.seqs, args.smoke) if (args.seqs or args.smoke) else seqs
            out.append(dict(common, config=c, seqs=list(seqs), cap_bytes=int(cap * GIB)))
        return out
    configs = configs or list(ALL_CONFIGS)
    caps = [0.0] if (args.smoke or args.quick) and caps_arg is None else [float(c) for c in (caps_arg or "0,80").split(",")]
    for cap in caps:
        for c in configs:
            out.append(dict(common, config=c, seqs=list(_seqs(args.seqs, args.smoke)), cap_bytes=int(cap * GIB)))
    return out


def _layer_profile(args, env) -> dict | None:
    """Run benchmarks/bench_layer_profile.py in its own process (the --quick per-layer explanation)."""
    here = Path(__file__).resolve().parent
    out = Path(args.json).with_name("bench_layer_profile.json") if args.json else (
        Path(os.environ["OUT"]) / "bench_layer_profile.json" if os.environ.get("OUT") else
        Path("/tmp") / f"bench_layer_profile-{os.getpid()}.json")
    cmd = [sys.executable, str(here / "bench_layer_profile.py"), "--json", str(out)]
    if args.smoke:
        cmd += ["--smoke"]
    else:
        cmd += ["--seqs", QUICK_PROFILE["seqs"], "--budget-s", str(QUICK_PROFILE["budget_s"])]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=(
            300.0 if args.smoke else QUICK_PROFILE["budget_s"] + 45.0))
        text, rc = p.stdout, p.returncode
        err = p.stderr
    except subprocess.TimeoutExpired as exc:
        text = (exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout) or ""
        rc, err = -9, "timeout"
    print("\n".join(line for line in text.splitlines() if not line.startswith("[")), flush=True)
    print(f"[{time.time() - t0:6.0f} s] layer profile (exit {rc})", flush=True)
    if out.exists():  # written after every method: a killed run still leaves its rows (then "partial": true)
        rep = json.loads(out.read_text())
        rep["process_s"] = round(time.time() - t0, 1)
        if rc != 0:
            rep["exit"] = rc
        if rep.get("partial"):  # killed before its summary: make it here
            sys.path.insert(0, str(here))
            import bench_layer_profile as lp

            lp.add_recompute(rep["rows"])
            rep["explain"], rep["ceilings"] = lp.explain(rep["rows"]), lp.ceilings(rep["rows"])
            print(lp.table(rep["rows"]))
            print(lp.explain_text(rep["explain"], rep["ceilings"]))
        return rep
    return {"failed": f"exit {rc}: {err.strip().splitlines()[-1][:300] if err and err.strip() else ''}"}


def failed_row(cell, seq, rc, err, timed_out_s=None) -> dict:
    """The row for the length a cell process died on. A process killed by SIGKILL that the bench did not kill
    (``timed_out_s`` None) is counted as out of *host* memory: on Linux that signal comes from the kernel's
    out-of-memory killer (or a container's memory limit), and the cell that meets it is CPU offload, whose pinned
    copies of the saved activations live in host memory (2026-12-07: offload at 16K on a 128 GiB host). Such a row is
    an OOM row (``oom_phase`` "host"), so the matrix stops the ladder there; every other exit stays ``failed``."""
    row = {"config": cell["config"], "seq": seq, "cap_gib": cell["cap_bytes"] / GIB, "oom": False}
    last = err.strip().splitlines()[-1][:300] if err and err.strip() else ""
    if timed_out_s is not None:
        row["failed"] = f"timed out after {timed_out_s:.0f} s"
    elif rc == -9:
        row.update(oom=True, oom_phase="host", killed=f"SIGKILL, not the bench's timeout (last stderr line: {last!r})")
    else:
        row["failed"] = f"process exit {rc}: {last}"
    return row


def _costs_at(cell, model, seq):
    """The measured per-layer costs at ``seq`` (scaled from the nearest profiled length if the profile lacks it:
    agoq_core.planner.budget.costs_at_length) and the note saying so (None if measured there)."""
    from agoq_core.planner.budget import costs_at_length
    from agoq_core.planner.model import model_shape

    return costs_at_length(cell.get("measured") or {}, seq, model_shape(model))


def _read_layer_costs(paths, hidden, reports=None) -> dict:
    """bench_layer_profile JSONs (``--layer-costs A.json[,B.json]``: e.g. the 2026-12-01 32K profile and a 64K one
    measured later) as one profile: the first file's report with ``costs`` merged over all (a later file's
    (seq, method) wins), each file's saved bytes corrected for its own input
    (agoq_core.planner.budget.load_layer_costs)."""
    _use_checkout()
    from agoq_core.planner.budget import load_layer_costs

    reports = reports if reports is not None else [json.loads(Path(p).read_text()) for p in paths.split(",") if p]
    costs, notes = load_layer_costs(reports, hidden=hidden)
    out = dict(reports[0], costs=costs)
    if len(reports) > 1:
        out["merged_from"] = [p for p in paths.split(",") if p] if paths else len(reports)
    if notes:
        out["cost_corrections"] = notes
    return out


def _write_json(path, report):
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str))
    tmp.replace(p)


def _environment(device):
    try:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import harness  # benchmarks/harness.py (i13-core): date, command, versions, device

        return harness.environment(device)
    except Exception:  # noqa: BLE001 - older checkouts: a minimal record
        import datetime
        import platform

        import torch

        env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "command": " ".join([os.path.basename(sys.executable), *sys.argv]), "host": platform.node(),
               "torch": torch.__version__}
        if device == "cuda" and torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            env.update(gpu=p.name, memory_gib=round(p.total_memory / GIB, 1))
        return env


def table(rows, smoke):
    unit, uname = ((1 << 20), "MiB") if smoke else (GIB, "GiB")
    lines = [f"{'config':<14} {'cap':>5} {'seq':>7} {'tokens/s':>10} {'median':>10} {'peak ' + uname:>10} "
             f"{'pred ' + uname:>10}  note"]
    for r in rows:
        cap = f"{r['cap_gib']:.0f}" if r.get("cap_gib") else "all"
        if r.get("unavailable") or r.get("failed"):
            note, tps, pk, med = (r.get("unavailable") or r.get("failed"))[:60], "-", "-", "-"
        elif r.get("oom"):
            note, tps, pk, med = "OOM" + (f" ({r['oom_phase']})" if r.get("oom_phase") else ""), "-", "-", "-"
        else:
            tps = f"{r['tokens_per_s']:,.0f}"
            med = f"{r['tokens_per_s_median']:,.0f}" if r.get("tokens_per_s_median") else "-"
            pk = f"{r['peak_bytes'] / unit:.1f}" if r.get("peak_bytes") else "n/a"
            note = ", ".join(f"{k}={v}" for k, v in (("ckpt_layers", r.get("ckpt_layers")),
                                                        ("ckpt", r.get("checkpointing")), ("mix", r.get("mix")))
                             if v is not None)
        if r.get("compile_fallbacks"):
            note = f"EAGER FALLBACK x{len(r['compile_fallbacks'])}; " + note
        if r.get("config") == "policy-m" and str(r.get("costs", "")).startswith("analytic"):
            # --layer-costs held no bf16 options at this length (e.g. a float8-only profile): the eager analytic plan
            note = "ANALYTIC COSTS (eager options); " + note
        pred = f"{r['predicted_peak_bytes'] / unit:.1f}" if r.get("predicted_peak_bytes") else ""
        lines.append(f"{r['config']:<14} {cap:>5} {r['seq']:>7} {tps:>10} {med:>10} {pk:>10} {pred:>10}  {note}")
    return "\n".join(lines)


def _fastest_row(rows, which):
    """The row with the most tokens/s among ``rows`` whose configuration ``which(config)`` accepts (None: none)."""
    return max((r for r in rows if which(r["config"])), key=lambda r: r["tokens_per_s"], default=None)


def summarize(rows):
    """Longest sequence per (config, cap), and per (cap, seq) the fastest alternative vs AGoQ's best."""
    agoq = AGOQ
    ok = [r for r in rows if not r.get("oom") and r.get("tokens_per_s")]
    longest = {}
    for r in ok:
        k = f"{r['config']}@{r['cap_gib']:.0f}"
        longest[k] = max(longest.get(k, 0), r["seq"])
    cmp = []
    for cap in sorted({r["cap_gib"] for r in rows}):
        for seq in sorted({r["seq"] for r in rows}):
            here = [r for r in ok if r["cap_gib"] == cap and r["seq"] == seq]
            alt = _fastest_row(here, lambda c: c not in agoq)
            ours = _fastest_row(here, lambda c: c in agoq)
            plain = _fastest_row(here, lambda c: c in _PLAINS)  # plain bf16, eager or compiled
            if alt or ours:
                cmp.append({"cap_gib": cap, "seq": seq, "fastest_alternative": alt and alt["config"],
                            "alternative_tokens_per_s": alt and alt["tokens_per_s"],
                            "agoq_best": ours and ours["config"], "agoq_tokens_per_s": ours and ours["tokens_per_s"],
                            "ratio": (ours["tokens_per_s"] / alt["tokens_per_s"]) if (alt and ours) else None,
                            # the same two rows by their median step: one slow step moves a mean of 2-5 (§5.12)
                            "ratio_median": (ours["tokens_per_s_median"] / alt["tokens_per_s_median"])
                            if (alt and ours and alt.get("tokens_per_s_median") and ours.get("tokens_per_s_median"))
                            else None,
                            "plain_fits": plain is not None})
    pred = [{"config": r["config"], "seq": r["seq"], "cap_gib": r["cap_gib"], "measured": r["peak_bytes"],
             "predicted": r["predicted_peak_bytes"], "error": r["predicted_peak_bytes"] / r["peak_bytes"] - 1}
            for r in ok if r.get("predicted_peak_bytes") and r.get("peak_bytes")]
    # per cap: the longest length any alternative / AGoQ reached (the goal: AGoQ >= 1.25x)
    reach = []
    for cap in sorted({r["cap_gib"] for r in ok}):
        alt = max((r["seq"] for r in ok if r["cap_gib"] == cap and r["config"] not in agoq), default=None)
        ours = max((r["seq"] for r in ok if r["cap_gib"] == cap and r["config"] in agoq), default=None)
        reach.append({"cap_gib": cap, "alternatives_longest": alt, "agoq_longest": ours,
                      "ratio": (ours / alt) if (alt and ours) else None})
    # per (config, cap): the longest length that ran and the shortest that ran out of memory (a ladder without
    # an OOM row does not bound the configuration's reach)
    bounds: dict = {}
    for r in rows:
        b = bounds.setdefault(f"{r['config']}@{r['cap_gib']:.0f}", {"fits": None, "oom": None})
        if r.get("oom"):
            b["oom"] = r["seq"] if b["oom"] is None else min(b["oom"], r["seq"])
        elif r.get("tokens_per_s"):
            b["fits"] = max(b["fits"] or 0, r["seq"])
    return {"longest_seq": longest, "agoq_vs_fastest_alternative": cmp, "policy_peak_prediction": pred,
            "longest_by_cap": reach, "reach": bounds}


def phase_lines(rows):
    """One line per measured row: its median forward / backward / optimizer ms on the GPU's stream (and on the host)."""
    out = []
    for r in rows:
        ph = r.get("phases_ms")
        if not ph or r.get("oom"):
            continue
        cols = []
        for side in ("gpu", "host"):
            if ph.get(side):
                cols.append(f"{side} " + " / ".join(f"{ph[side][k]:,.1f}" for k in PHASES))
        out.append(f"phases ms (forward / backward / optimizer): {r['config']} cap={r['cap_gib']:.0f} seq={r['seq']}: "
                   + "; ".join(cols))
    return out


def plot(rows, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    if not rows:  # nothing ran (every cell skipped): no figure, the JSON says why
        return None
    caps = sorted({r["cap_gib"] for r in rows})
    names = list(dict.fromkeys(r["config"] for r in rows))
    # one colour per configuration in every panel (tab20: enough for the whole matrix; tab10 repeated after 10)
    colours = {c: plt.get_cmap("tab20")(i % 20) for i, c in enumerate(names)}
    fig, axes = plt.subplots(1, len(caps), figsize=(6.5 * len(caps), 4.5), squeeze=False)
    for ax, cap in zip(axes[0], caps):
        for cfg in names:
            pts = sorted((r["seq"], r["tokens_per_s"]) for r in rows
                         if r["config"] == cfg and r["cap_gib"] == cap and not r.get("oom") and r.get("tokens_per_s"))
            ooms = [r["seq"] for r in rows if r["config"] == cfg and r["cap_gib"] == cap and r.get("oom")]
            if pts or ooms:
                style = "-o" if cfg in AGOQ else "--."
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=cfg, color=colours[cfg])
                if ooms:  # out of memory: an x on the length axis, in the configuration's colour
                    kw = {} if pts else {"label": f"{cfg} (out of memory)"}
                    ax.plot([min(ooms)], [0], "x", markersize=9, clip_on=False, color=colours[cfg], **kw)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length (tokens)")
        ax.set_ylabel("tokens/s")
        ax.set_title(f"budget: {'whole device' if not cap else f'{cap:.0f} GiB'} (x: out of memory)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return str(path)


#: Issue 18's matrix: the alternatives (plain, full / partial / op-level selective checkpointing, each eager and
#: compiled; CPU offload; Liger and torchao float8, each with the fastest checkpointing that fits, float8 also with
#: the chunked loss) and AGoQ's (LAAQ compiled, with float8 GEMMs, the budget policy and its float8 form), at
#: 8K-128K tokens under both budgets (the whole device and an 80 GiB cap).
MATRIX_CONFIGS = ("plain", "plain-c", "ckpt", "ckpt-c", "partial", "partial-c", "sac", "sac-c", "offload", "liger",
                  "fp8-c", "fp8-ce-c", "laaq-c", "laaq-fp8-c", "policy-m", "policy-m-fp8")
MATRIX_SEQS = (8 * K, 16 * K, 32 * K, 64 * K, 128 * K)
#: What the ``cells`` commands of ``--matrix`` are sized by (2026-12-07, 19 cells on an H100, docs/benchmarks.md §5.11:
#: 23-112 s per configuration's process): a process spends ~25 s before its first cell, a cell ~10 s compiling and
#: its 4 steps (2 warm-up, 2 timed); a step of LLaMA-2-7B takes ~0.9 s at 8K on an H100, growing with the length and
#: its square (attention), eager configurations ~1.3x, CPU offload ~5x (§5.5's offload row). An estimate for packing
#: device calls, not a prediction: the H200 is faster, a ladder that runs out of memory ends early.
MATRIX_PROCESS_S = 25.0
MATRIX_CELL_S = 10.0
#: the ``cells`` stage's limits: each configuration's process is killed after 240 s; no process starts after the
#: stage's limit - 60 s; a device call runs at most 600 s
MATRIX_PROCESS_LIMIT_S = 240.0
MATRIX_CALL_LIMIT_S = 560


def matrix_cell_seconds(config: str, seq: int) -> float:
    """Estimated seconds one cell of ``config`` at ``seq`` tokens adds to a ``cells`` process (MATRIX_CELL_S)."""
    x = seq / (8 * K)
    step = 0.85 * x + 0.05 * x * x
    # eager: the configurations without -c (liger included) but the budget policies, which plan compiled options
    step *= 5.0 if config == "offload" else 1.3 if not config.endswith("-c") and config not in (
        "policy-m", "policy-m-fp8") else 1.0
    return MATRIX_CELL_S + 4 * step


def _matrix_commands(todo: dict) -> list[tuple[str, float]]:
    """``cells`` commands (and their estimated seconds) for ``todo``: {(cap, lengths): [configurations]}. A
    configuration's lengths are split where one process would pass MATRIX_PROCESS_LIMIT_S; configurations with the
    same lengths share a command up to the stage's budget (its limit - 60 s), and each command asks for the limit its
    estimate needs, so several short ones can share one device call."""
    groups: dict = {}
    for (cap, qs), cs in todo.items():
        for c in cs:
            chunk, est = [], MATRIX_PROCESS_S
            for q in qs:
                t = matrix_cell_seconds(c, q)
                if chunk and est + t > MATRIX_PROCESS_LIMIT_S:
                    groups.setdefault((cap, tuple(chunk)), []).append((c, est))
                    chunk, est = [], MATRIX_PROCESS_S
                chunk.append(q)
                est += t
            groups.setdefault((cap, tuple(chunk)), []).append((c, est))
    out = []
    room = MATRIX_CALL_LIMIT_S - 60
    for (cap, qs), items in sorted(groups.items()):
        batch, total = [], 0.0
        for c, est in items + [(None, 0.0)]:
            if batch and (c is None or total + est > room):
                secs = int(min(MATRIX_CALL_LIMIT_S, max(120, 60 + total + 30)))
                out.append((f"CELLS_CONFIGS={','.join(batch)} CELLS_SEQS={','.join(f'{q // K}K' for q in qs)} "
                            f"CELLS_CAPS={cap:g} bash benchmarks/gpu_session.sh cells:{secs}", total))
                batch, total = [], 0.0
            if c is not None:
                batch.append(c)
                total += est
    return out


def matrix(rows, configs=MATRIX_CONFIGS, seqs=MATRIX_SEQS, caps=(0.0, 80.0)) -> dict:
    """Which cells of the matrix the rows cover: per (config, cap, seq) "ok" (measured), "oom" (ran out of memory),
    "oom-implied" (a shorter length of the same configuration and cap ran out of memory) or "missing"; the counts;
    and per cap the ``cells`` stage commands that would measure the missing ones (configurations with the same
    missing lengths together)."""
    by = {(r["config"], float(r.get("cap_gib") or 0), r["seq"]): r for r in rows
          if not r.get("failed") and not r.get("unavailable")}
    cells, counts, todo = {}, {"ok": 0, "oom": 0, "oom-implied": 0, "missing": 0}, {}
    for cap in caps:
        for c in configs:
            first_oom = min((q for (cc, cp, q), r in by.items() if cc == c and cp == cap and r.get("oom")),
                            default=None)
            lacking = []
            for q in seqs:
                r = by.get((c, cap, q))
                st = ("oom" if r.get("oom") else "ok") if r is not None else (
                    "oom-implied" if first_oom is not None and q > first_oom else "missing")
                cells[f"{c}@{cap:g}@{q}"] = st
                counts[st] += 1
                if st == "missing":
                    lacking.append(q)
            if lacking:
                todo.setdefault((cap, tuple(lacking)), []).append(c)
    planned = _matrix_commands(todo)
    return {"configs": list(configs), "seqs": list(seqs), "caps": list(caps), "cells": cells, "counts": counts,
            "commands": [c for c, _ in planned], "estimated_s": round(sum(t for _, t in planned)),
            "goals": matrix_goals(by, cells, configs, seqs, caps)}


#: Issue 18's speed goals: where plain bf16 does not fit, AGoQ's best >= 1.15x the fastest alternative that fits;
#: where it fits, the budget policy >= 0.98x plain.
GOAL_NO_PLAIN, GOAL_PLAIN = 1.15, 0.98


def matrix_goals(by, cells, configs=MATRIX_CONFIGS, seqs=MATRIX_SEQS, caps=(0.0, 80.0)) -> list[dict]:
    """Per (cap, length): the speed goal that applies there and where it stands on the measured rows ``by``
    ({(config, cap, seq): row}, every row, in the matrix or not), and whether a missing cell could still change it
    (``open``: the matrix configurations, alternatives or AGoQ's, not measured there; ``final`` when none)."""
    out = []
    for cap in caps:
        for q in seqs:
            here = [r for (_, cp, qq), r in by.items() if cp == cap and qq == q and not r.get("oom")
                    and r.get("tokens_per_s")]
            missing = [c for c in configs if cells[f"{c}@{cap:g}@{q}"] == "missing"]
            alt = _fastest_row(here, lambda c: c in _PLAINS)
            if alt is not None:  # only plain and the policies decide this goal
                missing = [c for c in missing if c in _PLAINS or c in _POLICIES]
                ours = _fastest_row(here, lambda c: c in _POLICIES)
                goal, what = GOAL_PLAIN, "plain fits: the budget policy against plain"
            else:
                ours, alt = _fastest_row(here, lambda c: c in AGOQ), _fastest_row(here, lambda c: c not in AGOQ)
                goal, what = GOAL_NO_PLAIN, "AGoQ's best against the fastest alternative"
            ratio = ours["tokens_per_s"] / alt["tokens_per_s"] if ours and alt else None
            state = ("met" if ratio >= goal else "not met") if ratio is not None else (
                "only AGoQ fits" if ours else "no AGoQ row" if alt else "nothing measured fits")
            out.append({"cap_gib": cap, "seq": q, "goal": what, "target": goal,
                        "agoq": ours and ours["config"], "agoq_tokens_per_s": ours and ours["tokens_per_s"],
                        "against": alt and alt["config"], "against_tokens_per_s": alt and alt["tokens_per_s"],
                        "ratio": ratio, "state": state, "open": missing, "final": not missing})
    return out


def _print_matrix(m) -> None:
    mark = {"ok": "ok", "oom": "OOM", "oom-implied": "(oom)", "missing": "-"}
    total = sum(m["counts"].values())
    print(f"\nissue 18's matrix: {len(m['configs'])} configurations x {len(m['seqs'])} lengths x {len(m['caps'])} "
          f"budgets = {total} cells: " + ", ".join(f"{v} {k}" for k, v in m["counts"].items()))
    for cap in m["caps"]:
        print(f"cap {cap:g} ({'whole device' if not cap else f'{cap:g} GiB'}):  " +
              " ".join(f"{q // K:>6}K" for q in m["seqs"]))
        for c in m["configs"]:
            print(f"  {c:14s}" + " ".join(f"{mark[m['cells'][f'{c}@{cap:g}@{q}']]:>7s}" for q in m["seqs"]))
    if m.get("goals"):
        print("goals per budget and length (the measured rows; 'open': missing cells that could still change it):")
        for g in m["goals"]:
            if g["ratio"] is not None:
                how = (f"{g['agoq']} {g['agoq_tokens_per_s']:,.0f} / {g['against']} {g['against_tokens_per_s']:,.0f} = "
                       f"{g['ratio']:.3f}x (goal {g['target']:g}x: {g['state']})")
            else:
                how = g["state"]
            print(f"  cap {g['cap_gib']:g} {g['seq'] // K:>4}K  {how}; " +
                  ("final" if g["final"] else f"open: {', '.join(g['open'])}"))
    if m["commands"]:
        n = m["counts"]["missing"]
        print(f"to measure the {n} missing cells: {len(m['commands'])} cells commands, ~{m['estimated_s'] / 60:.0f} "
              "device-minutes estimated from an H100's times (chain commands into one device call while their limits "
              "add up to under 600 s; a ladder stops at its first out-of-memory length, so a command past a "
              "configuration's limit ends early):")
        for cmd in m["commands"]:
            print("  " + cmd)


def _reread_kill(row) -> dict:
    """A row written before :func:`failed_row` (2026-12-07) as ``"process exit -9: <stderr>"``, read as it would be
    written now: that text with stderr after it was a SIGKILL from outside (a timeout left stderr empty)."""
    text = row.get("failed") or ""
    if not text.startswith("process exit -9: ") or not text[len("process exit -9: "):].strip():
        return row
    cell = {"config": row["config"], "cap_bytes": float(row.get("cap_gib") or 0) * GIB}
    return dict(failed_row(cell, row["seq"], -9, text[len("process exit -9: "):]), **{
        k: v for k, v in row.items() if k not in ("failed", "oom", "cap_gib")})


def merge(paths, out=None, show_matrix=False, matrix_caps=(0.0, 80.0)) -> int:
    """Rows of several runs in one table, summary and Pareto plot; the newest row (later file) per
    (configuration, cap, length) wins, an OOM row never replaces a measured one. A cap at or above the memory the
    run's device has (its meta's ``memory_gib``: an 80 GiB cap on an 80 GB H100) is no cap: such rows merge as the
    whole device, with ``cap_as_run`` keeping the cap they ran under."""
    rows: dict = {}
    for p in paths:
        try:
            doc = json.loads(Path(p).read_text())
            runs, mem = doc["runs"], (doc.get("meta") or {}).get("memory_gib")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SystemExit(f"--merge: cannot read the runs of {p}: {exc}") from exc
        for r in runs:
            r = _reread_kill(r)
            if r.get("failed") or r.get("unavailable"):
                continue
            cap = float(r.get("cap_gib") or 0)
            if cap and mem and cap >= float(mem):
                r = dict(r, cap_gib=0, cap_as_run=cap)
                cap = 0.0
            key = (r["config"], cap, r["seq"])
            if r.get("oom") and key in rows and not rows[key].get("oom"):
                continue
            rows[key] = dict(r, source=str(p))
    merged = list(rows.values())
    print(table(merged, False))
    summary = summarize(merged)
    for k, b in summary["reach"].items():
        print(f"{k:24s} longest that ran {b['fits'] or '-':>8}   out of memory at {b['oom'] or '-'}")
    summary["matrix"] = matrix(merged, caps=tuple(matrix_caps))
    if show_matrix:
        _print_matrix(summary["matrix"])
    if out:
        _write_json(out, {"meta": {"merged_from": paths}, "runs": merged, "summary": summary})
        png = plot(merged, Path(out).with_suffix(".png"))
        print(f"wrote {out}" + (f" and {png}" if png else ""))
    return 0


def main(argv=None):
    args = parse(argv)
    if args.cell:
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
        run_cell(json.loads(args.cell))
        return 0
    if args.merge:
        try:
            caps = tuple(float(c) for c in args.matrix_caps.split(","))
        except ValueError:
            raise SystemExit(f"--matrix-caps: comma-separated GiB numbers, got {args.matrix_caps!r}") from None
        return merge(args.merge.split(","), args.json, show_matrix=args.matrix, matrix_caps=caps)
    t_start = time.time()
    budget_s = args.budget_s if args.budget_s is not None else (205.0 if args.quick and not args.smoke else None)
    rows, skipped = [], []
    env = dict(os.environ)
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(_ROOT), str(_ROOT / "backends/triton_common"), str(_ROOT / "backends/cuda")] +
        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    path = args.json or (os.path.join(os.environ["OUT"], "bench_equal_memory.json") if os.environ.get("OUT") else None)
    layer_profile = None
    if args.layer_costs:
        layer_profile = _read_layer_costs(args.layer_costs, _shape(args.smoke, args.layers).hidden)
    elif args.quick and not args.no_layer_profile:
        layer_profile = _layer_profile(args, env)
        if layer_profile.get("costs"):  # (this run's profile measures with a non-leaf input: nothing to correct)
            layer_profile["costs"] = _read_layer_costs(None, _shape(args.smoke, args.layers).hidden,
                                                       [layer_profile])["costs"]
    measured = (layer_profile or {}).get("costs")
    if (layer_profile or {}).get("cost_corrections"):
        print(f"layer costs: {len(layer_profile['cost_corrections'])} saved-byte corrections (profile measured "
              "with a leaf input)", flush=True)
    for cell in _cells(args, measured):
        if budget_s is not None and time.time() - t_start > budget_s:
            skipped.append(f"{cell['config']}@{cell['cap_bytes'] / GIB:.0f}GiB: time budget {budget_s:.0f} s spent")
            continue
        t0 = time.time()
        cmd = [sys.executable, str(Path(__file__).resolve()), "--cell", json.dumps(cell)]
        limit = args.cell_timeout_s or (150.0 if args.quick else 900.0)
        timed_out = False
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=limit)
            out, err, rc = p.stdout, p.stderr, p.returncode
        except subprocess.TimeoutExpired as exc:
            out, err, rc = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or ""), "", -9
            timed_out = True
        got = [json.loads(line[5:]) for line in out.splitlines() if line.startswith("CELL ")]
        for r in got:
            r["process_s"] = round(time.time() - t0, 1)
        if rc != 0 and (not got or not got[-1].get("oom")):
            got.append(failed_row(cell, cell["seqs"][len(got)] if len(got) < len(cell["seqs"]) else -1, rc, err,
                                  limit if timed_out else None))
        rows += got
        if path:  # after every cell: a run its stage's timeout kills still leaves what it measured
            _write_json(path, {"meta": {"partial": True, "quick": args.quick}, "runs": rows,
                               "summary": summarize(rows), "layer_profile": layer_profile})
        print(f"[{time.time() - t_start:6.0f} s] {cell['config']} cap={cell['cap_bytes'] / GIB:.0f}: "
              + ", ".join(f"{r['seq']}:{'OOM' if r.get('oom') else ('x' if r.get('failed') or r.get('unavailable') else round(r['tokens_per_s']))}"
                          for r in got), flush=True)
    report = {"meta": _environment("cpu" if args.smoke else "cuda") | {
        "model": "tiny LLaMA (CPU smoke)" if args.smoke else "LLaMA-2-7B shapes", "batch": 1,
        "steps": args.steps, "warmup": args.warmup, "quick": args.quick, "wall_s": round(time.time() - t_start, 1), "skipped": skipped},
        "runs": rows, "summary": summarize(rows), "layer_profile": layer_profile}
    print(table(rows, args.smoke))
    for line in phase_lines(rows):
        print(line)
    for c in report["summary"]["agoq_vs_fastest_alternative"]:
        if c["ratio"]:
            print(f"cap {c['cap_gib']:.0f} seq {c['seq']}: {c['agoq_best']} / {c['fastest_alternative']} = "
                  f"{c['ratio']:.3f}{' (plain fits)' if c['plain_fits'] else ''}")
    for c in report["summary"]["longest_by_cap"]:
        print(f"cap {c['cap_gib']:.0f}: longest measured, alternatives {c['alternatives_longest']}, AGoQ {c['agoq_longest']}"
              " (only the lengths run; a ladder that did not reach OOM does not bound it)")
    for s in skipped:
        print("skipped:", s)
    if path:
        _write_json(path, report)
        png = plot(rows, Path(path).with_suffix(".png"))
        print(f"wrote {path}" + (f" and {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
