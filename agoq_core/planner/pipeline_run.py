"""Run a plan on a real torch.distributed.pipelining job and measure what each stage keeps.

``run_planned_pipeline(plan)`` spawns one CPU process per stage (gloo), builds the plan's model shape
as a Hugging Face ``LlamaForCausalLM`` (same seed on every rank), cuts it into the plan's virtual
stages (:class:`~agoq_core.planner.apply.HFStageModule`), turns LAAQ on in every stage with
``plan.laaq_config_for_stage(rank)`` and runs training steps with torch's own schedule.

Each rank measures, at the start and end of every forward and backward action:

- *saved* bytes: every tensor autograd saves (``saved_tensors_hooks``) and every tensor LAAQ keeps
  (its storage listener), counted once per storage, parameters excluded, only while alive;
- *pipeline* bytes: the stage outputs the runtime keeps for backward (seen by a forward hook);
- which micro-batches are in flight on each chunk (those with saved tensors alive),

and the order in which torch ran the actions. The parent compares all of it with the plan.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from agoq_core.planner.errors import PlannerError
from agoq_core.testing.dist import exit_spawned_rank, free_port

__all__ = ["run_planned_pipeline", "PipelineRunReport", "RankRun"]


@dataclass
class RankRun:
    rank: int
    actions: list[str]
    saved_peak: int
    pipeline_peak: int
    total_peak: int
    inflight_peak: int
    inflight_chunk_peaks: list[int]
    step_start_bytes: int
    """Saved + pipeline bytes already alive when a step starts (torch's stage set-up keeps one
    shape-inference forward alive on stages that infer from real inputs): not activations of the step."""
    saved_per_microbatch: dict[str, int]
    """Virtual stage -> bytes saved by one micro-batch (the largest over micro-batches and steps)."""
    recv_buffer_bytes: int
    laaq_formats: dict[str, list[str]]
    """Layer -> formats LAAQ's report lists for that layer's conversions on this rank."""
    losses: list[float]
    seconds: float


@dataclass
class PipelineRunReport:
    plan: Any
    ranks: list[RankRun]
    steps: int
    predicted: list[dict[str, Any]] = field(default_factory=list)

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for r, pred in zip(self.ranks, self.predicted):
            out.append({
                "stage": r.rank,
                "inflight_planned": pred["inflight"], "inflight_measured": r.inflight_peak,
                "saved_planned": pred["saved"], "saved_measured": r.saved_peak,
                "pipeline_planned": pred["pipeline"], "pipeline_measured": r.pipeline_peak,
                "total_planned": pred["total"], "total_measured": r.total_peak,
                "recv_planned": pred["recv"], "recv_measured": r.recv_buffer_bytes,
                "rel_error_total": (r.total_peak - pred["total"]) / pred["total"] if pred["total"] else 0.0,
                "step_start": r.step_start_bytes,
            })
        return out

    @property
    def max_rel_error(self) -> float:
        return max(abs(row["rel_error_total"]) for row in self.rows())

    def table(self) -> str:
        from agoq_core.planner.explain import fmt_bytes

        head = ["stage", "formats", "in flight plan/run", "saved plan", "saved run", "pipeline plan",
                "pipeline run", "total plan", "total run", "error", "alive at step start"]
        rows = []
        for s, row in zip(self.plan.stages, self.rows()):
            from agoq_core.planner.explain import _formats

            rows.append([str(row["stage"]), _formats(s.formats, self.plan.config.candidates),
                         f"{row['inflight_planned']}/{row['inflight_measured']}",
                         fmt_bytes(row["saved_planned"]), fmt_bytes(row["saved_measured"]),
                         fmt_bytes(row["pipeline_planned"]), fmt_bytes(row["pipeline_measured"]),
                         fmt_bytes(row["total_planned"]), fmt_bytes(row["total_measured"]),
                         f"{100 * row['rel_error_total']:+.2f}%", fmt_bytes(row["step_start"])])
        from agoq_core.planner.explain import _table

        return _table(rows, head)

    def to_dict(self) -> dict:
        return {"steps": self.steps, "rows": self.rows(),
                "ranks": [r.__dict__ for r in self.ranks], "max_rel_error": self.max_rel_error}


# ---- prediction ------------------------------------------------------------------------------------

def predicted_peaks(plan: Any, rank: int) -> dict[str, int]:
    """The plan's saved / pipeline / total activation peaks of ``rank`` (each at its own worst state)."""
    from agoq_core.planner.solver import peak_bytes

    s = plan.stages[rank]
    io = list(s.chunk_io_bytes)
    saved = [b - o for b, o in zip(s.chunk_bytes, io)]
    states = [a for a, _ in s.constraints]
    offsets = [k for _, k in s.constraints]
    return {"saved": peak_bytes(saved, states)[0], "pipeline": peak_bytes(io, states, offsets)[0],
            "total": s.activation_peak, "inflight": s.inflight_peak,
            "recv": s.static.get("pipeline_buffers", 0)}


# ---- the worker ------------------------------------------------------------------------------------

class _Meter:
    """Alive bytes of saved tensors and pipeline-held outputs, tagged by (virtual stage, micro-batch),
    kept in LAAQ's StorageLedger (one storage counted once, parameters excluded, only while alive)."""

    def __init__(self, params: Any) -> None:
        from agoq_core.laaq.memory import StorageLedger

        self.ledger = StorageLedger(exclude=params)
        self.tag: tuple = ("none",)
        self.polls: list[dict] = []
        self.per_mb: dict[tuple, int] = {}

    def add(self, t: Any, kind: str, tag: tuple | None = None) -> None:
        tag = tag or self.tag
        old = self.ledger.add(t, (kind, tag))
        if old is not None and old[1] != tag and old[1][0] == "F" and tag[0] == "F":
            # saved by several micro-batches (the input ids or targets, chunked views of one batch):
            # counted once, and it says nothing about which micro-batches are in flight
            self.ledger.retag(t, (old[0], ("shared",)))

    def pack(self, t: Any) -> Any:
        self.add(t, "saved")
        return t

    def listen(self, role: str, layer: Any, stored: Any) -> None:
        from agoq_core.laaq import storage

        for t in storage.stored_tensors(stored):
            self.add(t, "saved")

    def poll(self, label: str, vstages: tuple[int, ...]) -> None:
        """Record what is alive now (called at the start and end of every action)."""
        alive = {"saved": 0, "pipeline": 0}
        mbs = {vs: set() for vs in vstages}
        by_tag: dict[tuple, int] = {}
        for nbytes, (kind, tag) in self.ledger.alive():
            alive[kind] += nbytes
            if os.environ.get("AGOQ_PP_DEBUG") and tag[0] == "none":
                by_tag[("none", kind, nbytes)] = by_tag.get(("none", kind, nbytes), 0) + 1
            if kind == "saved" and tag[0] == "F":
                mbs[tag[1]].add(tag[2])
                by_tag[tag] = by_tag.get(tag, 0) + nbytes
        for tag, b in by_tag.items():
            self.per_mb[tag] = max(self.per_mb.get(tag, 0), b)
        self.polls.append({"at": label, **alive, "inflight": [len(mbs[vs]) for vs in vstages],
                           "by_tag": {"/".join(map(str, k)): v for k, v in sorted(by_tag.items())}})


def _traced(f: Any, kind: str, vs: int, meter: _Meter, vstages: tuple[int, ...], log: list[str]) -> Any:
    """``f`` (a stage's forward_one_chunk or backward_one_chunk) polled by ``meter`` before and after,
    its saved tensors tagged (kind, virtual stage, micro-batch), and logged as an action."""
    def run(i: int, *a: Any, **kw: Any) -> Any:
        meter.poll(f"{vs}{kind}{i}<", vstages)
        meter.tag = (kind, vs, i)
        log.append(f"{vs}{kind}{i}")
        out = f(i, *a, **kw)
        meter.poll(f"{vs}{kind}{i}>", vstages)
        return out

    return run


def _worker(rank: int, job: dict, out_dir: str) -> None:
    try:
        _worker_body(rank, job, out_dir)
    except BaseException:
        with open(os.path.join(out_dir, f"error-{rank}.txt"), "w") as fh:
            fh.write(traceback.format_exc())
        raise
    exit_spawned_rank()  # results written, group destroyed: skip torch's racy teardown


def _worker_body(rank: int, job: dict, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from transformers import LlamaForCausalLM

    from agoq_core import laaq
    from agoq_core.laaq import storage
    from agoq_core.planner.apply import build_stage_modules, causal_lm_loss, laaq_config_for_layers, make_schedule
    from agoq_core.models import ModelShape
    from agoq_core.planner.measure import hf_config, torch_dtype
    from agoq_core.planner.schedules import PipelineSpec

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(job["port"])
    dist.init_process_group("gloo", rank=rank, world_size=job["stages"])
    try:
        spec = PipelineSpec(schedule=job["schedule"], stages=job["stages"], microbatches=job["microbatches"],
                            chunks=job["chunks"])
        shape = ModelShape(**job["shape"])
        dtype = torch_dtype(job["dtype"])
        torch.manual_seed(job["seed"])  # every rank builds the same weights
        model = LlamaForCausalLM(hf_config(shape, seq_len=job["seq_len"])).to(dtype)
        layers = [tuple(x) for x in job["layers"]]
        mods = build_stage_modules(model, spec, layers, rank)
        formats = {int(k): v for k, v in job["formats"].items()}
        cfg = laaq_config_for_layers(formats)
        laaq_formats: dict[str, list[str]] = {}
        for _, m in mods:
            report = laaq.apply(m, cfg)
            for c in report.converted:  # what LAAQ really put on each layer
                if c.layer is not None:
                    laaq_formats.setdefault(str(c.layer), [])
                    laaq_formats[str(c.layer)] = sorted(set(laaq_formats[str(c.layer)]) | set(c.formats.values()))
        meter = _Meter([p for _, m in mods for p in m.parameters()])
        vstages = tuple(vs for vs, _ in mods)
        last_vs = spec.virtual_stages - 1
        stages = []
        log: list[str] = []
        for vs, m in mods:
            # Shapes are inferred by torch (its default, DYNAMIC mode). That runs one real forward on
            # stage 0 whose graph stays alive: measured as "alive at step start", not planned. (Giving
            # input_args/output_args/grads instead made torch 2.13 keep 128 KiB more per micro-batch
            # on the last stage, growing every step, in our runs.)
            st = PipelineStage(m, vs, spec.virtual_stages, torch.device("cpu"))
            m.register_forward_hook(lambda mod, args, out, _m=meter: _m.add(out, "pipeline"))
            st.forward_one_chunk = _traced(st.forward_one_chunk, "F", vs, meter, vstages, log)
            st.backward_one_chunk = _traced(st.backward_one_chunk, "B", vs, meter, vstages, log)
            stages.append(st)
        sched = make_schedule(spec, stages, loss_fn=causal_lm_loss)
        g = torch.Generator().manual_seed(job["seed"] + 1)
        n = spec.microbatches * job["microbatch_size"]
        losses: list[float] = []
        step_polls: list[list[dict]] = []
        last_vs = spec.virtual_stages - 1
        t0 = time.perf_counter()
        storage.add_listener(meter.listen)
        try:
            for step in range(job["steps"]):
                ids = torch.randint(0, shape.vocab, (n, job["seq_len"] + 1), generator=g)
                x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
                # The batch's token ids and targets are held whole for the step (torch splits them into
                # views): counted in bytes, but they do not say which micro-batch is in flight.
                for t in (x, y):
                    meter.add(t, "saved", ("input",))
                step_losses: list = []
                if step:
                    log.clear()
                meter.tag = ("none",)
                meter.poll("step-start", vstages)
                start_index = len(meter.polls) - 1
                with torch.autograd.graph.saved_tensors_hooks(meter.pack, lambda t: t):
                    if 0 in vstages and last_vs in vstages:
                        sched.step(x, target=y, losses=step_losses, return_outputs=False)
                    elif 0 in vstages:
                        sched.step(x, return_outputs=False)
                    elif last_vs in vstages:
                        sched.step(target=y, losses=step_losses, return_outputs=False)
                    else:
                        sched.step(return_outputs=False)
                meter.poll("end", vstages)
                step_polls.append(meter.polls[start_index:])
                losses.append(float(sum(float(v.detach()) for v in step_losses) / max(1, len(step_losses))))
        finally:
            storage.remove_listener(meter.listen)
        seconds = time.perf_counter() - t0
        recv = 0
        for st in stages:
            seen = set()
            for infos in st.args_recv_info.values():
                for info in infos:
                    b = getattr(info, "buffer", None)
                    if b is not None and b.untyped_storage()._cdata not in seen:
                        seen.add(b.untyped_storage()._cdata)
                        recv += b.untyped_storage().nbytes()
        polls = meter.polls
        per_mb: dict[str, int] = {}
        for (_, vs, _mb), b in meter.per_mb.items():
            per_mb[str(vs)] = max(per_mb.get(str(vs), 0), b)

        # The last step is the steady state: the first also holds torch's one-time stage set-up.
        sp = step_polls[-1]

        def above_start(key: str) -> int:  # peak during the step minus what was alive when it started
            return max(p[key] for p in sp) - sp[0][key]

        res = {
            "rank": rank, "actions": log,
            "saved_peak": above_start("saved"), "pipeline_peak": above_start("pipeline"),
            "total_peak": max(p["saved"] + p["pipeline"] for p in sp) - sp[0]["saved"] - sp[0]["pipeline"],
            "step_start_bytes": sp[0]["saved"] + sp[0]["pipeline"],
            "inflight_peak": max(sum(p["inflight"]) for p in sp),
            "inflight_chunk_peaks": [max(p["inflight"][c] for p in sp) for c in range(len(vstages))],
            "saved_per_microbatch": per_mb, "recv_buffer_bytes": recv, "laaq_formats": laaq_formats,
            "losses": losses if last_vs in vstages else [], "seconds": seconds,
        }
        if os.environ.get("AGOQ_PP_DEBUG"):
            with open(os.path.join(os.environ["AGOQ_PP_DEBUG"], f"polls-{rank}.json"), "w") as fh:
                json.dump(polls, fh)
        with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as fh:
            json.dump(res, fh)
    finally:
        dist.destroy_process_group()


def run_planned_pipeline(plan: Any, *, steps: int = 1, seed: int = 0, timeout: float = 600.0) -> PipelineRunReport:
    """Train ``steps`` steps of the plan's model with the plan's formats on a real CPU pipeline.

    The plan must be for CPU float32 or bfloat16 (``PlanConfig.dtype``); one process per stage.
    """
    import torch.multiprocessing as mp

    if plan.costs.unit != "B":
        raise PlannerError("run_planned_pipeline needs a plan in bytes (activations='measured' or 'formula'), "
                           "not the paper's bits accounting")
    from agoq_core.planner.model import split_layers

    spec = plan.spec
    job = {
        "schedule": spec.schedule, "stages": spec.stages, "microbatches": spec.microbatches, "chunks": spec.chunks,
        "shape": {k: getattr(plan.shape, k) for k in ("hidden", "layers", "heads", "kv_heads", "intermediate",
                                                      "vocab", "rope_theta", "tie_embeddings", "name")},
        "layers": [list(x) for x in split_layers(plan.shape.layers, spec)],
        "formats": {str(k): v for k, v in plan.layer_formats.items()},
        "dtype": plan.config.dtype, "seq_len": plan.config.seq_len, "microbatch_size": plan.config.microbatch_size,
        "seed": seed, "steps": steps, "port": free_port(),
    }
    with tempfile.TemporaryDirectory(prefix="agoq-pp-") as out_dir:
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_worker, args=(r, job, out_dir)) for r in range(spec.stages)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        for p in procs:
            p.join(max(1.0, deadline - time.monotonic()))
        alive = [i for i, p in enumerate(procs) if p.is_alive()]
        for i in alive:
            procs[i].terminate()
            procs[i].join(5)
        errors = []
        for r in range(spec.stages):
            path = os.path.join(out_dir, f"error-{r}.txt")
            if os.path.exists(path):
                with open(path) as fh:
                    errors.append(f"rank {r}:\n{fh.read()}")
        bad_exit = [i for i, p in enumerate(procs) if i not in alive and p.exitcode != 0]
        if errors or alive or bad_exit:
            why = f"ranks {alive} still running after {timeout:.0f} s. " if alive else ""
            why += f"ranks {bad_exit} exited with codes {[procs[i].exitcode for i in bad_exit]}. " if bad_exit else ""
            raise PlannerError("the pipeline run failed: " + why + "\n" + "\n".join(errors))
        ranks = []
        for r in range(spec.stages):
            with open(os.path.join(out_dir, f"rank-{r}.json")) as fh:
                ranks.append(RankRun(**json.load(fh)))
    return PipelineRunReport(plan=plan, ranks=ranks, steps=steps,
                             predicted=[predicted_peaks(plan, r) for r in range(spec.stages)])
