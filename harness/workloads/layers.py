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
