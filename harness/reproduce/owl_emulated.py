"""OWL at the testbed's scale: every strategy's round run for real through the emulated cluster (harness/systems/owl/),
each beside the flow simulator's prediction of that round at the run's scales (systems/owl/compare.py), in the
settings of Figs. 7, 10a and 11 and on a geo-distributed federation the paper could not try.

Eight or ten workers (whole racks) and the server: the most this machine's emulated CPU runs at a dilation its
probe chooses in a few minutes a setting. The settings of the paper's main comparison (Fig. 7) and the
geo-distributed one run `mini-inception` (Inception-v4's shape at CIFAR's size, 0.50 M parameters), the two
that show where the deployment matters (a rack of 8, no racks) `tiny` (0.05 M), which keeps each boot to
about four minutes here.
Each setting is a boot of its own (its probe first), written to emu/<setting>/ as `harness fl --backend emu`
writes a run.
"""
from __future__ import annotations

from ..files import atomic_write_json, atomic_write_text
from ..results import new_run_id
from ..systems.owl.compare import compare_fl
from ..systems.owl.emulated import EmuSetting, run_recorded
from ..workloads.fl.federation import federation, load_topology
from ..workloads.fl.models import get_branchy
from ..workloads.fl.records import as_json
from . import Context
from .claims import Claim, Section

BATCH = 4
STRATEGIES = ("naive", "overlap", "ipart", "owl", "optimal")


def _run(label: str, scenario: str, devices: int | None, model: str, what: str, figure: str, where: str) -> dict:
    return dict(label=label, scenario=scenario, devices=devices, model=model, what=what, figure=figure, where=where)


RUNS = (_run("testbed", "owl-testbed", 10, "mini-inception", "racks of 2 (five racks, alpha 0.5)", "Fig. 7",
             "Sec. 6.2"),
        _run("8x10", "owl-8x10", 8, "tiny", "one rack of 8: a central worker relays to 7 peers through its one "
             "interface", "Fig. 10a", "Sec. 6.3.2"),
        _run("norack", "owl-norack", 10, "tiny", "no racks: every worker a peer of every other", "Fig. 11", "Sec. 6.5"),
        _run("regional", "owl-regional", None, "mini-inception", "geo-distributed: case 4's regions as racks of 2, "
             "the server in California", "beyond the paper", "issue 82"))
QUICK_RUNS = ("regional",)

WHY_SCALE = ("at the testbed's scale the model is small (0.05 M or 0.50 M parameters) on ten workers or fewer: "
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
    table = ["| setting | model | strategy | measured s | predicted s | error | emulated CPU busy | measured |",
             "|---|---|---|---|---|---|---|---|"]
    for run in runs:
        ctx.progress(f"emulated: {run['label']}, {run['what']} (a probe boot, then the rounds)")
        topo, model = load_topology(run["scenario"], run["devices"]), get_branchy(run["model"])
        out = ctx.out / "emu" / run["label"]
        records, _, head = run_recorded(topo, [federation(topo)], model, list(STRATEGIES), BATCH, EmuSetting(), out,
                                        run_id=new_run_id("fl"), stream=_Progress(ctx.progress),
                                        finish=lambda recs, _s, _h, out=out: _write(out, recs))
        rows = {c.record.strategy: c for c in compare_fl(records)}
        for n in STRATEGIES:
            c = rows[n]
            busy = "-" if c.record.cpu_busy is None else f"{c.record.cpu_busy:.0%}"
            table.append(f"| {run['label']} | {run['model']} | {n} | {c.record.seconds:.3f} | "
                         f"{c.simulated.seconds:.3f} | {c.error:+.1%} | {busy} | {c.measured_what} |")
        measured = {n: rows[n].record.seconds for n in STRATEGIES}
        predicted = {n: rows[n].simulated.seconds for n in STRATEGIES}
        note = f"{head['line']}; largest error {max(abs(c.error) for c in rows.values()):.1%}"
        for of in ("naive", "ipart"):
            s.add(Claim(run["figure"], f"{run['label']} ({run['what']}; {run['model']}): OWL's round / {of}'s",
                        run["where"],
                        below=1.0, unit="x", why=WHY_SCALE),
                  predicted["owl"] / predicted[of], measured["owl"] / measured[of], note=note)
    atomic_write_text(ctx.out / "emu.md", "# OWL's strategies at the testbed's scale, measured and predicted\n\n"
                      + "\n".join(table) + "\n")
    return [s]
