"""The GPT as a layer profile (layers.Layer), so that HetPipe's planner partitions it as it does a CNN.

One layer per transformer block, the unit a harness Layout places; the embeddings ride with block 0
and the LM head with the last block, as on a pipeline's first and last stage (GPT.stage). Per sample:
the parameters, the forward FLOPs (harness/compute/: the same formulas the cost model and the compute
model use), the activation sent to the next block (s x h values) and the activations a block keeps
for its backward (Korthikanti et al. 2022, without recomputation: the harness's CPU runtimes keep
them). A real HetPipe run of the tiny GPT is planned from this profile (harness/systems/hetpipe/).
"""
from __future__ import annotations

from ..compute import block_activation_bytes, block_fwd_flop, head_fwd_flop
from ..compute.model import GPTConfig
from .layers import Layer, LayerProfile


def layer_chain(model: GPTConfig | LayerProfile) -> LayerProfile:
    """A model as its chain of layers: a CNN's profile as it is, a GPT's blocks (what the simulator's models of
    a run take either way)."""
    return model if isinstance(model, LayerProfile) else gpt_layer_profile(model)


def gpt_layer_profile(cfg: GPTConfig) -> LayerProfile:
    """The blocks of `cfg` as layers (HetPipe's planner reads any layer profile)."""
    act = cfg.seq * cfg.hidden
    kept = int(block_activation_bytes(cfg, 1, bytes_per_value=2, recompute=False) / 2)
    layers = []
    for i in range(cfg.layers):
        params, flop = cfg.block_params, block_fwd_flop(cfg, 1)
        if i == 0:
            params += cfg.embedding_params
        if i == cfg.layers - 1:
            params += cfg.head_params
            flop += head_fwd_flop(cfg, 1)
        layers.append(Layer(f"block{i}", params, flop, out_values=act, kept_values=kept))
    return LayerProfile(cfg.name, tuple(layers), input_values=cfg.seq)
