"""`harness sim --timeline`: each system's best layout predicted iteration by iteration as the links change."""
from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pandas as pd

from ..plan import systems
from .run_flags import add_agent_arguments
from ..scenario.preemption import KEEPALIVE_MISSED
from ..plan.arg_types import input_file, non_negative_float, non_negative_int, nonempty, positive_float, positive_int

#: what only a timeline with devices that leave takes
SPOT_FLAGS = ("checkpoint_every", "storage_gbps", "keepalive", "last_call", "recovery", "process_start",
              "replan_search")
MARKET_FLAGS = ("preempt_down", "preempt_notice", "preempt_seed")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--timeline", type=input_file, metavar="FILE",
                   help="links that change during the run (a timeline YAML or a trace CSV; default: the scenario's "
                        "own timeline:, if any): each system's best layout is predicted iteration by iteration")
    p.add_argument("--iterations", type=positive_int,
                   help="iterations predicted under a timeline (default 12; 100 useful ones when devices leave)")
    p.add_argument("--replan", action="store_true", default=None,
                   help="under a timeline: also the scheduled systems (ours, dtfm) re-planning after every change "
                        "(the scheduler on the links as they are; the new plan taken when faster, after its weights "
                        "moved)")
    g = p.add_argument_group("devices that leave and come back (a timeline's preempt/return events, or a spot market)")
    g.add_argument("--preempt-rate", type=nonempty, metavar="R|REGION=R,...",
                   help="a spot market: every device reclaimed at R per hour (a Poisson process each; by region: "
                        "REGION=R,...), away for an exponential time (--preempt-down); in place of the timeline's spot:")
    g.add_argument("--preempt-down", type=positive_float, metavar="S", help="mean seconds a reclaimed device is away "
                   "(default 600)")
    g.add_argument("--preempt-notice", type=non_negative_float, metavar="S",
                   help="the warning before each reclaim (default 0; AWS gives 120 s, GCP 30 s)")
    g.add_argument("--preempt-seed", type=non_negative_int, metavar="N", help="the market's seed (default 0)")
    g.add_argument("--checkpoint-every", type=positive_int, metavar="N",
                   help="every system checkpoints every N iterations (a restart resumes there; none: from iteration 0)")
    g.add_argument("--storage-gbps", type=positive_float, metavar="GB/s",
                   help="a checkpoint's write and read rate per device (default 2, a local NVMe drive: an assumption)")
    g.add_argument("--recovery", choices=("own", "restart"),
                   help="own (default): each system recovers as it does (ours re-plans in the run); restart: every "
                        "system restarts from its checkpoint under torchrun's agent, as `harness run` does so far")
    g.add_argument("--process-start", type=positive_float, metavar="S",
                   help="seconds a restart's processes take to start and join their group (default: a Python "
                        "process importing torch.distributed on this machine, measured; e.g. an emulated run's "
                        "restart_marks_s.process_group)")
    g.add_argument("--replan-search", type=non_negative_float, metavar="S",
                   help="seconds ours' scheduler takes to re-plan on the devices left (default: each search timed "
                        "on this machine as it runs; given, the prediction is the same on any machine)")
    add_agent_arguments(g)


def with_timeline(topo, args):
    """The scenario with --timeline in place of its own timeline."""
    from ..errors import HarnessError
    from ..scenario import load_timeline

    topo = topo if not args.timeline else replace(topo, timeline=load_timeline(args.timeline, topo))
    if getattr(args, "preempt_rate", None):
        from ..scenario.preemption import DEFAULT_DOWN_S, SpotMarket, parse_rates
        from ..scenario.timeline import Timeline, region_names

        rates = parse_rates(args.preempt_rate, "--preempt-rate", region_names(topo.regions))
        if not any(rate > 0 for _, rate in rates):
            raise HarnessError(f"--preempt-rate: every rate is 0: no device is ever reclaimed (got {args.preempt_rate!r})")
        market = SpotMarket("--preempt-rate", rates,
                            down_s=args.preempt_down or DEFAULT_DOWN_S, notice_s=args.preempt_notice or 0.0,
                            seed=args.preempt_seed or 0)
        topo = replace(topo, timeline=replace(topo.timeline or Timeline(source="--preempt-rate"), spot=market))
    else:
        given = [f for f in MARKET_FLAGS if getattr(args, f, None) is not None]
        if given:
            raise HarnessError(f"--{given[0].replace('_', '-')}: only with --preempt-rate")
    moves = topo.timeline is not None and bool(topo.timeline.devices or topo.timeline.spot)
    given = [f for f in SPOT_FLAGS if getattr(args, f, None) is not None]
    if given and not moves:
        raise HarnessError(f"--{given[0].replace('_', '-')}: only when devices leave (a timeline with preempt events, "
                           "or --preempt-rate)")
    if topo.timeline is None and args.replan:
        raise HarnessError(f"--replan: re-plans when the links change; {topo.name} has no timeline: (give --timeline)")
    if moves and args.replan:
        raise HarnessError("--replan: re-plans when the links change; when devices leave ours re-plans anyway")
    return topo


def print_timeline(sim, cands, args, cfg, out_dir: Path) -> Path | None:
    """Each system's best candidate under the scenario's timeline (and with --replan ours re-planning): a table
    of seconds per iteration, side by side, and timeline.csv (iteration, start_s and seconds per system) in the
    run directory `out_dir`. None without a timeline."""
    from ..files import atomic_path
    from ..sim.replan import predict_replanned
    from ..sim.timeline import predict_candidate, unmodelled

    timeline, iterations = sim.topo.timeline, args.iterations or 12
    if timeline is None:
        return None
    if timeline.devices or timeline.spot:
        return print_spot(sim, cands, args, cfg, out_dir)
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


def print_spot(sim, cands, args, cfg, out_dir: Path) -> Path:
    """Each system's best layout under the timeline's devices that leave and come back: the time to N useful
    iterations, useful iterations per hour, and every recovery's seconds by part; spot.csv (per iteration) and
    recoveries.csv in the run directory."""
    from ..files import atomic_path
    from ..plan.survivors import request_of
    from ..sim.preemption import RecoveryModel, predict_spot

    timeline, iterations = sim.topo.timeline, args.iterations or 100
    detect = None if args.keepalive is None else args.keepalive * KEEPALIVE_MISSED  # ours' and torchrun's
    given = {"storage_gbps": args.storage_gbps, "torchrun_last_call_s": args.last_call,
             "torchrun_detect_s": detect, "detect_s": detect, "start_s": args.process_start,
             "search_s": args.replan_search}
    model = RecoveryModel(checkpoint_every=args.checkpoint_every, restart_all=args.recovery == "restart",
                          **{k: v for k, v in given.items() if v is not None})
    rows, recoveries = [], []
    print(f"\nunder the timeline {timeline.source}: devices that leave and come back, {iterations} useful iterations"
          f" each (checkpoints: {f'every {args.checkpoint_every}' if args.checkpoint_every else 'none'})")
    print(f"{'system':<16} {'recovery':>8} {'time s':>10} {'useful/h':>10} {'events':>6} {'lost it.':>8} "
          f"{'recovery s':>10} {'checkpoint s':>12}")
    for c in (c for c in cands if c.best and c.layout is not None):
        if systems.get(c.system).layout_rule is None:
            print(f"{c.system:<16} {'-':>8}  not predicted: no layout rule to lay it out on the devices left")
            continue
        pred = predict_spot(sim, c.system, cfg, args.batch, timeline, iterations, model,
                            layout=request_of(c.system, c.layout, sim.budget),
                            options=sim.options_of(systems.get(c.system)))
        recovers = "restart" if model.restart_all else systems.get(c.system).recovery
        print(f"{c.system:<16} {recovers:>8} {pred.total_s:>10.1f} {pred.useful_per_hour:>10.0f} "
              f"{len(pred.recoveries):>6} {sum(r.lost_iterations for r in pred.recoveries):>8} "
              f"{sum(r.seconds for r in pred.recoveries):>10.1f} {pred.checkpoint_s:>12.2f}")
        rows += [{"system": c.system, **vars(i)} for i in pred.iterations]
        recoveries += [{"system": c.system, **vars(r), "seconds": r.seconds} for r in pred.recoveries]
    if recoveries:
        print(f"\n{'system':<16} {'at s':>8} {'kind':<8} {'detect':>7} {'re-plan':>7} {'moves':>7} {'re-mesh':>7} "
              f"{'restart':>7} {'lost it.':>8}  event")
        for r in recoveries:
            print(f"{r['system']:<16} {r['at_s']:>8.1f} {r['kind']:<8} {r['detect_s']:>7.2f} {r['replan_s']:>7.2f} "
                  f"{r['transfer_s']:>7.2f} {r['remesh_s']:>7.3f} {r['restart_s']:>7.2f} {r['lost_iterations']:>8}  "
                  f"{r['event']}")
    for name, table in (("recoveries.csv", recoveries), ("spot.csv", rows)):
        with atomic_path(Path(out_dir) / name) as tmp:
            pd.DataFrame(table).to_csv(tmp, index=False)
    return Path(out_dir) / "spot.csv"
