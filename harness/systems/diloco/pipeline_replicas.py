"""DiLoCo whose replicas are ours' pipelines (`--replica-stages P`): the devices split into devices / P pipelines of P
stages, placed by ours' scheduler (systems/ours/layout.py), and each pipeline trains its share of the batch
through ours' runtime (systems/ours/pipeline.py: its stages, schedule, sends and compute model) with no
data-parallel sync. Every H inner steps each stage's pseudo-gradient is averaged over the same stage of every
pipeline, and the outer Nesterov step applies it: torchft's replica groups, a pipeline being a replica whose
rank at position j is its stage j, so the cross-replica group of position j is ours' stage group C_j.

Why: a model that does not fit one device (GPT3-XL's 24 GB of training state over a V100's 16 GB) still trains
with DiLoCo, and the pipelines are placed as ours places them (within a region where it can).
Streaming DiLoCo's fragments are cut inside each stage: fragment i is the i-th run of consecutive blocks of every
stage, so every stage group syncs 1/F of its stage at each turn, all at once on their own links. Fragments of
consecutive blocks of the whole model would sync one stage group at a turn, its links carrying the whole stage
(the peak Streaming DiLoCo lowers), while the others' idle; and a stage holding no block of a fragment would have
nothing to hand torchft's DiLoCo at its turn.
torchft's DiLoCo syncs in an optimizer's post-step hook; the inner step is paced inside ours' iteration, so DiLoCo
hooks a step marker called after the iteration: the sync is timed as communication, as in runtime.py.
"""
from __future__ import annotations

import time

import torch

from .members import ADAMW, diloco_of, join_torchft, sync_row  # first: torchft loads after its RUST_LOG

from ...plan.request import RunSpec
from ...train import wire
from ...train.rank import RankContext, iteration_mark, iteration_progress
from ...train.stats import IterationStats
from ..ours.pipeline import PipelineStageRunner
from .settings import DiLoCoSettings


class _OwnGradient:
    """In place of ours' data-parallel sync: a pipeline steps on its own samples' mean gradient (ours scales each
    micro-batch's loss for the global batch, so its share's gradient is that mean over D_DP)."""

    def __init__(self, pipelines: int):
        self.pipelines = pipelines

    def post(self, *_args, **_kwargs) -> None:
        return None

    def sync(self, flat: torch.Tensor, iteration: int, posted=None, sent=None) -> torch.Tensor:
        return flat * self.pipelines


class _ReplicaStage(PipelineStageRunner):
    """Ours' stage runner, its pipeline a DiLoCo replica: its own gradient, DiLoCo's inner optimizer."""

    def __init__(self, ctx: RankContext, spec: RunSpec, settings: DiLoCoSettings):
        self.settings = settings
        super().__init__(ctx, spec)

    def _place(self, L, state: dict | None = None) -> None:
        super()._place(L, state)
        self.dp = _OwnGradient(L.dp)
        if self.settings.inner_optimizer == "adamw":
            self.opt = torch.optim.AdamW(self.params, lr=self.settings.inner_lr, **ADAMW)


def train_diloco_pipelines(ctx: RankContext, spec: RunSpec) -> list[IterationStats]:
    L, s = spec.layout, DiLoCoSettings.of(spec.run.options, spec.layout.devices, spec.cfg.layers)
    runner = _ReplicaStage(ctx, spec, s)
    stage, pipeline = runner.stage_idx, runner.replica
    sent = [0, 0]  # bytes this rank sent in outer syncs: in all, and at the last sync's end

    def on_send(b: int) -> None:
        sent[0] += b

    def load_state(sd: dict) -> None:  # not reached: a replica of several devices never heals (diloco_layout)
        runner.module.load_state_dict(sd["model"])

    member = join_torchft(ctx, spec, s, replica=pipeline, group_rank=stage, k=L.pp,
                          leader_rank=L.pipelines[pipeline][0], on_send=on_send, load_state_dict=load_state,
                          state_dict=lambda: {"model": runner.module.state_dict()})
    manager = member.manager
    marker = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.0)  # DiLoCo's hook: after the iteration
    steps, warmup = spec.run.warmup + spec.run.iters, spec.run.warmup
    turn = s.sync_every // s.fragments  # inner steps between two fragments' syncs
    stats = ctx.iteration_log()
    posted = {0: runner.post_receives(0)}
    ctx.mark("training")
    try:
        with diloco_of(manager, runner.module, marker, s):
            t_prev = time.monotonic()
            for it in range(steps):
                def post_next(nxt=it + 1):
                    if nxt < steps:
                        posted[nxt] = runner.post_receives(nxt)

                compute, loss = runner.iteration(it, posted.pop(it), post_next)
                due, outer_step, began = (it + 1) % turn == 0, manager.current_step(), time.perf_counter()
                if due:
                    ctx.reached("dp_sync", it)  # as the outer sync begins
                marker.step()  # DiLoCo's post-step hook: the outer sync every H steps
                t = time.monotonic()
                syncs = [sync_row(ctx, manager, it, pipeline, outer_step, outer_step % s.fragments,
                                  time.perf_counter() - began, sent, t)] if due else None
                if it >= warmup:
                    stats.append(IterationStats(seconds=t - t_prev, compute_seconds=compute,
                                                exposed_comm_seconds=max(0.0, t - t_prev - compute), loss=loss, end=t,
                                                iteration=it, outer_syncs=syncs, **runner.pacer.take_iteration(),
                                                **wire.take_iteration()))
                else:
                    runner.pacer.take()
                    wire.take_iteration()
                iteration_mark(it, t - t_prev, ctx.world_size)
                if ctx.rank == 0:
                    iteration_progress(it, steps, warmup, t - t_prev, mark=False)
                t_prev = t
        ctx.save_state(runner.state())
        return stats
    finally:
        member.shutdown()
