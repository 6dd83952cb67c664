"""`harness reproduce PAPER`: a paper's evaluation regenerated beside its published numbers, a verdict per claim."""
from __future__ import annotations

import sys
from pathlib import Path

from . import output_dir


def register(sub) -> None:
    from ..reproduce import PAPERS

    p = sub.add_parser(
        "reproduce", help="regenerate a paper's evaluation beside its numbers, with a verdict per claim",
        description="Runs every part of the paper's evaluation the harness can (simulated at the paper's scale; "
                    "measured where it runs here), writes the plots, claims.csv and, last, report.md: per figure "
                    "the paper's claims, the harness's figures and a verdict (holds: within 15 %; direction "
                    "holds; differs, with the reason the harness can name), and the settings the paper does not "
                    "state with the values assumed. Prints the expected time first and progress on stderr.")
    p.add_argument("paper", choices=(*sorted(PAPERS), "all"),
                   help="the paper: " + ", ".join(sorted(PAPERS)) + "; all: every one in turn, then "
                        "results/reproduce/index.md (--quick: index-quick.md) linking their reports with their "
                        "verdict counts")
    p.add_argument("--quick", action="store_true",
                   help="a first look: fewer repetitions of the measured parts and none of the longest (the "
                        "simulated ones are the same; the report names what it left out), into "
                        "results/reproduce/PAPER/quick unless --out")
    p.add_argument("--no-emulated", action="store_true",
                   help="only the simulated parts (seconds): none that trains for real, through the emulated "
                        "cluster or on loopback; the report names what it left out")
    p.add_argument("--out", type=output_dir,
                   help="directory to write (default results/reproduce/PAPER, or results/reproduce/PAPER/quick; "
                        "with all: the root of every paper's directory and the index)")
    p.set_defaults(func=cmd_reproduce)


def cmd_reproduce(args) -> int:
    from ..reproduce import get, reproduce
    from ..results import results_root

    if args.paper == "all":
        return _all(args)
    paper = get(args.paper)
    out = args.out or (results_root() / "reproduce" / args.paper / ("quick" if args.quick else ""))
    minutes = paper.expected_seconds(args.quick, not args.no_emulated) / 60
    parts = paper.runs(args.quick, not args.no_emulated)
    print(f"harness reproduce {args.paper}: {len(parts)} parts, expected about "
          f"{max(1, round(minutes))} min here; writing {out}", file=sys.stderr)
    report = reproduce(args.paper, Path(out), args.quick, lambda msg: print(f"  {msg}", file=sys.stderr),
                       emulated=not args.no_emulated)
    print(report)
    return 0


def _all(args) -> int:
    from ..reproduce import PAPERS, get, reproduce_all
    from ..results import results_root

    root = args.out or (results_root() / "reproduce")
    minutes = sum(get(n).expected_seconds(args.quick, not args.no_emulated) for n in PAPERS) / 60
    print(f"harness reproduce all: {', '.join(PAPERS)}, expected about {max(1, round(minutes))} min here; writing "
          f"{root}", file=sys.stderr)
    index, failed = reproduce_all(Path(root), args.quick, lambda msg: print(f"  {msg}", file=sys.stderr),
                                  emulated=not args.no_emulated)
    print(index)
    if failed:
        print(f"harness reproduce all: {', '.join(failed)} failed (see {index})", file=sys.stderr)
    return 1 if failed else 0
