"""The rank-level interface every training system implements, and the loopback launcher.

A system is a function `train(ctx: RankContext, spec: RunSpec) -> list[IterationStats]`
registered under its name with `@register_system("name")`. It runs on every rank
with the default process group already initialised (gloo on CPU, NCCL on GPU) and
returns one IterationStats per timed iteration (warm-up excluded). For parity
tests a rank hands the parameters it holds to `ctx.save_state({full GPT name:
tensor})`; the launcher merges them.

`rank_main` is what one rank runs under any launcher (loopback fork, emulated
cluster, torchrun); `run_local` forks `world_size` ranks on 127.0.0.1.
"""
from __future__ import annotations

import importlib
import json
import math
import os
import pkgutil
import signal
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist

from ..errors import HarnessError
from ..launch import fork_ranks
from ..model import GPTConfig, get_model

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class RunSpec:
    """Everything a rank needs; JSON-serialisable (`to_json` / `from_json`)."""

    run_id: str
    scenario: str
    system: str  # ours | ours-random | megatron | deepspeed
    backend: str  # emu | local | cluster
    kernel: str  # host | uml | none
    devices: int
    model: str
    layers: int
    batch: int  # global batch, samples
    micro_batch: int  # samples per micro-batch
    iters: int  # timed iterations
    warmup: int  # untimed iterations before them
    seed: int
    bandwidth_scale: float
    lr: float
    dtype: str  # fp32 | bf16 | fp16
    device_type: str  # cpu | cuda
    # System-specific layout. ours: {"d_pp", "d_dp", "pipelines": [[device of stage j] per replica],
    # "dp_sync": "sharded-ps"|"allreduce", "schedule": "gpipe"|"1f1b"}; megatron: {"tp","pp","dp",
    # "schedule","rank_order"}; deepspeed: {"zero": 3} | {"zero": 1, "pp", "dp", "schedule"}.
    layout: dict
    timeout_s: float = 120.0  # process-group timeout: a silent peer fails the run after this
    threads: int = 1  # torch intra-op threads per rank

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise HarnessError(f"dtype: unknown {self.dtype!r} (known: {', '.join(DTYPES)})")
        if self.device_type not in ("cpu", "cuda"):
            raise HarnessError(f"device_type: must be cpu or cuda (got {self.device_type!r})")

    @property
    def cfg(self) -> GPTConfig:
        return get_model(self.model, self.layers)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def to_json(self) -> dict:
        return json.loads(json.dumps(asdict(self)))

    @classmethod
    def from_json(cls, d: dict) -> "RunSpec":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise HarnessError(f"run spec: unknown fields {sorted(unknown)}")
        return cls(**d)


@dataclass
class IterationStats:
    """One timed iteration as one rank saw it. loss is NaN on ranks that compute none.
    end: time.monotonic() when the rank finished it (NaN when not taken)."""

    seconds: float
    compute_seconds: float
    exposed_comm_seconds: float
    loss: float
    end: float = math.nan


@dataclass
class RankContext:
    """Where this rank runs; the default process group is already initialised."""

    rank: int
    world_size: int
    device_index: int  # device id in the scenario (== rank under every launcher here)
    device: torch.device
    addr: str
    ifname: str
    collect_state: bool = False
    state: dict = field(default_factory=dict)
    marks: dict = field(default_factory=dict)  # wall-clock times of milestones (e.g. "training")

    def mark(self, name: str) -> None:
        """Note when a milestone was reached (start-up time of a run = first "training" mark)."""
        self.marks.setdefault(name, time.time())

    def save_state(self, named: dict[str, torch.Tensor]) -> None:
        """Hand over parameters (full GPT names) for parity checks; no-op unless asked for."""
        if self.collect_state:
            self.state.update({k: v.detach().float().cpu().clone() for k, v in named.items()})


@dataclass
class RankResult:
    rank: int
    stats: list[IterationStats]
    state: dict
    marks: dict = field(default_factory=dict)
    gathered: list | None = None  # rank 0 with rank_main(gather=True): every rank's stats


SystemFn = Callable[[RankContext, RunSpec], list[IterationStats]]
SYSTEMS: dict[str, SystemFn] = {}


def register_system(name: str):
    """Decorator: `@register_system("megatron") def train(ctx, spec): ...`."""

    def deco(fn: SystemFn) -> SystemFn:
        SYSTEMS[name] = fn
        return fn

    return deco


def get_system(name: str) -> SystemFn:
    """The registered train function; imports ours, then the baseline modules, until it is found
    (lazily: a run of ours never pays for importing the baselines' torch.distributed modules)."""
    errors = []
    mods = ["harness.train.pipeline"] + [
        f"harness.train.baselines.{m.name}"
        for m in pkgutil.iter_modules(importlib.import_module("harness.train.baselines").__path__)
    ]
    for mod in mods:
        if name in SYSTEMS:
            break
        try:
            importlib.import_module(mod)
        except Exception as e:  # noqa: BLE001 - reported only if the asked-for system is missing
            errors.append(f"{mod}: {type(e).__name__}: {e}")
    if name not in SYSTEMS:
        hint = f"; import errors: {' | '.join(errors)}" if errors else ""
        raise HarnessError(f"--system: unknown system {name!r} (known: {', '.join(sorted(SYSTEMS))}){hint}")
    return SYSTEMS[name]


@dataclass(frozen=True)
class RankEnv:
    """How one rank reaches the others (filled by the launcher)."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    addr: str = "127.0.0.1"
    ifname: str = ""
    device_index: int | None = None  # defaults to rank
    local_rank: int | None = None  # GPU index on this host (cuda); defaults to rank


def rank_main(spec: RunSpec, env: RankEnv, collect_state: bool = False, gather: bool = False) -> RankResult:
    """One rank: initialise the default group, run the system, tear the group down.

    With `gather` (ranks that share no parent, e.g. under torchrun), rank 0's result holds
    every rank's stats in `.gathered` (rank order)."""
    torch.set_num_threads(spec.threads)
    os.environ.update(
        MASTER_ADDR=env.master_addr, MASTER_PORT=str(env.master_port),
        RANK=str(env.rank), WORLD_SIZE=str(env.world_size),
    )
    if env.ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = env.ifname
        os.environ.setdefault("NCCL_SOCKET_IFNAME", env.ifname)
    local = env.rank if env.local_rank is None else env.local_rank
    if spec.device_type == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    fn = get_system(spec.system)
    kwargs = {"device_id": device} if backend == "nccl" else {}
    t_forked = time.time()
    dist.init_process_group(backend, init_method="env://", rank=env.rank, world_size=env.world_size,
                            timeout=timedelta(seconds=spec.timeout_s), **kwargs)
    _arm_fault(env.rank)
    ctx = RankContext(rank=env.rank, world_size=env.world_size,
                      device_index=env.rank if env.device_index is None else env.device_index,
                      device=device, addr=env.addr, ifname=env.ifname, collect_state=collect_state)
    ctx.marks["forked"] = t_forked
    ctx.mark("process_group")
    stats = fn(ctx, spec)
    result = RankResult(env.rank, stats, ctx.state, ctx.marks)
    if gather:
        everyone = [None] * env.world_size if env.rank == 0 else None
        dist.gather_object(stats, everyone, dst=0)
        result.gathered = everyone
    _leave_together(env.rank, env.world_size, spec.timeout_s)
    dist.destroy_process_group()
    return result


def _leave_together(rank: int, world_size: int, timeout_s: float) -> None:
    """Rank 0 hosts the store: it leaves only after every rank said it is done. (A gloo
    barrier would not do: with lazily connected pairs, a rank done with its part of the
    barrier can take the store down while others still need it to connect.)"""
    store = dist.distributed_c10d._get_default_store()
    store.add("harness/done", 1)
    if rank == 0:
        deadline = time.monotonic() + timeout_s
        while store.add("harness/done", 0) < world_size:
            if time.monotonic() > deadline:
                raise RuntimeError(f"ranks did not finish within {timeout_s:g} s of rank 0")
            time.sleep(0.02)


def warm_up_parent(spec: RunSpec) -> None:
    """Run one tiny CPU training step in the launcher before forking, so the children share
    the already faulted-in kernel code instead of each loading it (slow on UML's hostfs).
    Single-threaded (no OpenMP pool exists to break in the children); never touches CUDA."""
    from dataclasses import replace as _replace

    from .gpt import GPT, lm_loss, synthetic_batch

    torch.set_num_threads(1)
    cfg = _replace(spec.cfg, layers=1, hidden=64, heads=4, seq=16, vocab=256)
    model = GPT(cfg, 0)
    tokens, targets = synthetic_batch(cfg, 2, 0, 0)
    lm_loss(model(tokens), targets).backward()
    torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9).step()
    torch.cat([p.grad.reshape(-1) for p in model.parameters()]).tensor_split(2)


def _arm_fault(rank: int) -> None:
    """Fault injection for failure tests: HARNESS_FAULT="rank=R,after=S,mode=kill|exit"."""
    text = os.environ.get("HARNESS_FAULT", "")
    if not text:
        return
    opts = dict(kv.split("=", 1) for kv in text.split(","))
    if int(opts.get("rank", -1)) != rank:
        return
    mode = opts.get("mode", "kill")

    def fire():
        if mode == "exit":
            os._exit(17)
        os.kill(os.getpid(), signal.SIGKILL)

    t = threading.Timer(float(opts.get("after", 0)), fire)
    t.daemon = True
    t.start()


PROGRESS_PREFIX = "harness: "


def progress(line: str) -> None:
    """One progress line on stderr (the emulated launcher forwards lines with this prefix)."""
    print(f"{PROGRESS_PREFIX}{line}", file=sys.stderr, flush=True)


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


@dataclass
class LocalRun:
    """Results of every rank of one run."""

    ranks: list[RankResult]

    @property
    def stats(self) -> list[IterationStats]:
        return merge_stats([r.stats for r in self.ranks], shared_clock=True)  # forked on one host

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Parameters saved by the ranks, merged (the lowest rank holding a name wins)."""
        out: dict[str, torch.Tensor] = {}
        for r in self.ranks:
            for k, v in r.state.items():
                out.setdefault(k, v)
        return out


def merge_stats(per_rank: list[list[IterationStats]], shared_clock: bool = False) -> list[IterationStats]:
    """One iteration's figures from all ranks: its time, the busiest rank's compute, the
    rest exposed communication; loss = mean of the ranks that report one (every
    replica's last stage holds an equal share of the batch).

    Time: with one clock for all ranks (local and emulated runs share a kernel), the
    interval between the iteration's last end over all ranks and the previous one's, so
    the iterations add up to the run's wall time. The slowest rank's own duration
    (the fallback, for ranks on different hosts) overstates it when ranks jitter: each
    iteration takes the maximum of the ranks' noise while their mean period is shorter."""
    n = min(len(s) for s in per_rank)
    ends = None
    if shared_clock and n and all(not math.isnan(s[i].end) for s in per_rank for i in range(n)):
        ends = [max(s[i].end for s in per_rank) for i in range(n)]
        ends.insert(0, max(s[0].end - s[0].seconds for s in per_rank))
    out = []
    for i in range(n):
        its = [s[i] for s in per_rank]
        seconds = ends[i + 1] - ends[i] if ends else max(it.seconds for it in its)
        compute = max(it.compute_seconds for it in its)
        losses = [it.loss for it in its if not math.isnan(it.loss)]
        out.append(IterationStats(
            seconds=seconds, compute_seconds=compute,
            exposed_comm_seconds=max(0.0, seconds - compute),
            loss=sum(losses) / len(losses) if losses else float("nan"),
        ))
    return out


def run_local(spec: RunSpec, world_size: int | None = None, *, collect_state: bool = False,
              timeout_s: float = 600.0) -> LocalRun:
    """Fork `world_size` ranks on loopback (MASTER_ADDR=127.0.0.1) and run `spec` on them.

    Raises launch.RankFailure naming the rank if any rank fails; never hangs past
    `timeout_s` (+ a few seconds of grace to stop the rest).
    """
    world_size = world_size or spec.devices
    get_system(spec.system)  # fail fast in the parent on an unknown system
    port = free_port()

    def target(rank: int) -> RankResult:
        env = RankEnv(rank=rank, world_size=world_size, master_addr="127.0.0.1", master_port=port,
                      ifname=os.environ.get("HARNESS_LOOPBACK_IFNAME", "lo"))
        return rank_main(spec, env, collect_state)

    return LocalRun(fork_ranks(world_size, target, timeout_s=timeout_s))
