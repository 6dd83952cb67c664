"""`harness sim` (one scenario, every system), `sim report`, `sim calibrate RECORDS`, `sim compare RECORDS`."""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from ..errors import HarnessError
from .. import workloads
from ..plan import systems
from ..plan.arg_types import flag_dest
from . import sim_timeline
from .sim_compare import cmd_compare, profile_overrides, read_input
from ..allocation import ALLOCATORS
from .run_flags import add_system_options, given_options
from . import (add_alias, add_results_argument, add_transport_argument, input_file, input_path, name_list,
               non_negative_int, nonempty, output_dir, output_file, positive_float, positive_int, scenario_name,
               with_transport)

from .schedule import print_pipelines
from ..scenario import PAPER_CASES as CASES
from ..scheduler import DEFAULT_BUDGET

SIM_WORKLOADS = ("gpt", "cnn")  # the workloads `harness sim` runs (fl: `harness fl`)


def _common(p: argparse.ArgumentParser, defaults: dict) -> None:
    """Flags of `harness sim` and `sim report`; `defaults`: flag -> default (the workload's, filled in
    after parsing where it is missing: a flag left None was not given)."""
    d = defaults.get
    p.add_argument("--profile", type=input_file, help="compute profile JSON (from `harness sim calibrate`) replacing "
                   "the default efficiencies")
    p.add_argument("--budget", type=positive_int, default=d("--budget"),
                   help=f"scheduler evaluations for ours (default {DEFAULT_BUDGET})")
    p.add_argument("--seed", type=non_negative_int, default=d("--seed"), help="scheduler seed for ours (default 0)")
    add_alias(p, "--schedule-seed", "--seed")
    p.add_argument("--ps-mode", choices=["grouped", "rounds"], default=d("--ps-mode"),
                   help="ours' sharded parameter server: one grouped all-to-all (the runtime) or sequential rounds "
                        "(the order the paper's cost model sums); default grouped")
    p.add_argument("--placement", type=name_list,
                   help="GPT baselines' placements to try, comma-separated: default (rank order), random (seeds "
                        "2022-2024, averaged); default both (HetPipe's parameter server: --ps-placement)")
    p.add_argument("--no-cache", action="store_true", default=d("--no-cache"),
                   help="do not read or write results/sim/schedules/")
    p.add_argument("--protocol", choices=["nccl", "gloo"], default=d("--protocol"),
                   help="communication library's handshakes (default nccl, as the paper's GPUs)")
    add_transport_argument(p)
    p.add_argument("--allocator", choices=ALLOCATORS,
                   help="ours' and ours-random's blocks per stage over their pipelines (harness allocate; default "
                        "even; with --scheduler ga-hetero its own optimal)")
    p.add_argument("--scheduler", default=d("--scheduler"),
                   help="ours' scheduler: ga (default) | ga-kl | random | exhaustive | ga-hetero (compute and "
                        "network together, with the optimal allocation; harness schedule)")


def register(sub) -> None:
    p = sub.add_parser(
        "sim", help="simulate one training iteration per system at any scale; `sim report|calibrate|compare`",
        description="Predict iteration time and PFLOPS of ours, ours-random, Megatron and DeepSpeed on a "
                    "scenario from first principles (FLOPs, device profile, delay/bandwidth matrices).",
    )
    p.add_argument("--scenario", type=scenario_name, help="case number (1-5), name or path to a .yaml file")
    p.add_argument("--devices", type=positive_int, help="scale the scenario down to K devices")
    p.add_argument("--bandwidth-scale", type=positive_float, default=1.0, metavar="X",
                   help="multiply every link's bandwidth (default 1), as `harness run --bandwidth-scale` does: "
                        "predict an emulated run at its own scale")
    p.add_argument("--system", default="all", metavar="SYSTEM",
                   help=f"all (default) or one of: {', '.join(systems.names(simulated=True))}")
    add_system_options(p)
    p.add_argument("--model", default="gpt3-xl", help="model config (default gpt3-xl), or a CNN for hetpipe and "
                   f"horovod: {', '.join(workloads.get('cnn').models)}; a flag the model's workload does not take "
                   "is refused")
    p.add_argument("--layers", type=positive_int, help="override the model's layer count")
    p.add_argument("--batch", type=positive_int, help="global batch in samples (default 1024); for the CNN models "
                   "the minibatch of a GPU or virtual worker (default 32, HetPipe's)")
    p.add_argument("--micro-batch", type=positive_int, help="micro-batch in samples (default 1)")
    p.add_argument("--d-pp", type=positive_int, help="ours' pipeline stages (default as `harness run`: as square as "
                   "possible with the pipeline on the longer side, 8 for 64 devices)")
    p.add_argument("--json", type=output_file, help="write every simulated layout as a JSON list of records with `best`")
    sim_timeline.add_arguments(p)
    h = p.add_argument_group("HetPipe and Horovod (CNN models)")
    h.add_argument("--gpus", type=nonempty, help="the nodes used, as letters of the scenario's one-letter regions and the GPU "
                   "count, e.g. V4, VR8, VRQ12, VRQG16 (default: every GPU)")
    p.add_argument("--out", type=output_dir, help="run directory for records.csv (default RESULTS/<scenario>/<run-id>)")
    add_results_argument(p)
    _common(p, {})
    p.set_defaults(func=cmd_sim)
    ss = p.add_subparsers(dest="sim_command", metavar="{report,calibrate,compare}")

    r = ss.add_parser("report", help="paper-scale sweep: speedup tables, Fig. 3/6/7 style figures, report.md")
    r.add_argument("--out", type=output_dir, help="output directory (default RESULTS/sim/<run-id>)")
    add_results_argument(r)
    r.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES), metavar="CASE",
                   help="the paper's cases, of 1 2 3 4 5 (default all)")
    r.add_argument("--layers", type=positive_int, nargs="+", default=[24, 32, 40])
    r.add_argument("--batches", type=positive_int, nargs="+", default=[1024, 2048, 4096])
    r.add_argument("--no-fluidstack", action="store_true", help="skip the FluidStack case (Fig. 7)")
    only = r.add_mutually_exclusive_group()
    only.add_argument("--no-hetpipe", action="store_true", help="skip the systems' own sections (today HetPipe's "
                      "Figure 4 and Table 4, on hetpipe-testbed)")
    only.add_argument("--hetpipe-only", action="store_true", help="only the systems' own sections, HetPipe's "
                      "(seconds, not hours)")
    only.add_argument("--map", action="store_true", help="only the map of which system wins where: every scenario "
                      "of --map-scenarios at every bandwidth scale of --map-scales, each system at its best layout "
                      "(map.png, map.csv, map.json, report.md)")
    r.add_argument("--map-scenarios", type=scenario_name, nargs="+", metavar="SCENARIO",
                   help="the map's scenarios (default: 1 2 3 4 5 fluidstack hetero-regional)")
    r.add_argument("--map-scales", type=positive_float, nargs="+", metavar="X",
                   help="the map's bandwidth scales (default: 0.01 0.03 0.1 0.3 1 3 10)")
    r.add_argument("--scale", type=positive_int, nargs="+", metavar="DEVICES", help="the scale section's sizes, "
                   "of 64 256 1024 10240 (default all: case 5's world to 10,240 devices); --no-scale: none")
    r.add_argument("--no-scale", action="store_true", help="skip the scale section (planning and iteration time "
                   "against devices)")
    r.add_argument("--workers", type=positive_int, help="processes running the scheduler for uncached "
                   "settings (default: cores, at most 4)")
    _common(r, workloads.get("gpt").sim_flags)
    r.set_defaults(func=cmd_report)

    c = ss.add_parser("calibrate", help="fit the compute efficiency of each GPU type from measured records",
                      description="Efficiency per GPU type such that the simulator's busiest device computes as "
                      "long as the measured runs' did (median; ours' in-iteration timings preferred over the "
                      "baselines' start-up ones).")
    c.add_argument("records", type=input_path, help="records.csv, or a directory searched for records.csv")
    c.add_argument("--json", type=output_file, help="profile JSON to write (default RESULTS/sim/profile.json)")
    add_alias(c, "--out", "--json")
    add_results_argument(c)
    c.set_defaults(func=cmd_calibrate)

    m = ss.add_parser("compare", help="simulated vs measured iteration time per system and scenario",
                      description="Simulates each measured run as the harness ran it (ours with pre-posted "
                      "receives; the baselines as torch pipelining + DDP/ZeRO-1 over gloo or NCCL) and prints "
                      "measured (mean of the iterations) vs simulated seconds, the error (target 15%) and, "
                      "for ours on a shared host, the CPU load of the ranks.")
    m.add_argument("records", type=input_path, help="records.csv, or a directory searched for records.csv; FL runs: "
                   "their records.json or run directory (each measured round against the flow simulation)")
    m.add_argument("--profile", type=input_file, help="compute profile JSON (e.g. from `harness sim calibrate`)")
    m.add_argument("--csv", type=output_file, help="also write the comparison as CSV")
    m.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], help="wire precision of the runs (default: each "
                   "run's manifest, else fp32 for emu/local and bf16 for cluster)")
    m.set_defaults(func=cmd_compare)


def _settings(args):
    """How the simulator models the setting (sim/request.SimSettings) from the flags `harness sim` and `sim report`
    share; a bad value is one line naming its flag."""
    from ..results import results_root
    from ..sim.request import SimSettings
    from ..sim.sweep import PLACEMENTS

    return SimSettings(scheduler=args.scheduler, budget=args.budget or DEFAULT_BUDGET, seed=args.seed,
                       allocator=args.allocator, ps_mode=args.ps_mode, placements=tuple(args.placement or PLACEMENTS),
                       protocol=args.protocol, transport=getattr(args, "transport", "scenario"),
                       profile=None if args.profile is None else str(args.profile),
                       cache_dir=None if args.no_cache else str(results_root(args.results) / "sim" / "schedules"))


def cmd_sim(args) -> int:
    """`harness sim`: the model's workload takes its flags (with its defaults), then its command runs."""
    from ..errors import HarnessError

    if not args.scenario:
        raise HarnessError("--scenario: required (or use `harness sim report|calibrate|compare`)")
    workload = workloads.of_model(args.model, SIM_WORKLOADS)
    given = {flag: getattr(args, flag_dest(flag)) for flag in workloads.sim_flags(SIM_WORKLOADS)}
    for flag, value in workload.take_flags(args.model, given).items():
        setattr(args, flag_dest(flag), value)
    return RUNNERS[workload.name](args)


def cmd_sim_gpt(args) -> int:
    """`harness sim` on a GPT: the library's simulate (sim/request.py) of the flags' request; its records printed
    and written."""
    from .sim_scale import memory_notes, no_layout, planned_line, planning, search_with_progress
    from ..files import atomic_write_json
    from ..results import manifest, new_run_id, run_dir, write_records
    from ..sim.request import SimRequest, simulate
    from ..sim.sweep import record_json, to_record

    req = SimRequest(args.scenario, args.devices, args.bandwidth_scale, () if args.system == "all" else (args.system,),
                     args.model, args.layers, args.batch, args.micro_batch, args.d_pp, given_options(args),
                     _settings(args))
    topo = sim_timeline.with_timeline(req.topology(), args)
    with planning(req, topo) as on_plan:
        result = simulate(req, topo, on_plan=on_plan, on_search=lambda sim, cfg: search_with_progress(sim, cfg, args))
    cfg, cands, n = result.cfg, result.candidates, topo.n
    if result.planned is not None:
        print(planned_line(result.planned))
    run_id = new_run_id("sim")
    records = [to_record(c, run_id=run_id, topo=topo, cfg=cfg, batch=args.batch, micro_batch=args.micro_batch)
               for c in cands]
    print(f"{topo.name}: {n} devices, {cfg.name} L={cfg.layers} batch {args.batch}, micro-batch {args.micro_batch}")
    print(f"{'system':<12} {'seconds':>10} {'PFLOPS':>8}  layout")
    memory = memory_notes(topo, cfg, args, cands)
    for c, rec in zip(cands, records):
        if c.best:
            print(f"{c.system:<12} {c.seconds:>10.3f} {rec.pflops:>8.3f}  {_short(c.config)}{memory[id(c)]}")
    per_system = Counter(c.system for c in cands)
    for system in [s for s in result.systems if s not in per_system]:  # say so, rather than leave the row out
        print(f"{system:<12} {'-':>10} {'-':>8}  {no_layout(system, n, args)}")
    grid = sorted(((c, r) for c, r in zip(cands, records) if per_system[c.system] > 1),
                  key=lambda cr: (cr[0].system, cr[0].seconds))
    if grid:
        print("\ngrid of every system with more than one layout (Megatron: T x P x D; DeepSpeed: ZeRO-3, "
              "ZeRO-1 x P; placements averaged over seeds):")
        for c, rec in grid:
            print(f"  {c.system:<10} {c.seconds:>12.3f} s {rec.pflops:>8.4f} PFLOPS  {_short(c.config)}"
                  f"{memory[id(c)]}{'  <- best' if c.best else ''}")
    for c in cands:
        if systems.get(c.system).scheduled:
            print(f"{c.system}' pipelines (device of stage 0..D_PP-1 per replica):")
            print_pipelines(c.config["pipelines"], bool(args.json))
    out = args.out or run_dir(topo.name, run_id, args.results)
    if args.json:  # before the manifest: a run whose files could not all be written does not say ok
        atomic_write_json(args.json, [record_json(r, c.best) for c, r in zip(cands, records)])
        print(f"wrote {args.json}")
    write_records(Path(out) / "records.csv", records)
    if (path := sim_timeline.print_timeline(result.sim, cands, args, cfg, out)) is not None:
        print(f"wrote {path}")
    atomic_write_json(Path(out) / "manifest.json", manifest(run_id, "ok", backend="sim"))
    print(f"wrote {Path(out) / 'records.csv'}")
    return 0


def cmd_sim_cnn(args) -> int:
    """`harness sim` on a layer-profile CNN: hetpipe's and horovod's candidates, JSON records."""
    from ..workloads.cnn import get_cnn
    from ..errors import HarnessError
    from ..files import atomic_write_json
    from ..results import manifest, new_run_id, run_dir
    from ..scenario import load_scenario
    from ..sim.cnn import DTYPE, CNNOptions, record

    known = systems.names(simulated=True, workload="cnn")
    which = known if args.system == "all" else (args.system,)
    for s in which:
        if s not in known:
            raise HarnessError(f"--system: {s!r} does not train {args.model} (known for CNN models: all, {', '.join(known)})")
    if args.placement:
        raise HarnessError("--placement: the GPT baselines' placements; HetPipe's parameter server: --ps-placement")
    from ..sim.request import check_options

    options = given_options(args)
    check_options(options, which, args.model, None if args.system == "all" else args.system)
    topo = with_transport(load_scenario(args.scenario, args.devices).scaled(args.bandwidth_scale), args)
    model = get_cnn(args.model)
    from ..compute.profiles import device_profiles

    opts = CNNOptions(gpus=args.gpus, profiles=device_profiles(topo, profile_overrides(args), dtype=DTYPE),
                      options=options)
    batch = args.batch  # HetPipe's minibatch by default (Sec. 8.1: 32)
    cands = []
    from tqdm import tqdm

    for s in tqdm(which, desc=f"sim {topo.name}", unit="system", file=sys.stderr, leave=False):
        got = systems.get(s).simulate_fn("cnn")(topo, model, batch, opts)
        if got:
            max(got, key=lambda c: c.samples_per_s).best = True
        cands += got
    run_id = new_run_id("sim")
    records = [record(c, run_id=run_id, topo=topo, model=model, batch=batch) for c in cands]
    print(f"{topo.name}: {model.name} ({model.params / 1e6:.1f}M parameters), minibatch {batch}")
    print(f"{'system':<9} {'config':<22} {'GPUs':>4} {'N_m':>4} {'s/wave':>8} {'samples/s':>10} {'MB across nodes/sample':>23}")
    for c, r in zip(cands, records):
        conf = c.config
        label = f"{conf['policy']}-{conf['placement']}" if "policy" in conf else f"ring ({conf['gpus']})"
        print(f"{c.system:<9} {label:<22} {c.devices:>4} {conf.get('N_m', '-')!s:>4} {c.seconds:>8.3f} "
              f"{c.samples_per_s:>10.1f} {r['cross_node_bytes_per_sample'] / 1e6:>23.2f}{'  <- best' if c.best else ''}")
    out = args.out or run_dir(topo.name, run_id, args.results)
    if args.json:  # before the manifest (as cmd_sim_gpt)
        atomic_write_json(args.json, records)
        print(f"wrote {args.json}")
    atomic_write_json(Path(out) / "records.json", records)
    atomic_write_json(Path(out) / "manifest.json", manifest(run_id, "ok", backend="sim"))
    print(f"wrote {Path(out) / 'records.json'}")
    return 0


RUNNERS = {"gpt": cmd_sim_gpt, "cnn": cmd_sim_cnn}  # workload -> its `harness sim`


def _short(config: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in config.items() if k != "pipelines")


def cmd_report(args) -> int:
    from tqdm import tqdm

    from .sim_scale import check_scale, scale_section

    from ..report import sim as report
    from ..results import new_run_id, results_root

    kw = _settings(args).simulator_kwargs()
    check_scale(args)
    run_id = new_run_id("sim")
    out = args.out or results_root(args.results) / "sim" / run_id
    if args.map or args.map_scenarios or args.map_scales:
        return _cmd_map(args, out, run_id)
    if args.hetpipe_only:
        with tqdm(total=0, desc="sim report (systems' sections)", unit="setting", file=sys.stderr, leave=False) as bar:
            paths = report.write_sections_only(out, run_id, _sweep_sections(bar))
        print(f"wrote {out}/report.md and {len(paths) - 1} other files")
        return 0
    total = len(args.cases) * len(args.layers) * len(args.batches) + (0 if args.no_fluidstack else 3)
    with tqdm(total=total, desc="sim report", unit="setting", file=sys.stderr, leave=False) as bar, \
            tqdm(desc="schedules", unit="schedule", file=sys.stderr, leave=False) as sbar:
        def step(label):
            bar.set_postfix_str(label, refresh=False)
            bar.update(1)

        def scheduled(done, todo):
            sbar.total = todo
            sbar.update(done - sbar.n)

        opts = {"progress": step, "schedule_progress": scheduled, "workers": args.workers, **kw}
        sweeps = report.sweep_cases(args.cases, args.layers, args.batches, **opts)
        fs = None if args.no_fluidstack else report.sweep_fluidstack(**opts)
        sections = [] if args.no_hetpipe else _sweep_sections(bar)
        sections += [] if args.no_scale else [scale_section(args, bar, kw)]
    paths = report.write_report(out, sweeps, fs, run_id, report.sweep_notes(kw), sections)
    for r in report.summary_rows(sweeps):
        print(f"case {r['case']}: ours vs Megatron {r['vs_megatron_mean']:.2f}x, vs DeepSpeed "
              f"{r['vs_deepspeed_mean']:.2f}x (mean PFLOPS), scheduler vs random up to {r['vs_random'].max():.2f}x")
    print(f"wrote {out}/report.md and {len(paths) - 1} other files")
    return 0


def _cmd_map(args, out: Path, run_id: str) -> int:
    """`sim report --map`: the map's cells, with a bar over them, then its files."""
    from tqdm import tqdm

    from ..errors import HarnessError
    from ..report import map as smap

    if not args.map:
        raise HarnessError("--map-scenarios/--map-scales: options of --map")
    scenarios = tuple(args.map_scenarios or smap.MAP_SCENARIOS)
    scales = tuple(args.map_scales or smap.MAP_SCALES)
    total = len(scenarios) * len(scales) * len(smap.CONTENDERS)
    with tqdm(total=total, desc="sim report --map", unit="run", file=sys.stderr, leave=False) as bar:
        def step(label):
            bar.set_postfix_str(label, refresh=False)
            bar.update(1)

        cells = smap.sweep_map(scenarios, scales, settings=_settings(args), progress=step)
    paths = smap.write_map(Path(out), cells, run_id)
    for cell in cells:
        if cell.best:
            margin = "alone" if cell.margin == float("inf") else f"x{cell.margin:.2f}"
            second = cell.ranked[1][0] if len(cell.ranked) > 1 else "-"
            print(f"{cell.scenario:>16} x{cell.scale:<6g} {cell.best:<17} {margin} over {second}")
    print(f"wrote {out}/report.md and {len(paths) - 1} other files")
    return 0


def _sweep_sections(bar):
    """The systems' own report sections (HetPipe's), counted on `bar`."""
    from ..plan.systems import report_sections
    from ..report import sim as report

    bar.total = (bar.total or 0) + sum(section.steps for section in report_sections())

    def step(label):
        bar.set_postfix_str(label, refresh=False)
        bar.update(1)

    return report.sweep_sections(progress=step)


def cmd_calibrate(args) -> int:
    from ..compute.profiles import save_profiles
    from ..sim.compare import calibrate_records, load_measured

    from ..results import results_root

    notes: list[str] = []
    profiles = calibrate_records(read_input(args.records, lambda path: load_measured(path, notes)))
    for line in notes:
        print(f"note: {line}")
    out = args.json or results_root(args.results) / "sim" / "profile.json"
    save_profiles(out, profiles)
    for gpu, p in profiles.items():
        print(f"{gpu}: efficiency {p.efficiency['transformer']:.4g} of {p.peak_tflops:g} TFLOPS ({p.source})")
    print(f"wrote {out}")
    return 0
