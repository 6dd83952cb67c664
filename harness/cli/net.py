"""`harness net verify|clean|show|plan|apply|clear`: the emulated network, measured and cleaned."""
from __future__ import annotations

import sys

from . import (add_transport_argument, byte_sizes, input_file, non_negative_int, output_dir, output_file,
               positive_float, positive_int, scenario_name, seconds_list, with_transport)


def register(sub) -> None:
    p = sub.add_parser("net", help="network emulation: verify links, show/clean leftovers, real-node shaping")
    ss = p.add_subparsers(dest="net_command", metavar="ACTION", required=True)

    v = ss.add_parser("verify", help="measure RTT and TCP goodput of every ordered pair vs the scenario")
    _scenario_args(v)
    v.add_argument("--pairs", choices=("all", "sample"), default="all",
                   help="all ordered pairs, or a sample (each device to its next and previous); default all")
    v.add_argument("--json", type=output_file, help="write the full report (with kernel read-back) as JSON")
    v.add_argument("--csv", type=output_file, help="write one row per pair as CSV")
    v.add_argument("--kernel", choices=("auto", "host", "uml"), default="auto")
    v.add_argument("--measure-s", type=positive_float, default=2.0, help="bulk measuring window (default 2 s)")
    v.add_argument("--retries", type=non_negative_int, default=1, help="re-measure pairs that miss their target; with --transfer-curves, pairs whose connection failed (default 1)")
    v.add_argument("--timeout", type=positive_float, default=600.0)
    v.add_argument("--transfer-curves", type=output_dir, metavar="DIR",
                   help="instead: one connection's transfer time against message size and idle time per link class "
                        "(pairs of distinct rate and RTT), written to DIR as CSV, JSON (with the kernel's TCP "
                        "settings) and a plot, beside what the simulator's transport model predicts")
    v.add_argument("--timeline", type=input_file, metavar="FILE",
                   help="instead: replay a timeline (YAML of time events, or a trace CSV) and measure each change's "
                        "rate and delay before and after it, and how long it took to show in the measurement")
    v.add_argument("--sizes", type=byte_sizes,
                   help="transfer curves: message sizes (default 64K,512K,4M,32M)")
    v.add_argument("--idle", type=seconds_list,
                   help="transfer curves: idle seconds before each message (default 0,2)")
    v.add_argument("--reps", type=positive_int,
                   help="transfer curves: repetitions of every point (default 2)")
    add_transport_argument(v)
    v.set_defaults(func=cmd_verify)

    c = ss.add_parser("clean", help="remove what killed runs left (namespaces, veths, bridges, UML kernels)")
    c.add_argument("--all", action="store_true", help="also runs whose process is still alive")
    c.set_defaults(func=cmd_clean)

    s = ss.add_parser("show", help="list the harness's namespaces, links and runs in this kernel")
    s.set_defaults(func=cmd_show)

    pl = ss.add_parser("plan", help="print the ip/tc commands of the local emulated cluster (dry run)")
    _scenario_args(pl)
    pl.set_defaults(func=cmd_plan)

    for name, helptext in (("apply", "shape this real node: one namespace per GPU process on the NIC (macvlan)"),
                           ("clear", "remove this real node's namespaces and shaping")):
        a = ss.add_parser(name, help=helptext)
        a.add_argument("--inventory", type=input_file, required=True, help="cluster inventory YAML (see README)")
        a.add_argument("--node", required=True, help="this node's name in the inventory")
        a.add_argument("--dry-run", action="store_true", help="print the ip/tc commands, change nothing")
        if name == "apply":
            a.add_argument("--timeline", type=input_file, metavar="FILE",
                           help="then apply this timeline (YAML of at_s events, or a trace CSV) to the node's "
                                "devices, in the foreground until it ends (the links keep its last state) or is "
                                "stopped (Ctrl-C, SIGTERM: the scenario's links again); run it on every node with "
                                "the same --start")
            a.add_argument("--start", metavar="WHEN", default=None,
                           help="with --timeline: t = 0, the same on every node: now (default), seconds since the "
                                "epoch, or an ISO 8601 time with its zone (e.g. 2026-12-04T10:30:00Z)")
            a.add_argument("--log", type=output_file, metavar="FILE",
                           help="with --timeline: append each change as JSON lines (issued, kernel ack, read back)")
        a.set_defaults(func=cmd_apply if name == "apply" else cmd_clear)


def _scenario_args(p) -> None:
    p.add_argument("--scenario", required=True, type=scenario_name, help="case number (1-5), name or path to a .yaml file")
    p.add_argument("--devices", type=positive_int, help="scale the scenario down to K devices")
    p.add_argument("--bandwidth-scale", type=positive_float, default=1.0,
                   help="multiply every rate by s (delays stay real); default 1")


def cmd_verify(args) -> int:
    from ..network.verify import verify
    from ..scenario import load_scenario

    topo = with_transport(load_scenario(args.scenario, args.devices).scaled(args.bandwidth_scale), args)
    if args.transfer_curves:
        return _transfer_curves(topo, args)
    if args.timeline:
        from dataclasses import replace

        from ..network.verify_timeline import verify_timeline
        from ..scenario import load_timeline

        rep = verify_timeline(replace(topo, timeline=load_timeline(args.timeline, topo)), kernel=args.kernel,
                              timeout_s=args.timeout, stream=sys.stderr)
    else:
        rep = verify(topo, pairs=args.pairs, kernel=args.kernel,
                     measure_s=args.measure_s, retries=args.retries, timeout_s=args.timeout,
                     stream=sys.stderr)
    print(rep.table())
    rep.write(args.json, args.csv)
    for path in (args.json, args.csv):
        if path:
            print(f"wrote {path}")
    return 0 if rep.ok else 1


def _transfer_curves(topo, args) -> int:
    from ..network.curves import IDLES_S, REPS, SIZES, measure_curves
    from ..report.transfer import write_transfer_report

    rep = measure_curves(topo, pairs=args.pairs, sizes=args.sizes or SIZES, idles_s=args.idle or IDLES_S,
                         reps=args.reps or REPS, kernel=args.kernel, timeout_s=args.timeout, retries=args.retries,
                         stream=sys.stderr)
    for path in write_transfer_report(rep, args.transfer_curves):
        print(f"wrote {path}")
    return 0


def cmd_clean(args) -> int:
    from ..network import registry

    done = registry.clean(include_live=args.all)
    for e in done:
        print(f"removed run {e.run_id} ({e.kind}: {e.holds()})")
    left = registry.leftovers()
    if left["netns"] or left["links"]:
        print(f"still present (not in any registry entry, not touched): {left}", file=sys.stderr)
    print(f"net clean: {len(done)} run(s) removed")
    return 0


def cmd_show(args) -> int:
    from ..network import registry

    entries = registry.entries()
    for e in entries:
        state = "running" if registry.pid_alive(e.pid) else "killed (its harness process is gone: harness net clean)"
        print(f"run {e.run_id} {e.kind:8s} pid {e.pid} {state}: {e.holds()}")
    left = registry.leftovers()
    print(f"{len(entries)} run(s); namespaces here: {len(left['netns'])}, links here: {len(left['links'])}")
    for kind in ("netns", "links"):
        for name in left[kind]:
            print(f"  {kind}: {name}")
    return 0


def cmd_plan(args) -> int:
    from ..network.dryrun import local_cluster_commands
    from ..scenario import load_scenario

    topo = load_scenario(args.scenario, args.devices).scaled(args.bandwidth_scale)
    print("\n".join(local_cluster_commands(topo)))
    return 0


def cmd_apply(args) -> int:
    from ..errors import HarnessError
    from ..network.node import apply_node

    if args.timeline is None:
        for flag, value in (("--start", args.start), ("--log", args.log)):
            if value is not None:
                raise HarnessError(f"{flag}: only with --timeline")
    else:  # the timeline's mistakes before anything is shaped
        from ..network.node_timeline import describe_schedule, parse_start

        start = parse_start(args.start or "now")
        schedule = describe_schedule(args.inventory, args.node, args.timeline)
    for line in apply_node(args.inventory, args.node, dry_run=args.dry_run):
        print(line, flush=True)
    if args.timeline is None:
        return 0
    if args.dry_run:
        print("\n".join(schedule))
        return 0
    return _run_node_timeline(args, start)


def _run_node_timeline(args, start: float) -> int:
    """`net apply --timeline` after the shaping: in the foreground; Ctrl-C and SIGTERM stop it cleanly."""
    import signal
    import threading

    from ..network.node_timeline import run_node_timeline

    stop = threading.Event()
    old = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        run_node_timeline(args.inventory, args.node, args.timeline, start, stop=stop, log_path=args.log,
                          say=lambda line: print(line, flush=True))
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    return 0


def cmd_clear(args) -> int:
    from ..network.node import clear_node

    for line in clear_node(args.inventory, args.node, dry_run=args.dry_run):
        print(line)
    return 0
