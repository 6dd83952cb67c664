"""Megatron- and DeepSpeed-style parallelism applied from outside the model (torchtitan's habit).

Each function takes a model part and a process group or device mesh and returns it
parallelised with PyTorch's own implementation of the idea, never a hand-written
collective:

- `apply_tp`: tensor parallel (DTensor `parallelize_module`), Megatron's split of a
  block: q/k/v and the MLP's first Linear by columns (heads), the attention and MLP
  output projections by rows, so each block costs one all-reduce forward and one
  backward in attention and in the MLP.
- `apply_ddp`: data parallel with DDP's bucketed gradient all-reduce (`replicate`, DDP on
  FSDP2, for tensor-parallel parts).
- `apply_fsdp`: ZeRO stage 3 with FSDP2 `fully_shard`, one unit per block plus the root
  (per-block all-gather of parameters, reduce-scatter of gradients).
- `zero1_optimizer`: ZeRO stage 1, `ZeroRedundancyOptimizer` sharding the optimizer state
  over the data-parallel group (parameters broadcast after each step).
- `pipeline_stage` + `pipeline_schedule`: `torch.distributed.pipelining` with GPipe or
  1F1B; a layout without pipeline runs as a one-stage pipeline, so gradient accumulation
  over micro-batches and the DDP/FSDP no-sync logic are the library's in every case.

Each rank holds one pipeline stage (`model_part`); embeddings and LM head stay replicated
under tensor parallelism (Megatron also shards the vocabulary; at these model sizes the
blocks dominate).
"""
from __future__ import annotations

import os
import re
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed._composable.replicate_with_fsdp import replicate
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn.parallel import DistributedDataParallel

from ...train.gpt import GPT, Block, Stage, lm_loss
from ...train.reference import make_optimizer

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}

# Megatron's split of one transformer block (Shoeybi et al. 2019, Fig. 3).
TP_PLAN = {
    "attn.q": ColwiseParallel(),
    "attn.k": ColwiseParallel(),
    "attn.v": ColwiseParallel(),
    "attn.proj": RowwiseParallel(),
    "mlp.fc": ColwiseParallel(),
    "mlp.proj": RowwiseParallel(),
}


def model_part(model: GPT, blocks: tuple[int, int]) -> Stage:
    """The contiguous piece of `model` that a pipeline stage runs: blocks [first, last) of the
    layout's stage range (shares its modules)."""
    return model.stage(*blocks)


def apply_tp(part: nn.Module, tp_mesh: DeviceMesh) -> nn.Module:
    """Shard every block of `part` over `tp_mesh` (1-D); embeddings and head stay replicated.

    The attention infers its head count from the sharded width, so each rank runs heads/tp
    heads. Heads and the MLP width must divide by the mesh size (checked by the layout).
    """
    if tp_mesh.size() == 1:
        return part
    for block in part.modules():
        if isinstance(block, Block):
            parallelize_module(block, tp_mesh, TP_PLAN)
    return part


def apply_ddp(part: nn.Module, dp_mesh: DeviceMesh) -> nn.Module:
    """Data parallel over `dp_mesh`: one gradient all-reduce per step.

    Plain parts get DDP, with `find_unused_parameters=True`: otherwise DDP rebuilds its
    buckets after the first iteration, and under a pipeline schedule (several micro-batch
    backwards before that point) the rebuild trips an internal assert of the reducer
    (torch 2.13). Tensor-parallel parts (DTensor parameters, which DDP cannot take; the
    TP+DDP bridge `_pre_dp_module_transform` re-creates the Parameters after every forward,
    which loses them once a pipeline runs several forwards per step) get `replicate`,
    PyTorch's DDP rebuilt on FSDP2, which composes with TP meshes: the same all-reduce.

    `forward_sync_buffers=False` (the GPT has no buffers; the deprecated `broadcast_buffers`
    spelling warns on every rank), and the reducer's note that no parameter went unused,
    which is the point here, is kept off stderr (`_drop_unused_parameter_note`).
    """
    if dp_mesh.size() == 1:
        return part
    if any(isinstance(p, DTensor) for p in part.parameters()):
        return replicate(part, mesh=dp_mesh)
    ddp = DistributedDataParallel(
        part, process_group=dp_mesh.get_group(), forward_sync_buffers=False, find_unused_parameters=True
    )
    _drop_unused_parameter_note(ddp)
    return ddp


# Printed once per rank by the C++ reducer on the first forward: harmless here (the flag is there
# to stop the bucket rebuild, see apply_ddp), and C++ writes it straight to fd 2, where Python's
# `warnings` filters cannot reach it.
UNUSED_PARAMETER_NOTE = re.compile(rb"find_unused_parameters=True was specified in DDP constructor, "
                                   rb"but did not find any unused parameters")


def _drop_unused_parameter_note(module: nn.Module) -> None:
    """Send fd 2 to a temporary file during `module`'s first forward (the only one that prints the
    note), then copy back every line but the note: other output of that window still shows."""
    window = {}

    def before(_module, _args):
        sys.stderr.flush()
        window["file"] = tempfile.TemporaryFile()
        window["saved"] = os.dup(2)
        os.dup2(window["file"].fileno(), 2)

    def after(_module, _args, _output):
        pre.remove()
        post.remove()
        if "saved" not in window:
            return
        sys.stderr.flush()
        os.dup2(window["saved"], 2)
        os.close(window["saved"])
        with window["file"] as f:
            f.seek(0)
            kept = b"".join(ln for ln in f.read().splitlines(keepends=True) if not UNUSED_PARAMETER_NOTE.search(ln))
        if kept:
            os.write(2, kept)

    pre = module.register_forward_pre_hook(before)
    post = module.register_forward_hook(after, always_call=True)


def apply_fsdp(part: nn.Module, dp_mesh: DeviceMesh) -> nn.Module:
    """ZeRO-3: one FSDP2 unit per block (parameters gathered just for that block), then the root."""
    for block in part.modules():
        if isinstance(block, Block):
            fully_shard(block, mesh=dp_mesh)
    fully_shard(part, mesh=dp_mesh)
    return part


def zero1_optimizer(params, lr: float, dp_group: dist.ProcessGroup) -> torch.optim.Optimizer:
    """ZeRO-1: the reference optimizer (class and hyper-parameters of `make_optimizer`) with its
    state sharded over `dp_group`; each rank updates its shard, then parameters are broadcast."""
    reference = make_optimizer([torch.zeros(1, requires_grad=True)], lr)
    return ZeroRedundancyOptimizer(
        list(params), optimizer_class=type(reference), process_group=dp_group, **reference.defaults
    )


def pipeline_stage(
    part: nn.Module, stage: int, d_pp: int, pp_group: dist.ProcessGroup, stage_ranks: list[int],
    device: torch.device = torch.device("cpu"),
) -> PipelineStage:
    """A PipelineStage whose peers are `stage_ranks` (global rank of every stage, in order).

    `new_group` numbers its members by sorted global rank, which is not the stage order once
    ranks are permuted over devices; the stage-to-peer map is set from `stage_ranks` so that
    sends go to the right neighbour in every layout.
    """
    ps = PipelineStage(part, stage, d_pp, device, group=pp_group)
    ps.stage_index_to_group_rank = {j: dist.get_group_rank(pp_group, r) for j, r in enumerate(stage_ranks)}
    return ps


def pipeline_schedule(ps: PipelineStage, n_micro_batches: int, schedule: str):
    """GPipe or 1F1B over the stage; the loss of a micro-batch is its mean token loss and the
    schedule divides gradients by the micro-batch count, matching the reference."""
    return SCHEDULES[schedule](ps, n_microbatches=n_micro_batches, loss_fn=lm_loss, scale_grads=True)


def full_state(model: GPT) -> dict[str, torch.Tensor]:
    """This rank's parameters under the reference names, as full tensors (DTensors gathered).

    Only the parameters of the local model part are meaningful; the caller keeps those.
    Collective for DTensors: every rank of the tensor-parallel / sharding group must call it.
    """
    out = {}
    for name, p in model.named_parameters():
        t = p.detach()
        if isinstance(t, DTensor):
            t = t.full_tensor()
        out[name] = t.clone()
    return out
