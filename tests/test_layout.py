"""The one layout module: degrees, meshes, stage ranges, the seeded placement rule, grids, one-line errors."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from harness import layout as layouts
from harness.errors import HarnessError
from harness.layout import Layout, LayoutError
from harness.compute.model import get_model


def test_megatron_grid_is_the_papers_space_for_gpt3_xl_on_64_devices():
    cfg = get_model("gpt3-xl")  # 24 layers, 16 heads
    grid = {(l.tp, l.pp, l.dp) for l in layouts.megatron_grid(cfg, 64, 1024, 1)}
    expected = {(t, p, d) for t in (1, 2, 4, 8) for p in (1, 2, 4, 8) for d in (1, 2, 4, 8) if t * p * d == 64}
    assert grid == expected
    assert (1, 8, 8) in grid and (2, 4, 8) in grid  # the paper's optima (D.2)


def test_grid_drops_layouts_the_model_cannot_split():
    cfg = get_model("tiny", layers=2)  # 4 heads, 2 layers
    grid = {(l.tp, l.pp, l.dp) for l in layouts.megatron_grid(cfg, 8, 16, 1)}
    assert grid and all(t <= 4 and p <= 2 for t, p, _ in grid)
    assert (8, 1, 1) not in grid and (1, 8, 1) not in grid and (1, 4, 2) not in grid
    assert all(t * p * d == 8 for t, p, d in grid)


def test_deepspeed_grid_has_zero3_and_zero1_with_pipeline():
    cfg = get_model("gpt3-xl")
    labels = [l.label() for l in layouts.deepspeed_grid(cfg, 64, 1024, 1)]
    assert labels[0] == "zero3 dp=64"
    assert {"zero1 pp=2 dp=32 1f1b", "zero1 pp=4 dp=16 1f1b", "zero1 pp=8 dp=8 1f1b"} <= set(labels)


@pytest.mark.parametrize("build, field", [
    (lambda: layouts.in_rank_order(2, 2, 1, 2).check(get_model("tiny", 2), 8, 2, devices=8), "tp*pp*dp"),
    (lambda: layouts.in_rank_order(8, 1, 1, 2).check(get_model("tiny", 2), 8, 2), "layout.tp"),  # 4 heads
    (lambda: layouts.in_rank_order(1, 3, 1, 2), "layout.pp"),  # 2 layers
    (lambda: layouts.in_rank_order(1, 2, 2, 2, zero=3), "ZeRO-3"),
    (lambda: layouts.in_rank_order(2, 1, 2, 2, zero=1), "ZeRO-1"),
    (lambda: layouts.in_rank_order(1, 2, 1, 2, schedule="interleaved"), "layout.schedule"),
    (lambda: layouts.in_rank_order(1, 1, 3, 2).check(get_model("tiny", 2), 8, 2), "layout.dp"),  # batch 8 / 3
    (lambda: layouts.from_pipelines([[0, 0]], 2, "test"), "layout.mesh"),
    (lambda: layouts.from_pipelines([[1, 0]], 4, "test", stages=((0, 3), (2, 4))), "layout.stages[1]"),
    (lambda: layouts.in_rank_order(1, 2, 1, 4).check(get_model("tiny", 2), 8, 2), "layout.stages"),
    (lambda: Layout.from_json({"tp": 1, "pp": 1, "dp": 1, "mesh": [[[0]]], "stages": [[0, 2]], "d_tp": 1}),
     "unknown key 'd_tp'"),
    (lambda: Layout.from_json({"tp": 1, "pp": 1, "dp": 1, "mesh": [[[0]]]}), "layout.stages: missing"),
])
def test_bad_layouts_are_one_line_errors_naming_the_field(build, field):
    with pytest.raises(LayoutError) as e:
        build()
    assert field in str(e.value) and "\n" not in str(e.value)
    assert isinstance(e.value, HarnessError)


def test_rank_order_follows_megatrons_numbering():
    lay = layouts.in_rank_order(2, 2, 2, 4)  # tp fastest, then dp, pp slowest
    assert [lay.coords(r) for r in range(8)] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]
    assert lay.rank_order() == tuple(range(8))
    assert lay.pipelines == ((0, 4), (2, 6)) and lay.stage_group(1) == [4, 6]


def test_seeded_rule_reads_the_permutation_replica_major():
    perm = np.random.default_rng(2022).permutation(8)
    lay = layouts.seeded(1, 4, 2, 4, 2022)
    assert lay.pipelines == (tuple(perm[:4]), tuple(perm[4:]))  # replica i takes the i-th run of D_PP devices
    assert lay.placement == "seed-2022"
    # with tensor parallelism, the shard index is the fastest: device(j, i, t) = perm[(i*pp + j)*tp + t]
    tp = layouts.seeded(2, 2, 2, 4, 2023)
    perm = np.random.default_rng(2023).permutation(8)
    assert all(tp.device(j, i, t) == perm[(i * 2 + j) * 2 + t] for j in range(2) for i in range(2) for t in range(2))
    assert len({layouts.seeded(1, 4, 2, 4, s).mesh for s in layouts.RANDOM_SEEDS}) == 3


@pytest.mark.parametrize("pp, dp", [(4, 2), (2, 4), (8, 1), (1, 8)])
def test_baselines_random_layout_with_tp1_is_ours_random_assignment(pp, dp):
    """Megatron runs on the very random layouts ours-random ran on (paper D.2): one rule, one seed."""
    for seed in layouts.RANDOM_SEEDS:
        ours = layouts.seeded(1, pp, dp, 8, seed, schedule="gpipe", dp_sync="sharded-ps")
        megatron = layouts.seeded(1, pp, dp, 8, seed)
        assert ours.mesh == megatron.mesh


def test_stages_are_even_by_default_and_may_be_uneven():
    assert layouts.in_rank_order(1, 4, 1, 10).stages == ((0, 3), (3, 6), (6, 8), (8, 10))
    lay = layouts.from_pipelines([[0, 1]], 8, "test", stages=((0, 6), (6, 8)))
    assert lay.layers_per_stage == [6, 2] and lay.layers == 8


def test_json_round_trip():
    cfg = get_model("tiny", layers=4)
    lay = layouts.seeded(2, 2, 2, 4, 2023, schedule="gpipe").check(cfg, 8, 1, 8)
    assert Layout.from_json(lay.to_json()) == lay
    ours = layouts.from_pipelines([[3, 1], [0, 2]], 4, "ga", schedule="1f1b", dp_sync="sharded-ps", recompute=True,
                                  stages=((0, 1), (1, 4)))
    assert Layout.from_json(ours.to_json()) == ours


def test_with_rank_order_reads_megatrons_logical_ranks():
    lay = layouts.with_rank_order(layouts.in_rank_order(1, 2, 2, 2), [3, 1, 0, 2])
    assert lay.rank_order() == (3, 1, 0, 2) and lay.pipelines == ((3, 0), (1, 2))


def test_default_pipeline_degrees_are_square_with_the_pipeline_on_the_longer_side():
    assert layouts.default_pipeline_degrees(64, 24) == (8, 8)
    assert layouts.default_pipeline_degrees(8, 4) == (4, 2)
    assert layouts.default_pipeline_degrees(4, 2) == (2, 2)
    with pytest.raises(LayoutError, match="--devices"):
        layouts.default_pipeline_degrees(7, 2)


# ----------------------------------------------------------------------------- pipelines that differ
# Seven devices, an 8-block model: replica 0 runs 3 uneven stages, replica 1 two, replica 2 two.
HETERO = [((4, 0, 6), ((0, 2), (2, 5), (5, 8))), ((1, 5), ((0, 6), (6, 8))), ((3, 2), ((0, 4), (4, 8)))]


def test_a_layout_may_hold_pipelines_of_different_lengths():
    lay = layouts.from_replicas(HETERO, "hetpipe-np")
    assert not lay.uniform and (lay.tp, lay.pp, lay.dp, lay.zero, lay.devices, lay.layers) == (1, 3, 3, 0, 7, 8)
    assert lay.pipelines == ((4, 0, 6), (1, 5), (3, 2))
    assert lay.pipeline(1).stages == ((0, 6), (6, 8)) and lay.pipeline(0).layers_per_stage == [2, 3, 3]
    assert lay.label() == "pipelines 3+2+2 (hetpipe-np)"
    assert lay.check(get_model("tiny", 8), batch=6, micro_batch=1, devices=7) is lay
    assert Layout.from_json(lay.to_json()) == lay
    assert lay.to_json()["replicas"][2] == {"devices": [3, 2], "stages": [[0, 4], [4, 8]]}


def test_replicas_that_are_alike_make_the_uniform_mesh_of_the_usual_constructors():
    stages = ((0, 1), (1, 4))
    lay = layouts.from_replicas([((2, 0), stages), ((1, 3), stages)], "given", schedule="gpipe")
    mesh = layouts.from_pipelines([[2, 0], [1, 3]], 4, "given", schedule="gpipe")
    assert lay.uniform and lay == replace(mesh, stages=stages) and lay.layers_per_stage == [1, 3]
    assert "replicas" not in lay.to_json()  # a uniform layout's JSON is as it always was
    assert [p.devices for p in lay.replica_pipelines()] == [(2, 0), (1, 3)]


@pytest.mark.parametrize("replicas, message", [
    ([((0, 1), ((0, 2), (2, 8))), ((1, 2), ((0, 8),))], "layout.replicas[1]: 2 devices for 1 stage layer ranges"),
    ([((0, 1), ((0, 2), (2, 8))), ((1,), ((0, 8),))], "layout.replicas[1].devices: device 1 is placed twice "
                                                     "(replicas 0 and 1)"),
    ([((0, 1), ((0, 2), (2, 8))), ((3,), ((0, 8),))], "layout.replicas: must place every device 0..2 once "
                                                     "(got [0, 1, 3])"),
    ([((0, 1), ((0, 2), (2, 8))), ((2,), ((0, 6),))], "layout.replicas[1].stages: cover 6 blocks, replica 0 "
                                                     "covers 8 (every replica holds the whole model)"),
    ([((0, 1), ((0, 2), (3, 8))), ((2,), ((0, 8),))], "layout.replicas[0].stages[1]: must be a non-empty range "
                                                     "starting at block 2 (got [3, 8))"),
    ([((0, 1), ((0, 2), (2, 8))), ((), ())], "layout.replicas[1].devices: a pipeline needs at least one device"),
])
def test_pipelines_that_differ_are_checked_with_one_line_errors(replicas, message):
    with pytest.raises(LayoutError) as e:
        layouts.from_replicas(replicas, "given")
    assert str(e.value) == message


def test_a_layout_whose_pipelines_differ_is_refused_where_a_uniform_mesh_is_needed():
    from harness.systems.ours import sim as simsys
    from harness.netmodel.links import Links
    from harness.compute.profiles import device_profiles
    from harness.scenario import load_scenario

    lay = layouts.from_replicas(HETERO, "hetpipe-np")
    for read in (lay.array, lambda: lay.layers_per_stage, lambda: lay.stage_group(0), lambda: lay.coords(0),
                 lambda: layouts.with_rank_order(lay, range(7))):
        with pytest.raises(LayoutError, match=r"^layout.replicas: .* needs a uniform mesh; this layout's pipelines "
                                              r"differ \(stages per replica: 3, 2, 2\)$"):
            read()
    topo = load_scenario("1", devices=8)
    with pytest.raises(LayoutError, match="needs a uniform mesh"):
        simsys.simulate_ours(Links.from_topology(topo), device_profiles(topo), get_model("tiny", 8), 6, lay)
    with pytest.raises(LayoutError, match=r"layout.replicas: place 7 devices, the run has 8"):
        lay.check(get_model("tiny", 8), 6, 1, devices=8)
