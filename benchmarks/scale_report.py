"""Tables and plots of docs/scale.md: the cost model against the paper's tables, and its projections.

    python benchmarks/scale_report.py                 # markdown to stdout, PNGs to docs/img/scale_*.png
    python benchmarks/scale_report.py --no-plots      # tables only

Pure Python + matplotlib, CPU, ~1 minute. Every number is computed by agoq_core.scale from the inputs
named in docs/scale.md; nothing is measured here.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agoq_core.scale import Parallel, network_for, parse_cluster, predict  # noqa: E402
from agoq_core.scale.collectives import Group, collective_time, quangrad_allreduce_time, quangrad_two_hop_time  # noqa: E402
from agoq_core.scale.compute import quangrad_codec_seconds  # noqa: E402
from agoq_core.scale.devices import device_profile  # noqa: E402
from agoq_core.scale.paper import TABLE2, TABLE4, TABLE8_A6000, validate_table4  # noqa: E402
from agoq_core.scale.single_gpu import h200_check  # noqa: E402

IMG = ROOT / "docs" / "img"
NETWORKS = (("NVLink + 400 Gb/s IB (8 NICs/node)", "ib-400", 8), ("NVLink + 200 Gb/s RoCE (8 NICs/node)", "roce-200", 8),
            ("NVLink + 100 GbE (1 NIC/node)", "eth-100", 1), ("NVLink + 25 GbE (1 NIC/node)", "eth-25", 1))
WORLDS = tuple(2**k for k in range(3, 13))  # 8 .. 4096


def _size(n: float) -> str:
    for unit, v in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= v:
            return f"{n / v:g} {unit}"
    return f"{n:g} B"


def table4(plots: bool) -> None:
    rows, fits = validate_table4()
    print("### Table 4 (all-reduce micro-benchmark, TP=8, DP=8, 8 nodes x 8 A6000): predicted vs reported, ms\n")
    for net, f in fits.items():
        ar = f["all_reduce"]
        print(f"- {net}: alpha = {ar['alpha_s'] * 1e6:.1f} us per step, effective bandwidth "
              f"{f['effective_bandwidth_GBps']:.3f} GB/s per DP group (the NIC's 1/8 share: "
              f"{f['line_rate_per_group_GBps']:.3f} GB/s); codec: {f['codec']['alpha_s'] * 1e3:.3f} ms + "
              f"{2 / f['codec']['beta_s_per_byte'] / 1e9:.1f} GB/s of fp32 input")
    print("\n| network | size | column | reported | predicted | pred/rep |\n|---|---|---|---:|---:|---:|")
    for r in rows:
        tag = " (fitted)" if r.fitted_on else ""
        print(f"| {r.network} | {_size(r.size)} | {r.column}{tag} | {r.reported_ms:,.2f} | {r.predicted_ms:,.2f} | "
              f"{r.ratio:.2f} |")
    sp = {}
    for r in rows:
        sp.setdefault((r.network, r.size), {})[r.column] = r
    print("\n| network | size | speedup reported | speedup predicted |\n|---|---|---:|---:|")
    for (net, size), d in sp.items():
        print(f"| {net} | {_size(size)} | {d['all_reduce'].reported_ms / d['agoq'].reported_ms:.2f}x | "
              f"{d['all_reduce'].predicted_ms / d['agoq'].predicted_ms:.2f}x |")
    if plots:
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 5))
        marks = {"all_reduce": "o", "all_to_all": "s", "all_gather": "^", "codec": "x", "agoq": "D"}
        for r in rows:
            ax.scatter(r.reported_ms, r.predicted_ms, marker=marks[r.column],
                       color="tab:blue" if r.network == "200Gbps" else "tab:orange",
                       facecolors="none" if r.fitted_on else None)
        lim = (0.03, 1e5)
        ax.plot(lim, lim, "k:", lw=1)
        ax.set(xscale="log", yscale="log", xlim=lim, ylim=lim, xlabel="reported by the paper (ms)",
               ylabel="predicted (ms)", title="Paper Table 4: predicted vs reported\n(blue 200 Gb/s, orange 10 Gb/s; "
                                              "hollow = fitted)")
        for c, m in marks.items():
            ax.scatter([], [], marker=m, color="gray", label=c)
        ax.legend(fontsize=8)
        ax.annotate("1 GiB all-gather @10 Gb/s", (226.58, 6395), fontsize=7, xytext=(3, 2e4),
                    arrowprops={"arrowstyle": "->", "lw": 0.5})
        fig.tight_layout()
        fig.savefig(IMG / "scale_table4.png", dpi=110)
        plt.close(fig)


def table2(plots: bool) -> None:
    cl = parse_cluster("64xA6000", inter="200Gbps")
    par = Parallel(tp=8, pp=4, dp=2, schedule="1f1b", microbatches=8)
    print("\n### Table 2 (LLaMA2-13B, 64 x A6000, TP=8, PP=4, DP=2, 1F1B, 8 micro-batches): predicted vs reported\n")
    print("| seq | Megatron R rep / pred | Megatron s rep | pred (pred R) | pred (rep R) | AGoQ s rep | AGoQ pred | "
          "speedup rep | pred (pred R) | pred (rep R) | peak GiB base / AGoQ |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    xs, rep_b, rep_a, pb, pbr, pa = [], [], [], [], [], []
    errs = []
    for seq, (mr, mms, _, _, _, ams) in TABLE2.items():
        p = predict("llama2-13b", cl, par, seq, accounting="paper")
        f = predict("llama2-13b", cl, par, seq, accounting="paper", recompute=mr)
        b, a, bf = p.baseline.time.total, p.agoq.time.total, f.baseline.time.total
        xs.append(seq // 1024)
        rep_b.append(mms / 1e3), rep_a.append(ams / 1e3), pb.append(b), pbr.append(bf), pa.append(a)
        errs += [bf * 1e3 / mms - 1, a * 1e3 / ams - 1]
        print(f"| {seq // 1024}K | {mr} / {p.baseline.memory.recompute_layers} | {mms / 1e3:.1f} | {b:.1f} | {bf:.1f} | "
              f"{ams / 1e3:.1f} | {a:.1f} | {mms / ams:.2f}x | {b / a:.2f}x | {bf / a:.2f}x | "
              f"{p.baseline.memory.peak / 2**30:.1f} / {p.agoq.memory.peak / 2**30:.1f} |")
    print(f"\nmean |error| of the predicted times (reported R for Megatron): "
          f"{100 * sum(abs(e) for e in errs) / len(errs):.1f}%, max {100 * max(abs(e) for e in errs):.1f}%")
    print("\nBreakdown at 64K (s, busiest pipeline rank):\n")
    p = predict("llama2-13b", cl, par, 65536, accounting="paper", recompute=8)
    print("| arm | compute | recompute | TP comm | bubble | DP sync | optimizer | total |\n|---|---:|---:|---:|---:|---:|---:|---:|")
    for arm in (p.baseline, p.agoq):
        t = arm.time
        print(f"| {arm.arm} | {t.compute:.1f} | {t.recompute:.1f} | {t.tp_comm:.1f} | {t.bubble:.1f} | {t.dp_comm:.2f} | "
              f"{t.optimizer:.3f} | {t.total:.1f} |")
    # sensitivity to the one assumed A6000 number that matters most: PCIe share reached by the TP collectives
    import dataclasses

    from agoq_core.scale.network import INTRA_LINKS

    print("\nSensitivity to the assumed PCIe efficiency (TP collectives inside an A6000 node):\n")
    print("| PCIe efficiency | mean abs. error | speedup at 32K / 80K (reported R) |\n|---:|---:|---|")
    for eff in (0.4, 0.5, 0.6, 0.7, 0.8):
        link = dataclasses.replace(INTRA_LINKS["pcie4"], efficiency=eff)
        c2 = parse_cluster("64xA6000", network=network_for(link, "200Gbps"))
        e, sps = [], []
        for seq, (mr, mms, _, _, _, ams) in TABLE2.items():
            q = predict("llama2-13b", c2, par, seq, accounting="paper", recompute=mr)
            e += [abs(q.baseline.time.total * 1e3 / mms - 1), abs(q.agoq.time.total * 1e3 / ams - 1)]
            if seq in (32768, 81920):
                sps.append(f"{q.speedup:.2f}x")
        print(f"| {eff:.1f} | {100 * sum(e) / len(e):.1f}% | {' / '.join(sps)} |")
    if plots:
        import matplotlib.pyplot as plt

        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4))
        ax.plot(xs, rep_b, "o-", color="tab:red", label="Megatron, reported")
        ax.plot(xs, pbr, "o--", color="tab:red", mfc="none", label="Megatron, predicted (reported R)")
        ax.plot(xs, pb, ":", color="tab:red", label="Megatron, predicted (predicted R)")
        ax.plot(xs, rep_a, "s-", color="tab:green", label="AGoQ, reported")
        ax.plot(xs, pa, "s--", color="tab:green", mfc="none", label="AGoQ, predicted")
        ax.set(xlabel="sequence length (K tokens)", ylabel="iteration time (s)",
               title="LLaMA2-13B, 64 x A6000 (paper Table 2)")
        ax.legend(fontsize=7)
        ax2.plot(xs, [b / a for b, a in zip(rep_b, rep_a)], "o-", color="k", label="reported")
        ax2.plot(xs, [b / a for b, a in zip(pbr, pa)], "o--", color="k", mfc="none", label="predicted (reported R)")
        ax2.plot(xs, [b / a for b, a in zip(pb, pa)], ":", color="k", label="predicted (predicted R)")
        ax2.set(xlabel="sequence length (K tokens)", ylabel="AGoQ speedup vs Megatron", title="speedup")
        ax2.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(IMG / "scale_table2.png", dpi=110)
        plt.close(fig)


def table8() -> None:
    print("\n### Table 8 (LLaMA2-13B, TP=8, PP=1, 12K tokens, A6000): peak memory, GB\n")
    print("| method | reported | predicted |\n|---|---:|---:|")
    from agoq_core.planner.memory import StaticMemoryConfig
    from agoq_core.planner.schedules import PipelineSpec
    from agoq_core.planner.model import model_shape
    from agoq_core.scale.memory import agoq_memory, baseline_memory

    shape, spec = model_shape("llama2-13b"), PipelineSpec(schedule="1f1b", stages=1, microbatches=1)
    for name, (gb, grads, opt, laaq) in TABLE8_A6000.items():
        st = StaticMemoryConfig(grads=grads, optimizer=opt)
        if laaq:
            m = agoq_memory(shape, spec, tokens=12288, seq=12288, microbatch_size=1, tp=8, dp=1, usable_bytes=1 << 50,
                            accounting="paper", static=st)
        else:
            m = baseline_memory(shape, spec, tokens=12288, tp=8, dp=1, usable_bytes=1 << 50, accounting="paper",
                                recompute=0, static=st)
        print(f"| {name} | {gb:.1f} | {m.peak / 1e9:.1f} |")


def single_gpu() -> None:
    print("\n### One H200, LLaMA-2-7B (docs/benchmarks.md §1, 2026-11-29): predicted vs measured\n")
    print("| method | tokens | quantity | measured | predicted | error |\n|---|---:|---|---:|---:|---:|")
    for r in h200_check():
        m, p = r.measured, r.predicted
        if r.quantity == "saved_layers_bytes":
            m, p, unit = m / 2**30, p / 2**30, " GiB"
        else:
            unit = " s" if r.quantity == "step_s" else ""
        tag = " (fitted)" if r.fitted_on else ""
        print(f"| {r.method}{tag} | {r.seq:,} | {r.quantity} | {m:,.3f}{unit} | {p:,.3f}{unit} | {100 * r.error:+.1f}% |")


def _qg(numel: int, g: Group, dev, two_hop: bool) -> float:
    if two_hop:
        return quangrad_two_hop_time(numel, g, codec_seconds_of=lambda n, p: quangrad_codec_seconds(n, p, dev)).total
    return quangrad_allreduce_time(numel, g, codec_seconds=quangrad_codec_seconds(numel, g.size, dev)).total


def projection(plots: bool) -> None:
    dev = device_profile("H200")
    sizes = [2**k for k in range(12, 35)]  # 4 KiB .. 16 GiB of fp32 gradient
    print("\n### Projection: QuanGrad all-reduce vs NCCL fp32 all-reduce (data parallel over W GPUs, 8 per node)\n")
    print("Crossover = smallest fp32 gradient size from which QuanGrad is faster (\"never\" up to 16 GiB); "
          "speedup at 1 GiB of fp32 gradient (256 M parameters).\n")
    print("| network | W | crossover (flat, as implemented) | speedup @1 GiB | crossover (2-hop, not implemented) | "
          "speedup @1 GiB |\n|---|---:|---:|---:|---:|---:|")
    curves = {}
    for label, inter, nics in NETWORKS:
        net = network_for("nvlink4", inter, nics_per_node=nics)
        for W in WORLDS:
            g = Group(size=W, per_node=min(8, W), network=net)
            out = []
            for two in (False, True):
                sp = [collective_time("all_reduce", n, g) / _qg(n // 4, g, dev, two) for n in sizes]
                cross = next((n for n, s in zip(sizes, sp) if s > 1 and all(x > 1 for x in sp[sizes.index(n):])), None)
                out.append((cross, sp[sizes.index(2**30)]))
                curves[(label, W, two)] = sp
            print(f"| {label} | {W} | {_size(out[0][0]) if out[0][0] else 'never'} | {out[0][1]:.2f}x | "
                  f"{_size(out[1][0]) if out[1][0] else 'never'} | {out[1][1]:.2f}x |")
    if plots:
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True, sharey=True)
        for ax, (label, _, _) in zip(axes.flat, NETWORKS):
            for W, c in zip((8, 64, 512, 4096), ("tab:blue", "tab:orange", "tab:green", "tab:red")):
                ax.plot(sizes, curves[(label, W, False)], "-", color=c, label=f"W={W} flat")
                ax.plot(sizes, curves[(label, W, True)], "--", color=c, label=f"W={W} 2-hop")
            ax.axhline(1, color="k", lw=0.7)
            ax.set(xscale="log", yscale="log", title=label, xlabel="fp32 gradient bytes",
                   ylabel="fp32 all-reduce time / QuanGrad time")
            ax.grid(alpha=0.3)
        axes.flat[0].legend(fontsize=7, ncol=2)
        fig.suptitle("PREDICTED QuanGrad speedup over NCCL fp32 all-reduce (alpha-beta model; H200 codec rates "
                     "measured 2026-12-02)", fontsize=10)
        fig.tight_layout()
        fig.savefig(IMG / "scale_quangrad_projection.png", dpi=110)
        plt.close(fig)


def thousand_gpus(plots: bool) -> None:
    print("\n### Projection: 1,024 x H100 (NVLink + 400 Gb/s IB, 8 NICs/node), interleaved 1F1B, TP=8\n")
    cl = parse_cluster("1024xH100", inter="ib-400")
    bars = []
    print("| model | seq | PP x DP | micro-batches | baseline R | baseline s | AGoQ s | speedup | peak GiB base / AGoQ | "
          "AGoQ formats per stage |\n|---|---:|---|---:|---:|---:|---:|---:|---|---|")
    for model, seq in (("llama2-13b", 32768), ("llama2-13b", 65536), ("llama3-8b", 65536)):
        for pp in (8, 16):
            dp = 1024 // (8 * pp)
            m = 256 // dp  # global batch of 256 sequences
            par = Parallel(tp=8, pp=pp, dp=dp, schedule="interleaved-1f1b", microbatches=m)
            p = predict(model, cl, par, seq)
            fm = "; ".join(" ".join(f"{f}x{n}" for f, n in _counts(s.formats).items()) for s in p.agoq.memory.stages)
            print(f"| {model} | {seq // 1024}K | {pp} x {dp} | {m} | {p.baseline.memory.recompute_layers} | "
                  f"{p.baseline.time.total:.2f} | {p.agoq.time.total:.2f} | {p.speedup:.2f}x | "
                  f"{p.baseline.memory.peak / 2**30:.1f} / {p.agoq.memory.peak / 2**30:.1f} | {fm} |")
            bars.append((f"{model}\n{seq // 1024}K PP{pp}", p))
    if plots:
        import matplotlib.pyplot as plt

        keys = ("compute", "recompute", "tp_comm", "bubble", "dp_comm", "optimizer")
        fig, ax = plt.subplots(figsize=(12, 4.5))
        x = 0
        ticks, names = [], []
        colors = dict(zip(keys, ("tab:blue", "tab:red", "tab:orange", "lightgray", "tab:purple", "tab:brown")))
        for name, p in bars:
            for off, arm in ((0, p.baseline), (0.4, p.agoq)):
                bottom = 0.0
                d = arm.time.to_dict()
                for k in keys:
                    ax.bar(x + off, d[k], 0.38, bottom=bottom, color=colors[k], label=k if x == 0 and off == 0 else None)
                    bottom += d[k]
                ax.text(x + off, bottom, "B" if off == 0 else "A", ha="center", va="bottom", fontsize=7)
            ticks.append(x + 0.2)
            names.append(name)
            x += 1
        ax.set_xticks(ticks, names, fontsize=7)
        ax.set_ylabel("predicted step time (s)")
        ax.set_title("PREDICTED step time on 1,024 x H100, B = baseline (bf16, fp32 grads + all-reduce, recompute to "
                     "fit), A = AGoQ", fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(IMG / "scale_1k_gpus.png", dpi=110)
        plt.close(fig)


def _counts(formats: dict) -> dict:
    out: dict = {}
    for f in formats.values():
        out[f] = out.get(f, 0) + 1
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    plots = not args.no_plots
    if plots:
        import matplotlib

        matplotlib.use("Agg")
        IMG.mkdir(parents=True, exist_ok=True)
    table4(plots)
    table2(plots)
    table8()
    single_gpu()
    projection(plots)
    thousand_gpus(plots)
    return 0


if __name__ == "__main__":
    sys.exit(main())
