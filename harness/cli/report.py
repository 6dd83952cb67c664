"""`harness report runs DIR`: measured runs side by side, as a table and plots; `harness report case DIR`:
one page per case of `make scenario-N`; `harness report convergence DIR`: loss against wall time."""
from __future__ import annotations

from . import input_dir, input_file, output_dir, positive_float


def register(sub) -> None:
    p = sub.add_parser("report", help="tables and plots over measured runs")
    ss = p.add_subparsers(dest="report_command", metavar="ACTION", required=True)
    r = ss.add_parser("runs", help="one row per system and layout: iteration seconds and PFLOPS over all runs "
                      "below DIR (failed runs left out); writes DIR/runs.csv, pflops.png (with the simulator's "
                      "prediction when a `sim compare --csv` file is found) and iterations.png")
    r.add_argument("dir", type=input_dir, help="e.g. results/5-worldwide/emu")
    r.add_argument("--out", type=output_dir, help="directory for runs.csv and the plots (default DIR)")
    r.add_argument("--sim-csv", type=input_file, help="`harness sim compare --csv` output to plot beside the measurements "
                   "(default DIR/../sim-vs-emu.csv when it exists)")
    r.set_defaults(func=cmd_runs)
    c = ss.add_parser("case", help="DIR/report.md: one page over what `make scenario-N` wrote to DIR (scenario, "
                      "schedule, simulator, emulated runs, simulator vs runs; which commit and machine; what is "
                      "measured and what simulated)")
    c.add_argument("dir", type=input_dir, help="e.g. results/5-worldwide")
    c.set_defaults(func=cmd_case)
    v = ss.add_parser("convergence", help="loss against wall time of every run below DIR, the data's loss floor "
                      "and the time each run took to reach floor x (1 + margin); writes convergence.png and "
                      "convergence.csv (train with --data markov: a floor below the starting loss)")
    v.add_argument("dir", type=input_dir, help="a directory of runs, e.g. results/hetpipe-testbed")
    v.add_argument("--out", type=output_dir, help="directory for convergence.png and .csv (default DIR)")
    v.add_argument("--margin", type=positive_float, default=0.1,
                   help="the target: floor x (1 + margin) (default 0.1: floor + 10%%)")
    v.set_defaults(func=cmd_convergence)


def cmd_runs(args) -> int:
    from ..report.runs import default_sim_csv, unfinished_runs, write_runs_table

    sim_csv = args.sim_csv or default_sim_csv(args.dir)
    text, paths = write_runs_table(args.dir, args.out, sim_csv)
    print(text)
    print(f"simulated PFLOPS from {sim_csv}" if sim_csv else "no sim compare CSV: measured PFLOPS only")
    for p in paths:
        print(f"wrote {p}")
    for run, state, reason in unfinished_runs(args.dir):
        print(f"left out: {run}: {state}" + (f" ({reason})" if reason else ""))
    return 0


def cmd_convergence(args) -> int:
    from ..report.convergence import write_convergence

    text, paths = write_convergence(args.dir, args.out, args.margin)
    print(text)
    for p in paths:
        print(f"wrote {p}")
    return 0


def cmd_case(args) -> int:
    from ..report.case import write_case_report

    print(f"wrote {write_case_report(args.dir)}")
    return 0
