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
from dataclasses import replace

import torch

from .members import ADAMW, diloco_of, join_torchft, stay_for_the_others, sync_row  # first: torchft after RUST_LOG

from ...compute import micro_batches
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
    """Ours' stage runner, its pipeline a DiLoCo replica: its own gradient, DiLoCo's inner optimizer. `share`:
    (its pipeline, how many) when the pipeline is a job of its own, run on a layout of that pipeline alone
    (job_layout): it still trains its share of the global batch, as in the run of every pipeline."""

    def __init__(self, ctx: RankContext, spec: RunSpec, settings: DiLoCoSettings, share: tuple | None = None):
        self.settings, self.share = settings, share
        super().__init__(ctx, spec)

    def _place(self, L, state: dict | None = None) -> None:
        pipelines = L.dp if self.share is None else self.share[1]
        m = self.spec.model
        self.n_local, self.local_batch = micro_batches(m.batch, m.micro_batch, pipelines), m.batch // pipelines
        super()._place(L, state)
        if self.share is not None:
            self.replica = self.share[0]  # the samples of its share (its neighbours were placed by L's ranks)
        self.dp = _OwnGradient(pipelines)
        if self.settings.inner_optimizer == "adamw":
            self.opt = torch.optim.AdamW(self.params, lr=self.settings.inner_lr, **ADAMW)


def job_layout(L, pipeline: int):
    """Pipeline `pipeline` of L alone, its stages the ranks 0..P-1 of its own job (train/quorum_agent.py starts
    them in stage order)."""
    return replace(L, dp=1, mesh=tuple(((j,),) for j in range(L.pp)), replicas=())


def train_diloco_pipelines(ctx: RankContext, spec: RunSpec) -> list[IterationStats]:
    L, s = spec.layout, DiLoCoSettings.of(spec.run.options, spec.layout.devices, spec.cfg.layers)
    one_job = ctx.world_size == L.devices  # else this pipeline is a job of its own (devices leave and come back)
    fresh = spec.with_resolved(start_iteration=0)  # the seed's weights: a pipeline back heals from a peer
    if one_job:
        runner = _ReplicaStage(ctx, fresh, s)
    else:
        mine = next(r for r, p in enumerate(L.pipelines) if ctx.device_index in p)
        runner = _ReplicaStage(ctx, replace(fresh, layout=job_layout(L, mine)), s, share=(mine, L.dp))
    stage, pipeline = runner.stage_idx, runner.replica
    sent = [0, 0]  # bytes this rank sent in outer syncs: in all, and at the last sync's end
    where = {"it": spec.resolved.start_iteration}  # the iteration under way ("healed": a peer's, once healed)

    def on_send(b: int) -> None:
        sent[0] += b

    def load_state(sd: dict) -> None:  # a pipeline back heals: each stage from the same stage of a peer
        runner.module.load_state_dict(sd["model"])
        runner.opt.load_state_dict(sd["inner"])
        where["healed"] = sd["iteration"]

    member = join_torchft(ctx, spec, s, replica=pipeline, group_rank=stage, k=L.pp,
                          leader_rank=L.pipelines[pipeline][0] if one_job else 0, one_job=one_job, on_send=on_send,
                          load_state_dict=load_state, state_dict=lambda: {
                              "model": runner.module.state_dict(), "inner": runner.opt.state_dict(),
                              "iteration": where["it"]})
    manager = member.manager
    marker = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.0)  # DiLoCo's hook: after the iteration
    steps, warmup = spec.run.warmup + spec.run.iters, spec.run.warmup
    turn = s.sync_every // s.fragments  # inner steps between two fragments' syncs
    stats = ctx.iteration_log()
    it, taken = spec.resolved.start_iteration, 0
    posted = {it: runner.post_receives(it)}
    ctx.mark("training")
    try:
        with diloco_of(manager, runner.module, marker, s):
            t_prev = time.monotonic()
            while it < steps:
                where["it"], taken = it, taken + 1
                due = taken % turn == 0

                def post_next(nxt=it + 1):  # a sync may heal this replica to a peer's iteration: posted after it
                    if nxt < steps and not due:
                        posted[nxt] = runner.post_receives(nxt)

                compute, loss = runner.iteration(it, posted.pop(it), post_next)
                outer_step, began = manager.current_step(), time.perf_counter()
                if due:
                    ctx.reached("dp_sync", it)  # as the outer sync begins
                marker.step()  # DiLoCo's post-step hook: a fragment's outer sync every H / fragments steps
                t = time.monotonic()
                syncs = [sync_row(ctx, manager, where.get("healed", it), pipeline, outer_step,
                                  outer_step % s.fragments, time.perf_counter() - began, sent, t)] if due else None
                if it >= warmup:
                    stats.append(IterationStats(seconds=t - t_prev, compute_seconds=compute,
                                                exposed_comm_seconds=max(0.0, t - t_prev - compute), loss=loss, end=t,
                                                iteration=it, outer_syncs=syncs, **runner.pacer.take_iteration(),
                                                **wire.take_iteration()))
                else:
                    runner.pacer.take()
                    wire.take_iteration()
                if one_job:  # every rank marks; else the device that stays to the end (as runtime.py)
                    iteration_mark(it, t - t_prev, ctx.world_size)
                if ctx.device_index == s.lighthouse_device:
                    iteration_progress(it, steps, warmup, t - t_prev, mark=not one_job)
                t_prev, it = t, where.pop("healed", it) + 1  # healed in this step's sync: the peer's iteration
                if due and it < steps:
                    posted[it] = runner.post_receives(it)
        ctx.save_state(runner.state())
        if not one_job and s.lighthouse_device in L.pipelines[pipeline]:  # every rank of it: its job ends as one
            stay_for_the_others(ctx, spec.run.timeout_s)
        return stats
    finally:
        member.shutdown()
