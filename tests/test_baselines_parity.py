"""Megatron- and DeepSpeed-style layouts train exactly as the single-process reference (fp32, 3 steps).

Every layout the issue names runs on forked gloo ranks through the trainer's launcher
(`run_local`) and must match `reference_train` in loss and parameters within 1e-5 relative.
"""
from __future__ import annotations

import math

import pytest
import torch

from harness import layout as layouts
from harness.layout import Layout
from harness.plan.request import RunSpec
from harness.train.gpt import GPT
from harness.train.local import local_spec, run_local
from harness.train.reference import reference_train

pytestmark = pytest.mark.timeout(90)

MODEL, LAYERS, BATCH, MICRO, STEPS, SEED, LR = "tiny", 2, 8, 2, 3, 0, 0.1
REL = 1e-5


@pytest.fixture(scope="module")
def reference():
    from harness.compute.model import get_model

    return reference_train(get_model(MODEL, LAYERS), BATCH, MICRO, STEPS, SEED, LR)


def spec(system: str, layout: Layout) -> RunSpec:
    return local_spec(layout, system, name=MODEL, batch=BATCH, micro_batch=MICRO, iters=STEPS, seed=SEED, lr=LR,
                      timeout_s=60)


def rank_order(tp, pp, dp, order, **opts) -> Layout:
    return layouts.with_rank_order(layouts.in_rank_order(tp, pp, dp, LAYERS, **opts), order)


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref| over the tensor's scale; tensors whose reference is rounding noise
    (the key bias, whose gradient is exactly zero in exact arithmetic) are scaled by 1e-6."""
    return ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()


def assert_matches_reference(run, reference):
    ref_losses, ref_state = reference
    losses = [s.loss for s in run.stats]
    assert len(losses) == STEPS
    for got, ref in zip(losses, ref_losses):
        assert math.isfinite(got) and abs(got - ref) <= REL * abs(ref), (losses, ref_losses)
    state = run.state_dict()
    assert set(state) == set(ref_state), sorted(set(ref_state) ^ set(state))
    worst = max((relative_error(state[k], ref_state[k]), k) for k in ref_state)
    assert worst[0] <= REL, f"parameter {worst[1]} differs by {worst[0]:.2e} relative"
    # The parameters moved: a run that never stepped would not match a reference that did.
    init = GPT(run_cfg(), SEED).state_dict()
    assert max((state[k] - init[k]).abs().max().item() for k in init) > 1e-3


def run_cfg():
    from harness.compute.model import get_model

    return get_model(MODEL, LAYERS)


LAYOUTS = {
    "megatron-tp2": ("megatron", lambda: layouts.in_rank_order(2, 1, 1, LAYERS)),
    "megatron-pp2-gpipe": ("megatron", lambda: layouts.in_rank_order(1, 2, 1, LAYERS, schedule="gpipe")),
    "megatron-dp2": ("megatron", lambda: layouts.in_rank_order(1, 1, 2, LAYERS)),
    "megatron-tp2xpp2-1f1b": ("megatron", lambda: layouts.in_rank_order(2, 2, 1, LAYERS)),
    "megatron-tp2xdp2-permuted": ("megatron", lambda: rank_order(2, 1, 2, [2, 0, 3, 1])),
    "megatron-tp2xpp2xdp2-seed2022": ("megatron", lambda: layouts.seeded(2, 2, 2, LAYERS, 2022, schedule="gpipe")),
    "megatron-pp2-uneven": ("megatron", lambda: layouts.from_pipelines([[1, 0]], LAYERS, "test", stages=((0, 1), (1, 2)))),
    "deepspeed-zero3-4": ("deepspeed", lambda: layouts.in_rank_order(1, 1, 4, LAYERS, zero=3)),
    "deepspeed-zero1-pp2xdp2-permuted": ("deepspeed", lambda: rank_order(1, 2, 2, [3, 1, 0, 2], zero=1)),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_reference(name, reference):
    system, build = LAYOUTS[name]
    layout = build()
    run = run_local(spec(system, layout), collect_state=True, timeout_s=80)
    assert_matches_reference(run, reference)
