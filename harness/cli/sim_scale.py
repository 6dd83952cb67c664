"""`harness sim` at scale: the planner's degrees for ours, and what every simulated layout holds in memory."""
from __future__ import annotations

import sys
from contextlib import contextmanager

from ..scheduler import DEFAULT_BUDGET


def memory_notes(topo, cfg, args, cands) -> dict[int, str]:
    """'  [memory: fits | N GB over]' of every candidate whose layout is known (harness/layout/memory.py);
    the simulator itself does not limit memory."""
    from ..sim.sweep import candidate_memory

    out = {}
    for c in cands:
        fit = candidate_memory(c, topo, cfg, args.batch, args.micro_batch)
        out[id(c)] = "" if fit is None else f"  [memory: {fit.describe()}]"
    return out


def search_with_progress(sim, cfg, args) -> None:
    """The simulator's schedule search for (cfg, batch), on a progress bar."""
    from tqdm import tqdm

    with tqdm(total=args.budget, desc=f"schedule ({sim.scheduler})", unit="cand", file=sys.stderr, leave=False) as bar:
        def update(evaluated: int, best: float) -> None:
            bar.set_postfix_str(f"best {best:.3f} s", refresh=False)
            bar.update(evaluated - bar.n)

        sim.assignment(cfg, args.batch, progress=update)


def no_layout(system: str, devices: int, args) -> str:
    """Why `system` has no simulated row: no layout of its grid or rule splits the batch (10,240 devices and
    batch 1024: Megatron's and DeepSpeed's D_DP hold a factor 5, the batch none)."""
    return (f"no layout: no split of {devices:,} devices in {system}'s grid gives every replica whole "
            f"micro-batches of {args.micro_batch} from batch {args.batch} (a multiple of {devices:,} always splits)")


@contextmanager
def planning(req, topo):
    """The degrees planner's progress while `simulate` runs (harness schedule's option bars), when it plans ours'
    degrees (at scale, no --d-pp); its choice said after."""
    from ..scheduler.lumped import LUMPED_FROM
    from .schedule import option_bars

    if req.d_pp or topo.n < LUMPED_FROM:
        yield None
        return
    on_search, close_bars = option_bars(req.settings.budget, f"plan: {req.settings.scheduler}")
    print(f"{topo.name}: planning the degrees of {topo.n} devices...", file=sys.stderr, flush=True)
    try:
        yield on_search
    finally:
        close_bars()


def planned_line(p) -> str:
    """What the degrees planner chose, in one line."""
    m = p.assignment.model
    return (f"degrees by the planner: D_PP {p.chosen.d_pp} x D_DP {p.chosen.d_dp} of {len(p.options)} options "
            f"(`harness schedule` prints them all); its plan "
            + ("fits memory" if m["fits_memory"] else f"does not fit memory ({m['overflow_gb']:.1f} GB over)"))


def check_scale(args) -> None:
    """One line for a size the scale section does not have (before anything runs)."""
    from ..errors import HarnessError
    from ..report.scale import SIZES

    bad = [n for n in args.scale or () if n not in SIZES]
    if bad:
        raise HarnessError(f"--scale: {bad[0]} devices is not a size of the scale section "
                           f"(sizes: {', '.join(map(str, SIZES))})")


def scale_section(args, bar, sim_kwargs: dict) -> tuple:
    """(the scale section, its rows) for `harness sim report`: counted on `bar`, the planner's options on
    bars of their own (harness schedule's)."""
    from ..plan.systems import ReportSection
    from ..report import scale
    from .schedule import option_bars

    sizes = tuple(args.scale or scale.SIZES)
    bar.total = (bar.total or 0) + scale.steps(sizes)
    budget = args.budget or DEFAULT_BUDGET
    closers = []

    def on_search(scheduler):
        factory, close = option_bars(budget, f"scale: {scheduler}")
        closers.append(close)
        return factory

    def step(label):
        bar.set_postfix_str(label, refresh=False)
        bar.update(1)

    keep = {k: sim_kwargs[k] for k in ("profile_overrides", "protocol", "transport") if k in sim_kwargs}
    try:
        rows = scale.sweep_scale(sizes, budget, args.seed, step, on_search, **keep)
    finally:
        for close in closers:
            close()
    section = ReportSection("Scale", scale.steps(sizes), None, scale.write_scale, scale.scale_markdown)
    return section, rows
