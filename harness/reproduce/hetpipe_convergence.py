"""HetPipe's convergence figures (Figs. 5-6), trained for real with a CNN whose best loss is known.

The paper trains ResNet-152 (Fig. 5: HetPipe at D = 0 against Horovod) and VGG-19 (Fig. 6: D = 0, 4, 32
against Horovod) on ImageNet to a target accuracy and states how much sooner each reaches it. Neither
model nor ImageNet fits a CPU; here the small CNN (harness/train/cnn.py: convolutions, max-pools,
residual blocks) trains on teacher-labelled images whose floor is known, through the same runtimes, on the
testbed's 8 devices (two GPUs a node) on loopback: HetPipe ED with local placement at each D, and
Horovod, every device's compute paced as its GPU (the compute model, time-scaled so that the host does
not bound a phase; each run's overruns are in the report). A run's time to target is the elapsed time at
the first iteration whose loss, averaged over SMOOTH iterations, is within TARGET of the floor.

Time to target = samples to target (the statistics: staleness, batch, update rule) / samples per second
(the system). At the paper's scale the first comes from these runs and the second from the simulator
(VGG-19 and ResNet-152 on the 16 GPUs), so each claim is checked at both scales; the paper's numbers are
references only.
"""
from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..plan.asked import merged, request_of
from ..scenario import load_scenario
from ..systems import hetpipe as hp
from ..systems import horovod
from ..workloads.cnn import get_cnn
from . import Context, Setting
from .claims import Claim, Section

SCENARIO, PAPER_BATCH = "hetpipe-testbed", 32
#: within this share of the way from the floor to chance: the target loss
TARGET = 0.3
#: iterations averaged before comparing with the target: 640 images, so that the mean's noise (about 0.04 nats)
#: is small beside the curve's fall near the target; with 5, one run's crossing moved by 9 iterations between
#: windows of 5 and 10, while 10 and 15 agree within 5 for every run
SMOOTH = 10
MINIBATCH = 8  # HetPipe's minibatch (a VW's pipeline unit) and Horovod's per-GPU step, images
BATCH = 64  # images per iteration: 4 minibatches of each of ED's 2 VWs, one per GPU of Horovod's 8
#: SGD with momentum at the rate one process reaches the floor with on 32 images (0.02), scaled linearly with
#: the images per update for Horovod (once per 64); HetPipe updates once per minibatch of 8 in each VW, and
#: at the linear rate (0.005) its stale weights kept the loss near 1.5 (0.01 diverged): half of it
LR = {"horovod": 0.04, "hetpipe": 0.0025}
#: the compute model's time scale: the small CNN's minibatch is microseconds on these GPUs, the host's
#: Python milliseconds; at this scale its slowest phase is still held (the runs' overruns say)
TIME_SCALE = 30000.0
STALENESS = (0, 4, 32)
#: a run counts as sooner (or later) than another when its time to target differs by more than this many %:
#: runs of the same throughput and samples to target differ by timing jitter (D = 0 and D = 4: 0.04 %)
NOISE = 1.0
HETPIPE = {"policy": "ed", "ps_placement": "local"}  # ED-local, as the paper's convergence runs
RUNS = {"horovod": {"run": {"system": "horovod"}, "model": {"lr": LR["horovod"]}},
        **{f"D={d}": {"run": {"system": "hetpipe", "options": {**HETPIPE, "staleness": d}},
                      "model": {"lr": LR["hetpipe"]}} for d in STALENESS}}
#: Fig. 5's 12 GPUs at the testbed's scale: the G node left out (the paper's ResNet-152 does not fit its GPUs), a
#: scenario of V, R and Q (two GPUs each, loopback); Horovod at the same images a GPU (48 an iteration, its rate
#: scaled linearly), HetPipe at the same 64 (2 VWs of 3 GPUs)
NODES_12 = "VRQ"
RUNS_12 = {f"horovod {NODES_12}": {"run": {"system": "horovod"},
                                   "model": {"lr": LR["horovod"] * 6 / 8, "batch": 6 * MINIBATCH}},
           f"D=0 {NODES_12}": RUNS["D=0"]}
QUICK_RUNS = ("horovod", "D=0")
ITERS = {True: 48, False: 100}  # quick, full

WHY_STATS = ("at the paper's scale the samples to target are the small CNN's at the testbed's scale (2 VWs of 4 "
             "GPUs; the paper's 16 GPUs make 4), each system's throughput the simulator's for the paper's model")
WHY_SMALL = ("the small CNN's minibatch is microseconds of GPU work: the runs' links are loopback, not the "
             "testbed's InfiniBand, and its parameters are few, so synchronisation costs less than VGG-19's")


def settings() -> tuple[Setting, ...]:
    return (
        Setting("convergence runs", f"small-resnet on teacher-labelled images, {BATCH} images an iteration, "
                f"minibatches of {MINIBATCH}, SGD with momentum at lr {LR['horovod']} (Horovod) and "
                f"{LR['hetpipe']} (HetPipe, per minibatch), loopback, compute time scale {TIME_SCALE:g}",
                "no ImageNet or GPU here; the paper gives no learning rate: Horovod's scales linearly with the "
                "images per update, HetPipe's is half of that (at the linear rate its stale weights kept the loss "
                "near 1.5; twice it diverged)"),
        Setting("Fig. 5's 12 GPUs at the testbed's scale", f"the {NODES_12} nodes' 6 GPUs: Horovod at "
                f"{RUNS_12[f'horovod {NODES_12}']['model']['batch']} images an iteration, lr "
                f"{RUNS_12[f'horovod {NODES_12}']['model']['lr']:g}; HetPipe D = 0 as on 8",
                "the paper left the G node out of its 12 GPUs; Horovod keeps its images a GPU, its rate scaled "
                "linearly as on 8"),
        Setting("target", f"floor + {TARGET:g} x (chance - floor), loss averaged over {SMOOTH} iterations",
                "the paper's target accuracies (74 %, 67 %) belong to ImageNet"),
        Setting("\"x % faster\"", "x % less time to the target", "the paper's wording; its curves are not in the text"),
    )


def time_to_target(seconds: list[float], losses: list[float], target: float) -> tuple[float, int]:
    """(elapsed seconds, iterations) when the loss averaged over the last SMOOTH iterations first reaches
    `target`; (nan, -1) if it never does."""
    elapsed = np.cumsum(seconds)
    for i in range(SMOOTH - 1, len(losses)):
        if float(np.mean(losses[i - SMOOTH + 1:i + 1])) <= target:
            return float(elapsed[i]), i + 1
    return math.nan, -1


@lru_cache(maxsize=None)
def ed_local(model: str, staleness: int = 0, gpus: str | None = None) -> hp.HetPipePlan:
    """HetPipe ED-local on the paper's testbed, as its convergence runs (Sec. 8.4 reads the same plans)."""
    return hp.plan(load_scenario(SCENARIO), get_cnn(model), PAPER_BATCH, "ed", "local", staleness=staleness,
                   gpus=gpus)


def paper_scale() -> dict[str, float]:
    """Samples/s the simulator gives at the paper's scale: per claim's system, model and GPUs."""
    topo = load_scenario(SCENARIO)
    out = {"resnet152 horovod": horovod.simulate(topo, get_cnn("resnet152"), PAPER_BATCH).samples_per_s,
           "resnet152 D=0 12": ed_local("resnet152", gpus="VRQ12").result.samples_per_s,
           "resnet152 D=0 16": ed_local("resnet152").result.samples_per_s,
           "vgg19 horovod": horovod.simulate(topo, get_cnn("vgg19"), PAPER_BATCH).samples_per_s}
    for d in STALENESS:
        out[f"vgg19 D={d}"] = ed_local("vgg19", d).result.samples_per_s
    return out


def convergence(ctx: Context) -> list[Section]:
    """Figs. 5-6: the runs (QUICK: Horovod and D = 0 on the 8 devices only), then the claims at both scales."""
    from ..errors import HarnessError
    from ..results import read_records
    from ..scenario import write_regions
    from ..sim.compare import compare, load_measured
    from ..train.experiment import execute_many

    iters = ITERS[ctx.quick]
    base = {"compute": {"model": True, "time_scale": TIME_SCALE},
            "model": {"name": "small-resnet", "batch": BATCH, "micro_batch": MINIBATCH}}
    length = {"run": {"iters": iters, "warmup": 0, "results_root": str(ctx.out / "runs")}}
    groups = [({"scenario": SCENARIO, "devices": 8}, QUICK_RUNS if ctx.quick else tuple(RUNS))]
    if not ctx.quick:  # a network of its own: one execute_many each
        nodes = write_regions(SCENARIO, NODES_12, ctx.out / "scenarios" / f"{SCENARIO}-{NODES_12}.yaml")
        groups.append(({"scenario": str(nodes), "devices": 2 * len(NODES_12)}, tuple(RUNS_12)))
    found: dict[str, Path] = {}
    asked_of = {**RUNS, **RUNS_12}
    for network, labels in groups:
        ctx.progress(f"convergence: {', '.join(labels)} on {Path(network['scenario']).stem} ({network['devices']} "
                     f"devices, loopback), {iters} iterations each")
        asked = [merged(merged(merged(base, {"network": {**network, "mode": "none"}}), asked_of[k]), length)
                 for k in labels]
        results = execute_many([request_of(a) for a in asked])
        failed = [(label, r) for label, r in zip(labels, results) if not isinstance(r, Path)]
        if failed:
            raise HarnessError(f"reproduce hetpipe: convergence run {failed[0][0]} did not finish: "
                               f"{failed[0][1] or 'not started'}")
        found.update(zip(labels, results))
    ctx.found["convergence"] = found
    manifests = {k: json.loads((r / "manifest.json").read_text()) for k, r in found.items()}
    floor = manifests["horovod"]["data"]["loss_floor"]  # the teacher's: the same for every run
    target = floor + TARGET * (math.log(10) - floor)
    runs = {}
    for label, r in found.items():
        recs = read_records(r / "records.csv")
        seconds, losses = [x["seconds"] for x in recs], [x["loss"] for x in recs]
        t, n = time_to_target(seconds, losses, target)
        runs[label] = {"seconds": seconds, "losses": losses, "time": t, "iterations": n,
                       "batch": int(manifests[label]["spec"]["model"]["batch"]),
                       "overruns": sum(int(x["compute_overruns"]) for x in recs),
                       "simulated": compare(load_measured(r))[0].simulated_s}  # the simulator's run, no fitting
    ctx.progress("convergence: the paper's scale (simulated throughput)")
    _figure(runs, floor, target, ctx.out / "convergence.png")
    return [convergence_section(runs, paper_scale(), floor, target)]


def recorded_waits(runs: dict[str, Path]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """D -> (waiting, idle) per gate of the 8-device HetPipe runs among `runs` (label -> run directory), from
    their minibatches.csv (wsp.recorded_gate_waits); runs without a gate are left out."""
    from ..results import read_minibatches
    from ..systems.hetpipe import wsp

    out = {}
    for d in STALENESS:
        run = runs.get(f"D={d}")
        if run is None:
            continue
        n_m = json.loads((run / "manifest.json").read_text())["placement"]["N_m"]
        waiting, idle = wsp.recorded_gate_waits(read_minibatches(run / "minibatches.csv"), n_m)
        if len(waiting):
            out[d] = (waiting, idle)
    return out


def convergence_section(runs: dict[str, dict], sps: dict[str, float], floor: float, target: float) -> Section:
    """The claims of Figs. 5-6 from the runs' times to target (testbed scale) and their samples to target over
    the simulator's samples/s (paper scale); a claim whose runs are missing is "not run"."""
    rows = "\n".join(
        f"| {k} | {np.mean(r['seconds']):.2f} | {r['simulated']:.2f} | "
        f"{'-' if r['iterations'] < 0 else r['iterations']} | "
        f"{'-' if r['iterations'] < 0 else r['iterations'] * r['batch']} | {r['time']:.1f} | "
        f"{r['time'] / TIME_SCALE * 1e3:.2f} | {r['losses'][-1]:.3f} | {r['overruns']} |" for k, r in runs.items())
    s = Section("Figs. 5-6: convergence against Horovod and against D (trained for real)",
                text=f"The small CNN on teacher-labelled images (floor {floor:.3f} nats, chance {math.log(10):.3f}; "
                     f"target {target:.3f}) on the testbed's 8 devices (runs marked {NODES_12}: 6, the G node left "
                     "out, as the paper's 12 GPUs of Fig. 5), loopback, every device paced as its GPU (time "
                     f"scale {TIME_SCALE:g}; an overrun is a phase whose computation outran its modelled time, of "
                     "thousands a run); *simulated* is the simulator's prediction of each run's iteration (sim "
                     "compare: the same compute model, the testbed's links where loopback has none). Time to target = "
                     "samples to target / samples per second: the paper-scale column divides each run's samples "
                     "to target by the simulator's samples/s for the paper's model and GPUs.\n\n"
                     "| run | s per iteration | simulated s | iterations to target | samples to target | seconds to "
                     "target | modelled GPU ms to target | last loss | compute overruns |\n"
                     "|---|---|---|---|---|---|---|---|---|\n"
                     + rows,
                plots=["convergence.png"])
    time = {k: r["time"] for k, r in runs.items()}
    samples = {k: (r["iterations"] * r["batch"] if r["iterations"] > 0 else math.nan) for k, r in runs.items()}

    def ran(run: str) -> str:
        """A run of the G node left out, or where it did not run (QUICK), its 8-device counterpart."""
        return run if run in runs else run.split()[0]

    def change(base: tuple, other: tuple, later: bool) -> tuple[float | None, float | None]:
        """% less time `other` takes than `base` (later: % more), at the paper's scale and measured; each a
        (run, its system at the paper's scale: a key of `sps`)."""
        (b, b_sps), (o, o_sps) = (ran(base[0]), base[1]), (ran(other[0]), other[1])
        if b not in runs or o not in runs:
            return None, None
        pct = (lambda x, y: 100.0 * (y / x - 1)) if later else (lambda x, y: 100.0 * (1 - y / x))
        return pct(samples[b] / sps[b_sps], samples[o] / sps[o_sps]), pct(time[b], time[o])

    horovod_12, d0_12 = (f"{k} {NODES_12}" for k in ("horovod", "D=0"))
    checks = [
        (Claim("Fig. 5", "ResNet-152: HetPipe (12 GPUs, D = 0) reaches the target sooner than Horovod (12)",
               "Sec. 8.4", paper=35.0, above=NOISE, unit="%", why=WHY_STATS),
         (horovod_12, "resnet152 horovod"), (d0_12, "resnet152 D=0 12")),
        (Claim("Fig. 5", "ResNet-152: HetPipe (16 GPUs, D = 0) sooner than Horovod (12)", "Sec. 8.4", paper=39.0,
               above=NOISE, unit="%", why=WHY_STATS), (horovod_12, "resnet152 horovod"), ("D=0", "resnet152 D=0 16")),
        (Claim("Fig. 6", "VGG-19: HetPipe D = 0 sooner than Horovod", "Sec. 8.4", paper=29.0, above=NOISE, unit="%",
               why=WHY_STATS), ("horovod", "vgg19 horovod"), ("D=0", "vgg19 D=0")),
        (Claim("Fig. 6", "VGG-19: D = 4 sooner than D = 0", "Sec. 8.4", paper=28.0, above=NOISE, unit="%",
               why=WHY_SMALL), ("D=0", "vgg19 D=0"), ("D=4", "vgg19 D=4")),
        (Claim("Fig. 6", "VGG-19: D = 4 sooner than Horovod", "Sec. 8.4", paper=49.0, above=NOISE, unit="%",
               why=WHY_STATS), ("horovod", "vgg19 horovod"), ("D=4", "vgg19 D=4")),
        (Claim("Fig. 6", "VGG-19: D = 32 later than D = 4 (global staleness)", "Sec. 8.4", paper=4.7, above=NOISE,
               unit="%", why=WHY_SMALL), ("D=4", "vgg19 D=4"), ("D=32", "vgg19 D=32")),
    ]
    for claim, base, other in checks:
        later = claim.text.endswith("(global staleness)")  # the one claim of a run taking longer
        sim, emu = change(base, other, later)
        s.add(claim, sim, measured=emu, note=f"runs {ran(base[0])}, {ran(other[0])}; simulated samples/s: "
                                            f"{base[1]} {sps[base[1]]:.0f}, {other[1]} {sps[other[1]]:.0f}")
    return s


def _figure(runs: dict[str, dict], floor: float, target: float, out: Path) -> None:
    import matplotlib.pyplot as plt

    from ..plots.figures import save_figure

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, r in runs.items():
        ax.plot(np.cumsum(r["seconds"]) / TIME_SCALE * 1e3, r["losses"], label=label)
    ax.axhline(floor, color="k", ls=":", label="floor")
    ax.axhline(target, color="gray", ls="--", label="target")
    ax.set_xlabel("modelled GPU time (ms)")
    ax.set_ylabel("training loss (nats)")
    ax.set_title(f"Figs. 5-6 at the testbed's scale: small CNN, 8 GPUs ({NODES_12}: 6)")
    ax.legend()
    save_figure(fig, out)
    plt.close(fig)
