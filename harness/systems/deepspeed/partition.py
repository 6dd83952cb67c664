"""How DeepSpeed 0.6.7's pipeline engine splits a GPT over its stages: by parameters.

`PipelineModule(partition_method='parameters')` is the engine's default (runtime/pipe/module.py): it counts the
trainable parameters of every layer spec and cuts the list into contiguous parts whose heaviest part is as light
as possible (runtime/utils.py partition_balanced: a binary search on that bottleneck, each part then filled
greedily while it stays below it). A GPT pipe model lists the word and position embedding, the blocks, the final
LayerNorm and the LM head, whose weight the word embedding ties (TiedLayerSpec: counted on both stages). So the
first and last stages take fewer blocks than the rest, and a deep pipeline may leave the last stage the head
alone (GPT3-XL, 24 blocks over 8 stages: 1, 4, 4, 4, 4, 4, 3 and 0 blocks).

Written here, not imported: DeepSpeed needs CUDA to install, and the simulator only needs this split.
"""
from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate

from ...compute.model import GPTConfig

EPS = 1e-3  # partition_balanced's default precision of the bottleneck (parameters)


def layer_parameters(cfg: GPTConfig) -> list[int]:
    """Parameters of every layer spec of a GPT pipe model, in order: embedding, blocks, final LayerNorm, the
    tied LM head."""
    h = cfg.hidden
    return [cfg.embedding_params] + [cfg.block_params] * cfg.layers + [2 * h, cfg.vocab * h]


def _probe(prefix: list[float], parts: int, bottleneck: float) -> tuple[list[int], bool]:
    """Boundaries of the greedy split whose parts stay below `bottleneck`, and whether it covers every item."""
    n = len(prefix)
    bounds = [0] + [n] * parts
    target = bottleneck
    for p in range(1, parts):
        bounds[p] = bisect_left(prefix, target, lo=bounds[p - 1])
        if bounds[p] == n:  # the rest fits this part; DeepSpeed weighs it from the previous boundary's prefix
            return bounds, prefix[-1] - prefix[bounds[p - 1]] < bottleneck
        target = prefix[bounds[p] - 1] + bottleneck
    return bounds, target >= prefix[-1]


def partition_balanced(weights: list[float], parts: int) -> list[int]:
    """Boundaries (parts + 1, from 0 to len(weights)) of the contiguous split DeepSpeed 0.6.7 makes."""
    if len(weights) <= parts:
        return [min(p, len(weights)) for p in range(parts + 1)]
    prefix = list(accumulate(float(w) for w in weights))
    lower, upper = prefix[-1] / parts, prefix[-1]
    while upper > lower + EPS:
        mid = lower + (upper - lower) / 2
        if _probe(prefix, parts, mid)[1]:
            upper = mid
        else:
            lower = mid + EPS
    bounds, covered = _probe(prefix, parts, upper)
    assert covered
    return bounds


def pipe_stages(cfg: GPTConfig, pp: int) -> tuple[tuple[int, int], ...]:
    """[first, last) block of every stage under the parameter partition (a stage may hold no block)."""
    bounds = partition_balanced(layer_parameters(cfg), pp)
    # layer spec k (1..layers) is block k - 1; the embedding and the LayerNorm and head hold none
    blocks = [min(max(b - 1, 0), cfg.layers) for b in bounds]
    blocks[-1] = cfg.layers
    return tuple((blocks[j], blocks[j + 1]) for j in range(pp))
