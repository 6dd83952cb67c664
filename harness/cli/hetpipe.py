"""`harness hetpipe plan`: HetPipe's virtual workers, their partitions and memory, and the modelled throughput."""
from __future__ import annotations


from ..plan import systems
from .run_flags import add_alias, add_system_options, given_options
from ..workloads.cnn import CNN_MODELS
from . import nonempty, output_file, positive_int, scenario_name

SYSTEM = "hetpipe"  # the system whose options `hetpipe plan` takes


def register(sub) -> None:
    p = sub.add_parser("hetpipe", help="HetPipe's plans: `hetpipe plan` (virtual workers, partitions, N_m, WSP)")
    ss = p.add_subparsers(dest="hetpipe_command", metavar="{plan}", required=True)
    plan = ss.add_parser(
        "plan", help="print HetPipe's virtual workers, layers per GPU, memory and modelled throughput",
        description="Group the scenario's GPUs into virtual workers by a resource allocation policy (Park et al. "
                    "2020, Sec. 8.1), partition the model over each (the optimal allocator, within memory), pick "
                    "N_m and simulate Wave Synchronous Parallel through the parameter server.")
    plan.add_argument("--scenario", required=True, type=scenario_name, help="case name or path to a .yaml file (e.g. hetpipe-testbed)")
    plan.add_argument("--model", default="vgg19", choices=list(CNN_MODELS), help="default vgg19")
    plan.add_argument("--gpus", type=nonempty, help="nodes used, e.g. V4, VR8, VRQ12, VRQG16 (default: every GPU)")
    plan.add_argument("--batch", type=positive_int, default=32, help="minibatch per virtual worker (default 32)")
    add_system_options(plan, systems.get(SYSTEM))
    add_alias(plan, "--placement", "--ps-placement")
    plan.add_argument("--json", type=output_file, help="also write the plan as JSON")
    plan.set_defaults(func=cmd_plan)


def _placement_of(layout: dict) -> dict:
    """The layout's placement fields (devices and layers per VW); its runtime fields (schedule, dp_sync) name
    the GPT runtimes, not WSP, until HetPipe trains for real."""
    return {k: layout[k] for k in ("tp", "pp", "dp", "placement", "mesh", "stages", "replicas") if k in layout}


def cmd_plan(args) -> int:
    from tqdm import tqdm
    import sys

    from ..systems import hetpipe as hp
    from ..workloads.cnn import get_cnn
    from ..files import atomic_write_json
    from ..scenario import load_scenario

    topo = load_scenario(args.scenario)
    model = get_cnn(args.model)
    o = systems.get(SYSTEM).resolve_options(given_options(args))
    with tqdm(desc="N_m", unit="value", file=sys.stderr, leave=False) as bar:
        p = hp.plan(topo, model, args.batch, o["policy"], o["ps_placement"], o["staleness"], args.gpus, o["in_flight"],
                    progress=lambda n: bar.update(1))
    r = p.result
    print(f"{topo.name}: {model.name}, {len(p.devices)} GPUs, policy {p.policy}, placement {p.placement}, "
          f"D={p.staleness}, minibatch {args.batch}")
    print(f"N_m = {p.in_flight} (Max_m of the smallest VW: {p.max_in_flight}); local staleness {p.in_flight - 1}")
    doc = []
    for v, vw in enumerate(p.vws):
        letters = "".join(topo.region_of(d).name[0] for d in vw.devices)
        print(f"VW{v + 1} {letters}: bottleneck {vw.bottleneck_seconds:.3f} s per minibatch")
        for k, (d, (a, b)) in enumerate(zip(vw.devices, vw.stages)):
            send = f", sends {vw.send_fwd[k] * 1e3:.1f} ms" if k < len(vw.stages) - 1 else ""
            print(f"  stage {k}: device {d:>2} ({topo.profiles[d].gpu:<12}) layers {a:>2}-{b - 1:<2} "
                  f"({model.layers[a].name}..{model.layers[b - 1].name}) fwd+bwd {vw.fwd[k] + vw.bwd[k]:.3f} s, "
                  f"memory {vw.memory[k] / hp.GIB:5.2f} of {vw.capacity[k] / hp.GIB:.0f} GiB{send}")
        doc.append({"devices": list(vw.devices), "stages": [list(s) for s in vw.stages], "fwd": list(vw.fwd),
                    "bwd": list(vw.bwd), "memory_bytes": list(vw.memory)})
    print(f"parameter server sync (push or pull of every VW): {p.sync_seconds:.3f} s; across nodes per wave: "
          f"{p.cross_node_bytes / 1e6:.0f} MB")
    print(f"modelled: {r.seconds_per_wave:.3f} s per wave, {r.samples_per_s:.1f} samples/s; largest clock distance "
          f"when a VW resumes: {max(r.distance_at_resume, default=0)}")
    if args.json:
        atomic_write_json(args.json, {
            "scenario": topo.name, "model": model.name, "policy": p.policy, "placement": p.placement,
            "D": p.staleness, "N_m": p.in_flight, "max_N_m": p.max_in_flight, "minibatch": args.batch, "vws": doc,
            "sync_seconds": p.sync_seconds, "cross_node_bytes": p.cross_node_bytes,
            "seconds_per_wave": r.seconds_per_wave, "samples_per_s": r.samples_per_s, "layout": _placement_of(p.layout().to_json())})
        print(f"wrote {args.json}")
    return 0
