"""Checkpoints of the Megatron- and DeepSpeed-style runs, in ours' format (train/checkpoint.py: by full GPT
parameter name, its value and SGD momentum), so that a run restarted on fewer or more devices by the elastic agent
goes on from its last checkpoint on whatever degrees it now has, as torch.distributed.checkpoint's resharding
lets a Megatron or DeepSpeed user do.

What a rank writes: the parameters of its stage whose momentum it keeps, gathered whole: tensor-parallel and
ZeRO-3 shards (DTensors) are gathered over their group (collective: every rank of the group takes part), and
under ZeRO-1 each rank writes the parameters its optimizer shard owns (the replicas of a stage hold the same
values; every parameter is owned by one rank of each data-parallel group). What a rank reads: each parameter
of its stage, whole, then its own shard of it (a DTensor's placements) and of its momentum.
"""
from __future__ import annotations

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor, distribute_tensor

from ...train import checkpoint


def _whole(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _optimizer_state(optimizer) -> dict:
    """Parameter -> its optimizer state, on this rank (ZeRO-1: the shard's)."""
    return optimizer.optim.state if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer.state


def _momentum_owners(optimizer, params) -> list:
    """The parameters whose momentum this rank keeps, in the order every rank of a group calls them."""
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        mine = {id(p) for group in optimizer.optim.param_groups for p in group["params"]}
        return [p for p in params if id(p) in mine]
    return list(params)


def save(root, iteration: int, rank: int, world: int, named: list[tuple[str, torch.nn.Parameter]],
         optimizer) -> None:
    """Rank `rank` of `world` after `iteration` iterations: its stage's parameters `named` (GPT name,
    parameter), with their momentum (zeros before the first step)."""
    state = _optimizer_state(optimizer)
    held = {}
    owners = {id(p) for p in _momentum_owners(optimizer, [p for _, p in named])}
    for name, p in named:  # every rank of a group gathers every DTensor in one order
        value = _whole(p.detach())
        buf = state.get(p, {}).get("momentum_buffer")
        momentum = _whole(buf) if buf is not None else torch.zeros_like(value)
        if id(p) in owners:
            held[name] = (value, momentum)
    checkpoint.save(root, iteration, rank, world, held)


def load_into(run_dir, iteration: int, named: list[tuple[str, torch.nn.Parameter]], optimizer) -> None:
    """Set the stage's parameters `named` and the momentum this rank keeps from the checkpoint after
    `iteration` iterations (each rank takes its own shard of a whole tensor: no communication)."""
    whole = checkpoint.load(run_dir, iteration, [n for n, _ in named])
    state = _optimizer_state(optimizer)
    owners = {id(p) for p in _momentum_owners(optimizer, [p for _, p in named])}
    with torch.no_grad():
        for name, p in named:
            value, momentum = (t.to(device=p.device, dtype=p.dtype) for t in whole[name])
            if isinstance(p, DTensor):
                value = distribute_tensor(value, p.device_mesh, p.placements, src_data_rank=None)
                momentum = distribute_tensor(momentum, p.device_mesh, p.placements, src_data_rank=None)
            p.copy_(value)
            if id(p) in owners:
                state[p]["momentum_buffer"] = momentum.clone()
