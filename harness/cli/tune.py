"""`harness tune`: grid-search a baseline's parallel layout on a scenario (paper appendix D.2)."""
from __future__ import annotations

from pathlib import Path

from . import positive_float, positive_int


def register(sub) -> None:
    p = sub.add_parser(
        "tune",
        help="run every parallel layout of megatron or deepspeed on a scenario and report the best",
        description="megatron: every (D_TP, D_PP, D_DP) in {1,2,4,8} with product = devices that the model allows; "
                    "deepspeed: ZeRO-3 and ZeRO-1 + pipeline. Each point is a `harness run` (records kept under "
                    "results/<scenario>/<run-id>/); the summary goes to results/<scenario>/tune-<system>-<stamp>/.",
    )
    p.add_argument("--scenario", required=True, help="case number, name or path of a scenario file")
    p.add_argument("--system", required=True, choices=("megatron", "deepspeed"))
    p.add_argument("--devices", type=positive_int, help="scale the scenario down to K devices")
    p.add_argument("--model", default="tiny", help="tiny | small | medium | gpt3-xl | ... (default tiny)")
    p.add_argument("--layers", type=positive_int)
    p.add_argument("--batch", type=positive_int, default=8, help="global batch, samples (default 8)")
    p.add_argument("--micro-batch", type=positive_int, default=1, help="samples per micro-batch (default 1)")
    p.add_argument("--iters", type=positive_int, default=3, help="timed iterations per point (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed iterations first (default 1)")
    p.add_argument("--bandwidth-scale", type=positive_float, default=1.0,
                   help="multiply every link's bandwidth (default 1)")
    p.add_argument("--network", choices=("emulated", "none"), default="emulated",
                   help="emulated: namespaces with shaping; none: loopback, no shaping (default emulated)")
    p.add_argument("--seed", type=int, default=0, help="data and init seed (default 0)")
    p.add_argument("--schedule", choices=("gpipe", "1f1b"), default="1f1b",
                   help="pipeline schedule of every point (default 1f1b, as Megatron and DeepSpeed)")
    p.add_argument("--rank-order", default="default",
                   help="default (rank order) or a seed of a random layout, e.g. 2022 (default: default)")
    p.add_argument("--lr", type=positive_float, default=0.1)
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default=None,
                   help="default fp32 on cpu, bf16 on cuda")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--timeout", type=positive_float, default=600.0, help="seconds before a point is failed")
    p.add_argument("--out", type=Path, help="results root (default results/)")
    p.set_defaults(func=_tune)


def _tune(args) -> int:
    from ..train.baselines.tune import tune
    from ..train.experiment import RunRequest

    req = RunRequest(
        scenario=args.scenario, system=args.system, devices=args.devices, model=args.model, layers=args.layers,
        batch=args.batch, micro_batch=args.micro_batch, iters=args.iters, warmup=args.warmup,
        bandwidth_scale=args.bandwidth_scale, network=args.network, seed=args.seed, schedule=args.schedule,
        lr=args.lr, dtype=args.dtype or ("bf16" if args.device == "cuda" else "fp32"), device_type=args.device,
        timeout_s=args.timeout, results_root=args.out,
    )
    result = tune(req, args.system, rank_order=args.rank_order)
    print(result.table())
    print(f"summary: {result.summary_dir}")
    return 0 if result.best is not None else 1
