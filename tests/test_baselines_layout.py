"""Baseline layouts: the paper's grids, validation with one-line errors, rank orders, run flags."""
from __future__ import annotations

import pytest

from harness.errors import HarnessError
from harness.model import get_model
from harness.train.baselines.layout import (
    Layout,
    LayoutError,
    deepspeed_grid,
    degrees,
    from_json,
    layout_from_flags,
    megatron_grid,
    random_rank_order,
    validate,
)


def test_megatron_grid_is_the_papers_space_for_gpt3_xl_on_64_devices():
    cfg = get_model("gpt3-xl")  # 24 layers, 16 heads
    grid = {(l.tp, l.pp, l.dp) for l in megatron_grid(cfg, 64, 1024, 1)}
    expected = {(t, p, d) for t in (1, 2, 4, 8) for p in (1, 2, 4, 8) for d in (1, 2, 4, 8) if t * p * d == 64}
    assert grid == expected
    assert (1, 8, 8) in grid and (2, 4, 8) in grid  # the paper's optima (D.2)


def test_grid_drops_layouts_the_model_cannot_split():
    cfg = get_model("tiny", layers=2)  # 4 heads, 2 layers
    grid = {(l.tp, l.pp, l.dp) for l in megatron_grid(cfg, 8, 16, 1)}
    assert grid and all(t <= 4 and p <= 2 for t, p, _ in grid)
    assert (8, 1, 1) not in grid and (1, 8, 1) not in grid and (1, 4, 2) not in grid
    assert all(t * p * d == 8 for t, p, d in grid)


def test_deepspeed_grid_has_zero3_and_zero1_with_pipeline():
    cfg = get_model("gpt3-xl")
    labels = [l.label() for l in deepspeed_grid(cfg, 64, 1024, 1)]
    assert labels[0] == "zero3 dp=64"
    assert {"zero1 pp=2 dp=32 1f1b", "zero1 pp=4 dp=16 1f1b", "zero1 pp=8 dp=8 1f1b"} <= set(labels)


@pytest.mark.parametrize("layout, devices, field", [
    (Layout(2, 2, 1), 8, "tp*pp*dp"),
    (Layout(8, 1, 1), 8, "layout.tp"),  # tiny has 4 heads
    (Layout(1, 3, 1), 3, "layout.pp"),  # 2 layers
    (Layout(1, 1, 4, zero=3, schedule="1f1b"), 4, None),
    (Layout(1, 2, 2, zero=3), 4, "ZeRO-3"),
    (Layout(2, 1, 2, zero=1), 4, "ZeRO-1"),
    (Layout(1, 2, 1, schedule="interleaved"), 2, "layout.schedule"),
    (Layout(1, 2, 1, rank_order=(0, 0)), 2, "rank_order"),
    (Layout(1, 1, 3), 3, "layout.dp"),  # batch 8 does not split in 3
])
def test_validate_names_the_field(layout, devices, field):
    cfg = get_model("tiny", layers=2)
    if field is None:
        assert validate(layout, cfg, devices, 8, 2) is layout
        return
    with pytest.raises(LayoutError) as e:
        validate(layout, cfg, devices, 8, 2)
    assert field in str(e.value) and "\n" not in str(e.value)
    assert isinstance(e.value, HarnessError)


def test_coords_follow_megatrons_rank_numbering():
    lay = Layout(2, 2, 2)  # tp fastest, then dp, pp slowest
    assert [lay.coords(r) for r in range(8)] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]
    assert lay.mesh_ranks().shape == (2, 2, 2)


def test_random_rank_orders_are_seeded_permutations_and_tp_groups_ascend():
    orders = {seed: random_rank_order(8, seed) for seed in (2022, 2023, 2024)}
    assert len(set(orders.values())) == 3
    assert all(sorted(o) == list(range(8)) for o in orders.values())
    assert random_rank_order(8, 2022) == orders[2022]
    lay = Layout(2, 2, 2, rank_order=orders[2022])
    order = lay.order()
    # Group membership is the permutation's; only the order inside a TP group is normalised.
    pairs = [frozenset(orders[2022][k:k + 2]) for k in range(0, 8, 2)]
    assert [frozenset(order[k:k + 2]) for k in range(0, 8, 2)] == pairs
    assert all(order[k] < order[k + 1] for k in range(0, 8, 2))


@pytest.mark.parametrize("pp, dp", [(4, 2), (2, 4), (8, 1), (1, 8)])
def test_random_layout_with_tp1_is_ours_random_assignment(pp, dp):
    """Megatron runs on the very random layouts ours-random ran on (paper D.2)."""
    import numpy as np

    for seed in (2022, 2023, 2024):
        pipelines = np.random.default_rng(seed).permutation(8).reshape(dp, pp)  # experiment.place
        lay = Layout(1, pp, dp, rank_order=random_rank_order(8, seed, 1, pp))
        for rank in range(8):
            stage, replica, _ = lay.coords(rank)
            assert pipelines[replica][stage] == rank


def test_json_round_trip_and_unknown_keys():
    cfg = get_model("tiny", layers=2)
    lay = validate(Layout(2, 2, 2, schedule="gpipe", rank_order=random_rank_order(8, 2023)), cfg, 8, 8, 1)
    assert from_json("megatron", lay.to_json(), 8) == lay
    assert from_json("deepspeed", {"zero": 3}, 4) == Layout(1, 1, 4, zero=3)
    with pytest.raises(LayoutError, match="unknown key 'd_tp'"):
        from_json("megatron", {"tp": 1, "pp": 1, "dp": 2, "d_tp": 1}, 2)
    with pytest.raises(LayoutError, match="layout.zero"):
        from_json("deepspeed", {"zero": 2}, 2)
    with pytest.raises(LayoutError, match="missing"):
        from_json("megatron", {"tp": 2}, 2)


def test_layout_from_flags_fills_degrees_and_reports_them():
    cfg = get_model("tiny", layers=4)
    lay = layout_from_flags("megatron", cfg, 8, 16, 1, tp=2, pp=2)
    assert (lay["tp"], lay["pp"], lay["dp"]) == (2, 2, 2) and "rank_order" not in lay
    assert degrees("megatron", lay, 8) == (2, 2, 2)
    rnd = layout_from_flags("megatron", cfg, 8, 16, 1, pp=4, ranks="2024")
    assert rnd["rank_order"] == list(random_rank_order(8, 2024, 1, 4)) and degrees("megatron", rnd, 8) == (1, 4, 2)
    assert degrees("deepspeed", layout_from_flags("deepspeed", cfg, 8, 16, 1, zero=3), 8) == (1, 1, 8)
    assert degrees("deepspeed", layout_from_flags("deepspeed", cfg, 8, 16, 1, zero=1, pp=4), 8) == (1, 4, 2)
    with pytest.raises(LayoutError, match="--zero"):
        layout_from_flags("deepspeed", cfg, 8, 16, 1, pp=2)
    with pytest.raises(LayoutError, match="--tp"):
        layout_from_flags("deepspeed", cfg, 8, 16, 1, zero=1, tp=2)
    with pytest.raises(LayoutError, match="--rank-order"):
        layout_from_flags("megatron", cfg, 8, 16, 1, ranks="shuffled")


def test_plan_layout_validates_given_layouts_and_builds_from_flags():
    from harness.train.baselines.layout import plan_layout

    cfg = get_model("tiny", layers=4)
    lay, deg = plan_layout("megatron", cfg, 8, 16, 1, layout={"tp": 2, "pp": 4, "dp": 1})
    assert deg == (2, 4, 1) and lay["schedule"] == "1f1b"
    lay, deg = plan_layout("deepspeed", cfg, 8, 16, 1, zero=1, pp=2)
    assert deg == (1, 2, 4) and lay["zero"] == 1
    with pytest.raises(LayoutError, match="tp\\*pp\\*dp"):
        plan_layout("megatron", cfg, 8, 16, 1, layout={"tp": 2, "pp": 2, "dp": 1})
