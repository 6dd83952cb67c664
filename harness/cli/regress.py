"""`harness regress`: the throughput regression gate (harness/regress/) and `harness regress history`."""
from __future__ import annotations

import sys
from pathlib import Path

from . import add_alias, input_file, output_file


def register(sub) -> None:
    from ..regress import BASELINE, BASELINE_REPEATS, MEASURED_SYSTEMS, REPEATS, SUITE

    p = sub.add_parser(
        "regress",
        help="throughput regression gate: the suite's figures against the committed baseline",
        description="Computes a fixed suite of figures a regression would move and compares them with the "
                    f"committed baseline ({BASELINE.relative_to(BASELINE.parents[2])}). Exact figures (the "
                    f"scheduler's COMM-COST and the simulator's iteration seconds of every system, paper cases "
                    f"{', '.join(map(str, SUITE.cases))} at {SUITE.devices} devices, {SUITE.model}, batch "
                    f"{SUITE.batch}, seed {SUITE.seed}, budget {SUITE.budget}; the bytes on the wire per rank "
                    f"per iteration of {', '.join(SUITE.wire)} counted in short loopback runs of case 5) fail on "
                    "any change beyond float rounding. Measured figures (emulated case-5 runs of "
                    f"{', '.join(MEASURED_SYSTEMS)}, "
                    f"{REPEATS} each, {BASELINE_REPEATS} for a baseline, all in one boot of the emulated cluster; not "
                    "with --quick) fail when they moved the worse way "
                    "by more than their noise. Prints one table (figure, baseline, now, change, noise, verdict), "
                    "appends a line to the history and exits 1 on a regression.",
    )
    p.add_argument("--update-baseline", action="store_true",
                   help="renew the baseline with this commit's figures (on purpose: say why in the commit)")
    p.add_argument("--quick", action="store_true",
                   help="exact figures only, about half a minute (what CI runs); with --update-baseline the "
                        "baseline keeps its measured figures")
    p.add_argument("--debug", action="append", metavar="KEY=VALUE", default=[],
                   help="debug options of every run of the suite (repeatable; harness run --debug), e.g. "
                        "send_delay_s=0.01 or overlap=0 to plant a regression")
    p.add_argument("--baseline", type=output_file, default=BASELINE, help="baseline JSON (default: the committed one)")
    p.add_argument("--history", type=output_file, help="history file, one JSON line per run "
                                                "(default results/regress/history.jsonl)")
    p.set_defaults(func=_regress)
    hsub = p.add_subparsers(dest="regress_command", metavar="{history}")
    h = hsub.add_parser("history", help="plot every figure over the gate's runs",
                        description="One panel per figure over the runs of the history file, by commit.")
    h.add_argument("--history", dest="history_file", type=input_file,
                   help="history file (default RESULTS/regress/history.jsonl)")
    h.add_argument("--png", type=output_file, help="PNG to write (default RESULTS/regress/history.png)")
    add_alias(h, "--out", "--png")
    h.set_defaults(func=_history)


def _default(name: str) -> Path:
    from ..results import RESULTS_DIR

    return RESULTS_DIR / "regress" / name


def _regress(args) -> int:
    from .. import regress
    from ..plan.request import DebugSection
    from ..regress.history import append_history

    DebugSection.parse(args.debug)  # a bad option is one line now, not after the exact figures
    keep: dict = {}
    kept_machine = None
    if args.update_baseline:
        if args.quick and args.baseline.exists():  # renew the exact figures (and suite), keep the measured ones
            keep = {n: f for n, f in regress.read_baseline(args.baseline, same_suite=False).items()
                    if f.kind != "exact"}
            kept_machine = regress.baseline_machine(args.baseline) if keep else None  # where they were measured
        baseline = None
    else:
        baseline = regress.read_baseline(args.baseline)  # fail before the work
    say = lambda label: print(f"regress: {label}", file=sys.stderr, flush=True)  # noqa: E731
    figures = regress.exact_figures(progress=say)
    figures += regress.wire_figures(_default("runs"), tuple(args.debug), progress=say)
    if not args.quick:
        repeats = regress.BASELINE_REPEATS if args.update_baseline else regress.REPEATS
        figures += regress.measured_figures(_default("runs"), tuple(args.debug), repeats=repeats, progress=say)
    if args.update_baseline:
        regress.write_baseline(args.baseline, figures + list(keep.values()), machine_of=kept_machine)
        print(f"wrote {args.baseline} ({len(figures) + len(keep)} figures)")
        return 0
    if args.quick:  # the measured figures were not run: not missing
        baseline = {n: f for n, f in baseline.items() if f.kind == "exact"}
    same = regress.baseline_machine(args.baseline) == regress.machine()
    rows = regress.compare(baseline, figures, same_machine=same)
    print(regress.format_table(rows))
    failed = [r for r in rows if r.fails]
    history = args.history or _default("history.jsonl")
    append_history(history, figures, bool(failed))
    if failed:
        print(f"regress: {len(failed)} of {len(rows)} figures failed ({', '.join(r.figure for r in failed)}); "
              "if the change is intended, renew the baseline with `harness regress --update-baseline`",
              file=sys.stderr)
        return 1
    print(f"regress: {len(rows)} figures ok (history: {history})")
    return 0


def _history(args) -> int:
    from ..regress.history import plot_history, read_history

    history = read_history(args.history_file or _default("history.jsonl"))
    out = plot_history(history, args.png or _default("history.png"))
    print(f"wrote {out} ({len(history)} runs)")
    return 0
