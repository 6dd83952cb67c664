"""`harness fl`: OWL's federated-learning workload, simulated; `harness fl report`: its comparison plots."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import add_results_argument, fractions, input_path, output_dir, output_file, positive_int, scenario_name


def register(sub) -> None:
    p = sub.add_parser(
        "fl", help="OWL's FL workload: distribute a branchy model to racks of workers by strategy (`fl report`: plots)",
        description="Simulate one federated-learning round (Han et al. 2024, OWL): a server sends the model to every "
                    "worker of every rack, which computes its forward as the parameters arrive, then backward and a "
                    "gradient all-reduce. Strategies: naive, overlap, ipart, owl, optimal (exhaustive, small cases), "
                    "or all. Prints a table and writes results/<scenario>/<run-id>/records.json.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--scenario", type=scenario_name, help="an FL scenario: owl-testbed, owl-8x10, owl-4x20 or a path")
    p.add_argument("--devices", type=positive_int, help="keep this many workers, in whole racks")
    p.add_argument("--alpha", type=fractions, help="B_inter / B_intra in (0, 1]; several comma-separated; "
                   "none: the scenario's")
    p.add_argument("--model", default="inception-v4", help="inception-v4, dfn or tiny")
    p.add_argument("--strategy", default="all", help="naive, overlap, ipart, owl, optimal, or all (every one "
                   "but optimal, which runs only when named)")
    p.add_argument("--backend", default="sim", choices=["sim"], help="where it runs (part 2 adds emu)")
    p.add_argument("--batch", type=positive_int, default=32, help="minibatch per worker")
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
    from ..workloads.fl.records import as_json, normalised, to_record
    from ..files import atomic_write_json
    from ..results import manifest, new_run_id, run_dir

    if args.scenario is None:
        raise FLError("--scenario: required (e.g. owl-testbed)")
    model = get_branchy(args.model)
    names = st.selected(args.strategy)
    feds = [load_federation(args.scenario, args.devices, a) for a in (args.alpha or [None])]
    run_id = new_run_id("fl")
    records = []
    with tqdm(total=len(feds) * len(names), desc="fl", unit="round", file=sys.stderr, leave=False) as bar:
        for fed in feds:
            for n in names:
                bar.set_postfix_str(f"alpha {fed.alpha:g} {n}")
                records.append(to_record(st.run(n, model, fed, args.batch), run_id=run_id, fed=fed, model=model,
                                         batch=args.batch))
                bar.update(1)
    norm = normalised(records)
    fed = feds[0]
    print(f"{fed.name}: {model.name} ({model.params / 1e6:.2f} M parameters), {fed.workers} workers in "
          f"{fed.shape} racks (racks x workers), B_intra {fed.intra_Bps * 8 / 1e9:g} Gbps, batch {args.batch}")
    uplink = {round(f.alpha, 6): f.uplink_Bps * 8 / 1e9 for f in feds}
    print(f"{'alpha':>5} {'uplink':>6} {'strategy':<8} {'round s':>9} {'distrib. s':>10} {'server GB':>9} "
          f"{'vs naive':>8}  config")
    for k, r in enumerate(records):
        vs = f"{norm[k]:.3f}" if k in norm else "-"
        print(f"{r.alpha:>5g} {uplink[r.alpha]:>6g} {r.strategy:<8} {r.seconds:>9.3f} {r.distribution_seconds:>10.3f} "
              f"{r.server_bytes / 1e9:>9.2f} {vs:>8}  {r.config}")
    out = args.out or run_dir(fed.name, run_id, args.results)
    if args.json:  # before the manifest: a run whose files could not all be written does not say ok
        atomic_write_json(args.json, as_json(records))
        print(f"wrote {args.json}")
    atomic_write_json(Path(out) / "records.json", as_json(records))
    atomic_write_json(Path(out) / "manifest.json", manifest(run_id, "ok", backend="sim", workload="fl"))
    print(f"wrote {Path(out) / 'records.json'}")
    return 0


def cmd_report(args) -> int:
    from ..workloads.fl.records import read
    from ..report import fl as report

    from ..results import results_root

    paths = report.write(args.out or results_root(args.results) / "fl", read(args.paths))
    for p in paths:
        print(f"wrote {p}")
    return 0
