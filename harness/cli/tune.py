"""`harness tune`: grid-search a baseline's parallel layout on a scenario (paper appendix D.2)."""
from __future__ import annotations

import math

from . import non_negative_int, positive_float, positive_int
from ..plan.arg_types import number_in
from ..plan import systems
from .run_flags import add_training_arguments, rank_order, rank_order_text, request_from_args


def register(sub) -> None:
    p = sub.add_parser(
        "tune",
        help="run every parallel layout of megatron or deepspeed on a scenario and report the best",
        description="megatron: every (D_TP, D_PP, D_DP) in {1,2,4,8} with product = devices that the model allows; "
                    "deepspeed: ZeRO-3 and ZeRO-1 + pipeline. Each point is a `harness run` (records kept under "
                    "results/<scenario>/<run-id>/; emulated, all in one boot of the cluster at one time dilation); "
                    "the summary, with the simulator's prediction of every point, goes to "
                    "results/<scenario>/tune-<system>-<stamp>/.",
    )
    add_training_arguments(p)
    p.add_argument("--system", required=True, choices=systems.names(tunable=True))
    p.add_argument("--iters", type=positive_int, default=3, help="timed iterations per point (default 3)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="data and init seed (default 0)")
    p.add_argument("--schedule", choices=("gpipe", "1f1b"), default="1f1b",
                   help="pipeline schedule of every point (default 1f1b, as Megatron and DeepSpeed)")
    p.add_argument("--rank-order", default="default", type=rank_order_text,
                   help="default (rank order) or a seed of a random layout, e.g. 2022 (default: default)")
    p.add_argument("--budget", type=positive_int, default=None,
                   help="run only the K layouts the simulator predicts fastest (default: every layout); the others "
                        "are listed as skipped with their predictions")
    p.add_argument("--within", type=number_in(1, math.inf, high_open=True), default=None,
                   help="run no layout the simulator predicts more than this many times slower than its fastest, "
                        "a factor >= 1 (e.g. 2; under 1 would run none; default: no limit)")
    p.add_argument("--timeout", type=positive_float, default=600.0, help="seconds before a point is failed")
    p.set_defaults(func=_tune)


def _tune(args) -> int:
    from ..systems.baselines.tune import tune
    from ..plan.request import LayoutRequest

    req = request_from_args(args, LayoutRequest(schedule=args.schedule))
    result = tune(req, args.system, rank_order=rank_order(args.rank_order), budget=args.budget,
                  within=args.within)
    print(result.table())
    print(f"summary: {result.summary_dir}")
    return 0 if result.best is not None else 1
