"""`harness scenario list|show|export`."""
from __future__ import annotations

import json

from . import add_results_argument, output_dir, positive_int, scenario_name


def register(sub) -> None:
    p = sub.add_parser("scenario", help="list, show or export the network scenarios")
    ss = p.add_subparsers(dest="scenario_command", metavar="ACTION", required=True)

    ls = ss.add_parser("list", help="list the scenario files")
    ls.set_defaults(func=cmd_list)

    show = ss.add_parser("show", help="summary table and delay/bandwidth heatmaps (paper Fig. 3 a-b)")
    show.add_argument("scenario", type=scenario_name, help="case number (1-5), name (fluidstack) or path to a .yaml file")
    show.add_argument("--devices", type=positive_int, help="scale down to K devices, keeping the structure")
    show.add_argument("--out", type=output_dir, help="directory for summary.txt, delay.png, bandwidth.png "
                      "(default: RESULTS/<scenario>/scenario)")
    add_results_argument(show)
    show.add_argument("--no-plots", action="store_true", help="print the summary only")
    show.set_defaults(func=cmd_show)

    ex = ss.add_parser("export", help="device-level matrices as JSON (row index = device id)")
    ex.add_argument("scenario", type=scenario_name, help="case number (1-5), name or path to a .yaml file")
    ex.add_argument("--devices", type=positive_int)
    ex.add_argument("--json", action="store_true", required=True, help="print JSON (the only format)")
    ex.set_defaults(func=cmd_export)


def cmd_list(args) -> int:
    from ..scenario import list_scenarios, load_scenario

    names = list_scenarios()
    width = max(map(len, names))
    for name in names:
        t = load_scenario(name)
        print(f"{name:{width}s} {t.n:5d} devices  {len(t.regions):3d} regions  {t.description}")
    return 0


def cmd_show(args) -> int:
    from ..report.scenario import scenario_summary, write_heatmaps
    from ..files import atomic_write_text
    from ..results import results_root
    from ..scenario import load_scenario

    topo = load_scenario(args.scenario, args.devices)
    text = scenario_summary(topo)
    print(text)
    if not args.no_plots:
        out = args.out or results_root(args.results) / topo.name / "scenario"
        atomic_write_text(out / "summary.txt", text + "\n")
        for path in write_heatmaps(topo, out):
            print(f"wrote {path}")
    return 0


def cmd_export(args) -> int:
    from ..scenario import load_scenario

    print(json.dumps(load_scenario(args.scenario, args.devices).to_export()))
    return 0
