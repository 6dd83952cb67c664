"""`harness run`: train one system on a scenario (emulated cluster, loopback, or real nodes)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import positive_float, positive_int


def add_training_arguments(p: argparse.ArgumentParser) -> None:
    """Scenario, model, data and runtime flags shared by `harness run` and `harness tune`."""
    p.add_argument("--scenario", required=True, help="case number, name or path of a scenario file")
    p.add_argument("--devices", type=positive_int, help="scale the scenario down to K devices")
    p.add_argument("--model", default="tiny", help="tiny | small | medium | gpt3-xl | ... (default tiny)")
    p.add_argument("--layers", type=positive_int)
    p.add_argument("--batch", type=positive_int, default=8, help="global batch, samples (default 8)")
    p.add_argument("--micro-batch", type=positive_int, default=1, help="samples per micro-batch (default 1)")
    p.add_argument("--warmup", type=int, default=1, help="untimed iterations first (default 1)")
    p.add_argument("--bandwidth-scale", type=positive_float, default=1.0,
                   help="multiply every link's bandwidth (default 1)")
    p.add_argument("--network", choices=("emulated", "none"), default="emulated",
                   help="emulated: namespaces with shaping; none: loopback, no shaping (default emulated)")
    p.add_argument("--kernel", choices=("auto", "host", "uml"), default="auto",
                   help="emulated: the host kernel (needs sch_netem) or user-mode Linux (default auto)")
    p.add_argument("--lr", type=positive_float, default=0.1)
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default=None,
                   help="default fp32 on cpu, bf16 on cuda")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--out", type=Path, help="results root (default results/)")


def register(sub) -> None:
    p = sub.add_parser(
        "run",
        help="train a system on a scenario and write per-iteration records",
        description="Schedule, launch one rank per device (emulated cluster with shaping, or loopback with "
                    "--network none), train, and write results/<scenario>/<run-id>/{manifest.json,records.csv}. "
                    "Under torchrun on real nodes pass --inventory.",
    )
    add_training_arguments(p)
    p.add_argument("--system", default="ours", help="ours | ours-random | megatron | deepspeed (default ours)")
    p.add_argument("--iters", type=positive_int, default=3, help="timed iterations (default 3)")
    p.add_argument("--seed", type=int, default=0, help="data, init and random-assignment seed (default 0)")
    p.add_argument("--scheduler", help="ours: ga (default) | ga-kl | random | exhaustive | identity; "
                                       "ours-random: random-assignment (default)")
    p.add_argument("--budget", type=positive_int, default=2000, help="scheduler evaluations (default 2000)")
    p.add_argument("--d-pp", type=positive_int, help="pipeline stages (default: as square as possible)")
    p.add_argument("--d-dp", type=positive_int, help="data-parallel replicas")
    p.add_argument("--dp-sync", choices=("sharded-ps", "allreduce"), default="sharded-ps")
    p.add_argument("--schedule", choices=("gpipe", "1f1b"),
                   help="pipeline schedule (ours: gpipe by default, as the paper; baselines: 1f1b)")
    p.add_argument("--tp", type=positive_int, help="megatron: tensor-parallel degree")
    p.add_argument("--pp", type=positive_int, help="megatron/deepspeed: pipeline degree")
    p.add_argument("--dp", type=positive_int, help="megatron/deepspeed: data-parallel degree")
    p.add_argument("--zero", type=int, choices=(1, 3), help="deepspeed: ZeRO stage (1 with pipeline, 3 alone)")
    p.add_argument("--rank-order", default="default",
                   help="baselines: default, or a seed of a random layout (the permutation ours-random uses)")
    p.add_argument("--recompute", action=argparse.BooleanOptionalAction, default=None,
                   help="ours: recompute activations per block in backward (default: on for cuda)")
    p.add_argument("--timeout", type=positive_float, default=600.0, help="seconds before the run is failed")
    p.add_argument("--inventory", type=Path,
                   help="real nodes: run under torchrun with this cluster.yaml (see README)")
    p.set_defaults(func=_run)


def _run(args) -> int:
    from ..train.experiment import RunRequest, execute

    dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    req = RunRequest(
        scenario=args.scenario, system=args.system, devices=args.devices, model=args.model, layers=args.layers,
        batch=args.batch, micro_batch=args.micro_batch, iters=args.iters, warmup=args.warmup,
        bandwidth_scale=args.bandwidth_scale, network=args.network, kernel=args.kernel, seed=args.seed, scheduler=args.scheduler,
        d_pp=args.d_pp, d_dp=args.d_dp, dp_sync=args.dp_sync, schedule=args.schedule, lr=args.lr,
        dtype=dtype, device_type=args.device, budget=args.budget, timeout_s=args.timeout,
        results_root=args.out, recompute=args.recompute, tp=args.tp, pp=args.pp, dp=args.dp, zero=args.zero, rank_order=args.rank_order,
    )
    if args.inventory:
        from ..train.cluster import run_under_torchrun

        out = run_under_torchrun(req, args.inventory)
    else:
        out = execute(req)
    if out is not None:
        print(out)
    return 0
