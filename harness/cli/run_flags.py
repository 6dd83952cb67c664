"""The flags of a run -> its RunRequest (harness/plan/request.py): the command line, at the top.

`harness run` and `harness tune` add these flags to their parsers; `harness cluster sbatch` turns the job's
`harness run` arguments into the request its ranks will make (`run_request`). Each flag given is its section's
field; the defaults that follow from other fields are the library's (plan/asked.request_of), which the
regression gate and scripts use without any flag. The request's own checks (model, layout, network) happen where
it is planned (harness/plan/layouts.py); here only what a flag alone can say.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ..allocation import ALLOCATORS
from ..scheduler import DEFAULT_BUDGET
from ..workloads.cnn import CNN_DATA_SETS
from ..workloads.markov import DATA_SETS
from ..errors import HarnessError
from ..scenario import ScenarioError, load_scenario, reload_name
from ..scenario.inventory import Inventory, InventoryError
from ..scenario.preemption import HEARTBEAT_S, KEEPALIVE_MISSED, KEEPALIVE_S, LAST_CALL_S
from ..scenario.transport import PRESETS
from ..plan.arg_types import (flag_dest, input_dir, input_file, non_negative_float, non_negative_int, nonempty, output_dir, positive_float, positive_int,
                        scenario_name)
from ..plan import systems
from ..plan.asked import request_of
from ..plan.request import DebugSection, LayoutRequest, NetworkSection, RunRequest


class _DeprecatedAlias(argparse.Action):
    """An old spelling of a flag: stores into the new flag's attribute and prints a one-line note."""

    def __init__(self, option_strings, dest, new: str = "", **kw):
        self.new = new
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"harness: note: {option_string} is deprecated, use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_alias(p: argparse.ArgumentParser, old: str, new: str) -> None:
    """`old` keeps working as a deprecated spelling of the flag `new` already added to `p` (same type,
    choices and attribute); hidden from --help."""
    action = next(a for a in p._actions if new in a.option_strings)
    p.add_argument(old, action=_DeprecatedAlias, new=new, dest=action.dest, type=action.type,
                   choices=action.choices, nargs=action.nargs, metavar=action.metavar, help=argparse.SUPPRESS,
                   default=argparse.SUPPRESS)


def add_results_argument(p: argparse.ArgumentParser) -> None:
    """--results DIR: the root under which runs and reports go (every command that writes results)."""
    p.add_argument("--results", type=output_dir, metavar="DIR",
                   help="results root (default: $HARNESS_RESULTS, else results/ in the current directory)")


NETWORK_CHOICES = ("emulated", "none", "shaped")


def add_training_arguments(p: argparse.ArgumentParser, *, inventory: bool = False) -> None:
    """Scenario, model, data and runtime flags shared by `harness run` and `harness tune`
    (`inventory`: the scenario may come from --inventory instead)."""
    p.add_argument("--scenario", required=not inventory, type=scenario_name,
                   help="case number, name or path of a scenario file" + (" (with --inventory: the inventory's)"
                                                                         if inventory else ""))
    p.add_argument("--devices", type=positive_int, help="scale the scenario down to K devices")
    p.add_argument("--model", default="tiny", help="tiny | small | medium | gpt3-xl | ... (GPTs), or small-resnet "
                   "(a CNN: hetpipe and horovod train it) (default tiny)")
    p.add_argument("--layers", type=positive_int)
    p.add_argument("--batch", type=positive_int, default=8, help="global batch, samples (default 8)")
    p.add_argument("--micro-batch", type=positive_int, default=1, help="samples per micro-batch (default 1)")
    p.add_argument("--warmup", type=non_negative_int, default=1, help="untimed iterations first (default 1)")
    p.add_argument("--bandwidth-scale", type=positive_float,
                   help="multiply every link's bandwidth (default 1; with --inventory the inventory's)")
    p.add_argument("--network", choices=NETWORK_CHOICES,
                   help="emulated: namespaces with shaping; none: loopback, no shaping (default emulated); "
                        "with --inventory: shaped (by `harness net apply`, the default) or none")
    p.add_argument("--kernel", choices=("auto", "host", "uml"), default="auto",
                   help="emulated: the host kernel (needs sch_netem) or user-mode Linux (default auto)")
    p.add_argument("--timeline", metavar="FILE",
                   help="emulated: links that change during the run, applied live (a timeline YAML, or a trace "
                        "CSV: time_s,from,to,rate_gbps,delay_ms), in place of the scenario's own timeline: "
                        "(scenarios/timelines/ has examples)")
    p.add_argument("--lr", type=positive_float, default=0.1)
    p.add_argument("--data", choices=(*DATA_SETS, *CNN_DATA_SETS), default=None,
                   help="a GPT's synthetic tokens: uniform (nothing to learn; the loss stays at log V) or markov (a "
                        "fixed random Markov chain: learnable, its loss floor, the entropy rate, is in the "
                        "manifest); a CNN's images: teacher (labels drawn from a fixed teacher network's softmax: "
                        "its expected entropy, the floor, is in the manifest) (default uniform for a GPT, teacher "
                        "for a CNN)")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default=None,
                   help="default fp32 on cpu, bf16 on cuda")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--compute-model", action="store_true",
                   help="every forward, backward and optimizer step of a rank takes what its scenario device "
                        "gives (FLOPs / (peak x efficiency / slowdown)): it computes, then waits for the rest; "
                        "phases that took longer are counted in the records (compute_overruns)")
    p.add_argument("--compute-time-scale", type=positive_float, default=None, metavar="X",
                   help="with --compute-model: multiply every modelled time by X (e.g. 1000 so that a CPU computes "
                        "a GPU's microseconds within the modelled time). Default, emulated: a time dilation chosen "
                        "by a short probe of this host's cost per iteration (X, and every link X times slower on "
                        "top of --bandwidth-scale), so that the emulated CPU does not bound the iterations; said on "
                        "stderr and in each manifest (dilation)")
    add_results_argument(p)
    add_alias(p, "--out", "--results")
    p.add_argument("--debug", action="append", metavar="KEY=VALUE",
                   help="debug options carried to every rank (repeatable): fault_rank=R, fault_after_s=S, "
                        "fault_mode=kill|exit|preempt (preempt: device R leaves, the elastic agent goes on without it), "
                        "fault_iteration=K fault_phase=forward|backward|dp_sync|checkpoint (dies there instead), "
                        "fault_notice_s=S (preempt: warned there, taken S s later), "
                        "trace=1; ours' planted regressions: send_delay_s=S (every send "
                        "waits S first), overlap=0 (every send waits until the peer took the data; GPipe on "
                        "CPU); count_wire=1: every rank counts its bytes on the wire per iteration (manifest: "
                        "wire_bytes_per_rank; slows the compute); hetpipe: jitter_s=S (ranks of random speeds: "
                        "each waits up to 2 S x its device's draw after every compute phase) "
                        "(harness/plan/request.py: DebugSection)")


def network_from_args(args):
    """The network section: from the flags, or on real nodes (--inventory) from the inventory,
    which the flags may only repeat (`inventory_network`)."""

    transport = getattr(args, "transport", "scenario")
    if getattr(args, "inventory", None):
        from ..scenario.inventory import load_inventory

        if transport != "scenario":
            raise HarnessError("--transport: real nodes run with the TCP settings `harness net apply` set there "
                               "(the scenario's); not with --inventory")
        if getattr(args, "timeline", None) is not None:
            raise HarnessError("--timeline: the emulated cluster applies it; on real nodes not yet (with --inventory)")

        return inventory_network(load_inventory(args.inventory), scenario=args.scenario, devices=args.devices,
                                 bandwidth_scale=args.bandwidth_scale, mode=args.network)
    if args.scenario is None:
        raise HarnessError("--scenario: required (a case number, name or scenario file), unless --inventory gives it")
    if args.network == "shaped":
        raise HarnessError("--network shaped: real nodes only (give --inventory); here: emulated or none")
    timeline = getattr(args, "timeline", None)
    if timeline is not None and (args.network or "emulated") != "emulated":
        raise HarnessError(f"--timeline: changes shaped links during the run; --network {args.network} has none")
    return NetworkSection(scenario=args.scenario, devices=args.devices,
                          bandwidth_scale=1.0 if args.bandwidth_scale is None else args.bandwidth_scale,
                          mode=args.network or "emulated", kernel=args.kernel, transport=transport,
                          timeline=None if timeline is None else str(Path(timeline).resolve()))


def inventory_network(inv: Inventory, *, scenario: str | None = None, devices: int | None = None,
                      bandwidth_scale: float | None = None, mode: str | None = None) -> NetworkSection:
    """The network of a real-node run: the inventory's scenario, devices and bandwidth scale.
    A run argument given must agree with it (one-line InventoryError otherwise); `mode` is
    shaped (default) or none."""
    where = f"the inventory {inv.path}"
    if scenario is not None:
        try:
            asked = load_scenario(scenario).name
        except ScenarioError as e:
            raise InventoryError(f"--scenario {scenario}: {e}") from None
        if asked != inv.topo.name:
            raise InventoryError(f"--scenario {scenario}: {where} plays scenario {inv.topo.name}, not {asked} "
                                 "(leave --scenario out: on real nodes the inventory says it)")
    if devices is not None and devices != inv.topo.n:
        raise InventoryError(f"--devices {devices}: {where} has {inv.topo.n} devices "
                             "(leave --devices out: on real nodes the inventory says it)")
    if bandwidth_scale is not None and bandwidth_scale != inv.bandwidth_scale:
        raise InventoryError(f"--bandwidth-scale {bandwidth_scale:g}: {where} shapes at {inv.bandwidth_scale:g} "
                             "(leave --bandwidth-scale out: on real nodes the inventory says it)")
    if mode not in (None, "shaped", "none"):
        raise InventoryError(f"--network {mode}: not on real nodes (shaped, by `harness net apply`, or none)")
    return NetworkSection(scenario=reload_name(inv.topo), devices=inv.topo.n, bandwidth_scale=inv.bandwidth_scale,
                          mode=mode or "shaped")


def add_system_options(p: argparse.ArgumentParser, only: systems.System | None = None) -> None:
    """Every registered system's own options (plan/systems.py: Option) as flags, each saying whose it is (`only`:
    that system's, for a command of its own). Their default is None, so that given_options sees what was typed."""
    mine = {o.name: (o, [only.name]) for o in only.options} if only else systems.options()
    for o, owners in mine.values():
        # a word is quoted, so that a default named "default" reads as a value: (default 'default')
        default = "" if o.default is None else f" (default {o.default!r})" if isinstance(o.default, str) \
            else f" (default {o.default})"
        p.add_argument(o.flag, dest=o.dest, type=o.type, default=None, metavar=o.name.upper(), help=f"{', '.join(owners)}: {o.help}{default}")


def given_options(args) -> dict:
    """The systems' options given as flags: name -> value."""
    return {name: getattr(args, o.dest) for name, (o, _) in systems.options().items()
            if getattr(args, o.dest, None) is not None}


def request_from_args(args, layout):
    """The typed run request (harness/plan/request.py) of the flags shared by run and tune: each flag given is its
    section's field; plan/asked.request_of decides the rest."""
    given = lambda **kw: {k: v for k, v in kw.items() if v is not None}  # noqa: E731
    debug = DebugSection.parse(args.debug)
    return request_of({
        "model": given(name=args.model, layers=args.layers, batch=args.batch, micro_batch=args.micro_batch,
                       dtype=args.dtype, lr=args.lr, seed=args.seed, data=args.data),
        "layout": layout,
        "network": network_from_args(args),
        "run": given(system=args.system, iters=args.iters, warmup=args.warmup, device_type=args.device,
                     timeout_s=args.timeout, results_root=str(args.results) if args.results else None,
                     checkpoint_every=getattr(args, "checkpoint_every", None),
                     keepalive_s=getattr(args, "keepalive", None), last_call_s=getattr(args, "last_call", None),
                     resume=None if getattr(args, "resume", None) is None else str(Path(args.resume).resolve()),
                     options=given_options(args)),
        "compute": given(model=args.compute_model, time_scale=args.compute_time_scale),
        "debug": debug,
    })


#: Flags every run of one `harness run --each ...` shares: they make the cluster.
SHARED_ONLY = ("scenario", "devices", "bandwidth_scale", "network", "kernel", "inventory", "transport")


def add_transport_argument(p: argparse.ArgumentParser) -> None:
    """`--transport`: TCP settings in place of the scenario's `transport:` (harness/scenario/transport.py)."""
    p.add_argument("--transport", choices=("scenario", *PRESETS), default="scenario",
                   help="TCP settings: the scenario's (default), Linux's defaults (linux), or tuned (buffers from the "
                        "links' bandwidth-delay product, no slow start after idle)")


def add_agent_arguments(p) -> None:
    """The elastic agent's timers, with devices that leave (a timeline's preempt:, spot:): `harness run`'s agent
    and `harness sim`'s model of it take the same flags."""
    p.add_argument("--keepalive", type=positive_float, metavar="S",
                   help=f"with devices that leave: the keep-alive interval; a device is gone after "
                        f"{KEEPALIVE_MISSED} missed (default {KEEPALIVE_S:g}, torchrun's; {HEARTBEAT_S:g} for a "
                        f"system that re-plans, ours' heartbeat)")
    p.add_argument("--last-call", type=non_negative_float, metavar="S",
                   help=f"with devices that leave: how long a restart on fewer devices than the run's waits for more "
                        f"(default {LAST_CALL_S:g}, torchrun's)")


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    add_training_arguments(p, inventory=True)
    add_transport_argument(p)
    p.add_argument("--system", default="ours", metavar="SYSTEM",
                   help=f"what trains (default ours): {systems.help_text()}")
    p.add_argument("--iters", type=positive_int, default=3, help="timed iterations (default 3)")
    p.add_argument("--checkpoint-every", type=positive_int, metavar="N",
                   help="ours, ours-random: every rank writes what it holds (values, momentum) every N iterations to the run "
                        "directory's checkpoints/")
    p.add_argument("--resume", type=input_dir, metavar="RUN_DIR",
                   help="ours, ours-random: go on from that run's last complete checkpoint (any layout; --warmup + --iters "
                        "counts from iteration 0, as in that run)")
    add_agent_arguments(p)
    p.add_argument("--seed", type=non_negative_int, default=0,
                   help="data, init and random-assignment seed (default 0)")
    p.add_argument("--scheduler", type=nonempty, help="ours: ga (default) | ga-kl | random | exhaustive | identity | "
                                       "random-assignment | ga-hetero (compute and network together, with the "
                                       "optimal allocation; see harness schedule)")
    p.add_argument("--budget", type=positive_int, help=f"scheduler evaluations (default {DEFAULT_BUDGET})")
    p.add_argument("--d-pp", type=positive_int, help="pipeline stages (default: as square as possible)")
    p.add_argument("--d-dp", type=positive_int, help="data-parallel replicas")
    p.add_argument("--dp-sync", choices=("sharded-ps", "allreduce"), help="ours: default sharded-ps (the paper)")
    p.add_argument("--schedule", choices=("gpipe", "1f1b"),
                   help="pipeline schedule (ours: gpipe by default, as the paper; baselines: 1f1b)")
    p.add_argument("--tp", type=positive_int, help="megatron: tensor-parallel degree")
    p.add_argument("--pp", type=positive_int, help="megatron/deepspeed: pipeline degree")
    p.add_argument("--dp", type=positive_int, help="megatron/deepspeed: data-parallel degree")
    p.add_argument("--zero", type=int, choices=(1, 3), help="deepspeed: ZeRO stage (1 with pipeline, 3 alone)")
    p.add_argument("--rank-order", type=rank_order_text,
                   help="baselines: default, or a seed of a random layout (the permutation ours-random uses)")
    p.add_argument("--allocator", choices=ALLOCATORS, help="ours: each stage's blocks (default even, optimal with "
                                                          "ga-hetero; see harness allocate)")
    p.add_argument("--replan", action="store_const", const=True, default=None,
                   help="ours under a timeline: when the links change, the scheduler runs again on the links as "
                        "they are and a faster placement, whose gain over the iterations left pays for its moves, "
                        "runs from 2 iterations after the change (weights and optimizer state moved to their new "
                        "devices); the manifest records each re-plan and its cost")
    p.add_argument("--recompute", action=argparse.BooleanOptionalAction, default=None,
                   help="ours, and DiLoCo's pipeline replicas: recompute activations per block in "
                   "backward (default: on for cuda)")
    add_system_options(p)
    add_alias(p, "--placement", "--ps-placement")  # hetpipe's, before it was an option of its own
    p.add_argument("--timeout", type=positive_float, default=None,
                   help="seconds before the run is failed (default 600; a dilated run's from its expected time)")
    p.add_argument("--inventory", type=input_file,
                   help="real nodes: run under torchrun with this cluster.yaml, the one source of scenario, "
                        "devices and bandwidth scale (see README)")


def rank_order_text(text: str) -> str:
    """argparse type of --rank-order: `default` or a seed (an integer >= 0)."""
    if text != "default" and not (text.isdigit() and text.isascii()):
        raise argparse.ArgumentTypeError(f"must be default or an integer seed >= 0 (got {text!r})")
    return text


def rank_order(text: str | None) -> int | None:
    """--rank-order: `default` or unset (None: rank order) or an integer seed; one-line HarnessError otherwise."""

    if text is None or text == "default":
        return None
    try:
        return int(text)
    except ValueError:
        raise HarnessError(f"--rank-order: must be default or an integer seed (got {text!r})") from None


def layout_request(args, system):
    """The LayoutRequest of the layout flags given; a flag the system does not take is a one-line error."""

    given = {}
    for flag, field in systems.LAYOUT_FLAGS.items():
        value = getattr(args, flag_dest(flag))
        if flag == "--rank-order":
            value = rank_order(value)
        if value is None:
            continue
        if flag not in system.flags:
            raise HarnessError(f"{flag}: not an option of --system {system.name} "
                               f"(it takes {', '.join(system.flags) or 'no layout flags'})")
        given[field] = value
    return LayoutRequest(**given)


class FlagError(HarnessError, ValueError):
    """A flag argparse refused; str() is argparse's one line, prefixed by what was parsed."""


class _OneLineParser(argparse.ArgumentParser):
    """Its errors are one-line FlagErrors starting with `prefix`, not a usage and exit."""

    prefix = ""

    def error(self, message):
        raise FlagError(f"{self.prefix}{message}")


def run_request(argv: list[str]) -> RunRequest:
    """The RunRequest `harness run ARGV` makes (one run, no --each), with every check of its flags and
    of the system's layout flags; a bad flag is a one-line FlagError."""
    parser = _OneLineParser(prog="harness run", add_help=False)
    add_run_arguments(parser)
    args = parser.parse_args(list(argv))
    return request_from_args(args, layout_request(args, systems.get(args.system)))


def each_requests(args) -> list:
    """The run request of every --each: the flags outside, then its own on top (one line per mistake)."""
    if args.inventory:
        raise HarnessError("--each: runs on real nodes (--inventory) start one at a time under torchrun")
    parser = _OneLineParser(prog="harness run --each", add_help=False)
    add_run_arguments(parser)
    reqs = []
    for text in args.each:
        parser.prefix = f"--each {text!r}: "
        try:
            tokens = shlex.split(text)
        except ValueError as e:
            raise HarnessError(f"--each {text!r}: {e}") from None
        each = parser.parse_args(tokens, namespace=argparse.Namespace(**vars(args)))
        moved = [f"--{k.replace('_', '-')}" for k in SHARED_ONLY if getattr(each, k) != getattr(args, k)]
        if moved:
            raise HarnessError(f"--each {text!r}: {', '.join(moved)} is shared by every run of one command; "
                               f"give it before the first --each")
        reqs.append(request_from_args(each, layout_request(each, systems.get(each.system))))
    return reqs
