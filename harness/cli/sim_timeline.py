"""`harness sim --timeline`: each system's best layout predicted iteration by iteration as the links change."""
from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pandas as pd

from ..plan import systems
from ..plan.arg_types import input_file, positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--timeline", type=input_file, metavar="FILE",
                   help="links that change during the run (a timeline YAML or a trace CSV; default: the scenario's "
                        "own timeline:, if any): each system's best layout is predicted iteration by iteration")
    p.add_argument("--iterations", type=positive_int,
                   help="iterations predicted under a timeline (default 12)")
    p.add_argument("--replan", action="store_true", default=None,
                   help="under a timeline: also the scheduled systems (ours, dtfm) re-planning after every change "
                        "(the scheduler on the links as they are; the new plan taken when faster, after its weights "
                        "moved)")


def with_timeline(topo, args):
    """The scenario with --timeline in place of its own timeline."""
    from ..errors import HarnessError
    from ..scenario import load_timeline

    topo = topo if not args.timeline else replace(topo, timeline=load_timeline(args.timeline, topo))
    if topo.timeline is None and args.replan:
        raise HarnessError(f"--replan: re-plans when the links change; {topo.name} has no timeline: (give --timeline)")
    return topo


def print_timeline(sim, cands, args, cfg, out_dir: Path) -> Path | None:
    """Each system's best candidate under the scenario's timeline (and with --replan ours re-planning): a table
    of seconds per iteration, side by side, and timeline.csv (iteration, start_s and seconds per system) in the
    run directory `out_dir`. None without a timeline."""
    from ..files import atomic_path
    from ..sim.replan import predict_replanned
    from ..sim.timeline import predict_candidate, unmodelled

    timeline, iterations = sim.topo.timeline, args.iterations
    if timeline is None:
        return None
    series, replans = [], []
    for c in (c for c in cands if c.best):
        series.append((c.system, predict_candidate(sim, c, timeline, iterations)))
        if args.replan and systems.get(c.system).scheduled:
            pred, done = predict_replanned(sim, c, cfg, args.batch, timeline, iterations)
            series.append((f"{c.system}+replan", pred))
            replans += [(c.system, r) for r in done]
    table = {}
    for name, pred in series:
        table[f"{name}_start_s"] = [p.start_s for p in pred]
        table[f"{name}_s"] = [p.seconds for p in pred]
        table[f"{name}_changes"] = [p.changes for p in pred]
    df = pd.DataFrame(table)
    df.index.name = "iteration"
    print(f"\nunder the timeline {timeline.source} (seconds per iteration, each system's best layout; * a change "
          "applied before or during it):")
    print(f"{'iteration':>9} " + " ".join(f"{name:>14}" for name, _ in series))
    for k in range(iterations):
        print(f"{k:>9} " + " ".join(f"{df[f'{n}_s'][k]:>13.3f}{'*' if df[f'{n}_changes'][k] else ' '}"
                                    for n, _ in series))
    for system, r in replans:
        print(f"{system}: re-plan searched before iteration {r.searched} ({r.plan_seconds:.2f} s), taken before "
              f"iteration {r.iteration} ({r.move_seconds:.2f} s to move {r.moved_bytes / 1e9:.2f} GB); an iteration "
              f"{r.seconds_before:.3f} -> {r.seconds_after:.3f} s on the links as they were; pipelines {r.pipelines}")
    if args.replan and not replans:
        print("no re-plan took effect: after every change the plan in use stayed the fastest the scheduler found, "
              "or a faster one would start after the last iteration")
    missed = unmodelled(timeline)
    if missed:
        print(f"note: the simulator does not model {' or '.join(missed)}: those changes are predicted as none")
    path = Path(out_dir) / "timeline.csv"
    with atomic_path(path) as tmp:
        df.to_csv(tmp)
    return path
