"""Single-process training that every parallel system must reproduce (fp32, same seed).

Every system (ours, megatron, deepspeed) builds `GPT(cfg, seed)`, draws
`synthetic_batch(cfg, batch, step, seed)`, optimises with `make_optimizer`, and
defines the loss of a step as the mean over the whole batch. Micro-batches of
equal size therefore contribute `loss_mb / n_micro_batches` each; a data-parallel
replica holding `k` of the `n` micro-batches contributes the sum of its `k` terms,
and the replicas' gradients are summed.
"""
from __future__ import annotations

import torch

from ..compute import micro_batches
from ..compute.model import GPTConfig
from .gpt import GPT, lm_loss, synthetic_batch

# Plain SGD with momentum: deterministic, elementwise, and well-behaved for parity
# (Adam's first step is ~lr*sign(g), which amplifies rounding on tiny gradients).
MOMENTUM = 0.9


def make_optimizer(params, lr: float) -> torch.optim.Optimizer:
    """The one optimizer of every system: SGD with momentum, fp32 master state."""
    return torch.optim.SGD(params, lr=lr, momentum=MOMENTUM)




def reference_train(
    cfg: GPTConfig, batch: int, micro_batch: int, steps: int, seed: int = 0, lr: float = 0.1, data: str = "uniform"
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Train `steps` iterations in one process; returns (loss per step, final state_dict).

    The loss of a step is measured before that step's update (as a trainer logs it).
    """
    n_mb = micro_batches(batch, micro_batch)
    model = GPT(cfg, seed)
    opt = make_optimizer(model.parameters(), lr)
    losses = []
    for step in range(steps):
        tokens, targets = synthetic_batch(cfg, batch, step, seed, data)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for k in range(n_mb):
            sl = slice(k * micro_batch, (k + 1) * micro_batch)
            loss = lm_loss(model(tokens[sl]), targets[sl]) / n_mb
            loss.backward()
            total += loss.item()
        opt.step()
        losses.append(total)
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}
