"""HetPipe's evaluation in `harness sim report`: Figure 4 (policies vs Horovod) and Table 4 (adding whimpy GPUs).

On the `hetpipe-testbed` scenario with D = 0 (as the paper's Figure 4 and Table 4), simulated by
harness/systems/hetpipe/, harness/systems/hetpipe/wsp.py and harness/systems/horovod/. The paper's numbers appear only as
references beside the predictions.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .. import hetpipe as hp
from ...workloads.cnn import get_cnn
from ...scenario import Topology, load_scenario
from .. import horovod
from ... import plots
from ...plan.systems import ReportSection
from ...plots.figures import save_figure

SCENARIO = "hetpipe-testbed"
MODELS = ("vgg19", "resnet152")
GPU_SETS = ("V4", "VR8", "VRQ12", "VRQG16")
POLICY_BARS = (("np", "default"), ("ed", "default"), ("hd", "default"), ("ed", "local"))  # HetPipe's bars
FIG4 = ("np", "ed", "hd", "ed-local", "horovod")

# Park et al. 2020, Table 4 (samples/s; HetPipe with ED-local, its total concurrent minibatches in brackets) and
# Sec. 8.3's ratios and bytes across nodes: references for the report only.
PAPER_TABLE4 = {
    "vgg19": {"horovod": (164, 205, 265, 339), "hetpipe": ((300, 5), (530, 16), (572, 20), (606, 20))},
    "resnet152": {"horovod": (233, 353, 415, None), "hetpipe": ((256, 5), (516, 20), (538, 24), (580, 28))},
}
PAPER_FIG4 = {"vgg19": "ED-local 1.8x Horovod; NP, ED, HD below Horovod",
              "resnet152": "ED-local 1.4x Horovod (12 GPUs); ED and HD close to Horovod"}
PAPER_BYTES_MB = {"vgg19": (103, 515), "resnet152": (298, 211)}  # ED-local, Horovod: "data transferred across nodes"


@dataclass
class Entry:
    samples_per_s: float
    concurrent: int  # minibatches in flight over all VWs (HetPipe) or GPUs used (Horovod)
    cross_bytes_per_sample: float
    cross_bytes_per_minibatch: float  # HetPipe: activations one VW's minibatch sends across nodes; Horovod: one GPU's
    # reduce-scatter (the all-gather moves as much again)


@dataclass
class HetPipeSweep:
    topo: Topology
    fig4: dict[str, dict[str, Entry]] = field(default_factory=dict)
    table4: dict[str, dict[str, dict[str, Entry]]] = field(default_factory=dict)


def _hetpipe_entry(topo: Topology, model, p: hp.HetPipePlan, batch: int) -> Entry:
    return Entry(p.result.samples_per_s, p.samples_per_wave, p.cross_node_bytes / (p.samples_per_wave * batch),
                 hp.cut_bytes(topo, model, p.vws[0], batch))


def _horovod_entry(topo: Topology, model, gpus: str | None, batch: int) -> Entry:
    r = horovod.simulate(topo, model, batch, gpus)
    n = len(r.devices)
    grads = model.params * hp.BYTES_PER_VALUE
    nodes = len({topo.device_region[d] for d in r.devices})
    return Entry(r.samples_per_s, n, r.cross_node_bytes / (n * batch), (n - 1) / n * grads if nodes > 1 else 0.0)


def sweep(batch: int = 32, progress=None) -> HetPipeSweep:
    topo = load_scenario(SCENARIO)
    out = HetPipeSweep(topo)
    for name in MODELS:
        model = get_cnn(name)
        row = {}
        for (policy, placement), label in zip(POLICY_BARS, FIG4):
            row[label] = _hetpipe_entry(topo, model, hp.plan(topo, model, batch, policy, placement), batch)
            if progress:
                progress(f"hetpipe {name} {label}")
        row[FIG4[-1]] = _horovod_entry(topo, model, None, batch)
        if progress:
            progress(f"hetpipe {name} {FIG4[-1]}")
        out.fig4[name] = row
        out.table4[name] = {}
        for gpus in GPU_SETS:
            out.table4[name][gpus] = {
                "horovod": _horovod_entry(topo, model, gpus, batch),
                "hetpipe": _hetpipe_entry(topo, model, hp.plan(topo, model, batch, "ed", "local", gpus=gpus), batch)}
            if progress:
                progress(f"hetpipe {name} {gpus}")
    return out


def figure(s: HetPipeSweep, out: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    plots.grouped_bars(axes[0], list(MODELS), {lab: [s.fig4[m][lab].samples_per_s for m in MODELS] for lab in FIG4},
                       "samples/s (simulated)", "(a) Fig. 4: policies vs Horovod, 16 GPUs, D=0")
    series = {f"{sys} {m}": [s.table4[m][g][sys].samples_per_s for g in GPU_SETS]
              for m in MODELS for sys in ("hetpipe", "horovod")}
    plots.lines(axes[1], list(GPU_SETS), series, "samples/s (simulated)", "(b) Table 4: adding whimpy GPUs (ED-local)")
    path = save_figure(fig, out)
    plt.close(fig)
    return path


def markdown(s: HetPipeSweep) -> str:
    L = ["## HetPipe (Park et al. 2020): virtual workers and WSP vs Horovod, simulated", "",
         f"Scenario `{s.topo.name}` ({s.topo.description}); minibatch 32, fp32, D = 0. Compute: fp32 peak x the "
         "dense-GEMM efficiency of harness/compute/profiles.py (no CNN measurement); memory: parameters, gradients, momentum "
         "and the wave's update, and the activations of every minibatch in flight on a stage.", "",
         "### Figure 4: samples/s per policy (N_m in brackets: minibatches in flight per VW)", "",
         "| model | NP | ED | HD | ED-local | Horovod | ED-local / Horovod | paper |", "|---|---|---|---|---|---|---|---|"]
    for m in MODELS:
        r = s.fig4[m]
        nvw = lambda lab: r[lab].concurrent // 4  # noqa: E731  four VWs on 16 GPUs
        cells = [f"{r[lab].samples_per_s:.0f} ({nvw(lab)})" for lab in FIG4[:4]]
        L.append(f"| {m} | {' | '.join(cells)} | {r['horovod'].samples_per_s:.0f} ({r['horovod'].concurrent} GPUs) | "
                 f"{r['ed-local'].samples_per_s / r['horovod'].samples_per_s:.2f}x | {PAPER_FIG4[m]} |")
    L += ["", "### Table 4: adding whimpy GPUs, samples/s (HetPipe ED-local, total minibatches in flight in brackets)",
          "", "| model | system | " + " | ".join(GPU_SETS) + " | last / first |", "|---|---|---|---|---|---|---|"]
    for m in MODELS:
        for sys, in_flight in (("horovod", False), ("hetpipe", True)):
            vals = [s.table4[m][g][sys] for g in GPU_SETS]
            cells = [f"{e.samples_per_s:.0f}" + (f" ({e.concurrent})" if in_flight else "") for e in vals]
            paper = PAPER_TABLE4[m][sys]
            ref = ", ".join("X" if p is None else (f"{p[0]}({p[1]})" if isinstance(p, tuple) else str(p)) for p in paper)
            L.append(f"| {m} | {sys} | {' | '.join(cells)} | {vals[-1].samples_per_s / vals[0].samples_per_s:.2f}x |")
            L.append(f"| | paper | {ref.replace(', ', ' | ')} | |")
    L += ["", "### Bytes crossing nodes, ED-local vs Horovod (16 GPUs)", "",
          "| model | ED-local MB/sample | Horovod MB/sample | ED-local MB per VW minibatch (forward) | "
          "Horovod MB per GPU (one ring phase) | paper (ED-local, Horovod) |", "|---|---|---|---|---|---|"]
    for m in MODELS:
        e, h = s.fig4[m]["ed-local"], s.fig4[m]["horovod"]
        L.append(f"| {m} | {e.cross_bytes_per_sample / 1e6:.2f} | {h.cross_bytes_per_sample / 1e6:.2f} | "
                 f"{e.cross_bytes_per_minibatch / 1e6:.0f} | {h.cross_bytes_per_minibatch / 1e6:.0f} | "
                 f"{PAPER_BYTES_MB[m][0]}, {PAPER_BYTES_MB[m][1]} MB |")
    L += ["", "![hetpipe](hetpipe.png)", ""]
    return "\n".join(L) + "\n"


def write(out_dir: Path, s: HetPipeSweep) -> list[Path]:
    from ...files import atomic_write_json

    doc = {"fig4": {m: {k: vars(e) for k, e in row.items()} for m, row in s.fig4.items()},
           "table4": {m: {g: {k: vars(e) for k, e in d.items()} for g, d in row.items()} for m, row in s.table4.items()}}
    atomic_write_json(Path(out_dir) / "hetpipe.json", doc)
    return [Path(out_dir) / "hetpipe.json", figure(s, Path(out_dir) / "hetpipe.png")]


SECTION = ReportSection("HetPipe: Figure 4 and Table 4", len(MODELS) * (len(FIG4) + len(GPU_SETS)),
                        lambda progress=None: sweep(progress=progress), write, markdown)
