"""`harness run`: train one system on a scenario (emulated cluster, loopback, or real nodes)."""
from __future__ import annotations

from pathlib import Path

from ..plan import systems
from ..plan.arg_types import nonempty
from .run_flags import add_run_arguments, each_requests, layout_request, request_from_args


def register(sub) -> None:
    p = sub.add_parser(
        "run",
        help="train a system on a scenario and write per-iteration records",
        description="Schedule, launch one rank per device (emulated cluster with shaping, or loopback with "
                    "--network none), train, and write results/<scenario>/<run-id>/{manifest.json,records.csv}. "
                    "Under torchrun on real nodes pass --inventory. With --each, several runs in turn that share "
                    "the flags given before; emulated, they share one boot of the cluster.",
    )
    add_run_arguments(p)
    p.add_argument("--each", action="append", metavar="'FLAGS'", type=nonempty,
                   help="one run of several (repeatable, in order): its own flags on top of the others, e.g. "
                        "--each '--system ours' --each '--system megatron --pp 4 --dp 2'. The runs share one "
                        "network (--scenario, --devices, --bandwidth-scale, --network, --kernel go outside) and, "
                        "emulated, one boot of the cluster, one set of imports and one warm-up; each run is its "
                        "own fork of fresh ranks with its own results directory. Exit status 1 if any failed")
    p.set_defaults(func=_run)


def _run(args) -> int:
    from ..train.experiment import execute

    if args.each:
        return _run_each(args)
    req = request_from_args(args, layout_request(args, systems.get(args.system)))
    if args.inventory:
        from ..train.cluster import run_under_torchrun

        out = run_under_torchrun(req, args.inventory)
    else:
        out = execute(req)
    if out is not None:
        print(out)  # stdout: the run directory alone, for scripts; the summary goes to stderr
        _summary(out)
    return 0


def _summary(run: Path) -> None:
    import sys

    from ..report.runs import run_summary

    print(f"harness run: {run_summary(run)}", file=sys.stderr)


def _run_each(args) -> int:
    """Every --each in turn; prints each run directory, a line per failed or unstarted run; 1 if any."""
    import sys

    from ..errors import HarnessError
    from ..train.experiment import execute_many

    reqs = each_requests(args)
    results = execute_many(reqs)
    bad = 0
    for text, res in zip(args.each, results):
        if isinstance(res, Path):
            print(res)
            _summary(res)
        else:
            bad += 1
            why = res if isinstance(res, HarnessError) else "not started (stopped before)"
            print(f"harness: --each {text!r}: {why}", file=sys.stderr)
    if bad:
        print(f"harness: error: {bad} of {len(results)} runs did not finish", file=sys.stderr)
    return 1 if bad else 0
