"""dtfm: the paper's own runtime (DS3Lab/DT-FM, the code behind Yuan et al. 2022), modelled from its source.

`ours` is this harness's runtime (receives posted for the whole iteration, no barriers, a stage's sync
overlapping the next iteration); dtfm is what the paper measured. One iteration of DT-FM's `sgd_iter`
(pipeline_parallel/dist_gpipe_pipeline_async.py), per rank:

1. `dist.barrier()` of all ranks (gloo: a dissemination barrier, netmodel/links.dissemination_barrier);
2. per gradient-accumulation step: the forwards of all its micro-batches through the pipeline (receive,
   compute and send on their own CUDA streams, so a stage computes while it sends), a barrier of all
   ranks, then all the backwards (activation checkpointing: each recomputes its forward);
3. the optimizer step (data_parallel/dist_dp_sharded_ps.py): after the stage's last backward, the
   sharded parameter server over its flattened fp16 gradients, two grouped all-to-alls (every member
   sends chunk i to member i and receives its own chunk from every member, all pairs at once; sums;
   sends its summed chunk to every member the same way); then the fp16 optimizer with its fp32 master
   weights offloaded to the host (optimizer/optimizer.py, `--use-offload` True by default): gradients
   down over PCIe, the overflow check and SGD on the CPU, parameters back up;
4. `torch.cuda.synchronize()` and a barrier of all ranks.

Iterations do not overlap (barriers on both ends); DT-FM times one from leaving the first barrier to
leaving the last (rank 0's print, averaged by dist_runner.py): `seconds`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import compute as work
from ... import layout as layouts
from ...netmodel import collectives
from ...netmodel.links import Links
from ...compute.model import GPTConfig
from ...compute.profiles import ComputeProfile
from ...layout import RANDOM_SEEDS, Layout
from ...sim import pipeline
from ...sim.sweep import PAPER_RUNTIME, Candidate, Simulator, mean_candidate, on_links
from ...sim.systems import SimError, SimResult, check_layers

REPO = "DS3Lab/DT-FM"
# Samples of one gradient-accumulation step per pipeline: the paper's scripts run `--batch-size 64
# --micro-batch-size 1` with `ga_step` = batch / (64 x D_DP) (scripts/aws_run_batch_gpt3_optimal.sh: ga_step 2
# for batch 1024 on D_DP = 8)
STEP_SAMPLES = 64
# The paper's runs train QQP sequence classification (dist_runner.py, task SeqClassification): the first stage
# embeds a BERT WordPiece vocabulary (bert-large-cased, 28,996 tokens, padded to a multiple of 128), the last
# ends in a pooler and a 2-way classifier on the first token (no LM head)
VOCAB = 29056
# The paper's instances (AWS p3.2xlarge, README's AMI): one V100 on PCIe 3.0 x16 (8 GT/s x 16 lanes x 128/130,
# per direction) beside a Xeon E5-2686 v4 (4 channels of DDR4-2400): both the specifications' peaks, so the
# offloaded step modelled here is a lower bound
PCIE_BYTES_PER_S = 15.75e9
HOST_MEMORY_BYTES_PER_S = 76.8e9
# Per parameter of the offloaded step: over PCIe its fp16 gradient down and fp16 value up; in host memory the
# gradient's staging and fp32 conversion (2 + 2 + 4), the overflow check's read (4), SGD's read of value and
# gradient and write of the value (12), the value's fp16 conversion and staging (4 + 2 + 2)
OFFLOAD_PCIE_BYTES = 4
OFFLOAD_HOST_BYTES = 32

# What the model assumes and where the paper's code states it: (setting, value, source)
CONFIG_SOURCES = (
    ("pipeline schedule", "GPipe: all forwards, a barrier, all backwards", f"{REPO} pipeline_parallel/"
     "dist_gpipe_pipeline_async.py sgd_iter"),
    ("micro-batch", "1 sample", f"{REPO} scripts/local_scripts/gpt3_xl_pp8_dp8.sh --micro-batch-size 1"),
    ("gradient accumulation", f"{STEP_SAMPLES} samples a step per pipeline, batch / ({STEP_SAMPLES} x D_DP) steps",
     f"{REPO} scripts/aws_run_batch_gpt3_optimal.sh (ga_step 2, batch_size 64 for batch 1024)"),
    ("activation recompute", "attention and MLP of every block checkpointed", f"{REPO} modules/gpt_modules.py "
     "use_checkpoint=True"),
    ("precision", "fp16 model and gradients, fp32 master weights on the host", f"{REPO} dist_runner --fp16; "
     "optimizer/optimizer.py Fp16Optimizer, --use-offload default True"),
    ("optimizer", "SGD (no momentum)", f"{REPO} pipeline_parallel/dist_gpipe_pipeline_async.py optim.SGD"),
    ("data-parallel sync", "sharded PS: two grouped all-to-alls after the stage's backward", f"{REPO} "
     "data_parallel/dist_dp_sharded_ps.py, comm/nccl_backend.py all_reduce_opt"),
    ("barriers", "gloo dist.barrier() of all ranks: start, after each step's forwards, end", f"{REPO} "
     "sgd_iter; comm/nccl_backend.py barrier; comm/comm_utils.py default_init (gloo)"),
    ("workload", f"QQP classification: BERT vocabulary ({VOCAB} padded), 2-way head, no LM head",
     f"{REPO} dist_runner.py, modules/task_modules.py SeqClassification"),
    ("NCCL", "2.8.4 over sockets: a send completes when its sockets take the data (no credit from the receiver, "
     "so no NCCL_BUFFSIZE bound per round trip); 16 sockets a peer on the instances' ENA NICs (2 threads x 8), so "
     "Linux's default buffers hold 16 x 3 MB in flight, more than any link's round trip carries: the scenario's "
     "links are filled", f"{REPO} README (cupy-cuda110 8.6.0, whose wheel bundles NCCL 2.8.4: cupy-release-tools "
     "v8 dist_config); NCCL 2.8.4 src/transport/net.cc netSendProxy, net_socket.cc ncclSocketGetNsockNthread "
     "(vendor 0x1d0f), ncclTopoGetNchannels (one p2p channel a remote peer)"),
    ("GPU memory (whether a layout fits)", "fp16 value, gradient and the sharded PS's gradient buffer per parameter; "
     "a step's micro-batches keep every block's input and the stage's output; one block recomputed at a time",
     f"{REPO} data_parallel/dist_dp_sharded_ps.py _declare_grad_buffer, optimizer/optimizer.py (offload); "
     "harness/systems/dtfm/memory.py"),
)


@dataclass(frozen=True)
class Span:
    """One interval of the iteration's timeline: a barrier, a step's forwards or backwards on a stage, a
    stage's scatter or gather, its optimizer step. index: the barrier's number, or the stage."""

    kind: str
    index: int
    start: float
    end: float
    step: int = 0


def stage_params(cfg: GPTConfig, split: list[int]) -> np.ndarray:
    """Parameters of every stage as DT-FM builds it (modules/dist_gpt_pp_module.py)."""
    h = cfg.hidden
    params = np.asarray(split, dtype=float) * cfg.block_params
    params[0] += VOCAB * h + cfg.seq * h
    params[-1] += h * h + h + 2 * h + 2
    return params


def offload_seconds(params: np.ndarray) -> np.ndarray:
    """The offloaded fp16 optimizer's step over `params` parameters (see OFFLOAD_*)."""
    return params * (OFFLOAD_PCIE_BYTES / PCIE_BYTES_PER_S + OFFLOAD_HOST_BYTES / HOST_MEMORY_BYTES_PER_S)


def step_micro_batches(batch: int, micro_batch: int, pipelines: int) -> tuple[int, int]:
    """(gradient-accumulation steps, micro-batches a step) of a pipeline."""
    per_pipeline = work.micro_batches(batch, micro_batch, pipelines, "pipelines")
    per_step = max(1, STEP_SAMPLES // micro_batch)
    if per_pipeline <= per_step:
        return 1, per_pipeline
    if per_pipeline % per_step:
        raise SimError(f"--batch {batch}: {per_pipeline} micro-batches a pipeline do not split into "
                       f"gradient-accumulation steps of {per_step}")
    return per_pipeline // per_step, per_step


def simulate_dtfm(links: Links, profiles: list[ComputeProfile], cfg: GPTConfig, batch: int, layout: Layout,
                  micro_batch: int = 1, bytes_per_value: int = work.PAPER_BYTES, system: str = "dtfm") -> SimResult:
    """One iteration of DT-FM on the layout's pipelines (its stages' blocks; schedule and recompute are
    DT-FM's own). details["timeline"]: its Spans."""
    pipelines = layout.array()[:, :, 0].T  # (D_DP, D_PP); DT-FM's rank r = dp * D_PP + pp
    R, P = pipelines.shape
    check_layers(cfg, P)
    steps, M = step_micro_batches(batch, micro_batch, R)
    split = list(layout.layers_per_stage)
    fwd, bwd = work.stage_compute(cfg, split, micro_batch, profiles, pipelines, recompute=True, lm_head=False)
    act = work.activation_bytes(cfg, micro_batch, bytes_per_value)
    S = pipelines.T  # (P, R)
    fser, fdel = collectives.step_times(links, S[:-1], S[1:], act)
    bser, bdel = collectives.step_times(links, S[1:], S[:-1], act)
    times = pipeline.StageTimes(fwd.T, bwd.T, fser, fdel, bser, bdel, links, S, act)
    params = stage_params(cfg, split)
    ranks = pipelines.reshape(-1)
    spans: list[Span] = []

    def barrier(arrive_ps: np.ndarray) -> np.ndarray:  # (P, R) in, (P, R) out
        arrive = arrive_ps.T.reshape(-1)
        leave = collectives.dissemination_barrier(links, ranks, arrive)
        spans.append(Span("barrier", sum(s.kind == "barrier" for s in spans), float(arrive.min()),
                          float(leave.max())))
        return leave.reshape(R, P).T

    t = barrier(np.zeros((P, R)))
    began = float(t[0, 0])  # rank 0 starts its clock
    for step in range(steps):
        tl = pipeline.timeline(times, M, "gpipe", overlap=True, start=t, phase="F")
        spans += [Span("forward", j, float(t[j].min()), float(tl.finish[j].max()), step) for j in range(P)]
        t = barrier(tl.finish)
        tl = pipeline.timeline(times, M, "gpipe", overlap=True, start=t, phase="B")
        spans += [Span("backward", j, float(t[j].min()), float(tl.finish[j].max()), step) for j in range(P)]
        t = tl.finish
    grads = params * bytes_per_value
    opt = offload_seconds(params)
    # every stage's exchange at once (they run together: the nodes' shared NICs carry them all)
    scatter, gather = collectives.sharded_ps_phases(links, S, grads, start=t)
    for j in range(P):
        spans += [Span("scatter", j, float(t[j].max()), float(scatter[j].max())),
                  Span("gather", j, float(scatter[j].max()), float(gather[j].max())),
                  Span("optimizer", j, float(gather[j].max()), float(gather[j].max() + opt[j]))]
    end = gather + opt[:, None]
    t = barrier(end)
    compute = float((steps * M * (fwd + bwd)).max() + opt.max())
    return SimResult(
        system, {"pp": P, "dp": R, "steps": steps}, float(t[0, 0]) - began, compute,
        dp_comm_seconds=max(s.end - s.start for s in spans if s.kind in ("scatter", "gather")) if R > 1 else 0.0,
        details={"timeline": spans, "period_seconds": float(t.max()), "micro_batches": steps * M,
                 "barrier_seconds": sum(s.end - s.start for s in spans if s.kind == "barrier")},
    )


def _layout(pipelines, cfg: GPTConfig, placement: str) -> Layout:
    # DT-FM splits the blocks evenly (--num-layers per stage)
    return layouts.from_pipelines(pipelines, cfg.layers, placement, **PAPER_RUNTIME)


def candidates_dtfm(sim: Simulator, cfg: GPTConfig, batch: int) -> list[Candidate]:
    """DT-FM on the scheduler's assignment (the paper's rank map from generate_assignment.py)."""
    pipelines = sim.assignment(cfg, batch)
    lay = _layout(pipelines, cfg, sim.scheduler)
    r = simulate_dtfm(sim.links, sim.profiles, cfg, batch, lay, sim.micro_batch)
    return [Candidate("dtfm", {"pp": sim.d_pp, "dp": sim.d_dp, "scheduler": sim.scheduler, "steps": r.config["steps"],
                               "pipelines": pipelines.tolist()}, r.seconds, r.compute_seconds, (sim.schedule_seed,),
                      layout=lay, resimulate=on_links(simulate_dtfm, sim, cfg, batch, [lay]))]


def candidates_dtfm_random(sim: Simulator, cfg: GPTConfig, batch: int) -> list[Candidate]:
    """DT-FM on the seeded random placements of RANDOM_SEEDS (the paper's random rank maps), averaged."""
    lays = sim.random_layouts(cfg)
    runs = [simulate_dtfm(sim.links, sim.profiles, cfg, batch, lay, sim.micro_batch, system="dtfm-random")
            for lay in lays]
    return [mean_candidate("dtfm-random", {"pp": sim.d_pp, "dp": sim.d_dp, "placement": "random",
                                           "pipelines": [[list(p) for p in lay.pipelines] for lay in lays]},
                           runs, RANDOM_SEEDS, lays[0],
                           on_links(simulate_dtfm, sim, cfg, batch, lays, system="dtfm-random"))]


def simulate_dtfm_layout(links, profiles, cfg, batch: int, lay: Layout, mb: int, bpv: int) -> tuple[float, float]:
    r = simulate_dtfm(links, profiles, cfg, batch, lay, mb, bpv)
    return r.seconds, r.compute_seconds
