"""What a runtime that cuts the model into stages needs of it, whether a GPT or a CNN.

HetPipe's runtime (and Horovod's, for a CNN) trains either the GPT (gpt.py: blocks, synthetic tokens,
next-token loss) or the small CNN (cnn.py: units, teacher-labelled images, classification loss). Both
are chains of layers built from a seed alone; a stage is layers [first, last). `net_of(spec)` picks.
"""
from __future__ import annotations

import torch

from ..plan.request import ModelSection
from . import cnn, gpt


class GPTNet:
    """The GPT: its blocks are the layers (embeddings with the first, the head with the last)."""

    def __init__(self, m: ModelSection):
        self.m, self.cfg = m, m.cfg
        self.layers = self.cfg.layers

    def build(self) -> gpt.GPT:
        return gpt.GPT(self.cfg, self.m.seed)

    def global_name(self, local: str, first: int) -> str:
        """A stage's parameter name (blocks counted in the stage) as the whole model's."""
        parts = local.split(".")
        return ".".join(["blocks", str(first + int(parts[1]))] + parts[2:]) if parts[0] == "blocks" else local

    def layer_of(self, name: str) -> int:
        """The layer a parameter (whole-model name) belongs to: the embeddings to block 0, the head to the last."""
        if name.startswith("embed."):
            return 0
        if name.startswith("head."):
            return self.layers - 1
        return int(name.split(".")[1])

    def boundary(self, layer: int, micro_batch: int) -> tuple[int, ...]:
        """The activation layer `layer` sends on (and its gradient coming back)."""
        return (micro_batch, self.cfg.seq, self.cfg.hidden)

    def batch(self, iteration: int) -> tuple[torch.Tensor, torch.Tensor]:
        return gpt.synthetic_batch(self.cfg, self.m.batch, iteration, self.m.seed, self.m.data)

    def loss(self, out: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return gpt.lm_loss(out, targets)

    def floor(self) -> float:
        return gpt.loss_floor(self.cfg, self.m.data, self.m.seed)


class CNNNet:
    """The small CNN: its units are the layers."""

    def __init__(self, m: ModelSection):
        self.m = m
        self.layers = len(cnn.UNITS)

    def build(self) -> cnn.SmallResNet:
        return cnn.SmallResNet(self.m.seed)

    def global_name(self, local: str, first: int) -> str:
        parts = local.split(".")
        return ".".join(["units", str(first + int(parts[1]))] + parts[2:])

    def layer_of(self, name: str) -> int:
        return cnn.unit_of(name)

    def boundary(self, layer: int, micro_batch: int) -> tuple[int, ...]:
        return cnn.activation_shape(layer, micro_batch)

    def batch(self, iteration: int) -> tuple[torch.Tensor, torch.Tensor]:
        return cnn.teacher_batch(self.m.batch, iteration, self.m.seed)

    def loss(self, out: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return cnn.classification_loss(out, targets)

    def floor(self) -> float:
        return cnn.teacher_floor(self.m.seed)


def net_of(m: ModelSection) -> GPTNet | CNNNet:
    return CNNNet(m) if m.is_cnn else GPTNet(m)

