"""OWL (Han et al. 2024; seed 002): its evaluation (Sec. 6) regenerated on `owl-testbed` and its device settings.

Fig. 7 (training time against the number of workers, with the offline optimum), Fig. 8 (the round's
communication share; GPU memory utilization), Fig. 9 (alpha), Fig. 10a (rack settings), Fig. 10b (the OWL-A /
OWL-B ablation), Fig. 11 (no racks: `owl-norack`) and Sec. 4.4's centralized against decentralized deployment
(eqs. 13-15), each simulated at the paper's scale by harness/workloads/fl/ (DFN and Inception-v4, up to 100
workers), and every strategy measured at the testbed's scale through the emulated cluster (owl_emulated.py).
The paper's numbers come from its text (its figures' bars are not in the text: those claims are the
directions the text states); where it gives a range ("63-69 %") the claim is its middle and the text its range.
"""
from __future__ import annotations

import numpy as np

from ..workloads.fl import activity
from ..workloads.fl import strategies as st
from ..workloads.fl.federation import load_federation
from ..workloads.fl.models import get_branchy
from . import Context, Paper, Part, Setting, owl_emulated
from .claims import Claim, Section

SCENARIO, NORACK, BATCH = "owl-testbed", "owl-norack", 32
MODELS = ("dfn", "inception-v4")
NAMES = {"dfn": "DFN", "inception-v4": "Inception-v4"}
WORKERS = (10, 20, 50, 100)  # whole racks of the testbed's 2 (and whole workers without racks)
ALPHAS = (0.2, 0.4, 0.6, 0.8, 1.0)
RACK_SETTINGS = {"2x50": SCENARIO, "4x20": "owl-4x20", "8x10": "owl-8x10"}
BASELINES = ("naive", "overlap", "ipart")
OWL_B_SEEDS = range(5)  # OWL-B's random groupings: the mean of this many draws

WHY_UPLINK = ("in the model the server's uplink (B_inter) carries every copy of the model it sends: naive one to "
              "every worker, OWL one to every rack, so with racks of 2 OWL's round is about half of naive's; a cut "
              "beyond 50 % needs a server that is not the bottleneck the paper describes")
WHY_BASELINES = ("a CIFAR-sized forward takes milliseconds against seconds of distribution, so overlapping the two "
                 "(Overlap, IPart) saves little and both stay near naive: OWL's lead over them is its lead over naive")
WHY_COMM = ("the round is almost all distribution through the server's uplink (Fig. 7); the paper's share needs a much "
            "faster server, or a much longer computation, than its testbed's 10 Gbps and CIFAR-10 give")
WHY_RACKS = ("with racks of n the server sends a model per rack, not per worker: OWL's round is about 1/n of naive's "
             "(a cut of at most 87.5 % at 8x10, 75 % at 4x20)")
WHY_NORACK = ("without racks the model leaves the server once and the workers relay it to one another, while IPart's "
              "server sends it to every worker: in the model OWL's lead grows with the workers far past the paper's")
WHY_DFN = ("OWL's DFN is not described in the seed; harness/workloads/fl/models.py's stand-in (fused blocks of "
           "two branches) is 6.9 % larger than the paper's")


def _rounds(scenario: str, devices: int | None, model: str, names, alpha: float | None = None) -> dict:
    fed = load_federation(scenario, devices, alpha)
    m = get_branchy(model)
    return {n: st.run(n, m, fed, BATCH) for n in names}


def _cut(rounds: dict, of: str, by: str = "owl") -> float:
    """How much `by` cuts `of`'s training time, in per cent."""
    return 100 * (1 - rounds[by].seconds / rounds[of].seconds)


def _plot(name: str, ctx: Context, panels: list[tuple[str, list[str], dict, str]]) -> str:
    import matplotlib.pyplot as plt

    from .. import plots
    from ..plots.figures import save_figure

    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (title, xlabels, series, ylabel) in zip(axes[0], panels):
        plots.lines(ax, xlabels, series, ylabel, title)
    save_figure(fig, ctx.out / f"{name}.png")
    plt.close(fig)
    return f"{name}.png"


def fig7(ctx: Context) -> list[Section]:
    names = BASELINES + ("owl", "oos")
    sections, panels, widening = [], [], {}
    for model in MODELS:
        by_w = {}
        for w in WORKERS:
            ctx.progress(f"fig. 7: {model}, {w} workers")
            by_w[w] = _rounds(SCENARIO, w, model, names)
        most = WORKERS[-1]
        ctx.progress(f"fig. 7: {model}, {most} workers, the optimal grouping (local search)")
        best = _rounds(SCENARIO, most, model, ("optimal",))["optimal"]
        top = by_w[most]
        norm = {n: [by_w[w][n].seconds / by_w[w]["naive"].seconds for w in WORKERS] for n in names}
        panels.append((f"Fig. 7, {NAMES[model]}: training time / naive's (simulated)", [str(w) for w in WORKERS], norm,
                       "normalised training time"))
        widening[model] = norm["owl"][-1] / norm["owl"][0]
        s = Section(f"Fig. 7 ({NAMES[model]}): training time against the number of workers",
                    text=f"{', '.join(map(str, WORKERS))} workers in racks of 2 (alpha 0.5), one round each of "
                         "naive, overlap, IPart, OWL and the offline optimum (`oos`: the rack-fed fluid bound), "
                         "normalised to naive's; `optimal` (a local search over every base's groupings from OWL's "
                         f"plan) at {most} workers.")
        for of, paper, rng in (("naive", 66, "63-69"), ("overlap", 28.5, "27-30"), ("ipart", 22, "20-24")):
            s.add(Claim("Fig. 7", f"{NAMES[model]}, {most} workers: OWL cuts {of}'s training time (the paper: {rng} %)",
                        "Sec. 6.2", paper=paper, above=0.0, unit="%",
                        why=WHY_UPLINK if of == "naive" else WHY_BASELINES), _cut(top, of))
        s.add(Claim("Fig. 7", f"{NAMES[model]}, {most} workers: OWL within 10 % of the offline optimum (OWL / OOS - 1)",
                    "Sec. 6.2", below=10.0, unit="%"), 100 * (top["owl"].seconds / top["oos"].seconds - 1),
              note=f"OWL / optimal (local search, {best.config['searched']} plans) - 1: "
                   f"{100 * (top['owl'].seconds / best.seconds - 1):.2f} %")
        s.add(Claim("Fig. 7", f"{NAMES[model]}: the gap to naive widens with the workers (OWL's normalised time at "
                    f"{WORKERS[-1]} / at {WORKERS[0]})", "Sec. 6.2", below=1.0, unit="x"), widening[model])
        sections.append(s)
    sections[-1].add(Claim("Fig. 7", "the widening is more pronounced for Inception-v4 than DFN (DFN's ratio above / "
                           "Inception-v4's)", "Sec. 6.2", above=1.0, unit="x", why=WHY_DFN),
                     widening["dfn"] / widening["inception-v4"])
    sections[-1].plots.append(_plot("fig7", ctx, panels))
    return sections


def fig8(ctx: Context) -> list[Section]:
    """Fig. 8a: the share of a round that is communication: the round less the slowest worker's computation.
    Fig. 8b: the share of the round the workers' GPU memory is read or written (activity.py: while kernels run)."""
    most = WORKERS[-1]
    s = Section(f"Fig. 8: time breakdown and GPU memory utilization at {most} workers",
                text="Fig. 8a: communication share = 1 - (forward + backward computation of the slowest worker) / "
                     f"round, at {most} workers in racks of 2. Fig. 8b: GPU memory utilization, nvidia-smi's "
                     "(the share of time device memory is read or written), modelled as the share of the round a "
                     "worker's GPU runs kernels (each forward layer as the simulator schedules it, then the "
                     "backward; parameters landing at the network's rate barely touch device memory), the "
                     "workers' mean; `fig8b.png` draws it over one round.")
    timelines = {}
    for model in MODELS:
        ctx.progress(f"fig. 8: {model}")
        fed, m = load_federation(SCENARIO, most), get_branchy(model)
        compute = float(activity.computation_seconds(m, fed, BATCH).max())
        rounds = _rounds(SCENARIO, most, model, BASELINES + ("owl",))
        share = {n: 100 * (1 - compute / r.seconds) for n, r in rounds.items()}
        s.add(Claim("Fig. 8a", f"{NAMES[model]}: OWL's communication share of a round", "Sec. 6.2", paper=12.0,
                    unit="%", why=WHY_COMM), share["owl"],
              note=f"computation {compute * 1e3:.1f} ms of {rounds['owl'].seconds:.2f} s")
        s.add(Claim("Fig. 8a", f"{NAMES[model]}: OWL's communication share below every baseline's (OWL's / the "
                    "smallest baseline's)", "Sec. 6.2", below=1.0, unit="x"),
              share["owl"] / min(share[n] for n in BASELINES))
        busy = {n: activity.busy_intervals(m, fed, BATCH, r) for n, r in rounds.items()}
        memory = {n: 100 * activity.busy_share(busy[n], rounds[n].seconds) for n in rounds}
        timelines[model] = {n: activity.busy_over_time(busy[n], rounds[n].seconds) for n in rounds}
        s.add(Claim("Fig. 8b", f"{NAMES[model]}: OWL's average GPU memory utilization over a round", "Sec. 6.2",
                    paper=83.0, unit="%", why=WHY_COMM),
              memory["owl"], note=", ".join(f"{n} {memory[n]:.2f} %" for n in BASELINES))
        s.add(Claim("Fig. 8b", f"{NAMES[model]}: OWL's GPU memory utilization above every baseline's (OWL's / the "
                    "largest baseline's)", "Sec. 6.2", above=1.0, unit="x"),
              memory["owl"] / max(memory[n] for n in BASELINES))
    s.plots.append(_plot_busy(ctx, timelines))
    return [s]


def _plot_busy(ctx: Context, timelines: dict) -> str:
    """Fig. 8b's drawing: the workers' mean GPU memory utilization in each 1 % of one round, per strategy."""
    import matplotlib.pyplot as plt

    from ..plots import series_style
    from ..plots.figures import save_figure

    fig, axes = plt.subplots(1, len(timelines), figsize=(5.5 * len(timelines), 4), squeeze=False)
    for ax, (model, by_name) in zip(axes[0], timelines.items()):
        for n, (t, busy) in by_name.items():
            ax.step(t, 100 * busy, where="post", color=series_style(n)[0], label=n)
        ax.set_xlabel("seconds into the round", fontsize=8)
        ax.set_ylabel("GPU memory utilization, %", fontsize=8)
        ax.set_title(f"Fig. 8b, {NAMES[model]}: {WORKERS[-1]} workers (simulated)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save_figure(fig, ctx.out / "fig8b.png")
    plt.close(fig)
    return "fig8b.png"


def fig9(ctx: Context) -> list[Section]:
    sections, panels, gap = [], [], {}
    for model in MODELS:
        cut = []
        for a in ALPHAS:
            ctx.progress(f"fig. 9: {model}, alpha {a:g}")
            r = _rounds(SCENARIO, None, model, ("ipart", "owl"), a)
            cut.append(_cut(r, "ipart"))
        panels.append((f"Fig. 9, {NAMES[model]}: OWL's cut of IPart's time, % (simulated)", [f"{a:g}" for a in ALPHAS],
                       {"owl vs ipart": cut}, "per cent"))
        gap[model] = cut
        s = Section(f"Fig. 9 ({NAMES[model]}): OWL against IPart over alpha",
                    text=f"100 workers in racks of 2, alpha = B_inter / B_intra in {', '.join(map(str, ALPHAS))} (the "
                         "server's uplink is B_inter: it moves with alpha); OWL's cut of IPart's training time.")
        s.add(Claim("Fig. 9", f"{NAMES[model]}: OWL beats IPart at every alpha (the smallest cut)", "Sec. 6.3.1",
                    paper=16.7 if model == "inception-v4" else None, above=0.0, unit="%", why=WHY_BASELINES), min(cut))
        if model == "inception-v4":
            s.add(Claim("Fig. 9b", "Inception-v4: OWL's cut of IPart at alpha 1", "Sec. 6.3.1", paper=19.0, above=0.0,
                        unit="%", why=WHY_BASELINES), cut[-1])
            s.add(Claim("Fig. 9b", "Inception-v4: OWL's cut of IPart at alpha 0.2", "Sec. 6.3.1", paper=29.0,
                        above=0.0, unit="%", why=WHY_BASELINES), cut[0])
        s.add(Claim("Fig. 9", f"{NAMES[model]}: the gap widens as alpha falls (cut at 0.2 less cut at 1, points)",
                    "Sec. 6.3.1", above=0.0, unit="points",
                    why="in the model a rack of 2 pulls one model through B_inter and the server's uplink moves with "
                        "alpha, so OWL's and IPart's times scale alike with 1 / alpha"), cut[0] - cut[-1])
        sections.append(s)
    sections[0].add(Claim("Fig. 9a", "DFN's gap smaller than Inception-v4's (at alpha 0.2, DFN's cut / "
                          "Inception-v4's)", "Sec. 6.3.1", below=1.0, unit="x", why=WHY_DFN),
                    gap["dfn"][0] / gap["inception-v4"][0])
    sections[-1].plots.append(_plot("fig9", ctx, panels))
    return sections


def fig10a(ctx: Context) -> list[Section]:
    model = "inception-v4"
    s = Section("Fig. 10a: device settings",
                text="Inception-v4 (the paper does not say which model), alpha 0.5, the testbed's workers as 50 "
                     "racks x 2, 20 x 4 and 10 x 8; OWL's cut of naive's training time.")
    cut = {}
    for label, scenario in RACK_SETTINGS.items():
        ctx.progress(f"fig. 10a: {label}")
        cut[label] = _cut(_rounds(scenario, None, model, ("naive", "owl")), "naive")
    s.add(Claim("Fig. 10a", "8 GPUs x 10 racks: OWL's cut of naive's time", "Sec. 6.3.2", paper=58.0, above=0.0,
                unit="%", why=WHY_RACKS), cut["8x10"])
    s.add(Claim("Fig. 10a", "4 GPUs x 20 racks: OWL's cut of naive's time", "Sec. 6.3.2", paper=43.0, above=0.0,
                unit="%", why=WHY_RACKS), cut["4x20"])
    s.add(Claim("Fig. 10a", "more GPUs a rack, fewer racks: a larger cut (8x10 less 4x20, points)", "Sec. 6.3.2",
                above=0.0, unit="points"), cut["8x10"] - cut["4x20"], note=f"2x50: {cut['2x50']:.1f} %")
    return [s]


def fig10b(ctx: Context) -> list[Section]:
    s = Section("Fig. 10b: the ablation (OWL-A without the deploying algorithm, OWL-B without the grouping one)",
                text="100 workers in racks of 2, alpha 0.5. OWL-A: Algorithm 1's groups at D = n, every group through "
                     "the rack's first worker; OWL-B: Algorithm 2 over random groupings (the mean of "
                     f"{len(OWL_B_SEEDS)} draws). Training time over OWL's.")
    for model in MODELS:
        ctx.progress(f"fig. 10b: {model}")
        fed, m = load_federation(SCENARIO), get_branchy(model)
        owl = st.run("owl", m, fed, BATCH).seconds
        a = 100 * (st.run("owl-a", m, fed, BATCH).seconds / owl - 1)
        b = 100 * (float(np.mean([st.owl_b(m, fed, BATCH, seed).seconds for seed in OWL_B_SEEDS])) / owl - 1)
        why = ("racks of 2 leave one relay per group and the server's uplink decides the round, so how the groups "
               "are made and deployed moves it little")
        s.add(Claim("Fig. 10b", f"{NAMES[model]}: OWL-A slower than OWL (time / OWL's - 1)", "Sec. 6.4",
                    paper=9.0 if model == "inception-v4" else None, above=0.0, unit="%", why=why), a)
        s.add(Claim("Fig. 10b", f"{NAMES[model]}: OWL-B slower than OWL (time / OWL's - 1)", "Sec. 6.4",
                    paper=14.0 if model == "inception-v4" else None, above=0.0, unit="%", why=why), b)
    return [s]


def fig11(ctx: Context) -> list[Section]:
    names = BASELINES + ("owl",)
    sections, panels = [], []
    for model in MODELS:
        by_w = {}
        for w in WORKERS:
            ctx.progress(f"fig. 11: {model}, {w} workers without racks")
            by_w[w] = _rounds(NORACK, w, model, names)
        panels.append((f"Fig. 11, {NAMES[model]}: seconds per round, no racks (simulated)", [str(w) for w in WORKERS],
                       {n: [by_w[w][n].seconds for w in WORKERS] for n in names}, "seconds"))
        top = by_w[WORKERS[-1]]
        s = Section(f"Fig. 11 ({NAMES[model]}): no racks",
                    text=f"`{NORACK}`: {', '.join(map(str, WORKERS))} workers, each its own rack, every pair and the "
                         "server at 10 Gbps; OWL's peers relay across the whole federation.")
        s.add(Claim("Fig. 11", f"{NAMES[model]}, {WORKERS[-1]} workers: OWL cuts IPart's training time", "Sec. 6.5",
                    paper=21.0 if model == "inception-v4" else 15.0, above=0.0, unit="%", why=WHY_NORACK),
              _cut(top, "ipart"))
        s.add(Claim("Fig. 11", f"{NAMES[model]}: OWL's lead over IPart grows with the workers (cut at "
                    f"{WORKERS[-1]} less at {WORKERS[0]}, points)", "Sec. 6.5", above=0.0, unit="points",
                    why=WHY_NORACK),
              _cut(top, "ipart") - _cut(by_w[WORKERS[0]], "ipart"))
        if model == "inception-v4":
            half, most = WORKERS[-2], WORKERS[-1]  # the paper's 50 and 100
            norm = {w: by_w[w]["owl"].seconds / by_w[w]["naive"].seconds for w in (half, most)}
            s.add(Claim("Fig. 11a", f"Inception-v4, {half} workers: OWL's time / naive's", "Sec. 6.5", paper=0.60,
                        unit="x", why=WHY_NORACK), norm[half])
            s.add(Claim("Fig. 11a", f"Inception-v4, {most} workers: OWL's time / naive's", "Sec. 6.5", paper=0.63,
                        unit="x", why=WHY_NORACK), norm[most])
            s.add(Claim("Fig. 11a", f"Inception-v4: OWL's normalised time grows little from {half} to {most} workers "
                        f"(at {most} less at {half}, points)", "Sec. 6.5", paper=3.0, unit="points",
                        why="without racks OWL's server sends the model once and peers relay it, so its round grows "
                            "with the relays, as naive's grows with the server's copies"),
                  100 * (norm[most] - norm[half]))
        sections.append(s)
    sections[-1].plots.append(_plot("fig11", ctx, panels))
    return sections


def deployment(ctx: Context) -> list[Section]:
    s = Section("Sec. 4.4 (eqs. 13-15, Fig. 6): centralized against decentralized deployment",
                text="Inception-v4, OWL's groups at the D Algorithm 2 chooses, deployed centralized (central workers "
                     "relay in the rack) and decentralized (every worker pulls every group from the server); the "
                     "ratio of their distribution times beside eq. 15's t_ce / t_de.")
    m = get_branchy("inception-v4")
    for label in ("4x20", "8x10"):
        for a in (0.2, 0.5, 1.0):
            ctx.progress(f"deployment: {label}, alpha {a:g}")
            fed = load_federation(RACK_SETTINGS[label], None, a)
            ce = st.run("owl", m, fed, BATCH)
            D = ce.config["D"]
            de = st.deployed("owl-de", m, fed, BATCH, D, "decentralized")
            s.add(Claim("Sec. 4.4", f"{label}, alpha {a:g}: t_ce / t_de at D = {D} (the paper: eq. 15)", "eq. 15",
                        paper=st.eq15(a, D, fed.racks[0]), below=1.0 + 1e-6, unit="x",
                        why="eq. 15 counts a rack alone; in the model every rack's pulls share the server's uplink, "
                            "which both deployments wait on"), ce.distribution_seconds / de.distribution_seconds)
    return [s]


SETTINGS = (
    Setting("minibatch", f"{BATCH} images a worker", "the paper does not state it"),
    Setting("image size", "299 x 299 (Inception-v4), 224 x 224 (DFN): the models' ImageNet inputs",
            "the paper trains on CIFAR-10 (32 x 32) without saying how the inputs were sized; the larger input "
            "only lengthens the computation, which is small beside the distribution either way"),
    Setting("GPU speed", "RTX 3080's fp32 peak x the dense-GEMM efficiency (harness/compute/profiles.py)",
            "no measured per-layer time of the testbed is at hand"),
    Setting("link latency", "25 us inside a rack, 50 us across racks and to the server", "the paper gives none"),
    Setting("the server's uplink", "B_inter (it sits behind the inter-rack fabric); without racks, 10 Gbps",
            "the paper says the server is one more machine of the testbed, on the same switch"),
    Setting("GPU memory utilization (Fig. 8b)", "the share of the round a worker's GPU runs kernels (its forward's "
            "layers as scheduled, then the backward), the workers' mean",
            "the paper's \"percentage of GPU memory used per unit time\" read as nvidia-smi's memory utilization "
            "(the share of time device memory is read or written); parameters landing at 10 Gbps barely load it"),
    Setting("OOS", "the rack-fed fluid bound: each rack's layers in forward order at the server's fair share, no "
            "set-up, no delay, fully overlapped", "the paper: \"complete overlap ... without communication delay\""),
    Setting("OWL-A", "Algorithm 1's groups at D = n, every group through the rack's first worker",
            "the paper: \"an unbalanced deploy setting is replaced\""),
    Setting("OWL-B", f"Algorithm 2 over random groupings, the mean of {len(OWL_B_SEEDS)} draws",
            "the paper: \"a random grouping is replaced\""),
    Setting("DFN", "fused blocks of a deep and a shallow path in ResNet-18's stages (27.16 M parameters)",
            "the seed does not describe DFN [38]; the paper's has 25.41 M"),
)

PAPER = Paper(
    "owl", "OWL (Han et al. 2024)", "002",
    "A server and racks of workers: before every round each worker needs the whole model, and OWL groups every "
    "base's branches (Algorithm 1) and deploys the groups through central workers that relay them inside their rack "
    "(Algorithm 2), against Naive FL, Overlap FL and IPart, on the paper's testbed (`scenarios/owl-testbed.yaml`: "
    "100 RTX 3080 in 50 racks of 2, 10 Gbps inside a rack, alpha 0.5 across).",
    parts=(Part("fig7", "Fig. 7: training time against the workers, with the offline optimum (simulated)", 40, fig7),
           Part("fig8", "Fig. 8: the round's communication share, GPU memory utilization (simulated)", 5, fig8),
           Part("fig9", "Fig. 9: OWL against IPart over alpha (simulated)", 10, fig9),
           Part("fig10a", "Fig. 10a: rack settings (simulated)", 5, fig10a),
           Part("fig10b", "Fig. 10b: the OWL-A / OWL-B ablation (simulated)", 15, fig10b),
           Part("fig11", "Fig. 11: no racks (simulated)", 20, fig11),
           Part("deployment", "Sec. 4.4: centralized against decentralized deployment, eq. 15 (simulated)", 10,
                deployment),
           Part("emulated", "at the testbed's scale: every strategy measured through the emulated cluster in the "
                "settings of Figs. 7, 8, 9, 10a, 10b, 11 and Sec. 4.4 and on a geo-distributed federation, each "
                "predicted", 1860,
                owl_emulated.emulated, quick_seconds=360, measured=True)),
    settings=SETTINGS,
)
