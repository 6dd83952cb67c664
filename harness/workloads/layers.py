"""The one layer profile of the layer-profile workloads (cnn: HetPipe's VGG-19 and ResNet-152; fl: OWL's
branchy models): per sample, what partitioning, model distribution and the simulator read of a layer.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layer:
    """One unit of partitioning or distribution, per sample."""

    name: str
    params: int
    fwd_flop: float
    out_values: int = 0  # the activation it sends to the next layer (the gradient coming back has the same size)
    kept_values: int = 0  # activation values it keeps for its backward


class LayerSums:
    """The parameters and forward FLOPs of anything that holds `layers`."""

    layers: tuple[Layer, ...]

    @property
    def params(self) -> int:
        return sum(l.params for l in self.layers)

    @property
    def fwd_flop(self) -> float:
        return sum(l.fwd_flop for l in self.layers)


@dataclass(frozen=True)
class LayerProfile(LayerSums):
    """A model as the chain of its layers (a CNN, or a GPT's blocks: workloads/gpt_layers.py), what HetPipe's
    planner partitions; input_values: one sample's input."""

    name: str
    layers: tuple[Layer, ...]
    input_values: int
