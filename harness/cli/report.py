"""`harness report runs DIR`: measured runs side by side."""
from __future__ import annotations

from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("report", help="tables over measured runs")
    ss = p.add_subparsers(dest="report_command", metavar="ACTION", required=True)
    r = ss.add_parser("runs", help="one row per system and layout: iteration seconds and PFLOPS over all runs "
                      "below DIR (failed runs left out); writes DIR/runs.csv")
    r.add_argument("dir", type=Path, help="e.g. results/5-worldwide")
    r.add_argument("--out", type=Path, help="directory for runs.csv (default DIR)")
    r.set_defaults(func=cmd_runs)


def cmd_runs(args) -> int:
    from ..report.runs import write_runs_table

    text, paths = write_runs_table(args.dir, args.out)
    print(text)
    for p in paths:
        print(f"wrote {p}")
    return 0
