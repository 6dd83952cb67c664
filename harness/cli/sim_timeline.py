"""`harness sim --timeline`: each system's best layout predicted iteration by iteration as the links change."""
from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pandas as pd

from ..plan.arg_types import input_file, positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--timeline", type=input_file, metavar="FILE",
                   help="links that change during the run (a timeline YAML or a trace CSV; default: the scenario's "
                        "own timeline:, if any): each system's best layout is predicted iteration by iteration")
    p.add_argument("--iterations", type=positive_int,
                   help="iterations predicted under a timeline (default 12)")


def with_timeline(topo, args):
    """The scenario with --timeline in place of its own timeline."""
    from ..scenario import load_timeline

    return topo if not args.timeline else replace(topo, timeline=load_timeline(args.timeline, topo))


def print_timeline(sim, cands, iterations: int, out_dir: Path) -> Path | None:
    """Each system's best candidate under the scenario's timeline: a table of seconds per iteration, side by side,
    and timeline.csv (iteration, start_s and seconds per system) in `out_dir`. None without a timeline."""
    from ..files import atomic_path
    from ..sim.timeline import predict_candidate, unmodelled

    timeline = sim.topo.timeline
    if timeline is None:
        return None
    best = [c for c in cands if c.best]
    table = {}
    for c in best:
        pred = predict_candidate(sim, c, timeline, iterations)
        table[f"{c.system}_start_s"] = [p.start_s for p in pred]
        table[f"{c.system}_s"] = [p.seconds for p in pred]
        table[f"{c.system}_changes"] = [p.changes for p in pred]
    df = pd.DataFrame(table)
    df.index.name = "iteration"
    print(f"\nunder the timeline {timeline.source} (seconds per iteration, each system's best layout; * a change "
          "applied before or during it):")
    print(f"{'iteration':>9} " + " ".join(f"{c.system:>14}" for c in best))
    for k in range(iterations):
        print(f"{k:>9} " + " ".join(f"{df[f'{c.system}_s'][k]:>13.3f}{'*' if df[f'{c.system}_changes'][k] else ' '}"
                                    for c in best))
    missed = unmodelled(timeline)
    if missed:
        print(f"note: the simulator does not model {' or '.join(missed)}: those changes are predicted as none")
    path = Path(out_dir) / "timeline.csv"
    with atomic_path(path) as tmp:
        df.to_csv(tmp)
    return path
