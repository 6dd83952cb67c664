"""`harness allocate`: each device's block range on one pipeline, by every layer allocator (harness/allocation/)."""
from __future__ import annotations

import sys

from . import output_file, positive_float, positive_int, scenario_name


def register(sub) -> None:
    from ..allocation import ALLOCATORS, MIP_TIME_LIMIT_S

    p = sub.add_parser(
        "allocate",
        help="allocate a model's blocks over a scenario's devices (Sky Computing's allocators and the optimum)",
        description="One pipeline over the scenario's devices in id order: every allocator chooses each device's "
                    "contiguous block range; printed per device with its memory and modelled stage seconds (one "
                    "micro-batch's forward and backward, its sends, the head on the last), the bottleneck marked, "
                    "and the simulated iteration (ours' runtime, GPipe, on the scenario's links).",
    )
    p.add_argument("--scenario", required=True, type=scenario_name, help="case number, name or YAML path (e.g. sky)")
    p.add_argument("--devices", type=positive_int, help="scale the scenario to this many devices")
    p.add_argument("--model", default="bert-large", help="model config (default bert-large, Sky Computing's)")
    p.add_argument("--layers", type=positive_int, help="override the model's block count")
    p.add_argument("--batch", type=positive_int, default=8, help="samples per iteration (default 8)")
    p.add_argument("--micro-batch", type=positive_int, default=1, help="samples per micro-batch (default 1)")
    p.add_argument("--dtype", choices=("fp16", "bf16", "fp32"), default="fp16", help="training precision (default fp16)")
    p.add_argument("--allocator", choices=(*ALLOCATORS, "all"), default="all", help="default all")
    p.add_argument("--time-limit", type=positive_float, default=MIP_TIME_LIMIT_S,
                   help=f"seconds for sky-mip's solver (default {MIP_TIME_LIMIT_S:g})")
    p.add_argument("--json", type=output_file, help="write the allocations (a list with --allocator all)")
    p.set_defaults(func=_allocate)


def _allocate(args) -> int:
    from ..allocation import ALLOCATORS, allocate, problem_for
    from ..systems.ours.sim import simulate_allocation
    from .. import compute as work
    from ..compute.model import get_model
    from ..files import atomic_write_json
    from ..scenario import load_scenario

    topo = load_scenario(args.scenario, devices=args.devices)
    cfg = get_model(args.model, args.layers)
    micro_batches = work.micro_batches(args.batch, args.micro_batch)
    devices = list(range(topo.n))
    problem = problem_for(cfg, topo, devices, args.micro_batch, micro_batches, args.dtype)
    names = ALLOCATORS if args.allocator == "all" else (args.allocator,)
    docs = []
    from tqdm import tqdm

    bar = tqdm(names, desc="allocate", unit="allocator", file=sys.stderr, leave=False)  # sky-mip: up to --time-limit
    for name in bar:
        bar.set_postfix_str(name)
        a = allocate(name, problem, time_limit_s=args.time_limit)
        iteration = simulate_allocation(cfg, topo, devices, a, args.batch, args.micro_batch, args.dtype)
        print(_table(a, problem, iteration))
        docs.append({"allocator": a.allocator, "layers_per_device": list(a.layers_per_device),
                     "stage_seconds": list(a.stage_seconds), "iteration_seconds": iteration,
                     "solve_seconds": a.solve_seconds, "proven_optimal": a.optimal})
    if args.json:
        atomic_write_json(args.json, docs if args.allocator == "all" else docs[0])
        print(f"wrote {args.json}")
    return 0


def _table(a, problem, iteration: float) -> str:
    used = problem.stage_memory(a.layers_per_device)
    lines = [f"{a.allocator}: bottleneck {problem.name(a.bottleneck)} at {max(a.stage_seconds):.4g} s per "
             f"micro-batch; iteration {iteration:.4g} s (simulated); solved in {a.solve_seconds:.3g} s"
             + (" (optimal)" if a.optimal else ""),
             f"  {'device':<40} {'blocks':>10} {'memory GB':>14} {'stage s':>10}"]
    for i, ((first, last), sec) in enumerate(zip(a.stages, a.stage_seconds)):
        mark = "  <- bottleneck" if i == a.bottleneck else ""
        lines.append(f"  {problem.name(i):<40} {f'{first}-{last - 1}':>10} "
                     f"{f'{used[i] / 1e9:.2f}/{problem.memory[i] / 1e9:.2f}':>14} {sec:>10.4g}{mark}")
    return "\n".join(lines)
