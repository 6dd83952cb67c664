"""Whole-iteration models: hand-checkable cases, monotonicity, and the paper's cost model as a lower bound."""
from __future__ import annotations


from dataclasses import replace

import numpy as np
import pytest

from harness import layout as layouts
from harness.scheduler.cost import CostModel
from harness.compute.model import stage_params, even_split, get_model
from harness.compute import c_pp_bytes
from harness.compute.profiles import device_profiles
from harness.scenario import load_scenario
from harness import compute
from harness.systems.baselines import sim as baselines
from harness.systems.ours import sim as ours_sim
from harness.netmodel.links import Links
from harness.sim.sweep import PAPER_RUNTIME
from tests.conftest import make_topology, random_topology

CFG = get_model("gpt3-xl", 8)


def ours(pipelines):
    """ours' layout on these pipelines, run as the paper's runtime (GPipe, sharded PS, recompute)."""
    return layouts.from_pipelines(pipelines, CFG.layers, "test", **PAPER_RUNTIME)


def placed(tp, pp, dp, order, **opts):
    """A baseline layout on Megatron's logical-rank order `order`."""
    return layouts.with_rank_order(layouts.in_rank_order(tp, pp, dp, CFG.layers, **opts), order)


def random_placement(n, seed):
    return np.random.default_rng(seed).permutation(n)


def uniform(n, delay_ms, gbps):
    return make_topology(np.full((n, n), delay_ms), np.full((n, n), gbps))


def test_ours_two_stages_one_link_closed_form():
    topo = uniform(2, 20.0, 1.0)
    links, prof = Links.from_topology(topo), device_profiles(topo)
    M = 16
    r = ours_sim.simulate_ours(links, prof, CFG, M, ours([[0, 1]]))
    fwd, bwd = compute.stage_compute(CFG, [4, 4], 1, prof, np.array([0, 1]))
    ser = compute.activation_bytes(CFG, 1) / (1e9 / 8)
    a = 0.020
    t_fwd = fwd[0] + ser + a + fwd[1] + (M - 1) * max(fwd[0], ser, fwd[1])
    t_end = t_fwd + bwd[1] + ser + a + bwd[0] + (M - 1) * max(bwd[1], ser, bwd[0])
    opt = np.array([compute.optimizer_seconds(p, prof[j]) for j, p in enumerate(stage_params(CFG, [4, 4]))])
    # one replica: no data-parallel sync; stage 0 ends an iteration (its optimizer step) and starts the next
    assert r.seconds == pytest.approx(t_end + opt[0], rel=1e-12)
    assert r.compute_seconds == pytest.approx(max(M * (fwd + bwd) + opt), rel=1e-12)


def test_zero3_step_closed_form_on_uniform_ring():
    n, delay_ms, gbps = 8, 3.0, 4.0
    topo = uniform(n, delay_ms, gbps)
    links, prof = Links.from_topology(topo), device_profiles(topo)
    batch = 2 * n
    # no reuse distance: every module step gathers its parameters
    r = baselines.simulate_zero3(links, prof, CFG, batch, layouts.in_rank_order(1, 1, n, CFG.layers, zero=3), max_reuse=0)
    alpha, rate = delay_ms / 1e3, gbps * 1e9 / 8

    def ag(params):  # ring all-gather: D-1 steps of one shard
        return (n - 1) * (alpha + 2 * params / n / rate)

    c_f = compute.block_fwd_flop(CFG, 1) / prof[0].flops_per_s("transformer")
    h_f = compute.head_fwd_flop(CFG, 1) / prof[0].flops_per_s("lm_head")
    per_layer = 2 * max(c_f, ag(CFG.block_params)) + max(2 * c_f, 2 * ag(CFG.block_params))
    per_mb = (CFG.layers * per_layer + 3 * ag(CFG.embedding_params)  # forward gather; backward gather + reduce-scatter
              + max(h_f, ag(CFG.head_params)) + max(2 * h_f, 2 * ag(CFG.head_params)))
    opt = compute.optimizer_seconds(sum(stage_params(CFG, 1)) / n, prof[0])  # each device steps its 1/n shard
    # the overflow flag and the norm: NCCL's tree over 8 is 3 hops deep (1 -> 2 -> 4 -> 0), up and down
    small = 2 * (2 * 3 * alpha)
    assert r.seconds == pytest.approx(batch // n * per_mb + small + opt, rel=1e-12)


def test_zero3_keeps_parameters_a_module_reuses_within_the_distance():
    """DeepSpeed's release rule by hand on two blocks (block 50.4M, embedding 107M, head 103M parameters) with a
    reuse distance of 5e8: the trace is E, b0, b1, H forward; H backward; b1, b0 recompute + backward; E backward."""
    cfg = get_model("gpt3-xl", 2)
    p, e, h = cfg.block_params, cfg.embedding_params, cfg.head_params
    assert 6 * p + 2 * h > 5e8 > 3 * p + 2 * h and 6 * p + 2 * e > 5e8 > 3 * p + 2 * e  # what each step sees ahead
    first = [True, True, True, True, False, False, False, False, False, True]  # E's forward gather is gone by its backward
    steady = [False, False, False, True, False, False, False, False, False, True]  # blocks and E kept from the last one
    assert baselines.zero3_gathers(cfg, 2, 5e8) == tuple(first + steady)
    # the paper's model under DeepSpeed's default distance: a block gathers fewer than twice a micro-batch, not 3 times
    cfg24 = get_model("gpt3-xl", 24)
    steps = len(baselines.zero3_trace(cfg24))
    second = baselines.zero3_gathers(cfg24, 2)[steps:]
    blocks = sum(g for (m, _, _), g in zip(baselines.zero3_trace(cfg24), second) if m.startswith("block"))
    assert 24 <= blocks < 2 * 24


def _all_systems(topo, pipelines, batch=32):
    links, prof = Links.from_topology(topo), device_profiles(topo)
    n = topo.n
    perm = random_placement(n, 2022)
    return {
        "ours": ours_sim.simulate_ours(links, prof, CFG, batch, ours(pipelines)).seconds,
        "ours-rounds": ours_sim.simulate_ours(links, prof, CFG, batch, ours(pipelines), ps_mode="rounds").seconds,
        "megatron-1-4-2": baselines.simulate_megatron(links, prof, CFG, batch, placed(1, 4, 2, perm)).seconds,
        "megatron-2-2-2": baselines.simulate_megatron(links, prof, CFG, batch, placed(2, 2, 2, perm)).seconds,
        "zero3": baselines.simulate_zero3(links, prof, CFG, batch, placed(1, 1, n, perm, zero=3)).seconds,
        "zero1-pp2": baselines.simulate_zero1_pp(links, prof, CFG, batch, placed(1, 2, 4, perm, zero=1)).seconds,
    }


@pytest.mark.parametrize("seed", [0, 1])
def test_less_bandwidth_or_more_delay_never_makes_an_iteration_faster(seed):
    topo = random_topology(8, seed)
    pipelines = random_placement(8, seed).reshape(4, 2).T
    base = _all_systems(topo, pipelines)
    rng = np.random.default_rng(seed)
    slower_bw = topo.with_device_links(bandwidth_gbps=topo.bandwidth_gbps * rng.uniform(0.3, 1.0, (8, 8)))
    more_delay = topo.with_device_links(delay_ms=topo.delay_ms + rng.uniform(0, 50, (8, 8)))
    for worse in (slower_bw, more_delay):
        after = _all_systems(worse, pipelines)
        for k in base:
            assert after[k] >= base[k] - 1e-9, k
    # and a strictly slower network does cost something for every system
    much_worse = topo.with_device_links(bandwidth_gbps=topo.bandwidth_gbps / 10)
    after = _all_systems(much_worse, pipelines)
    assert all(after[k] > base[k] for k in base)


@pytest.mark.parametrize("case,devices,d_pp,seed", [("5", 64, 8, 2022), ("5", 64, 8, 2023), ("fluidstack", 32, 8, 1),
                                                    ("4", 64, 8, 5)])
def test_cost_model_is_a_lower_bound_of_simulated_communication(case, devices, d_pp, seed):
    topo = load_scenario(case)
    d_dp = topo.n // d_pp
    links, prof = Links.from_topology(topo), device_profiles(topo)
    batch = 256
    pipelines = random_placement(topo.n, seed).reshape(d_pp, d_dp).T
    c_dp = float(compute.stage_param_bytes(CFG, even_split(CFG.layers, d_pp)).max())
    # every stage synchronises c_dp bytes, as the cost model assumes (eq. 2 uses one c_dp for all groups)
    r = ours_sim.simulate_ours(links, prof, CFG, batch, ours(pipelines), dp_bytes=np.full(d_pp, c_dp), ps_mode="rounds")
    cm = CostModel(topo, d_pp, d_dp, c_pp_bytes(CFG, batch, d_dp), c_dp)
    dp_cost = cm.datap_cost(pipelines.T)
    pp_cost = cm.pipeline_cost(pipelines) - dp_cost
    assert dp_cost <= r.dp_comm_seconds * (1 + 1e-9)
    assert pp_cost <= r.pp_comm_seconds * (1 + 1e-9)
    # the bound is not loose by orders of magnitude: the sim pays the modelled bytes on the modelled links
    assert r.pp_comm_seconds < 3 * pp_cost


def test_ours_steady_state_overlaps_a_sync_tail_with_the_next_iteration(monkeypatch):
    """Stage 1's replicas are far apart (a long sharded-PS tail), stage 0's close: in the steady state
    stage 0 already runs the next iteration's forwards while stage 1 synchronises, so the period is
    shorter than one iteration from a common start, and never longer."""
    delay = np.full((4, 4), 1.0)
    bw = np.full((4, 4), 100.0)
    delay[1, 3] = delay[3, 1] = 80.0  # devices 1 and 3 hold stage 1 of the two replicas
    bw[1, 3] = bw[3, 1] = 0.2
    topo = make_topology(delay, bw)
    links, prof = Links.from_topology(topo), device_profiles(topo)
    pipelines = np.array([[0, 1], [2, 3]])
    steady = ours_sim.simulate_ours(links, prof, CFG, 16, ours(pipelines))
    assert steady.seconds < steady.details["first_iteration_seconds"]
    monkeypatch.setattr(ours_sim, "STEADY_ITERATIONS", 1)
    single = ours_sim.simulate_ours(links, prof, CFG, 16, ours(pipelines))
    assert single.seconds == pytest.approx(steady.details["first_iteration_seconds"])
    assert steady.dp_comm_seconds == pytest.approx(single.dp_comm_seconds)


def test_the_tied_embedding_is_reduced_by_the_first_and_last_stage_of_each_replica(monkeypatch):
    """DeepSpeed 0.6.7's TrainSchedule ends ReduceTiedGrads, ReduceGrads, OptimizerStep; Megatron-LM's train_step
    all-reduces the word embedding's gradient across its embedding group after the data-parallel one: the word
    embedding, tied to the LM head on the last stage, has its gradient all-reduced by those two devices of each
    replica once both are ready; by hand on uniform links: two ring steps of half the embedding each."""
    topo = uniform(8, 50.0, 1.0)
    links = Links.from_topology(topo)
    dev = np.arange(8).reshape(4, 2)  # 4 stages x 2 replicas
    finish = np.array([[9.0, 8.0], [5.0, 5.5], [6.0, 6.5], [7.0, 9.5]])
    embedding = CFG.vocab * CFG.hidden * 2
    ready = baselines.tied_gradients(links, dev, finish, embedding)
    step = float(links.delay_s[0, 6]) + float(links.serialization_s(np.array([0]), np.array([6]), embedding / 2)[0])
    assert ready[0] == pytest.approx([9.0 + 2 * step, 9.5 + 2 * step], rel=1e-9)  # from when both were done
    assert np.array_equal(ready[0], ready[-1]) and np.array_equal(ready[1:-1], finish[1:-1])  # the others go on
    assert np.array_equal(baselines.tied_gradients(links, dev[:1], finish[:1], embedding), finish[:1])  # one stage
    # in whole iterations: both engines take longer for it, with a pipeline; without one nothing is tied apart
    prof = device_profiles(topo)
    runs = {"zero1": (baselines.simulate_zero1_pp, placed(1, 4, 2, np.arange(8), zero=1)),
            "megatron": (baselines.simulate_megatron, placed(2, 2, 2, np.arange(8))),
            "megatron-pp1": (baselines.simulate_megatron, placed(2, 1, 4, np.arange(8)))}
    tied = {k: f(links, prof, CFG, 16, lay).seconds for k, (f, lay) in runs.items()}
    monkeypatch.setattr(baselines, "tied_gradients", lambda links, dev, ready, nbytes: np.array(ready, float))
    untied = {k: f(links, prof, CFG, 16, lay).seconds for k, (f, lay) in runs.items()}
    assert tied["zero1"] > untied["zero1"] and tied["megatron"] > untied["megatron"]
    assert tied["megatron-pp1"] == untied["megatron-pp1"]


def test_zero3_takes_the_largest_micro_batch_its_gpus_hold_and_gathers_that_many_times_less():
    """DeepSpeed 0.6.7's ZeRO-3 on the paper's V100s (16 GB), GPT3-XL: by hand, what a device holds at micro-batch m
    (systems/deepspeed/zero3.py); the largest power of two that fits and divides its samples is what the simulator
    runs, and fewer micro-batches gather the model fewer times."""
    from harness.systems.deepspeed.sim import candidates_deepspeed
    from harness.systems.deepspeed.zero3 import zero3_bytes, zero3_micro_batch
    from harness.sim.sweep import Simulator

    cfg = get_model("gpt3-xl", 24)
    s, h, a, v = cfg.seq, cfg.hidden, cfg.heads, cfg.vocab
    params = 24 * cfg.block_params + cfg.embedding_params + cfg.head_params
    for m in (1, 8):
        want = (params * 12 / 64 + 1e9 * 2 + 5e8 * 2  # states over 64, the live parameters' cap, the gradient bucket
                + 24 * s * m * h * 2 + s * m * h * (34 + 5 * a * s / h) + m * s * v * 2)  # inputs, one block, logits
        assert zero3_bytes(cfg, m, 64, 2) == pytest.approx(want, rel=1e-12)
    assert zero3_bytes(cfg, 8, 64, 2) < 16e9 < zero3_bytes(cfg, 16, 64, 2)
    assert zero3_micro_batch(cfg, 1024, 64, 16e9, 2) == 8 and zero3_micro_batch(cfg, 4096, 64, 16e9, 2) == 8
    assert zero3_micro_batch(cfg, 64, 64, 16e9, 2) == 1  # one sample a device
    assert zero3_micro_batch(cfg, 1024, 64, 1e9, 2) == 1  # nothing fits: its memory note says by how much
    sim = Simulator(load_scenario("1"), placements=("default",))  # 64 V100s of 16 GB
    z3 = next(c for c in candidates_deepspeed(sim, cfg, 1024) if c.config["zero"] == 3)
    assert z3.config["micro_batch"] == 8
    at = lambda m: baselines.simulate_zero3(sim.links, sim.profiles, cfg, 1024, z3.layout, m).seconds  # noqa: E731
    assert z3.seconds == pytest.approx(at(8), rel=1e-12) and at(8) < at(1)


def test_deepspeed_pipeline_splits_its_layers_by_parameters():
    """DeepSpeed 0.6.7's PipelineModule defaults to partition_method='parameters' (systems/deepspeed/partition.py).
    By hand: weights 5,1,1,1,1,1 in 3 parts cannot have a part lighter than the 5, and at that bottleneck the greedy
    fill puts every 1 in the second part. GPT3-XL (h 2048): the embedding holds 107.1M parameters (2.13 blocks of
    50.4M), the tied head 102.9M (2.04 blocks); 24 blocks over 8 stages cannot keep every part within 3 blocks' weight
    (embedding + 1, 6 x 3, head + 1 = 20 blocks), so the bottleneck is 4 blocks: 1, 4, 4, 4, 4, 4, 3 blocks and the
    head alone. The simulator's ZeRO-1 + pipeline runs that split; a layout of this harness's runtimes may not leave
    a stage empty."""
    from harness.systems.deepspeed.partition import partition_balanced, pipe_stages
    from harness.systems.deepspeed.sim import candidates_deepspeed
    from harness.sim.sweep import Simulator

    assert partition_balanced([5, 1, 1, 1, 1, 1], 3) == [0, 1, 6, 6]
    assert partition_balanced([1, 1, 1, 1], 2) == [0, 2, 4]
    cfg = get_model("gpt3-xl", 24)
    assert [b - a for a, b in pipe_stages(cfg, 8)] == [1, 4, 4, 4, 4, 4, 3, 0]
    assert [b - a for a, b in pipe_stages(cfg, 2)] == [12, 12]
    sim = Simulator(load_scenario("1"), placements=("default",))
    pp8 = next(c for c in candidates_deepspeed(sim, cfg, 1024) if c.config.get("pp") == 8)
    assert pp8.layout.layers_per_stage == [1, 4, 4, 4, 4, 4, 3, 0]
    run = baselines.simulate_zero1_pp(sim.links, sim.profiles, cfg, 1024, pp8.layout)
    assert pp8.seconds == pytest.approx(run.seconds)
    with pytest.raises(layouts.LayoutError, match=r"layout.stages\[7\]: must be a non-empty range"):
        layouts.in_rank_order(1, 8, 8, 24, stages=pipe_stages(cfg, 8))  # zero 0: this harness's runtimes


def test_a_run_refuses_a_layout_with_an_empty_stage():
    """DeepSpeed's engine may leave a stage only the head (the simulator models it); this harness's runtimes run a
    block on every stage, so a run given such a layout stops with one line naming the stage."""
    from harness.plan.layouts import resolve_layout
    from harness.plan.request import LayoutRequest, ModelSection, NetworkSection, RunRequest, RunSection
    from harness.systems.deepspeed.partition import pipe_stages

    cfg = get_model("gpt3-xl", 24)
    lay = layouts.in_rank_order(1, 8, 8, 24, zero=1, stages=pipe_stages(cfg, 8))
    req = RunRequest(network=NetworkSection(scenario="1", mode="none"),
                     model=ModelSection(name="gpt3-xl", layers=24, batch=1024, dtype="fp16"),
                     run=RunSection(system="deepspeed"), layout=LayoutRequest(explicit=lay))
    with pytest.raises(layouts.LayoutError, match=r"^layout.stages\[7\]: this harness's runtimes run at least one"):
        resolve_layout(req, load_scenario("1"))
    even = replace(req, layout=LayoutRequest(explicit=layouts.in_rank_order(1, 8, 8, 24, zero=1)))
    assert resolve_layout(even, load_scenario("1"))[0].layers_per_stage == [3] * 8
