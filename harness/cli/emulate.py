"""`harness emulate --scenario N [--devices K] [--bandwidth-scale s] [--timeout S] -- CMD ARGS...`."""
from __future__ import annotations

import sys

from . import input_file, positive_float, positive_int, scenario_name


def register(sub) -> None:
    p = sub.add_parser(
        "emulate", help="run a command once per device inside the emulated cluster (tc/netem shaped)",
        description="Runs CMD once in every device's network namespace, all at once, with HARNESS_DEVICE, "
                    "HARNESS_WORLD_SIZE, HARNESS_ADDR, HARNESS_IFNAME, HARNESS_PEERS set; streams each "
                    "device's output prefixed with [device]; exits non-zero if any device fails or the "
                    "timeout passes; always tears the cluster down.")
    p.add_argument("--scenario", required=True, type=scenario_name, help="case number (1-5), name or path to a .yaml file")
    p.add_argument("--devices", type=positive_int, help="scale the scenario down to K devices")
    p.add_argument("--bandwidth-scale", type=positive_float, default=1.0,
                   help="multiply every rate by s (delays stay real); default 1")
    p.add_argument("--timeout", type=positive_float, default=600.0, help="seconds (default 600)")
    p.add_argument("--kernel", choices=("auto", "host", "uml"), default="auto",
                   help="host kernel (needs sch_netem) or user-mode Linux; default: host if it can")
    p.add_argument("--launcher", action="store_true",
                   help="run CMD once in the cluster's root namespace with HARNESS_CLUSTER (see docs)")
    p.add_argument("--timeline", type=input_file, metavar="FILE",
                   help="links that change while CMD runs (a timeline YAML or a trace CSV; t = 0 when CMD starts), "
                        "applied live; in place of the scenario's own timeline:")
    p.add_argument("--dry-run", action="store_true", help="print the ip/tc commands and exit")
    p.add_argument("cmd", nargs="*", metavar="-- CMD ARGS", help="the program to run")
    p.set_defaults(func=cmd_emulate)


def cmd_emulate(args) -> int:
    from ..errors import HarnessError
    from ..network.emulate import run_emulated
    from ..scenario import load_scenario

    topo = load_scenario(args.scenario, args.devices).scaled(args.bandwidth_scale)
    if args.timeline:
        from dataclasses import replace

        from ..scenario import load_timeline

        topo = replace(topo, timeline=load_timeline(args.timeline, topo))
    if args.dry_run:
        from ..network.dryrun import local_cluster_commands

        print("\n".join(local_cluster_commands(topo)))
        return 0
    if not args.cmd:
        raise HarnessError("emulate: no command given (harness emulate --scenario N -- CMD ARGS...)")
    res = run_emulated(topo, args.cmd, mode="launcher" if args.launcher else "per-device",
                       kernel=args.kernel, timeout_s=args.timeout,
                       stream=sys.stdout)
    for c in res.timeline:  # what the timeline changed, when (on the command's clock)
        print(f"harness emulate: t={c['applied_s']:.3f} s: {c['event']} ({c['pairs']} pair(s), acknowledged in "
              f"{c['took_ms']:.1f} ms)", file=sys.stderr)
    codes = ", ".join(str(c) for c in res.returncodes)
    print(f"harness emulate: kernel {res.kernel}, bandwidth scale {res.bandwidth_scale:g}, "
          f"return codes [{codes}]{' (timed out)' if res.timed_out else ''}", file=sys.stderr)
    return res.returncode
