"""HetPipe (Park et al., USENIX ATC 2020; seed 004): its evaluation (Sec. 8) regenerated on `hetpipe-testbed`.

Fig. 3 (one virtual worker against N_m), Fig. 4 with Table 3's policies (NP, ED, HD, ED-local against
Horovod at D = 0), Table 4 (adding whimpy GPUs), Sec. 8.3's bytes across nodes and Sec. 8.4's waiting and
idle times, each simulated at the paper's scale by harness/systems/hetpipe/ and harness/systems/horovod/;
Fig. 4 trained for real at the testbed's scale through the emulated cluster, and Figs. 5-6 (convergence) with
a CNN on loopback (hetpipe_convergence.py), whose runs Sec. 8.4 also reads. The paper's numbers come from its
text and tables (its figures' bars are not in the text: those claims are the directions the text states).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..scenario import load_scenario
from ..systems import hetpipe as hp
from ..systems.hetpipe import report as hp_report
from ..systems.hetpipe import wsp
from ..systems.hetpipe.setting import MAX_NM
from ..workloads.cnn import get_cnn
from . import Context, Paper, Part, Setting, hetpipe_convergence, hetpipe_emulated
from .claims import Claim, Section, smallest_step

SCENARIO, BATCH = hp_report.SCENARIO, 32  # Sec. 8.1: "batch size of 32"
MODELS = hp_report.MODELS
NAMES = {"vgg19": "VGG-19", "resnet152": "ResNet-152"}
# Table 3's seven virtual workers (device ids on hetpipe-testbed: V 0-3, R 4-7, G 8-11, Q 12-15)
TABLE3_VWS = {"VVVV": (0, 1, 2, 3), "RRRR": (4, 5, 6, 7), "GGGG": (8, 9, 10, 11), "QQQQ": (12, 13, 14, 15),
              "VRGQ": (0, 4, 8, 12), "VVQQ": (0, 1, 12, 13), "RRGG": (4, 5, 8, 9)}
HOMOGENEOUS = ("VVVV", "RRRR", "GGGG", "QQQQ")

WHY_COMPUTE = ("each GPU computes at its fp32 peak x the dense-GEMM efficiency of compute/profiles.py; the "
               "paper's per-GPU cuDNN speeds (and TensorFlow's overheads) are not measured here")
WHY_MEMORY = ("Max_m follows the harness's memory model (parameters, gradients, momentum, the wave's update, "
              "every in-flight minibatch's activations); TensorFlow's workspace and allocator are not modelled, so "
              "more minibatches fit than on the testbed")
WHY_CUTS = ("the bytes at the cuts follow the harness's partition; the paper does not state its cut layers, "
            "nor what its byte count covers (per minibatch, per wave, one direction)")
WHY_PS = ("in the model a wave's push and pull hold back only the next minibatch's entry, while the minibatches "
          "already in flight can keep the bottleneck stage busy; the testbed's TensorFlow parameter servers (their "
          "CPU, serialisation, gRPC) are not modelled")
WHY_IDENTICAL = ("the model's virtual workers run deterministically: ED's identical VWs never wait for each "
                 "other, so raising D saves nothing; the testbed's run-to-run jitter between VWs is not modelled")


def _vw_curve(topo, model, devices) -> dict:
    """One VW alone (Fig. 3): per N_m that fits, samples/s and its busiest stage's utilisation."""
    costs = hp.Costs.of(topo, model, BATCH, [list(devices)])
    out = {"n": [], "samples_per_s": [], "busiest": [], "busiest_stage": [], "spread": []}
    for n in range(1, MAX_NM + 1):
        try:
            vw = hp.best_order(topo, costs, list(devices), n)
        except hp.HetPipeError:
            break
        sync = hp.sync_seconds(topo, hp.ps_traffic(topo, model, [vw], "default"))
        r = wsp.simulate([vw], n, BATCH, 0, sync, sync)
        util = (np.add(vw.fwd, vw.bwd)) * r.samples_per_s / BATCH  # busy seconds per second, per stage
        out["n"].append(n)
        out["samples_per_s"].append(r.samples_per_s)
        out["busiest"].append(float(util.max()))
        out["busiest_stage"].append(int(util.argmax()))
        out["spread"].append(float(util.max() / util.min()) if util.min() > 0 else float("inf"))
    return out


def fig3(ctx: Context) -> list[Section]:
    import matplotlib.pyplot as plt

    from ..plots.figures import save_figure

    topo = load_scenario(SCENARIO)
    sections = []
    fig, axes = plt.subplots(2, 2, figsize=(12, 7))
    for col, name in enumerate(MODELS):
        model = get_cnn(name)
        curves = {}
        for label, devices in TABLE3_VWS.items():
            ctx.progress(f"fig. 3: {name} {label}")
            curves[label] = _vw_curve(topo, model, devices)
        s = Section(f"Fig. 3 ({NAMES[name]}): one virtual worker against N_m",
                    text="Each of Table 3's seven virtual workers alone, N_m from 1 up to the most that fit "
                         "(Max_m), its parameter server placed by default; samples/s normalised to N_m = 1 and "
                         "the busiest stage's utilisation (the paper's \"maximum average GPU utilization among "
                         "partitions\").")
        for label, c in curves.items():
            t = c["samples_per_s"]
            best = int(np.argmax(t))
            s.add(Claim("Fig. 3", f"{NAMES[name]} {label}: throughput grows with N_m (at Max_m / at N_m = 1)",
                        "Sec. 8.2, Fig. 3", above=1.0, unit="x", why=WHY_MEMORY),
                  t[-1] / t[0], note=f"Max_m {c['n'][-1]}, best {t[best] / t[0]:.2f}x at N_m {c['n'][best]}")
        hom = max(curves[k]["spread"][int(np.argmax(curves[k]["samples_per_s"]))] for k in HOMOGENEOUS)
        s.add(Claim("Fig. 3", f"{NAMES[name]}: homogeneous VWs' stages equally busy (busiest / least busy stage, "
                    "worst of NP's four, at the best N_m)", "Sec. 8.2", paper=1.0, unit="x",
                    why="the partition keeps every in-flight minibatch's activations within memory, so at the "
                        "fastest N_m layers leave the first stages; " + WHY_MEMORY), hom,
              note=f"at N_m = 1: {max(curves[k]['spread'][0] for k in HOMOGENEOUS):.2f}x")
        het = [k for k in TABLE3_VWS if k not in HOMOGENEOUS]
        ends = [curves[k]["busiest_stage"][int(np.argmax(curves[k]["samples_per_s"]))] in (0, len(k) - 1) for k in het]
        s.add(Claim("Fig. 3", f"{NAMES[name]}: in heterogeneous VWs the first or last stage is the busiest "
                    "(share of VRGQ, VVQQ, RRGG)", "Sec. 8.2", above=0.5, why=WHY_COMPUTE), float(np.mean(ends)))
        sections.append(s)
        for label, c in curves.items():  # fig3.png: both models, shown under the last
            t = np.array(c["samples_per_s"])
            axes[0, col].plot(c["n"], t / t[0], marker="o", ms=3, label=label)
            axes[1, col].plot(c["n"], c["busiest"], marker="o", ms=3, label=label)
        axes[0, col].set_title(f"{NAMES[name]}: throughput / throughput at N_m = 1 (simulated)", fontsize=9)
        axes[1, col].set_title(f"{NAMES[name]}: busiest stage's utilisation (simulated)", fontsize=9)
        for ax in axes[:, col]:
            ax.set_xlabel("N_m", fontsize=8)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    save_figure(fig, ctx.out / "fig3.png")
    plt.close(fig)
    sections[-1].plots.append("fig3.png")
    return sections


def fig4_table4(ctx: Context) -> list[Section]:
    sw = hp_report.sweep(BATCH, progress=lambda msg: ctx.progress(f"fig. 4 / table 4: {msg}"))
    hp_report.write(ctx.out, sw)  # hetpipe.json, hetpipe.png
    _table4_figure(sw, ctx.out)
    f4 = Section("Fig. 4: allocation policies against Horovod, 16 GPUs, D = 0",
                 text="Table 3's policies, each at the N_m that is fastest (the same on every VW), the parameter "
                      "server placed by default or locally (ED-local); Horovod on every GPU that holds the model "
                      "(ResNet-152: 12, the RTX 2060s left out).", plots=["hetpipe.png"])
    for name in MODELS:
        r = {k: e.samples_per_s for k, e in sw.fig4[name].items()}
        f4.add(Claim("Fig. 4", f"{NAMES[name]}: NP below ED and HD (the smallest VW's memory bounds N_m)",
                     "Sec. 8.3", above=1.0, unit="x", why=WHY_MEMORY), min(r["ed"], r["hd"]) / r["np"],
               note=f"min(ED, HD) / NP; NP {r['np']:.0f}, ED {r['ed']:.0f}, HD {r['hd']:.0f} samples/s")
    vgg, res = ({k: e.samples_per_s for k, e in sw.fig4[m].items()} for m in MODELS)
    for pol in ("np", "ed", "hd"):
        f4.add(Claim("Fig. 4", f"VGG-19: Horovod above {pol.upper()}", "Sec. 8.3", above=1.0, unit="x",
                     why=WHY_COMPUTE), vgg["horovod"] / vgg[pol], note=f"Horovod / {pol.upper()}")
    for pol in ("ed", "hd"):
        f4.add(Claim("Fig. 4", f"ResNet-152: {pol.upper()} close to Horovod (12 GPUs)", "Sec. 8.3", paper=1.0,
                     unit="x", why=WHY_COMPUTE), res[pol] / res["horovod"], note=f"{pol.upper()} / Horovod")
    for name in MODELS:
        r = sw.fig4[name]
        f4.add(Claim("Fig. 4", f"{NAMES[name]}: local placement speeds ED up (ED-local / ED)", "Sec. 8.3", above=1.0,
                     unit="x", why=WHY_PS), r["ed-local"].samples_per_s / r["ed"].samples_per_s)
    f4.add(Claim("Fig. 4", "VGG-19: ED-local over Horovod", "Sec. 8.3", paper=1.8, above=1.0, unit="x",
                 why=WHY_COMPUTE), vgg["ed-local"] / vgg["horovod"])
    f4.add(Claim("Fig. 4", "ResNet-152: ED-local over Horovod (40 % higher)", "Sec. 8.3", paper=1.4, above=1.0,
                 unit="x", why=WHY_COMPUTE), res["ed-local"] / res["horovod"])
    return [f4, _bytes(sw), _table4(sw)]


def _bytes(sw) -> Section:
    s = Section("Sec. 8.3: data transferred across nodes, ED-local against Horovod",
                text="ED-local: the activations one VW's minibatch sends between stages on different nodes "
                     "(forward; the gradients come back alike; the local parameter server sends nothing across). "
                     "Horovod: one GPU's share of a ring all-reduce phase.")
    for name in MODELS:
        e, h = sw.fig4[name]["ed-local"], sw.fig4[name]["horovod"]
        ed_mb, hv_mb = hp_report.PAPER_BYTES_MB[name]
        s.add(Claim("Sec. 8.3", f"{NAMES[name]}: ED-local MB across nodes", "p. 10", paper=ed_mb, unit="MB",
                    why=WHY_CUTS), e.cross_bytes_per_minibatch / 1e6)
        s.add(Claim("Sec. 8.3", f"{NAMES[name]}: Horovod MB across nodes", "p. 10", paper=hv_mb, unit="MB",
                    why=WHY_CUTS), h.cross_bytes_per_minibatch / 1e6)
        side = {"above": 1.0} if ed_mb > hv_mb else {"below": 1.0}
        s.add(Claim("Sec. 8.3", f"{NAMES[name]}: ED-local moves {'more' if ed_mb > hv_mb else 'less'} than Horovod",
                    "p. 10", unit="x", why=WHY_CUTS, **side),
              e.cross_bytes_per_minibatch / h.cross_bytes_per_minibatch)
    return s


def _table4(sw) -> Section:
    s = Section("Table 4: adding whimpy GPUs (HetPipe ED-local, four VWs but on V4; Horovod)",
                text="samples/s on the GPU sets V4, VR8, VRQ12, VRQG16; the paper's total concurrent minibatches "
                     "(N_m x VWs) beside the harness's.", plots=["table4.png"])
    for name in MODELS:
        for sys in ("horovod", "hetpipe"):
            for g, paper in zip(hp_report.GPU_SETS, hp_report.PAPER_TABLE4[name][sys]):
                e = sw.table4[name][g][sys]
                if paper is None:
                    continue  # the paper's "X": ResNet-152 does not fit a G GPU; Horovod's 16 is its 12
                value = paper[0] if isinstance(paper, tuple) else paper
                s.add(Claim("Table 4", f"{NAMES[name]} {sys} {g}: samples/s", "Table 4", paper=value, why=WHY_COMPUTE),
                      e.samples_per_s)
                if isinstance(paper, tuple):
                    s.add(Claim("Table 4", f"{NAMES[name]} {sys} {g}: concurrent minibatches", "Table 4",
                                paper=paper[1], why=WHY_MEMORY), float(e.concurrent))
            sets = [g for g, paper in zip(hp_report.GPU_SETS, hp_report.PAPER_TABLE4[name][sys]) if paper]
            series = [sw.table4[name][g][sys].samples_per_s for g in sets]  # the sets the paper ran
            s.add(Claim("Table 4", f"{NAMES[name]} {sys}: whimpy GPUs raise throughput ({sets[-1]} / {sets[0]})",
                        "Sec. 8.3", above=1.0, unit="x", why=WHY_COMPUTE), series[-1] / series[0])
            s.add(Claim("Table 4", f"{NAMES[name]} {sys}: every node added raises throughput (smallest step)",
                        "Sec. 8.3, Table 4", above=1.0, unit="x", why=WHY_COMPUTE), smallest_step(series),
                  note=" -> ".join(f"{v:.0f}" for v in series))
    most, least = hp_report.GPU_SETS[-1], hp_report.GPU_SETS[0]
    gains = [sw.table4[m][most]["hetpipe"].samples_per_s / sw.table4[m][least]["hetpipe"].samples_per_s for m in MODELS]
    s.add(Claim("Table 4", "HetPipe: \"up to 2.3 times speedup\" with the whimpy GPUs (the larger model's VRQG16 / V4)",
                "Sec. 8.3", paper=2.3, above=1.0, unit="x", why=WHY_COMPUTE), max(gains))
    return s


def sync_overhead(ctx: Context) -> list[Section]:
    s = Section("Sec. 8.4: synchronisation overhead against D (VGG-19, ED-local, 16 GPUs)",
                text="From the simulated waves: *waiting*, from a VW finishing a wave to its pull of the global "
                     "weights completing; *idle*, the part of it in which the VW's first stage has no task.")
    waits = {}
    for d in (0, 4):
        ctx.progress(f"sec. 8.4: D = {d}")
        waits[d] = hetpipe_convergence.ed_local("vgg19", d).result.gate_waits()
    w0, w4 = float(waits[0][0].mean()), float(waits[4][0].mean())
    runs = hetpipe_convergence.recorded_waits(ctx.found.get("convergence", {}))  # D -> (waiting, idle), measured
    if runs:
        s.text += (" *Measured*: the same from the convergence runs' per-minibatch records (the small CNN, 8 "
                   "devices; idle: the first stage blocked in the pull): " +
                   ", ".join(f"D = {d}: waiting {w.mean() * 1e3:.1f} ms, idle {i.mean() * 1e3:.1f} ms over "
                             f"{len(w)} gates" for d, (w, i) in runs.items()) + ".")
    m0, m4 = (float(runs[d][0].mean()) if d in runs else math.nan for d in (0, 4))
    s.add(Claim("Sec. 8.4", "waiting at D = 4 / waiting at D = 0", "Sec. 8.4", paper=0.62, below=1.0, unit="x",
                why=WHY_IDENTICAL), w4 / w0, measured=m4 / m0 if runs else None,
          note=f"{w4 * 1e3:.0f} / {w0 * 1e3:.0f} ms")
    s.add(Claim("Sec. 8.4", "idle / waiting (D = 4)", "Sec. 8.4", paper=0.18, below=1.0, unit="x",
                why="the pipeline's work during a wait depends on the stage times and N_m of the harness's "
                    "partition; " + WHY_COMPUTE), float(waits[4][1].mean()) / w4,
          measured=float(runs[4][1].mean()) / m4 if 4 in runs else None)
    return [s]


def _table4_figure(sw, out: Path) -> None:
    """Table 4's samples/s beside the paper's, one panel per model (table4.png)."""
    import matplotlib.pyplot as plt

    from ..plots.figures import save_figure

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    x = np.arange(len(hp_report.GPU_SETS))
    for ax, name in zip(axes, MODELS):
        for sys, color in (("hetpipe", "#9467bd"), ("horovod", "#7f7f7f")):
            ax.plot(x, [sw.table4[name][g][sys].samples_per_s for g in hp_report.GPU_SETS], marker="o", color=color,
                    label=f"{sys} (simulated)")
            paper = [np.nan if p is None else (p[0] if isinstance(p, tuple) else p)
                     for p in hp_report.PAPER_TABLE4[name][sys]]
            ax.plot(x, paper, marker="s", ls="--", color=color, label=f"{sys} (paper)")
        ax.set_xticks(x, hp_report.GPU_SETS)
        ax.set_title(f"Table 4, {NAMES[name]}: samples/s", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save_figure(fig, out / "table4.png")
    plt.close(fig)


SETTINGS = (
    Setting("GPU speed", "fp32 peak x the dense-GEMM efficiency (harness/compute/profiles.py)",
            "no measured cuDNN convolution speed per GPU type is at hand; the same efficiency for every type"),
    Setting("link latency", "5 us inside a node (PCIe) and between nodes (InfiniBand)",
            "the paper gives bandwidths only (15.75 GB/s, 56 Gbps); both are single-digit microseconds"),
    Setting("optimizer", "SGD with momentum, fp32 (value, gradient, momentum, the wave's update per parameter)",
            "TensorFlow 1.12's ImageNet recipes for both models; the paper names no optimizer"),
    Setting("N_m searched", f"1 to {MAX_NM}, the fastest that fits kept (the same on every VW)",
            "Sec. 8.3: \"N_m is set such that performance is maximized\""),
    Setting("parameter-server placement (default)", "layer l's shard on node l mod 4",
            "Sec. 8.1: layers round-robin over the servers \"as in TensorFlow\""),
    Setting("Horovod", "a ring all-reduce of the fp32 gradients in device order, overlapped with the backward",
            "Horovod's tensor fusion and overlap: the baseline's best case"),
    Setting("bytes across nodes", "ED-local: one VW minibatch's forward activations at cuts between nodes; "
            "Horovod: one GPU's ring phase", "the paper states totals without their unit of work"),
    Setting("waves simulated", f"{wsp.WAVES} per VW, throughput over the second half", "a steady state"),
    Setting("Table 4 at the testbed's scale", "two GPUs a node; HetPipe ED-local at 64 images an iteration (8 a "
            "minibatch), Horovod at 8 images a GPU", "the paper's minibatch of 32 for both, scaled to the small "
            "CNN's minibatch of the convergence runs; Horovod's batch grows with its GPUs, as on the testbed"),
)

PAPER = Paper(
    "hetpipe", "HetPipe (Park et al., USENIX ATC 2020)", "004",
    "Virtual workers of heterogeneous GPUs, each a pipeline, trained data parallel through a parameter server "
    "under Wave Synchronous Parallel, on the paper's testbed (`scenarios/hetpipe-testbed.yaml`: 4 nodes x 4 GPUs "
    "of TITAN V, TITAN RTX, RTX 2060, Quadro P4000).",
    parts=(Part("fig3", "Fig. 3: one virtual worker against N_m (simulated)", 10, fig3),
           Part("fig4", "Fig. 4, Table 4 and the bytes across nodes (simulated)", 27, fig4_table4),
           Part("convergence", "Figs. 5-6: convergence against Horovod and D (a CNN trained for real)", 1140,
                hetpipe_convergence.convergence, quick_seconds=180, measured=True),
           Part("sync", "Sec. 8.4: waiting and idle time against D (simulated; measured in the convergence runs)",
                5, sync_overhead),
           Part("fig3-emulated", "Fig. 3 at the testbed's scale (emulated runs, each predicted)", 240,
                hetpipe_emulated.fig3_emulated, measured=True, in_quick=False),
           Part("fig4-emulated", "Fig. 4 and the bytes across nodes at the testbed's scale (emulated runs, each "
                "predicted)", 360, hetpipe_emulated.fig4_emulated,
                measured=True, in_quick=False),
           Part("table4-emulated", "Table 4 at the testbed's scale: V, VR, VRQ (emulated runs, each predicted; "
                "VRQG is Fig. 4's)", 540, hetpipe_emulated.table4_emulated, measured=True, in_quick=False)),
    settings=SETTINGS + hetpipe_convergence.settings(),
)
