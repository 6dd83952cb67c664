"""`harness cluster sbatch`: the Slurm job of a shaped real-node training run."""
from __future__ import annotations

from . import add_alias, input_file, output_file


def register(sub) -> None:
    p = sub.add_parser("cluster", help="real nodes: write the Slurm job that shapes, trains and clears")
    ss = p.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)
    s = ss.add_parser(
        "sbatch", help="write a Slurm batch script: per node net apply, torchrun in namespaces, net clear",
        description="Write a Slurm batch script for the inventory's nodes. One step per node runs `harness net "
                    "apply`, torchrun with each process in its device's namespace running `harness run "
                    "--inventory ... ARGS`, and `harness net clear` on exit (also after a time limit or scancel). "
                    "The inventory is the one source of scenario, device count and bandwidth scale: ARGS that "
                    "disagree are refused now. Example: harness cluster sbatch --inventory cluster.yaml --script "
                    "job.sbatch -- --system ours --device cuda --model gpt3-xl")
    s.add_argument("--inventory", type=input_file, required=True, help="cluster inventory YAML (see README)")
    s.add_argument("--script", type=output_file, help="write the script here (default: print it)")
    add_alias(s, "--out", "--script")
    s.add_argument("--partition", help="Slurm partition")
    s.add_argument("--time", help="Slurm time limit, e.g. 01:00:00")
    s.add_argument("--no-shaping", action="store_true",
                   help="train on the nodes' own network: no namespaces, no shaping, no root needed")
    s.add_argument("run_args", nargs="*", metavar="-- ARGS", help="the `harness run` arguments")
    s.set_defaults(func=cmd_sbatch)


def job_request(inv, run_args: list[str], *, shaped: bool):
    """The RunRequest every rank of the job makes of its `harness run` arguments; a bad flag is one line."""
    from ..train.cluster_batch import SbatchError, script_args
    from .run_flags import FlagError, run_request

    try:
        return run_request(script_args(inv, run_args, shaped=shaped))
    except FlagError as e:
        raise SbatchError(f"harness run arguments: {e}") from None


def cmd_sbatch(args) -> int:
    from ..train.cluster_batch import check_args, sbatch_script
    from ..scenario.inventory import load_inventory
    from ..files import atomic_write_text

    inv = load_inventory(args.inventory.resolve())
    shaped = not args.no_shaping
    check_args(args.run_args, args.partition, args.time)  # what the script sets, before the arguments are parsed
    req = job_request(inv, args.run_args, shaped=shaped)
    text = sbatch_script(inv, args.run_args, req, partition=args.partition, time=args.time, shaping=shaped)
    if args.script is None:
        print(text, end="")
    else:
        atomic_write_text(args.script, text, mode=0o777)
        print(f"wrote {args.script} ({len(inv.nodes)} nodes): sbatch {args.script}")
    return 0
