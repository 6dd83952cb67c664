"""The `tiny` branchy model as a PyTorch module, for training on a CPU (OWL part 2 runs it for real).

Built from the same widths as models.tiny(), base by base and branch by branch, so that its
parameters per branch are the profile's (tests/test_fl.py checks it): convolutions without bias,
each followed by BatchNorm and ReLU; a base's branches are joined by concatenation.
"""
from __future__ import annotations

import torch
from torch import nn


def _conv(cin: int, cout: int, k: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, padding=k // 2, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(inplace=False))


class Concat(nn.Module):
    """A nonlinear base: parallel branches on one input, outputs concatenated along channels."""

    def __init__(self, *branches: nn.Module):
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([b(x) for b in self.branches], dim=1)


def _block(cin: int) -> Concat:
    return Concat(
        _conv(cin, 8, 1),
        nn.Sequential(_conv(cin, 8, 1), _conv(8, 16, 3)),
        nn.Sequential(_conv(cin, 8, 1), _conv(8, 8, 3), _conv(8, 16, 3)),
        nn.Sequential(nn.AvgPool2d(3, 1, 1, count_include_pad=False), _conv(cin, 8, 1)),
    )


class Tiny(nn.Module):
    """models.tiny(): stem, (Inception-style block, strided conv) x 2, global pooling and the classifier."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.bases = nn.ModuleList([_conv(3, 16, 3), _block(16), _conv(48, 48, 3, 2), _block(48), _conv(48, 48, 3, 2)])
        self.classifier = nn.Linear(48, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for base in self.bases:
            x = base(x)
        return self.classifier(x.mean(dim=(2, 3)))


class GlobalMean(nn.Module):
    """Tiny's global pooling before the classifier."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


def _branch_units(branch: nn.Module) -> list[nn.Module]:
    """A branch's layers as units that run one after another: each ends with a module that has parameters
    (a convolution with its BatchNorm and ReLU, or a linear layer); a pooling before it runs with it."""
    if isinstance(branch, nn.Sequential) and isinstance(branch[0], nn.Conv2d):
        return [branch]  # one convolution layer (_conv)
    units, pending = [], []
    for m in (branch.children() if isinstance(branch, nn.Sequential) else [branch]):
        pending.append(m)
        if any(True for _ in m.parameters()):
            units.append(pending[0] if len(pending) == 1 else nn.Sequential(*pending))
            pending = []
    if pending:
        raise ValueError(f"a branch ends without a layer that has parameters: {pending}")
    return units


def layer_units(net: Tiny) -> list[list[list[nn.Module]]]:
    """Per base, per branch, the units that compute the profile's layers (models.tiny(): same order, same
    parameters each), sharing the net's parameters: a worker runs them one at a time as they arrive."""
    bases = []
    for base in net.bases:
        branches = base.branches if isinstance(base, Concat) else [base]
        bases.append([_branch_units(b) for b in branches])
    bases.append([[nn.Sequential(GlobalMean(), net.classifier)]])
    return bases


def forward_by_units(bases: list[list[list[nn.Module]]], x: torch.Tensor) -> torch.Tensor:
    """The net's forward from its units in forward order (what a worker computes, in whatever order its
    layers arrive): a base's branches read the base's input and are concatenated."""
    for branches in bases:
        outs = []
        for units in branches:
            h = x
            for u in units:
                h = u(h)
            outs.append(h)
        x = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
    return x
