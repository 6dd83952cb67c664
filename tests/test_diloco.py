"""DiLoCo and Streaming DiLoCo on torchft (harness/systems/diloco/): the runtime on forked gloo ranks over loopback,
its knobs' one-line refusals, the wire encodings and the simulator's model.

The anchor: with SGD as the inner optimizer, H = 1, an outer lr of 1 and no outer momentum, an outer step sets
every replica to the average of their locally stepped parameters, which is synchronous data parallelism's step on
the averaged gradient (SGD's step and momentum are linear in the gradient): the run must match the single-process
reference as every system does.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from harness import layout as layouts
from harness.compute.model import get_model, stage_params
from harness.errors import HarnessError
from harness.plan import systems as registry
from harness.train.gpt import GPT
from harness.train.local import local_spec, run_local
from harness.train.reference import reference_train

pytestmark = pytest.mark.timeout(120)

MODEL, LAYERS, BATCH, MICRO, STEPS, SEED, LR = "tiny", 2, 8, 2, 3, 0, 0.1
RETURN_ITERS = 40  # a replica preempted and back (_preempted_and_back)
REL = 1e-5


def options(system: str = "diloco", **given) -> dict:
    return registry.get(system).resolve_options(given)


def run(devices: int, system: str = "diloco", steps: int = STEPS, stages: int = 1, layers: int = LAYERS,
        recompute: bool = False, **given):
    lay = layouts.in_rank_order(1, stages, devices // stages, layers, schedule="1f1b", recompute=recompute)
    spec = local_spec(lay, system, name=MODEL, batch=BATCH, micro_batch=MICRO, iters=steps, seed=SEED, lr=LR,
                      timeout_s=90, options=options(system, **given))
    return run_local(spec, collect_state=True)


def test_h1_outer_lr_1_no_momentum_is_synchronous_data_parallelism():
    ref_losses, ref_state = reference_train(get_model(MODEL, LAYERS), BATCH, MICRO, STEPS, SEED, LR)
    r = run(2, sync_every=1, outer_lr=1.0, outer_momentum=0.0, inner_optimizer="sgd")
    losses = [s.loss for s in r.stats]
    assert len(losses) == STEPS
    for got, want in zip(losses, ref_losses):
        assert math.isfinite(got) and abs(got - want) <= REL * abs(want), (losses, ref_losses)
    state = r.state_dict()
    worst = max(((state[k] - v).abs().max() / v.abs().max().clamp_min(1e-6)).item() for k, v in ref_state.items())
    assert worst <= REL
    init = GPT(get_model(MODEL, LAYERS), SEED).state_dict()
    assert max((state[k] - init[k]).abs().max().item() for k in init) > 1e-3  # it trained


@pytest.mark.parametrize("recompute", [False, True])
def test_replicas_that_are_pipelines_at_h1_outer_lr_1_no_momentum_are_synchronous_data_parallelism(recompute):
    """A replica as one of ours' pipelines (pipeline_replicas.py): 2 pipelines of 2 stages on ours' runtime, no
    data-parallel sync, each stage's outer step over its stage group: at the anchor's settings it is the reference,
    and each stage's sync carries that stage's parameters only; the same with the stages recomputing their blocks'
    activations in backward (--recompute: what fits GPT3-XL's pipelines on a V100)."""
    ref_losses, ref_state = reference_train(get_model(MODEL, LAYERS), BATCH, MICRO, STEPS, SEED, LR)
    r = run(4, stages=2, replica_stages=2, sync_every=1, outer_lr=1.0, outer_momentum=0.0, inner_optimizer="sgd",
            recompute=recompute)
    losses = [s.loss for s in r.stats]
    for got, want in zip(losses, ref_losses):
        assert math.isfinite(got) and abs(got - want) <= REL * abs(want), (losses, ref_losses)
    state = r.state_dict()
    worst = max(((state[k] - v).abs().max() / v.abs().max().clamp_min(1e-6)).item() for k, v in ref_state.items())
    assert worst <= REL
    syncs = [row for rank in r.ranks for s in rank.stats if s.outer_syncs for row in s.outer_syncs]
    assert len(syncs) == 4 * STEPS and all(row["participants"] == 2 and row["committed"] for row in syncs)
    sent = {row["rank"]: row["bytes"] for row in syncs if row["iteration"] == 0}
    per_stage = stage_params(get_model(MODEL, LAYERS), [LAYERS // 2, LAYERS // 2])
    layout = layouts.in_rank_order(1, 2, 2, LAYERS, schedule="1f1b")
    for rank, b in sent.items():  # 2 (p - 1) / p = 1 at p = 2: one fp32 copy of its stage
        assert b == pytest.approx(4 * per_stage[layout.coords(rank)[0]], rel=1e-3)


def test_local_steps_diverge_from_data_parallelism_and_sync_every_h():
    """H = 2 with the papers' outer optimizer is not data parallelism: the loss differs from the reference after
    the first sync, and every rank records one outer sync each H inner steps, with the bytes of one fp32 ring
    all-reduce of the model."""
    ref_losses, _ = reference_train(get_model(MODEL, LAYERS), BATCH, MICRO, 4, SEED, LR)
    r = run(2, steps=4, sync_every=2, inner_optimizer="sgd")
    losses = [s.loss for s in r.stats]
    assert abs(losses[0] - ref_losses[0]) <= REL * ref_losses[0]  # the first step: same start, same data
    assert abs(losses[3] - ref_losses[3]) > 1e-4 * ref_losses[3]
    syncs = [row for rank in r.ranks for s in rank.stats if s.outer_syncs for row in s.outer_syncs]
    assert sorted((row["iteration"], row["rank"]) for row in syncs) == [(1, 0), (1, 1), (3, 0), (3, 1)]
    params = get_model(MODEL, LAYERS).params
    assert all(row["bytes"] == pytest.approx(params * 4, rel=1e-3) for row in syncs)  # 2 (p - 1) / p = 1 at p = 2
    assert [row["outer_step"] for row in syncs if row["rank"] == 0] == [1, 2]
    assert all(row["participants"] == 2 for row in syncs)


def test_streaming_fragments_and_replicas_of_two_devices_keep_replicas_identical():
    """Streaming DiLoCo (2 fragments) on 4 devices as 2 replicas of 2: it trains, a fragment syncs every H / 2
    steps in turn, the devices of a replica stay identical (their gradients all-reduced every step) and the
    replicas agree on a fragment right after its sync."""
    r = run(4, "streaming-diloco", steps=4, sync_every=2, fragments=2, fragment_sync_delay=0, replicas=2)
    assert all(math.isfinite(s.loss) for s in r.stats)
    syncs = [row for rank in r.ranks for s in rank.stats if s.outer_syncs for row in s.outer_syncs]
    assert sorted({(row["iteration"], row["fragment"]) for row in syncs}) == [(0, 0), (1, 1), (2, 0), (3, 1)]
    assert {row["participants"] for row in syncs} == {2}
    states = [rank.state for rank in r.ranks]  # ranks 0, 1: replica 0; ranks 2, 3: replica 1
    assert all(torch.equal(states[0][k], states[1][k]) and torch.equal(states[2][k], states[3][k]) for k in states[0])
    # the last step synced fragment 1 (block 1 and the head): the replicas agree on it, and not on fragment 0,
    # which took a local step since its sync
    last = [k for k in states[0] if k.startswith(("blocks.1.", "head."))]
    first = [k for k in states[0] if k.startswith(("blocks.0.", "embed."))]
    assert last and all(torch.equal(states[0][k], states[2][k]) for k in last)
    assert any(not torch.equal(states[0][k], states[2][k]) for k in first)


def test_streaming_on_replicas_that_are_pipelines_syncs_a_fragment_of_every_stage_in_turn():
    """Streaming DiLoCo (2 fragments) on 2 pipelines of 2 stages, 4 blocks: a fragment is a run of blocks inside each
    stage, so at every turn each stage syncs half of its stage over its stage group (the bytes of that half), and
    right after a fragment's turn the pipelines agree on it in every stage and not on the other fragment."""
    from harness.systems.diloco.sim import stage_fragment_params

    r = run(4, "streaming-diloco", steps=4, stages=2, layers=4, replica_stages=2, sync_every=2, fragments=2,
            fragment_sync_delay=0, inner_optimizer="sgd")
    assert len(r.stats) == 4 and all(math.isfinite(s.loss) for s in r.stats)
    syncs = [row for rank in r.ranks for s in rank.stats if s.outer_syncs for row in s.outer_syncs]
    assert sorted((row["iteration"], row["fragment"]) for row in syncs) == sorted(
        (it, it % 2) for it in range(4) for _ in range(4))
    assert all(row["participants"] == 2 and row["committed"] for row in syncs)
    layout = layouts.in_rank_order(1, 2, 2, 4, schedule="1f1b")
    halves = stage_fragment_params(get_model(MODEL, 4), [2, 2], 2)  # (stage, fragment)
    for row in syncs:  # 2 (p - 1) / p = 1 at p = 2: one fp32 copy of its stage's fragment
        assert row["bytes"] == pytest.approx(4 * halves[layout.coords(row["rank"])[0], row["fragment"]], rel=1e-3)
    state = {layout.coords(rank.rank)[:2]: rank.state for rank in r.ranks}  # (stage, pipeline) -> its parameters
    synced = {0: ("blocks.1.",), 1: ("blocks.3.", "head.")}  # each stage's fragment 1, synced at the last step
    for stage, prefixes in synced.items():
        a, b = state[(stage, 0)], state[(stage, 1)]
        assert all(torch.equal(a[k], b[k]) for k in a if k.startswith(prefixes))
        assert any(not torch.equal(a[k], b[k]) for k in a if not k.startswith(prefixes))


@pytest.mark.parametrize("wire,share", [("bf16", 0.5), ("int8", 0.25)])
def test_wire_encodings_send_less_and_keep_replicas_identical(wire, share):
    """bf16 and int8 pseudo-gradients: the bytes of an outer sync are that share of fp32's (int8: plus a scale a
    block and the padding of whole blocks), the replicas agree, and the model trains as fp32's does."""
    fp32 = run(2, steps=2, sync_every=1, inner_optimizer="sgd")
    low = run(2, steps=2, sync_every=1, inner_optimizer="sgd", wire=wire)
    sent = lambda r: sum(row["bytes"] for rank in r.ranks for s in rank.stats for row in s.outer_syncs or [])
    assert sent(low) / sent(fp32) == pytest.approx(share, rel=0.02)
    states = [rank.state for rank in low.ranks]
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    a, b = fp32.state_dict(), low.state_dict()
    init = GPT(get_model(MODEL, LAYERS), SEED).state_dict()
    moved = sum(float((a[k] - init[k]).norm() ** 2) for k in init) ** 0.5
    off = sum(float((a[k] - b[k]).norm() ** 2) for k in init) ** 0.5
    assert off < 0.05 * moved  # rounding, not another update


def _int8_rank(rank: int, port: int, n: int):
    from datetime import timedelta

    from torch.distributed import ReduceOp
    from torch.distributed.distributed_c10d import AllreduceOptions

    from harness.systems.diloco.codec import WireProcessGroup

    sent = []
    pg = WireProcessGroup("int8", timedelta(seconds=30), sent.append)
    pg.configure(f"127.0.0.1:{port}/int8", f"r{rank}", rank, n)
    x = torch.randn(3000, generator=torch.Generator().manual_seed(rank)) * (rank + 1)
    mine = x.clone()
    opts = AllreduceOptions()
    opts.reduceOp = ReduceOp.SUM
    pg.allreduce([x], opts).wait()
    pg.shutdown()
    return mine, x, sent


def test_int8_all_reduce_sums_within_its_rounding():
    """The int8 codec on 3 gloo ranks: every rank gets the same sum, within its roundings (one a hop of the ring,
    each half a step of 1/127 of a block's running largest value), and is charged 2 (p - 1) / p of a byte a value
    plus the scales."""
    from torch.distributed import TCPStore

    from harness.systems.diloco.codec import BLOCK, WireProcessGroup  # noqa: F401 (loaded before the fork: a
    from harness.train.launch import fork_ranks  # child importing torchft beside the store's thread can hang)

    n = 3
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    out = fork_ranks(n, lambda r: _int8_rank(r, store.port, n), timeout_s=60)
    exact = sum(o[0] for o in out)
    for _, got, _ in out:
        assert torch.equal(got, out[0][1])
    bound = n * sum(o[0].abs().max() for o in out) / 127  # n roundings of at most the sum's scale: generous
    assert (out[0][1] - exact).abs().max() <= bound
    assert (out[0][1] - exact).abs().max() > 0  # it did round: the values went as int8
    padded = -(-3000 // (n * BLOCK)) * BLOCK * n
    assert out[0][2] == [int(2 * (n - 1) / n * padded * (1 + 4 / BLOCK))]


def _failed_then_next_quorum_rank(rank: int, port: int):
    from datetime import timedelta

    from torch.distributed import ReduceOp
    from torch.distributed.distributed_c10d import AllreduceOptions

    from harness.systems.diloco.codec import WireProcessGroup

    pg = WireProcessGroup("fp32", timedelta(seconds=30))
    pg.configure(f"127.0.0.1:{port}/q1", f"r{rank}", rank, 3)
    if rank == 2:
        return None  # gone before the all-reduce: its connections close
    opts = AllreduceOptions()
    opts.reduceOp = ReduceOp.SUM
    try:
        pg.allreduce([torch.ones(1000)], opts).wait()
        failed = None
    except RuntimeError as e:
        failed = str(e)
    x = torch.full((1000,), float(rank + 1))
    pg.configure(f"127.0.0.1:{port}/q2", f"r{rank}", rank, 2)  # the quorum of the ranks left
    pg.allreduce([x], opts).wait()
    pg.shutdown()
    return failed, x


def test_a_group_whose_all_reduce_failed_gives_way_to_the_next_quorums():
    """torchft reconfigures a replica's process group at each new quorum; ours sets the failed one aside (codec.py:
    gloo's abort of it can hang): the ranks left all-reduce in the next quorum's group."""
    from torch.distributed import TCPStore

    from harness.systems.diloco.codec import WireProcessGroup  # noqa: F401 (loaded before the fork)
    from harness.train.launch import fork_ranks

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    out = fork_ranks(3, lambda r: _failed_then_next_quorum_rank(r, store.port), timeout_s=90)
    for failed, x in out[:2]:
        assert failed is not None  # the lost rank's group failed
        assert torch.equal(x, torch.full((1000,), 3.0))  # 1 + 2: the next quorum's sum


def _pipelines(devices: int, **given) -> tuple:
    """The pipelines (devices in stage order) `harness run --system diloco --scenario 3 --devices N --layers 2
    --batch 8` places with these options (ours' scheduler, seeded: the run's own)."""
    from harness.plan.layouts import resolve_layout
    from harness.plan.request import LayoutRequest, ModelSection, NetworkSection, RunRequest, RunSection
    from harness.scenario import load_scenario

    req = RunRequest(network=NetworkSection(scenario="3", mode="none"),
                     model=ModelSection(name=MODEL, layers=LAYERS, batch=BATCH),
                     run=RunSection(system="diloco", options=options(**given)), layout=LayoutRequest())
    return resolve_layout(req, load_scenario("3", devices=devices))[0].pipelines


def test_harness_run_writes_the_outer_syncs_and_refuses_bad_knobs_in_one_line(cli, tmp_path):
    """`harness run --system diloco` on loopback: its records, every rank's outer syncs in outer_syncs.csv and their
    sum per outer step in the manifest; knobs that do not fit the devices or the model are one line, exit 2, and
    leave no run behind."""
    import json

    from harness.results import read_outer_syncs, read_records

    base = ["--scenario", "3", "--devices", "4", "--layers", "2", "--batch", "8", "--network", "none"]
    rc, _, err = cli("run", "--system", "diloco", *base, "--iters", "4", "--warmup", "0", "--sync-every", "2",
                     "--results", tmp_path / "runs")
    assert rc == 0, err
    run_dir = next((tmp_path / "runs").rglob("records.csv")).parent
    assert len(read_records(run_dir / "records.csv")) == 4
    rows = read_outer_syncs(run_dir / "outer_syncs.csv")
    assert sorted({(r["iteration"], r["outer_step"]) for r in rows}) == [(1, 1), (3, 2)]
    assert len(rows) == 8 and {r["participants"] for r in rows} == {4} and {r["committed"] for r in rows} == {1}
    summary = json.loads((run_dir / "manifest.json").read_text())["outer_syncs"]
    assert summary["outer_steps"] == 2 and summary["dropped"] == 0
    assert summary["bytes"] == pytest.approx(sum(r["bytes"] for r in rows) / 2)
    home = next(list(p) for p in _pipelines(4, replica_stages=2) if 0 in p)  # the Lighthouse's pipeline
    partner = next(d for d in home if d != 0)
    for flags, says in [(["--replicas", "3"], "--replicas: 3 replicas do not split the 4 devices"),
                        (["--replicas", "1"], "--replicas: DiLoCo needs at least 2 replicas"),
                        (["--recompute"], "--recompute: DiLoCo recomputes activations in its pipelines' stages only"),
                        (["--lighthouse-device", "4"], "--lighthouse-device: device 4 is not in the run"),
                        (["--system", "streaming-diloco", "--fragments", "3"],
                         "--fragments: must be 1 to the model's 2"),
                        (["--replica-stages", "3"], "--replica-stages: 3 stages a pipeline must split the 4 devices"),
                        (["--replica-stages", "4"], "into at least 2 pipelines"),
                        (["--replica-stages", "2", "--replicas", "2"], "--replicas: with --replica-stages 2"),
                        (["--replicas", "2", "--debug", "fault_mode=preempt", "--debug", "fault_rank=2"],
                         "--replicas: devices leave and come back in this run: a replica must be one device or one "
                         "pipeline"),
                        (["--replica-stages", "2", "--debug", "fault_mode=preempt", "--debug",
                          f"fault_rank={partner}"], f"--lighthouse-device: device 0's replica (devices {home}) leaves"),
                        (["--system", "streaming-diloco", "--replica-stages", "2"],
                         "--fragments: 2 fragments are cut inside each of the 2 stages, which hold 1 of the 2")]:
        system = [] if "--system" in flags else ["--system", "diloco"]
        rc, out, err = cli("run", *system, *base, *flags, "--results", tmp_path / "bad")
        assert rc == 2 and says in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "bad").exists()


# ----------------------------------------------------------------------------- the simulator's model
def _model(scenario: str = "5", devices: int | None = None):
    from harness.scenario import load_scenario
    from harness.sim.sweep import Simulator

    topo = load_scenario(scenario, devices=devices) if devices else load_scenario(scenario)
    sim = Simulator(topo, placements=("default",))
    return sim, layouts.in_rank_order(1, 1, topo.n, 24, schedule="1f1b"), get_model("gpt3-xl")


def test_sim_outer_sync_is_the_ring_all_reduce_of_the_model_once_every_h_steps():
    """At paper scale (case 5, GPT3-XL): an iteration is the inner step plus the ring all-reduce of the model's
    pseudo-gradients over the replicas spread over H steps; H = 1 is that all-reduce every step (fp32), and as H
    grows the iteration tends to the inner step alone."""
    from harness.netmodel import collectives
    from harness.systems.diloco import sim as dsim

    sim, lay, cfg = _model()
    batch, mb, bpv = 1024, 1, 4  # fp32 parameters: the pseudo-gradients go as fp32
    sims = {h: dsim.simulate_diloco_layout(sim.links, sim.profiles, cfg, batch, lay, mb, bpv,
                                           options=options(sync_every=h, outer_momentum=0.0))[0]
            for h in (1, 10, 100)}
    steps, _ = dsim.inner_step_seconds(sim.links, sim.profiles, cfg, batch, lay, mb, bpv,
                                       dsim.DiLoCoSettings.of(options(), lay.devices, cfg.layers))
    ring = float(collectives.ring_allreduce(sim.links, np.arange(lay.devices)[None, :], cfg.params * 4).max())
    outer = max(dsim.optimizer_seconds(cfg.params, p) for p in sim.profiles)
    assert sims[1] == pytest.approx(steps.max() + ring + outer, rel=1e-9)
    assert sims[10] == pytest.approx(steps.max() + (ring + outer) / 10, rel=1e-9)
    assert sims[1] > sims[10] > sims[100] > steps.max()


def test_sim_replicas_that_are_pipelines_are_ours_pipelines_plus_each_stages_outer_sync_every_h():
    """`--replica-stages 4` in case 5 at GPT3-XL (a replica: one of ours' pipelines of 4 stages): the inner step is
    ours' pipeline with no data-parallel sync; each stage's pseudo-gradient crosses its stage group's ring once every H
    steps, so H = 100 is within a percent of the inner step and H = 1 pays the ring every step, as ours' all-reduce
    sync does; the bytes between regions fall with H to the pipelines' activations."""
    from dataclasses import replace

    from harness.systems.diloco import sim as dsim
    from harness.systems.ours.sim import simulate_ours

    sim, _, cfg = _model("5", devices=8)
    lay = layouts.in_rank_order(1, 4, 2, 24, schedule="1f1b")
    fn = registry.get("diloco").simulate_layout_fn
    h1 = fn({"sync_every": 1, "replica_stages": 4})(sim.links, sim.profiles, cfg, 64, lay, 1, 2)[0]
    h100 = fn({"sync_every": 100, "replica_stages": 4})(sim.links, sim.profiles, cfg, 64, lay, 1, 2)[0]
    inner = simulate_ours(sim.links, sim.profiles, cfg, 64, lay, 1, dp_bytes=np.zeros(4), bytes_per_value=2).seconds
    ours = simulate_ours(sim.links, sim.profiles, cfg, 64, replace(lay, dp_sync="allreduce"), 1,
                         bytes_per_value=2).seconds
    assert inner < h100 < 1.01 * inner and h1 > h100
    assert h1 == pytest.approx(ours, rel=0.1)  # ours overlaps a stage's sync tail with the next fill
    region = [sim.topo.device_region[d] for d in range(8)]
    nbytes = registry.get("diloco").cross_node_bytes_fn
    b1, b100 = (nbytes({"sync_every": h, "replica_stages": 4})(region, cfg, 64, lay, 1, 2) for h in (1, 100))
    acts = b100 - (b1 - b100) / 99  # the activations' part: what is left at H -> infinity
    assert b1 > b100 > acts > 0


def test_sim_pipeline_replicas_recompute_on_gpus_as_ours_does_which_fits_gpt3_xl_on_v100s():
    """`harness sim` of DiLoCo's pipeline replicas lays them out for the devices it models (nccl: GPUs), with ours'
    rule: their stages recompute activations in backward, and GPT3-XL's 8-stage pipelines in case 5 fit a V100's
    16 GB (DiLoCo's outer state included); keeping the activations they would not. Over gloo (the CPUs of an
    emulated run) they keep them, as `harness run` there does."""
    from dataclasses import replace

    from harness.scenario import load_scenario
    from harness.sim.sweep import Simulator, candidate_memory

    topo, cfg, batch = load_scenario("5", devices=64), get_model("gpt3-xl"), 1024
    gpus = Simulator(topo, placements=("default",), options={"replica_stages": 8, "sync_every": 100})
    cand = gpus.run("diloco", cfg, batch)[0]
    assert cand.layout.pp == 8 and cand.layout.recompute
    assert candidate_memory(cand, topo, cfg, batch, 1).fits
    kept = replace(cand, layout=replace(cand.layout, recompute=False))
    assert not candidate_memory(kept, topo, cfg, batch, 1).fits
    cpus = Simulator(topo, placements=("default",), protocol="gloo", options={"replica_stages": 8})
    assert not cpus.run("diloco", cfg, batch)[0].layout.recompute


def test_sim_streaming_on_replicas_that_are_pipelines_overlaps_each_stages_fragment_syncs():
    """Streaming DiLoCo on 4-stage pipeline replicas (case 5, GPT3-XL): with no overlap its fragments' syncs add up to
    DiLoCo's one sync of each stage (the same bytes, a ring's latency more a fragment); a delay of one inner step
    hides part of each, and never more than the syncs."""
    sim, _, cfg = _model("5", devices=8)
    lay = layouts.in_rank_order(1, 4, 2, 24, schedule="1f1b")
    at = lambda system, **o: registry.get(system).simulate_layout_fn(  # noqa: E731
        {"sync_every": 8, "replica_stages": 4, **o})(sim.links, sim.profiles, cfg, 64, lay, 1, 2)[0]
    whole, inner = at("diloco"), at("diloco", sync_every=10 ** 9)
    no_overlap = at("streaming-diloco", fragments=2, fragment_sync_delay=0)
    assert no_overlap == pytest.approx(whole, rel=0.02) and no_overlap >= whole
    assert inner < at("streaming-diloco", fragments=2, fragment_sync_delay=1) < no_overlap


def test_sim_bytes_per_iteration_fall_with_h_and_the_wire_format():
    """Between regions, an iteration carries 1 / H of the fp32 ring's bytes (at H = 1: Horovod's ring of the same
    gradients), bf16 half of that and int8 a quarter (and its scales)."""
    from harness.systems.diloco import sim as dsim
    from harness.systems.horovod import ring_cross_node_bytes

    sim, lay, cfg = _model()
    region = sim.topo.device_region
    at = lambda **o: dsim.layout_cross_node_bytes(region, cfg, 1024, lay, 1, 4, options=options(**o))  # noqa: E731
    ring = ring_cross_node_bytes(region, list(range(lay.devices)), cfg.params * 4)
    assert at(sync_every=1) == pytest.approx(ring)
    assert at(sync_every=100) == pytest.approx(ring / 100)
    assert at(sync_every=100, wire="bf16") == pytest.approx(ring / 200)
    assert at(sync_every=100, wire="int8") == pytest.approx(ring / 400 * (1 + 4 / 1024), rel=1e-6)
    # fp16 parameters send fp16 pseudo-gradients whatever --wire says, unless it is narrower
    assert dsim.layout_cross_node_bytes(region, cfg, 1024, lay, 1, 2, options=options(sync_every=100)) == \
        pytest.approx(ring / 200)


def test_sim_streaming_overlap_hides_a_fragment_sync_behind_inner_steps():
    """Streaming: each fragment's all-reduce overlaps fragment_sync_delay inner steps; on case 5's slow links a
    delay of one step hides part of it, so the iteration is shorter than with no overlap, and never shorter than
    the inner step."""
    from harness.systems.diloco import sim as dsim

    sim, lay, cfg = _model()
    run = lambda delay: dsim.simulate_diloco_layout(  # noqa: E731
        sim.links, sim.profiles, cfg, 1024, lay, 1, 2,
        options=options("streaming-diloco", sync_every=8, fragments=4, fragment_sync_delay=delay))[0]
    steps, _ = dsim.inner_step_seconds(sim.links, sim.profiles, cfg, 1024, lay, 1, 2,
                                       dsim.DiLoCoSettings.of(options(), lay.devices, cfg.layers))
    assert steps.max() < run(1) < run(0)


def test_sim_a_runs_own_length_holds_the_syncs_its_iterations_reached():
    """A measured run's iterations (registry run_length): iteration i syncs a fragment when i + 1 is a multiple of
    H / fragments, the fragments in turn, as the runtime does. A window without a sync is the inner step alone (what
    the dilation probe's one timed iteration is); whole cycles are the cycle's average; a window of one turn holds
    the first fragment's sync and no other."""
    from harness.systems.diloco import sim as dsim

    sim, lay, cfg = _model()
    opts = options("streaming-diloco", sync_every=8, fragments=2)
    run = lambda iterations=None, **o: dsim.simulate_diloco_layout(  # noqa: E731
        sim.links, sim.profiles, cfg, 1024, lay, 1, 2, options={**opts, **o}, iterations=iterations)[0]
    step = dsim.inner_step_seconds(sim.links, sim.profiles, cfg, 1024, lay, 1, 2,
                                   dsim.DiLoCoSettings.of(opts, lay.devices, cfg.layers))[0].max()
    assert registry.get("streaming-diloco").run_length and registry.get("diloco").run_length
    assert run((1, 1)) == pytest.approx(step) and run((0, 3)) == pytest.approx(step)  # no sync before iteration 3
    assert run((0, 8)) == pytest.approx(run()) and run((8, 16)) == pytest.approx(run())  # whole cycles
    first, both = run((0, 4)) * 4 - 4 * step, run((0, 8)) * 8 - 8 * step  # the first fragment's sync; both
    assert 0 < first < both and run((4, 4)) * 4 - 4 * step == pytest.approx(both - first)
    assert run((0, 4), fragments=1) == pytest.approx(step)  # one fragment: its sync ends the 8th step
    assert run((7, 1), fragments=1) - step > max(first, both - first)  # the whole model's sync: more than a half's


def _return_when(work, device: int, iteration: int, notices, stop) -> None:
    """Play the timeline controller's part (network/timeline_control.py) for a loopback run: once a replica still
    there has journaled `iteration`, append "return `device`" to the device-notices file the agent follows."""
    import time

    from harness.train import journals

    while not stop.is_set():
        done = [s.iteration for j in work.rglob("job-*-device-*") if not j.name.endswith(f"-{device}")
                for s in journals.journaled(j / "stats-0.jsonl")]
        if done and max(done) >= iteration:
            with open(notices, "a") as f:
                f.write(f"return {device} {time.monotonic():.6f}\n")
            return
        stop.wait(0.05)


def _preempted_and_back(cli, tmp_path, monkeypatch, device: int, *flags) -> Path:
    """`harness run --system diloco` on loopback, 4 devices, 40 iterations paced by the compute model (~0.3 s each,
    so the others train on while the job back starts), `device` preempted as iteration 3 begins (the debug
    section's fault) and back once a replica still there has journaled iteration 4; its run directory."""
    import threading

    from harness.network.timeline_program import DEVICES_ENV

    work, notices, stop = tmp_path / "work", tmp_path / "devices", threading.Event()
    work.mkdir()
    monkeypatch.setenv("HARNESS_WORK_DIR", str(work))
    monkeypatch.setenv(DEVICES_ENV, str(notices))
    driver = threading.Thread(target=_return_when, args=(work, device, 4, notices, stop), daemon=True)
    driver.start()
    try:
        rc, _, err = cli("run", "--system", "diloco", *flags, "--scenario", "3", "--devices", "4", "--layers", LAYERS,
                         "--batch", BATCH, "--network", "none", "--iters", RETURN_ITERS, "--warmup", "0",
                         "--sync-every", "2", "--data", "markov", "--compute-model", "--compute-time-scale", "1000",
                         "--results", tmp_path / "results", "--debug", "fault_mode=preempt",
                         "--debug", f"fault_rank={device}", "--debug", "fault_iteration=3",
                         "--debug", "fault_phase=forward")
    finally:
        stop.set()
        driver.join()
    assert rc == 0, err
    return next((tmp_path / "results").rglob("records.csv")).parent


def test_a_replica_preempted_mid_run_is_left_out_and_one_back_heals_from_a_peer_without_a_restart(cli, tmp_path,
                                                                                                monkeypatch):
    """torchft's quorum through a lost replica and one back (train/quorum_agent.py): device 2 is preempted as
    iteration 3 begins; the three replicas left go on with no restart (one job each, never stopped), their outer
    syncs counting three; device 2 comes back (the timeline controller's notice, played here through its file) once
    the others are at iteration 5: a new job starts at the iteration they are in, takes its H steps on its stale
    model, joins their quorum and heals from a peer, and syncs with them to the end. recoveries.csv has a row for
    the loss (when the quorum went on without it, the inner steps no outer step holds) and one for the return (its
    start, its heal, the steps it took before)."""
    import json

    from harness.results import read_outer_syncs, read_records

    ITERS = RETURN_ITERS
    run_dir = _preempted_and_back(cli, tmp_path, monkeypatch, 2)
    assert [r["iteration"] for r in read_records(run_dir / "records.csv")] == list(range(ITERS))
    syncs = read_outer_syncs(run_dir / "outer_syncs.csv")
    assert {r["participants"] for r in syncs if r["iteration"] == 1} == {4}
    assert {r["participants"] for r in syncs if 3 <= r["iteration"] <= 5} == {3}
    healed = min(r["iteration"] for r in syncs if r["rank"] == 2 and r["iteration"] > 3)  # its first sync back
    assert healed > 5 and all(r["committed"] for r in syncs)
    for i in range(healed, ITERS, 2):  # from its heal on, in every sync with the others
        assert {(r["rank"], r["participants"]) for r in syncs if r["iteration"] == i} == {(d, 4) for d in range(4)}
    elastic = json.loads((run_dir / "manifest.json").read_text())["elastic"]
    gens = elastic["generations"]
    assert len(gens) == 5 and gens[4]["devices"] == [2] and gens[4]["start_iteration"] >= 5  # a new job, no restart
    lost, back = [r for r in elastic["events"] if r["event"] == "restart"]
    assert lost["after"] == "preempt" and lost["devices"] == [2] and lost["from"] == "quorum"
    assert lost["lost_iterations"] == 1  # iteration 2, after the sync at 1; iteration 3 never ran
    assert lost["detect_s"] > 0
    assert back["after"] == "return" and back["devices"] == [2] and back["from"] == "peer"
    assert back["resumed_from"] == gens[4]["start_iteration"]
    assert 0 < back["restart_s"] < back["restart_marks_s"]["state_moved"]  # its start, then its heal
    assert back["lost_iterations"] >= 1  # its steps on the stale model, up to its heal
    assert (run_dir / "recoveries.csv").read_text().count("\n") == 3


def test_a_pipeline_replica_preempted_mid_run_goes_with_its_devices_and_comes_back_healed_stage_by_stage(
        cli, tmp_path, monkeypatch):
    """Replicas that are ours' pipelines (2 pipelines of 2 stages), each a job of its own, through a loss and a
    return: the last stage of the pipeline without the Lighthouse's device is preempted as iteration 3 begins and
    takes its pipeline with it; the other goes on alone with no restart; once it is at iteration 5 the device is
    back, its pipeline starts again as a job on both its devices, and each stage heals from the same stage of the
    peer at the next quorum, then syncs with it to the end."""
    import json

    from harness.results import read_outer_syncs, read_records

    ITERS = RETURN_ITERS
    lost_pipe = next(list(p) for p in _pipelines(4, replica_stages=2, sync_every=2) if 0 not in p)
    gone = lost_pipe[-1]
    run_dir = _preempted_and_back(cli, tmp_path, monkeypatch, gone, "--replica-stages", "2")
    assert [r["iteration"] for r in read_records(run_dir / "records.csv")] == list(range(ITERS))
    syncs = read_outer_syncs(run_dir / "outer_syncs.csv")
    assert {(r["rank"], r["participants"]) for r in syncs if r["iteration"] == 1} == {(d, 2) for d in range(4)}
    assert {r["participants"] for r in syncs if 3 <= r["iteration"] <= 5} == {1}
    assert not {r["rank"] for r in syncs if 3 <= r["iteration"] <= 5} & set(lost_pipe)
    healed = min(r["iteration"] for r in syncs if r["rank"] == gone and r["iteration"] > 3)  # its first sync back
    assert healed > 5 and all(r["committed"] for r in syncs)
    for i in range(healed, ITERS, 2):  # both its stages heal in one sync, then sync with the other to the end
        assert {(r["rank"], r["participants"]) for r in syncs if r["iteration"] == i} == {(d, 2) for d in range(4)}
    elastic = json.loads((run_dir / "manifest.json").read_text())["elastic"]
    gens = elastic["generations"]
    assert [g["devices"] for g in gens[2:]] == [lost_pipe] and gens[2]["start_iteration"] >= 5
    assert sorted(map(tuple, (g["devices"] for g in gens[:2]))) == sorted(_pipelines(4, replica_stages=2))
    lost, back = [r for r in elastic["events"] if r["event"] == "restart"]
    assert lost["devices"] == lost_pipe and lost["from"] == "quorum" and lost["detect_s"] > 0
    assert lost["lost_iterations"] == 1  # iteration 2, after the sync at 1; iteration 3 never ended
    assert back["devices"] == lost_pipe and back["from"] == "peer"
    assert back["resumed_from"] == gens[2]["start_iteration"]
    assert 0 < back["restart_s"] < back["restart_marks_s"]["state_moved"]


def test_sim_quorum_recovery_counts_the_lost_replicas_steps_and_its_heal():
    """A replica lost as step 6 begins with H = 4 loses the 2 steps since its sync at step 3; the survivors' quorum
    at the end of step 7 waits out its heartbeat (5 s) and then syncs without it. One back takes its own turn of H
    steps on a stale model, heals at the others' next quorum after them, and the peer's state (20 bytes a
    parameter) crosses the link in that time."""
    from harness.systems.diloco import sim as dsim

    sim, _, _ = _model("5", devices=8)
    lay, cfg = layouts.in_rank_order(1, 1, 8, 2, schedule="1f1b"), get_model("gpt3-xl", 2)
    opts = options(sync_every=4)
    got = dsim.quorum_recovery(sim.links, sim.profiles, cfg, 64, lay, 1, 2, opts, 5, 6, 9, start_s=3.0)
    assert got["lost_iterations"] == 2 and got["back"]["lost_iterations"] == 4
    assert got["detect_s"] > dsim.HEARTBEAT_TIMEOUT_S
    heal_bytes = cfg.params * dsim.HEAL_BYTES_PER_PARAM
    assert got["back"]["state_moved_s"] > 3.0 + heal_bytes / sim.links.rate_Bps[0, 5]
    later = dsim.quorum_recovery(sim.links, sim.profiles, cfg, 64, lay, 1, 2, opts, 5, 7, start_s=3.0)
    assert later["lost_iterations"] == 3 and "back" not in later


def test_sim_quorum_recovery_of_a_pipeline_replica_heals_each_stage_from_the_same_stage_of_a_peer():
    """Replicas that are pipelines (4 of 2 stages, GPT3-XL L=2, case 5): device 5 (pipeline 1's last stage) lost as
    step 6 begins takes its pipeline, which loses its 2 steps since the sync at 3; back as step 9 begins (started in
    3 s), it takes its turn of 4 steps and heals at the others' next quorum after that: stage j's state (its
    parameters, 20 bytes each) from stage j of pipeline 0, both stages at once, the slower one the heal."""
    from dataclasses import replace

    from harness.systems.diloco import sim as dsim

    sim, _, _ = _model("5", devices=8)
    lay, cfg = layouts.in_rank_order(1, 2, 4, 2, schedule="1f1b"), get_model("gpt3-xl", 2)
    opts = options(sync_every=4, replica_stages=2)
    got = dsim.quorum_recovery(sim.links, sim.profiles, cfg, 64, lay, 1, 2, opts, 5, 6, 9, start_s=3.0)
    assert got["lost_iterations"] == 2 and got["back"]["lost_iterations"] == 4
    step = registry.get("diloco").simulate_layout_fn({**opts, "sync_every": 10 ** 9})(
        sim.links, sim.profiles, cfg, 64, lay, 1, 2)[0]  # the pipeline's inner step (a sync in a billion steps)
    others = 3 * step
    while others < 3.0 + 4 * step:
        others += 4 * step
    q = dsim.quorum_model(cfg, opts, 8)
    stages = stage_params(cfg, [1, 1])
    heal = max(replace(q, heal_bytes=stages[j] * dsim.HEAL_BYTES_PER_PARAM).heal_s(sim.links, peer, mine)
               for j, (peer, mine) in enumerate([(0, 1), (4, 5)]))
    assert got["back"]["state_moved_s"] == pytest.approx(others + heal, rel=1e-6)
    assert got["detect_s"] > 2 * step


def test_sim_a_replica_lost_inside_an_all_reduce_costs_those_in_it_the_sync_timeout_and_their_turn():
    """Lost 2 s into the all-reduce of the sync ending step 7 (H = 4, sync timeout 60 s): the others wait out the
    timeout from the all-reduce's start, drop the sync (each replica's 4 steps thrown away), and sync without it at
    the end of their next turn: the loss costs 58 s more than one lost as that next turn begins, whose quorum also
    waits out its heartbeats. Only a step that ends a sync has an all-reduce to be lost in."""
    from harness.systems.diloco import sim as dsim

    sim, _, _ = _model("5", devices=8)
    lay, cfg = layouts.in_rank_order(1, 1, 8, 2, schedule="1f1b"), get_model("gpt3-xl", 2)
    opts = options(sync_every=4, sync_timeout=60.0)
    at = lambda step, **kw: dsim.quorum_recovery(sim.links, sim.profiles, cfg, 64, lay, 1, 2, opts, 5, step, **kw)
    inside, next_turn = at(7, in_sync_s=2.0), at(8)
    assert inside["lost_iterations"] == 3 and inside["dropped_iterations"] == 4 and next_turn["lost_iterations"] == 0
    step = dsim.inner_step_seconds(sim.links, sim.profiles, cfg, 64, lay, 1, 2,
                                   dsim.DiLoCoSettings.of(opts, 8, cfg.layers))[0].max()
    heartbeat_wait = dsim.quorum_model(cfg, opts, 8).wait_s(4 * step)  # the next turn's quorum, for one lost at 8
    assert inside["detect_s"] - next_turn["detect_s"] == pytest.approx(58.0 - heartbeat_wait, rel=1e-9)
    with pytest.raises(ValueError, match="step 6 ends no sync"):
        at(6, in_sync_s=0.5)


def test_the_quorum_agent_counts_a_replica_out_of_step_from_a_dropped_sync_until_it_heals():
    """train/quorum_agent.py's account of a replica stalled in a sync a lost peer left (emulated: the peer's packets
    vanish, so only torchft's timeout tells): its sync is dropped, its steps until it heals at its next committed
    sync are thrown away, so the run's iterations are those of the replicas in step (else the stalled replica's
    late ends would put the run's clock backwards); every rank's sync rows are kept, the dropped one too; and the
    loss is detected at the first sync another replica committed, not at the dropped one."""
    from harness.train import quorum_agent as qa
    from harness.train.stats import IterationStats

    def it(i, end, syncs=None):
        return IterationStats(1.0, 0.5, 0.5, 2.0, end, iteration=i, outer_syncs=syncs)

    def sync(i, rank, end, committed, participants=3):
        return [{"iteration": i, "rank": rank, "end": end, "committed": committed, "participants": participants}]

    fast = qa._Job(0, (0,), 0, None, [], 0.0)
    stalled = qa._Job(1, (1,), 0, None, [], 0.0)
    lost = qa._Job(2, (2,), 0, None, [], 0.0)
    lost.killed = 10.5
    per_job = [
        (fast, 0, [it(0, 10.0, sync(0, 0, 10.0, 1)), it(1, 11.0), it(2, 12.0, sync(2, 0, 12.0, 1, 1)), it(3, 13.0)]),
        # its sync at 0 committed after the loss, with the lost one's part in it; then dropped at 1 (a peer closed);
        # stale steps; healed in its sync at 2
        (stalled, 0, [it(0, 10.6, sync(0, 1, 10.6, 1)), it(1, 10.8, sync(1, 1, 10.8, 0)),
                   it(2, 41.0, sync(2, 1, 41.0, 1, 2)), it(3, 42.0)]),
        (lost, 0, [])]
    merged = qa._merged(per_job, 0, 4, replicas=3)
    assert [s.end for s in merged] == [10.6, 11.0, 12.0, 42.0]
    assert [s.seconds for s in merged[1:]] == pytest.approx([0.4, 1.0, 30.0])
    assert [(r["rank"], r["committed"]) for r in merged[1].outer_syncs] == [(1, 0)]  # kept, though out of step
    (row,) = qa._recoveries(per_job, [{"event": "preempt", "device": 2, "at_s": 10.5}], t0=0.0)
    # the fast one's sync of a smaller quorum; not the stalled one's at 0 (it held the lost one) nor its dropped one
    assert row["detect_s"] == pytest.approx(12.0 - 10.5)


def test_sim_compare_and_the_convergence_report_keep_runs_of_one_system_with_other_options_apart():
    """`harness sim compare` and `harness report convergence` on DiLoCo runs at H = 1, 10 and 50: a row and a curve
    each (their options are in sim compare's group key), named by the options set away from their defaults."""
    import json

    from harness.report import convergence
    from harness.sim import compare

    assert "options" in compare.GROUP_KEYS
    rec = {"system": "diloco", "options": json.dumps(options(sync_every=10, wire="int8"))}
    assert compare._named(rec) == "diloco sync_every=10 wire=int8"
    assert compare._named({"system": "diloco", "options": json.dumps(options())}) == "diloco"
    assert compare._named({"system": "megatron"}) == "megatron"
    manifest = {"spec": {"run": {"options": options("streaming-diloco", sync_every=10)}}}
    assert convergence._label("streaming-diloco", manifest) == "streaming-diloco sync_every=10"
