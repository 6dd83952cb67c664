"""`harness fl`: OWL's federated-learning workload, simulated or run in the emulated cluster; `harness fl report`:
its comparison plots."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import (add_results_argument, fractions, input_path, non_negative_int, output_dir, output_file, positive_float,
               positive_int, scenario_name)

EMU_ONLY = ("bandwidth_scale", "compute_time_scale", "timeout", "kernel", "repeat")


def register(sub) -> None:
    from ..workloads.fl.models import BRANCHY_MODELS

    p = sub.add_parser(
        "fl", help="OWL's FL workload: distribute a branchy model to racks of workers by strategy (`fl report`: plots)",
        description="One federated-learning round per strategy (Han et al. 2024, OWL): a server sends the model to "
                    "every worker of every rack, which computes its forward as the parameters arrive, then backward "
                    "and a gradient all-reduce. Strategies: naive, overlap, ipart, owl, owl-de, owl-a, owl-b, oos (a "
                    "bound), optimal (exhaustive, or a local search), a comma-separated list, or all. --backend sim "
                    "simulates; --backend emu runs the server and every worker as processes of the emulated "
                    "cluster (a model small enough to train here, parameters as tensors over the shaped links, "
                    "compute held to the device's modelled time x --compute-time-scale) and records what was "
                    "measured, bytes counted as sent. Prints a table and writes "
                    "results/<scenario>/<run-id>/records.json.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--scenario", type=scenario_name, help="an FL scenario: owl-testbed, owl-8x10, owl-4x20, "
                   "owl-norack, owl-regional or a path")
    p.add_argument("--devices", type=positive_int, help="keep this many workers, in whole racks")
    p.add_argument("--alpha", type=fractions, help="B_inter / B_intra in (0, 1]; several comma-separated; "
                   "none: the scenario's")
    p.add_argument("--model", default="inception-v4", help=f"{', '.join(BRANCHY_MODELS)} (--backend emu: "
                   "the ones small enough to train here; it names them when it refuses another)")
    p.add_argument("--strategy", default="all", help="naive, overlap, ipart, owl; owl-de (decentralized), owl-a, "
                   "owl-b (the ablations), oos (a bound; sim only), optimal; a comma-separated list, or all (naive, "
                   "overlap, ipart and owl)")
    p.add_argument("--backend", default="sim", choices=["sim", "emu"],
                   help="sim: the flow simulator; emu: processes in the emulated cluster (tc/netem shaped links)")
    p.add_argument("--batch", type=positive_int, default=32, help="minibatch per worker")
    p.add_argument("--bandwidth-scale", type=positive_float, default=argparse.SUPPRESS,
                   help="emu: multiply every rate, the server's uplink too (default 1; a chosen time dilation "
                   "divides it further)")
    p.add_argument("--compute-time-scale", type=positive_float, metavar="X", default=argparse.SUPPRESS,
                   help="emu: every layer's forward and the backward take X times their modelled time on the "
                   "scenario's GPU (default: a time dilation k chosen by a probe boot that runs each round undilated: "
                   "compute k times longer, links k times slower, so that the emulated CPU keeps headroom)")
    p.add_argument("--timeout", type=positive_float, default=argparse.SUPPRESS,
                   help="emu: seconds before the run is failed (default: from the "
                   "simulated rounds)")
    p.add_argument("--kernel", choices=("auto", "host", "uml"), default=argparse.SUPPRESS,
                   help="emu: the host kernel (needs sch_netem) or "
                   "user-mode Linux (default auto)")
    p.add_argument("--repeat", type=positive_int, metavar="N", default=argparse.SUPPRESS,
                   help="emu: run every strategy's round N times, interleaved, and record the fastest (the others "
                        "slowed by the host's other work; every round's seconds go to the manifest) (default 1)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="emu: the model's and the data's seed")
    p.add_argument("--json", type=output_file, help="also write the records as a JSON list")
    p.add_argument("--out", type=output_dir, help="run directory (default RESULTS/<scenario>/<run-id>)")
    add_results_argument(p)
    p.set_defaults(func=cmd_fl)
    ss = p.add_subparsers(dest="fl_command", metavar="{report}")
    r = ss.add_parser("report", help="plots and a table comparing strategies from FL records",
                      description="Normalised training time (to naive, per setting) of every strategy, the trend over "
                                  "alpha, server bytes; fl.png and fl.md in --out.")
    r.add_argument("paths", nargs="+", type=input_path, help="records JSON files or run directories")
    r.add_argument("--out", type=output_dir, help="output directory (default RESULTS/fl)")
    add_results_argument(r)
    r.set_defaults(func=cmd_report)


def cmd_fl(args) -> int:
    from tqdm import tqdm

    from ..workloads.fl import strategies as st
    from ..workloads.fl.federation import FLError, load_federation
    from ..workloads.fl.models import get_branchy
    from ..workloads.fl.records import to_record
    from ..files import atomic_write_json
    from ..results import manifest, new_run_id, run_dir

    if args.scenario is None:
        raise FLError("--scenario: required (e.g. owl-testbed)")
    if args.backend != "emu":
        given = [n for n in EMU_ONLY if hasattr(args, n)]
        if given:
            raise FLError(f"--{given[0].replace('_', '-')}: only with --backend emu")
    model = get_branchy(args.model)
    names = st.selected(args.strategy)
    if args.backend == "emu":
        return _emulated(args, model, names)
    feds = [load_federation(args.scenario, args.devices, a) for a in (args.alpha or [None])]
    run_id = new_run_id("fl")
    records = []
    with tqdm(total=len(feds) * len(names), desc="fl", unit="round", file=sys.stderr, leave=False,
              disable=None) as bar:  # no bar where stderr is not a terminal
        for fed in feds:
            for n in names:
                bar.set_postfix_str(f"alpha {fed.alpha:g} {n}")
                records.append(to_record(st.run(n, model, fed, args.batch), run_id=run_id, fed=fed, model=model,
                                         batch=args.batch))
                bar.update(1)
    out = args.out or run_dir(feds[0].name, run_id, args.results)
    _print_and_write(args, records, feds, model, out)
    atomic_write_json(Path(out) / "manifest.json", manifest(run_id, "ok", backend="sim", workload="fl"))
    return 0


def _print_and_write(args, records, feds, model, out) -> None:
    from ..files import atomic_write_json
    from ..workloads.fl.records import as_json, normalised

    norm = normalised(records)
    fed = feds[0]
    print(f"{fed.name}: {model.name} ({model.params / 1e6:.2f} M parameters), {fed.workers} workers in "
          f"{fed.shape} racks (racks x workers), B_intra {fed.intra_Bps * 8 / 1e9:g} Gbps, batch {args.batch}")
    uplink = {round(f.alpha, 6): f.uplink_Bps * 8 / 1e9 for f in feds}
    print(f"{'alpha':>5} {'uplink':>6} {'strategy':<8} {'round s':>9} {'distrib. s':>10} {'server MB':>9} "
          f"{'racks MB':>8} {'vs naive':>8}  config")
    for k, r in enumerate(records):
        vs = f"{norm[k]:.3f}" if k in norm else "-"
        print(f"{r.alpha:>5g} {uplink[r.alpha]:>6g} {r.strategy:<8} {r.seconds:>9.3f} {r.distribution_seconds:>10.3f} "
              f"{r.server_bytes / 1e6:>9.3f} {sum(r.rack_bytes) / 1e6:>8.3f} {vs:>8}  {r.config}")
    if args.json:  # before the manifest: a run whose files could not all be written does not say ok
        atomic_write_json(args.json, as_json(records))
        print(f"wrote {args.json}")
    atomic_write_json(Path(out) / "records.json", as_json(records))
    print(f"wrote {Path(out) / 'records.json'}")


def _emulated(args, model, names) -> int:
    """One boot of the emulated cluster per alpha, every strategy's round in it; the manifest says running
    first, and failed (naming the process) or ok at the end. Without --compute-time-scale, a probe boot first
    runs each round undilated and the time dilation is chosen from what it cost the host."""
    from ..results import new_run_id, run_dir
    from ..systems.owl.emulated import EmuSetting, check_runnable, emulated_federation, plan_rounds, run_recorded
    from ..train.launch import RankFailure
    from ..workloads.fl.federation import FLError, federation, load_topology

    check_runnable(model)
    topo = load_topology(args.scenario, args.devices)
    feds = [federation(topo, a) for a in (args.alpha or [None])]
    dilate = not hasattr(args, "compute_time_scale")
    setting = EmuSetting(bandwidth_scale=getattr(args, "bandwidth_scale", 1.0),
                         compute_time_scale=getattr(args, "compute_time_scale", 1.0),
                         timeout_s=getattr(args, "timeout", None), kernel=getattr(args, "kernel", "auto"),
                         seed=args.seed)
    # every plan before anything is written: a strategy that cannot plan is one line, not a failed run
    for f in feds:
        plan_rounds(model, emulated_federation(f, setting.bandwidth_scale, setting.compute_time_scale), names,
                    args.batch)
    run_id = new_run_id("fl")
    out = Path(args.out or run_dir(topo.name, run_id, args.results))

    def finish(records, chosen, head):
        _print_and_write(args, records, feds, model, out)
        print(head["line"])
        if "advice" in head:
            print(head["advice"])

    try:
        run_recorded(topo, feds, model, names, args.batch, setting, out, run_id=run_id,
                     repeat=getattr(args, "repeat", 1), dilate=dilate, stream=sys.stderr, finish=finish)
    except RankFailure as e:
        raise FLError(f"fl --backend emu: {e}") from None
    return 0


def cmd_report(args) -> int:
    from ..workloads.fl.records import read
    from ..report import fl as report

    from ..results import results_root

    paths = report.write(args.out or results_root(args.results) / "fl", read(args.paths))
    for p in paths:
        print(f"wrote {p}")
    return 0
