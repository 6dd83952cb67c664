"""OWL at the testbed's scale: every strategy's round run for real through the emulated cluster (harness/systems/owl/),
each beside the flow simulator's prediction of that round at the run's scales (systems/owl/compare.py), in the
settings of Figs. 7, 8, 9, 10a, 10b and 11 and Sec. 4.4, and on a geo-distributed federation the paper could not
try.

Eight or ten workers (whole racks) and the server: the most this machine's emulated CPU runs at a dilation its
probe chooses in a few minutes a setting (twenty workers with `tiny`: naive and OWL at 4 and 20 workers measure Fig.
7's widening gap). The settings of the paper's main comparison (Fig. 7) and the geo-distributed one run
`mini-inception` (Inception-v4's shape at CIFAR's size, 0.50 M parameters), the others
`tiny` (0.05 M), which keeps each boot to about four minutes here: a rack of 8 (Fig. 10a; with OWL-A, OWL-B and
OWL-DE, Fig. 10b's ablations and Sec. 4.4's decentralized deployment, which a rack of 2 leaves no room to differ),
no racks (Fig. 11), and racks of 2 at alpha 0.2 and 1 (Fig. 9: a boot each, one probe for both).
Each setting is a probe boot and a boot per alpha, written to emu/<setting>/ as `harness fl --backend emu`
writes a run.
"""
from __future__ import annotations

import json

from ..files import atomic_write_json, atomic_write_text
from ..results import new_run_id
from ..systems.owl.compare import compare_fl
from ..systems.owl.emulated import EmuSetting, emulated_federation, run_recorded
from ..workloads.fl.activity import computation_seconds
from ..workloads.fl.federation import federation, load_topology
from ..workloads.fl.models import get_branchy
from ..workloads.fl.records import as_json
from ..workloads.fl.strategies import eq15
from . import Context
from .claims import Claim, Section

BATCH = 4
BASELINES = ("naive", "overlap", "ipart")
STRATEGIES = BASELINES + ("owl", "optimal")
ABLATIONS = ("owl-a", "owl-b", "owl-de")  # Fig. 10b's and Sec. 4.4's, where a rack of 8 gives them room
ALPHAS = (0.2, 1.0)  # Fig. 9's ends
WIDENING_WORKERS = (4, 20)  # Fig. 7's gap against the workers: naive and OWL at each (20: ~4 min a boot here)


def _run(label: str, scenario: str, devices: int | None, model: str, what: str, figure: str, where: str,
         strategies=STRATEGIES, alphas=(None,), widening: bool = False, breakdown: bool = False) -> dict:
    return dict(label=label, scenario=scenario, devices=devices, model=model, what=what, figure=figure, where=where,
                strategies=strategies, alphas=alphas, widening=widening, breakdown=breakdown)


RUNS = (_run("testbed", "owl-testbed", 10, "mini-inception", "racks of 2 (five racks, alpha 0.5)", "Fig. 7",
             "Sec. 6.2", breakdown=True),
        _run("8x10", "owl-8x10", 8, "tiny", "one rack of 8: a central worker relays to 7 peers through its one "
             "interface, the server's uplink B_inter at alpha 0.5", "Fig. 10a", "Sec. 6.3.2",
             strategies=STRATEGIES + ABLATIONS, alphas=(0.5,)),
        _run("norack", "owl-norack", 10, "tiny", "no racks: every worker a peer of every other", "Fig. 11", "Sec. 6.5"),
        _run("regional", "owl-regional", None, "mini-inception", "geo-distributed: case 4's regions as racks of 2, "
             "the server in California", "beyond the paper", "issue 82"),
        *(_run(f"workers-{w}", "owl-testbed", w, "tiny", f"racks of 2, {w} workers", "Fig. 7", "Sec. 6.2",
               strategies=("naive", "owl"), widening=True) for w in WIDENING_WORKERS),
        _run("alpha", "owl-testbed", 10, "tiny", "racks of 2 at alpha 0.2 and 1 (a boot each)", "Fig. 9",
             "Sec. 6.3.1", strategies=("ipart", "owl"), alphas=ALPHAS))
QUICK_RUNS = ("regional",)

WHY_SCALE = ("at the testbed's scale the model is small (0.05 M or 0.50 M parameters) on twenty workers or fewer: "
             "set-up and delays weigh more against its bytes than against Inception-v4's")


class _Progress:
    """A stream for run_recorded's lines (the probe, the dilation, each round) that says them as progress."""

    def __init__(self, say):
        self.say, self.buf = say, ""

    def write(self, text: str) -> None:
        self.buf += text
        *lines, self.buf = self.buf.split("\n")
        for line in lines:
            if line.strip():
                self.say(line.strip())

    def flush(self) -> None:
        pass


def _write(out, records) -> None:
    atomic_write_json(out / "records.json", as_json(records))


def emulated(ctx: Context) -> list[Section]:
    runs = [r for r in RUNS if not ctx.quick or r["label"] in QUICK_RUNS]
    s = Section("At the testbed's scale: every strategy measured through the emulated cluster, each predicted",
                text=f"`mini-inception` or `tiny` (batch {BATCH} a worker; the claims say which), eight or ten "
                     "workers and the server, each a process in the emulated cluster over the scenario's shaped links "
                     "(the server's uplink and every worker's interface one shaped limit each), at the dilation a "
                     "probe boot chose; each round beside the flow simulator's prediction at the run's scales, "
                     "uncalibrated. The rounds side by side: `emu.md`."
                     + (" QUICK: the geo-distributed federation only." if ctx.quick else ""))
    table = ["| setting | model | alpha | strategy | measured s | predicted s | error | emulated CPU busy | measured |",
             "|---|---|---|---|---|---|---|---|---|"]
    by_workers = {}  # the widening runs: workers -> OWL's round / naive's, (predicted, measured)
    for run in runs:
        ctx.progress(f"emulated: {run['label']}, {run['what']} (a probe boot, then the rounds)")
        topo, model = load_topology(run["scenario"], run["devices"]), get_branchy(run["model"])
        out = ctx.out / "emu" / run["label"]
        feds = [federation(topo, a) for a in run["alphas"]]
        records, _, head = run_recorded(topo, feds, model, list(run["strategies"]), BATCH, EmuSetting(), out,
                                        run_id=new_run_id("fl"), stream=_Progress(ctx.progress),
                                        finish=lambda recs, _s, _h, out=out: _write(out, recs))
        rows = {(c.record.alpha, c.record.strategy): c for c in compare_fl(records)}
        for c in rows.values():
            busy = "-" if c.record.cpu_busy is None else f"{c.record.cpu_busy:.0%}"
            table.append(f"| {run['label']} | {run['model']} | {c.record.alpha:g} | {c.record.strategy} | "
                         f"{c.record.seconds:.3f} | {c.simulated.seconds:.3f} | {c.error:+.1%} | {busy} | "
                         f"{c.measured_what} |")
        note = f"{head['line']}; largest error {max(abs(c.error) for c in rows.values()):.1%}"
        found = _claims(run, rows, feds) + (_breakdown(run, rows, feds[0], model) if run["breakdown"] else [])
        for claim, predicted, measured in found:
            s.add(claim, predicted, measured, note=note)
        if run["widening"]:
            owl, naive = rows[(round(feds[0].alpha, 6), "owl")], rows[(round(feds[0].alpha, 6), "naive")]
            by_workers[feds[0].workers] = (owl.simulated.seconds / naive.simulated.seconds,
                                           owl.record.seconds / naive.record.seconds)
    if len(by_workers) > 1:
        few, most = min(by_workers), max(by_workers)
        s.add(Claim("Fig. 7", f"racks of 2, `tiny`: the gap to naive widens with the workers (OWL's round / naive's "
                    f"at {most} workers over that at {few})", "Sec. 6.2", below=1.0, unit="x", why=WHY_SCALE),
              by_workers[most][0] / by_workers[few][0], by_workers[most][1] / by_workers[few][1],
              note="each number of workers a boot of its own, at the dilation its probe chose")
    atomic_write_text(ctx.out / "emu.md", "# OWL's strategies at the testbed's scale, measured and predicted\n\n"
                      + "\n".join(table) + "\n")
    return [s]


def _claims(run: dict, rows: dict, feds: list) -> list[tuple[Claim, float, float]]:
    """A run's claims, each (claim, predicted, measured) from its rounds (`rows`: (alpha, strategy) -> comparison)."""
    def seconds(alpha, n, of="seconds"):
        c = rows[(round(alpha, 6), n)]
        return getattr(c.simulated, of), getattr(c.record, of)

    def ratio(alpha, a, b, of="seconds"):
        (pa, ma), (pb, mb) = seconds(alpha, a, of), seconds(alpha, b, of)
        return pa / pb, ma / mb

    head = f"{run['label']} ({run['what']}; {run['model']})"
    out = []
    if len(feds) > 1:  # Fig. 9: OWL against IPart at each alpha
        cut = {a: [100 * (1 - v) for v in ratio(fed.alpha, "owl", "ipart")] for a, fed in zip(run["alphas"], feds)}
        for a in run["alphas"]:
            out.append((Claim("Fig. 9", f"{head}: OWL cuts IPart's round at alpha {a:g}", run["where"], above=0.0,
                              unit="%", why=WHY_SCALE), *cut[a]))
        lo, hi = run["alphas"][0], run["alphas"][-1]
        out.append((Claim("Fig. 9", f"{head}: the gap widens as alpha falls (cut at {lo:g} less cut at {hi:g}, "
                          "points)", run["where"], above=0.0, unit="points", why=WHY_SCALE),
                    cut[lo][0] - cut[hi][0], cut[lo][1] - cut[hi][1]))
        return out
    alpha = feds[0].alpha
    for of in [n for n in ("naive", "ipart") if n in run["strategies"]]:
        out.append((Claim(run["figure"], f"{head}: OWL's round / {of}'s", run["where"], below=1.0, unit="x",
                          why=WHY_SCALE), *ratio(alpha, "owl", of)))
    if "owl-a" in run["strategies"]:
        why = ("a rack of 8 in one emulated region: OWL-A's one relay and OWL-B's random groups cost what the "
               "simulator says they cost at the run's scales")
        for n, label in (("owl-a", "OWL-A"), ("owl-b", "OWL-B")):
            out.append((Claim("Fig. 10b", f"{head}: {label} slower than OWL (its round / OWL's)", "Sec. 6.4",
                              above=1.0, unit="x", why=why), *ratio(alpha, n, "owl")))
        D = {n: json.loads(rows[(round(alpha, 6), n)].record.config).get("D") for n in ("owl", "owl-de")}
        n_rack = feds[0].racks[0]
        out.append((Claim("Sec. 4.4", f"{head}: t_ce / t_de, OWL's distribution over OWL-DE's (D = {D['owl']} and "
                          f"{D['owl-de']}; the paper: eq. 15)", "eq. 15",
                          paper=eq15(alpha, D["owl"], n_rack) if D["owl"] == D["owl-de"] else None,
                          below=1.0 + 1e-6, unit="x",
                          why="eq. 15 counts the bytes alone; a round's set-up and delays weigh on both deployments"),
                    *ratio(alpha, "owl", "owl-de", "distribution_seconds")))
    return out


def _breakdown(run: dict, rows: dict, fed, model) -> list[tuple[Claim, float, float]]:
    """Fig. 8 at the testbed's scale: each worker's layers are held to their modelled seconds (x the run's
    compute_time_scale), so its computation is known and the round is measured: communication share = 1 -
    computation / round (8a), GPU busy share = computation / round (8b, as fl/activity.py reads it)."""
    head = f"{run['label']} ({run['what']}; {run['model']})"
    alpha = round(fed.alpha, 6)
    rec = rows[(alpha, "owl")].record
    scaled = emulated_federation(fed, rec.bandwidth_scale, rec.compute_time_scale)
    compute = float(computation_seconds(model, scaled, BATCH).max())
    names = [n for n in BASELINES if (alpha, n) in rows]
    busy = {n: (compute / rows[(alpha, n)].simulated.seconds, compute / rows[(alpha, n)].record.seconds)
            for n in names + ["owl"]}
    why = ("at the testbed's scale as at the paper's the round is mostly the server's sends; a share like the "
           "paper's needs a computation as long as the distribution")
    return [(Claim("Fig. 8a", f"{head}: OWL's communication share of a round", "Sec. 6.2", paper=12.0, unit="%",
                   why=why), *(100 * (1 - b) for b in busy["owl"])),
            (Claim("Fig. 8b", f"{head}: OWL's GPU busy share above every baseline's (OWL's / the largest "
                   "baseline's)", "Sec. 6.2", above=1.0, unit="x"),
             *(busy["owl"][k] / max(busy[n][k] for n in names) for k in (0, 1)))]
