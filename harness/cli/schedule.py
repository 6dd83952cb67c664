"""`harness schedule` (one assignment) and `harness schedule compare` (paper Fig. 4)."""
from __future__ import annotations

import argparse
import sys

from ..allocation import ALLOCATORS
from ..scheduler import DEFAULT_BUDGET
from . import (add_alias, add_results_argument, non_negative_int, output_dir, output_file, positive_float, positive_int,
               scenario_name)


def add_layout_arguments(p: argparse.ArgumentParser) -> None:
    """Scenario, layout and message-size flags shared by `schedule` and `schedule compare`."""
    # Not `required=True`: argparse would then demand it before `compare`; checked in resolve_layout.
    p.add_argument("--scenario", type=scenario_name, help="case number (1-5), name or path to a .yaml file (required)")
    p.add_argument("--devices", type=positive_int, help="scale down to K devices, keeping the structure")
    p.add_argument("--d-pp", type=positive_int, help="pipeline stages (schedule: chosen by the planner within memory "
                   "unless given; compare: the smallest divisor >= sqrt(devices), 8 for 64)")
    p.add_argument("--d-dp", type=positive_int, help="data-parallel degree (default: devices / d-pp)")
    p.add_argument("--model", default="gpt3-xl", help="model config for c_pp and c_dp (default gpt3-xl)")
    p.add_argument("--layers", type=positive_int, help="override the model's layer count")
    p.add_argument("--batch", type=positive_int, default=1024, help="global batch in samples (default 1024)")
    p.add_argument("--dtype", choices=["fp16", "bf16", "fp32"], default="fp16",
                   help="bytes per value of activations and gradients (default fp16, as the paper)")
    add_alias(p, "--precision", "--dtype")
    p.add_argument("--c-pp-gb", type=positive_float, help="override c_pp (GB of 1e9 bytes)")
    p.add_argument("--c-dp-gb", type=positive_float, help="override c_dp (GB of 1e9 bytes)")
    p.add_argument("--budget", type=positive_int, default=DEFAULT_BUDGET,
                   help=f"candidates evaluated (default {DEFAULT_BUDGET})")


def register(sub) -> None:
    p = sub.add_parser(
        "schedule",
        help="assign tasklets to devices (random | ga | ga-kl | exhaustive | ga-hetero); `schedule compare` for Fig. 4",
        description="Search an assignment of D_PP x D_DP tasklets to devices minimising the paper's "
                    "COMM-COST (ga-hetero: the modelled iteration time). Prints the cost breakdown, every "
                    "stage's blocks and the modelled iteration (compute, data- and pipeline-parallel "
                    "communication); --json writes the assignment.",
    )
    add_layout_arguments(p)
    p.add_argument("--scheduler", default="ga", help="random | ga | ga-kl | exhaustive | ga-hetero (default ga); "
                   "ga-hetero minimises the modelled iteration time (compute and communication) with the "
                   "optimal layer allocation of every candidate")
    p.add_argument("--allocator", choices=ALLOCATORS, help="blocks of every stage for the modelled iteration: even (default) | "
                   "sky-heuristic | sky-mip | optimal; ga-hetero always takes optimal")
    p.add_argument("--micro-batch", type=positive_int, default=1, help="samples per micro-batch (default 1)")
    p.add_argument("--recompute", action=argparse.BooleanOptionalAction, default=None,
                   help="recompute activations per block in backward (default: the planner's choice, off where the "
                   "stages fit memory without it; on when --d-pp/--d-dp fix the degrees)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="the scheduler's seed (default 0)")
    p.add_argument("--json", type=output_file, help="write the assignment JSON here (with the planner's options)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_schedule)
    ss = p.add_subparsers(dest="schedule_command", metavar="compare")
    c = ss.add_parser("compare", help="random, ga-kl, ga with seeds 0, 1, 2: best cost vs candidates (Fig. 4)")
    add_layout_arguments(c)
    c.add_argument("--seed", type=non_negative_int, nargs="+", default=[0, 1, 2],
                   help="the seeds of every scheduler (default 0 1 2)")
    add_alias(c, "--seeds", "--seed")
    c.add_argument("--schedulers", nargs="+", default=["random", "ga-kl", "ga"])
    c.add_argument("--out", type=output_dir, help="directory for compare.csv and compare.png "
                   "(default RESULTS/<scenario>/compare)")
    add_results_argument(c)
    c.set_defaults(func=cmd_compare)


def resolve_layout(args):
    """(topology, d_pp, d_dp, c_pp_bytes, c_dp_bytes) from the shared flags."""
    from ..layout import LayoutError
    from ..compute.model import get_model
    from ..compute import BYTES_PER_VALUE, c_dp_bytes, c_pp_bytes
    from ..scenario import load_scenario

    if not args.scenario:
        raise LayoutError("--scenario: required (a case number 1-5, a name, or a path to a .yaml file)")
    topo = load_scenario(args.scenario, args.devices)
    n = topo.n
    d_pp, d_dp = args.d_pp, args.d_dp
    if d_pp is None and d_dp is None:
        d_pp = next(k for k in range(1, n + 1) if n % k == 0 and k * k >= n)
    if d_pp is None:
        d_pp = n // d_dp if n % d_dp == 0 else 0
    if d_dp is None:
        d_dp = n // d_pp if n % d_pp == 0 else 0
    if d_pp * d_dp != n:
        given = " x ".join(f"{f} {v}" for f, v in (("--d-pp", args.d_pp), ("--d-dp", args.d_dp)) if v is not None)
        raise LayoutError(f"{given}: {d_pp or '?'} stages x {d_dp or '?'} replicas do not make the {n} devices of "
                          f"{topo.name}")
    cfg = get_model(args.model, args.layers)
    if d_pp > cfg.layers:
        raise LayoutError(f"--d-pp: {d_pp} stages cannot split the {cfg.layers} layers of {cfg.name}")
    nbytes = BYTES_PER_VALUE[args.dtype]
    c_pp = args.c_pp_gb * 1e9 if args.c_pp_gb else c_pp_bytes(cfg, args.batch, d_dp, nbytes)
    c_dp = args.c_dp_gb * 1e9 if args.c_dp_gb else c_dp_bytes(cfg, d_pp, nbytes)
    return topo, d_pp, d_dp, c_pp, c_dp


def _progress_bar(total: int, desc: str, quiet: bool):
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, unit="cand", disable=quiet, file=sys.stderr, leave=False)

    def update(evaluated: int, best: float) -> None:
        bar.set_postfix_str(f"best {best:.3f} s", refresh=False)
        bar.update(evaluated - bar.n)

    return bar, update


def option_bars(budget: int, scheduler: str, quiet: bool = False):
    """(on_search, close) for the degrees planner: each option it searches gets a progress bar of its own."""
    bars = []

    def on_search(o):
        if bars:
            bars[-1].close()
        bar, update = _progress_bar(budget, f"{scheduler} {o.d_pp} x {o.d_dp}", quiet)
        bars.append(bar)
        return update

    def close():
        for bar in bars:
            bar.close()

    return on_search, close


def cmd_schedule(args) -> int:
    from ..files import atomic_write_json
    from ..scheduler import schedule

    from ..scheduler.iteration_cost import ComputeSetting
    from ..compute.model import get_model
    from ..scheduler import default_allocator

    if args.d_pp is None and args.d_dp is None and not (args.c_pp_gb or args.c_dp_gb):
        topo, a = _planned(args)
        d_pp, d_dp = a.d_pp, a.d_dp
    else:
        topo, d_pp, d_dp, c_pp, c_dp = resolve_layout(args)
        allocator = default_allocator(args.scheduler, args.allocator)
        setting = ComputeSetting(get_model(args.model, args.layers), args.batch, args.micro_batch, args.dtype,
                                 True if args.recompute is None else args.recompute)
        bar, update = _progress_bar(args.budget, f"{args.scheduler} seed {args.seed}", args.quiet)
        with bar:
            a = schedule(topo, d_pp, d_dp, c_pp, c_dp, args.scheduler, args.seed, args.budget, progress=update,
                         setting=setting, allocator=allocator)
    print(f"{topo.name}: {topo.n} devices, D_PP={d_pp} x D_DP={d_dp}, c_pp={a.c_pp_gb:.4g} GB, "
          f"c_dp={a.c_dp_gb:.4g} GB, scheduler {a.scheduler} seed {a.seed}, {a.trace[-1][0]} candidates")
    print(f"COMM-COST {a.cost['total']:.4f} s = DATAP {a.cost['dp']:.4f} s + PIPELINEP {a.cost['pp']:.4f} s; "
          f"no layout below {a.bound['total']:.4f} s (the bound: DATAP {a.bound['dp']:.4f} + PIPELINEP "
          f"{a.bound['pp']:.4f}), gap {a.gap:.1%}" + (" (optimal)" if a.gap < 1e-9 else ""))
    m = a.model
    print(f"modelled iteration {m['iteration_s']:.4f} s = compute {m['compute_s']:.4f} s ({m['micro_batches']} "
          f"micro-batches) + DATAP {m['dp_s']:.4f} s (each stage's own c_dp) + PIPELINEP {m['pp_s']:.4f} s; "
          f"blocks by {m['allocator']}: " + " ".join(str(b - f) for f, b in a.layers[0])
          + ("" if m["fits_memory"] else f"; does not fit memory ({m['overflow_gb']:.1f} GB over)"))
    print(f"  no layout and allocation below {m['bound']['total']:.4f} s (the bound: compute {m['bound']['compute']:.4f} "
          f"+ DATAP {m['bound']['dp']:.4f} + PIPELINEP {m['bound']['pp']:.4f}), gap {m['gap']:.1%}")
    print("  (the scheduler's cost model adds compute and communication, as the paper's COMM-COST does; "
          "`harness sim` simulates the runtime, which overlaps them, and gives a shorter iteration)")
    print_pipelines(a.pipelines, bool(args.json))
    if args.json:
        atomic_write_json(args.json, a.to_json())
        print(f"wrote {args.json}")
    return 0


SHOWN_PIPELINES = 16  # pipelines printed; --json has every one


def print_pipelines(pipelines, json_written: bool) -> None:
    """The first SHOWN_PIPELINES pipelines (device of every stage), and how many more there are."""
    for i, p in enumerate(pipelines[:SHOWN_PIPELINES]):
        print(f"  pipeline {i}: " + " -> ".join(map(str, p)))
    if len(pipelines) > SHOWN_PIPELINES:
        print(f"  ... {len(pipelines) - SHOWN_PIPELINES} more pipelines"
              + (" (all in the JSON)" if json_written else " (--json writes all)"))


def _planned(args):
    """The planner's assignment (harness/scheduler/degrees.py), its options printed as a table."""
    from ..compute.model import get_model
    from ..scenario import load_scenario
    from ..scheduler.degrees import plan

    if not args.scenario:
        from ..layout import LayoutError
        raise LayoutError("--scenario: required (a case number 1-5, a name, or a path to a .yaml file)")
    topo = load_scenario(args.scenario, args.devices)
    cfg = get_model(args.model, args.layers)
    on_search, close_bars = option_bars(args.budget, args.scheduler, args.quiet)
    if not args.quiet:
        print(f"{topo.name}: planning the degrees of {topo.n} devices ({cfg.name}, batch {args.batch}, "
              f"micro-batch {args.micro_batch}, {args.dtype})...", file=sys.stderr, flush=True)
    try:
        p = plan(topo, cfg, args.batch, args.micro_batch, args.dtype, args.scheduler, args.seed, args.budget,
                 args.recompute, args.allocator, on_search)
    finally:
        close_bars()
    print(degrees_table(p))
    p.assignment.plan = p.to_json()
    return topo, p.assignment


def degrees_table(p) -> str:
    """The planner's options, the searched ones with their plans' modelled iteration."""
    searched = {(o.d_pp, o.d_dp): (t, f) for o, t, f in p.searched}
    lines = ["degrees by the planner (every split of the devices the layers and batch allow; memory as "
             "`harness allocate` counts it; bound: no placement's modelled iteration is shorter):",
             f"  {'D_PP x D_DP':>12s}  {'recompute':9s}  {'memory':24s}  {'bound s':>9s}  plan's iteration s"]
    for o in p.options:
        memory = ("fits" if o.fits_any else "fits (roomiest placement)") if o.fits else f"{o.short_gb:.2f} GB short"
        t = searched.get((o.d_pp, o.d_dp))
        if t is None:
            found = "-" if o.fits else "- (does not fit)"
        else:
            found = f"{t[0]:.4f}" + ("" if t[1] else " (its plan does not fit)")
            found += "  <- chosen" if (o.d_pp, o.d_dp) == (p.chosen.d_pp, p.chosen.d_dp) else ""
        lines.append(f"  {o.d_pp:>5d} x {o.d_dp:<4d}  {'on' if o.recompute else 'off':9s}  {memory:24s}  "
                     f"{o.bound_s:9.4f}  {found}")
    if not p.assignment.model["fits_memory"]:
        lines.append(f"warning: no plan fits memory; the chosen one is {p.assignment.model['overflow_gb']:.2f} GB over")
    return "\n".join(lines)


def cmd_compare(args) -> int:
    from ..report.schedule import compare_schedulers
    from ..results import results_root

    topo, d_pp, d_dp, c_pp, c_dp = resolve_layout(args)
    out = args.out or results_root(args.results) / topo.name / "compare"
    table, paths = compare_schedulers(topo, d_pp, d_dp, c_pp, c_dp, args.schedulers, args.seed, args.budget, out)
    print(table)
    for p in paths:
        print(f"wrote {p}")
    return 0

