"""Branchy models as PyTorch modules, for training on a CPU (OWL's emulated runs, harness/systems/owl/).

Built from the profile itself (models.py records how each layer computes), so a module's parameters per
layer are the profile's by construction: every layer a unit that runs alone once its parameters are here
(a convolution without bias with its BatchNorm and ReLU, a pooling before it included; the classifier a
global mean and a linear layer), a base's branches read its input and meet along channels or in a sum.
Only a profile whose branches are chains of such layers builds (`tiny`, `mini-inception`; not
Inception-v4's split branches nor DFN's stem).
"""
from __future__ import annotations

import torch
from torch import nn

from .federation import FLError
from .models import BranchyModel


class GlobalMean(nn.Module):
    """The global pooling before a classifier."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


def _op(op: tuple) -> nn.Module:
    kind, *a = op
    if kind == "conv":
        cin, cout, kh, kw, stride, valid = a
        pad = (0, 0) if valid else (kh // 2, kw // 2)
        return nn.Sequential(nn.Conv2d(cin, cout, (kh, kw), stride, padding=pad, bias=False), nn.BatchNorm2d(cout),
                             nn.ReLU(inplace=False))
    if kind == "pool":
        k, stride, valid = a
        if stride == 1:
            return nn.AvgPool2d(k, 1, k // 2, count_include_pad=False)
        return nn.MaxPool2d(k, stride, padding=0 if valid else k // 2)
    if kind == "fc":
        cin, cout = a
        return nn.Sequential(GlobalMean(), nn.Linear(cin, cout))
    raise ValueError(f"unknown operation {kind!r}")


def _unit(ops: tuple[tuple, ...]) -> nn.Module:
    mods = [_op(op) for op in ops]
    return mods[0] if len(mods) == 1 else nn.Sequential(*mods)


def check_buildable(model: BranchyModel) -> None:
    bad = [f"{base.name}.b{j}" for base in model.bases for j, br in enumerate(base.branches) if not br.runnable]
    if bad:
        raise FLError(f"{model.name}: branch {bad[0]} is not a chain of layers; it does not build as a module")


class BranchyNet(nn.Module):
    """`model` as a module: `bases[i][j]` the units of base i's branch j, one per profile layer, in order."""

    def __init__(self, model: BranchyModel):
        super().__init__()
        check_buildable(model)
        self.bases = [[[_unit(ops) for ops in br.units] for br in base.branches] for base in model.bases]
        self.joins = [base.join for base in model.bases]
        self.units = nn.ModuleList(u for base in self.bases for br in base for u in br)  # registers the parameters

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return forward_by_units(self.bases, self.joins, x)


def join(outputs: list[torch.Tensor], how: str) -> torch.Tensor:
    """A base's branches' outputs met: one alone, concatenated along channels, or summed."""
    if len(outputs) == 1:
        return outputs[0]
    return torch.cat(outputs, dim=1) if how == "concat" else torch.stack(outputs).sum(0)


def forward_by_units(bases: list[list[list[nn.Module]]], joins: list[str], x: torch.Tensor) -> torch.Tensor:
    """The net's forward from its units in forward order (what a worker computes, in whatever order its
    layers arrive): a base's branches read the base's input and are joined."""
    for branches, how in zip(bases, joins):
        outs = []
        for units in branches:
            h = x
            for u in units:
                h = u(h)
            outs.append(h)
        x = join(outs, how)
    return x
