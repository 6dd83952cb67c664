"""OWL's FL workload in the simulator: models, grouping, federation, flows, strategies, CLI."""
import json
import random
import re

import numpy as np
import pytest

from harness.workloads.fl.federation import FLError, emulated_topology, federation, load_federation, load_topology
from harness.workloads.fl.activity import busy_intervals, busy_over_time, busy_share
from harness.workloads.fl.flows import SERVER, Transfer, arrivals, forward_end, forward_schedule, layer_seconds
from harness.workloads.fl.grouping import bell, bound, exact_groups, greedy_groups, largest, partitions
from harness.workloads.fl.models import BYTES_PER_PARAM, Base, Branch, BranchyModel, Layer, check, get_branchy
from harness.workloads.fl.strategies import STRATEGIES, owl_transfers, run, sized_branches
from harness.scenario import ScenarioError, load_scenario
from tests.test_scenario import write


# ----------------------------------------------------------------------------- models
def test_inception_v4_and_dfn_parameter_counts_against_the_paper():
    inc, dfn = get_branchy("inception-v4"), get_branchy("dfn")
    # from the architecture (Szegedy et al. 2017), not typed in: the paper reports 42.68 M and 25.41 M
    assert abs(inc.params - 42.68e6) / 42.68e6 < 1e-3
    assert abs(dfn.params - 25.41e6) / 25.41e6 < 0.10
    # 12.25 G multiply-adds per 299x299 image, as Inception-v4 is usually quoted (12.3 GMACs)
    assert 24.0e9 < inc.fwd_flop < 25.0e9
    # Inception-A/B/C blocks have four parallel branches, the reductions three
    widths = [len(b.branches) for b in inc.bases]
    assert widths.count(4) == 14 and widths.count(3) == 2 and widths[-1] == 1


def test_a_model_without_branches_is_refused():
    chain = BranchyModel("chain", (Base("a", (Branch((Layer("l", 10, 1.0),)),)),), 32)
    with pytest.raises(FLError, match="no base has two branches"):
        check(chain)
    with pytest.raises(FLError, match="unknown FL model"):
        get_branchy("resnet-9000")


# ----------------------------------------------------------------------------- grouping
def test_greedy_grouping_against_the_exact_one_on_random_instances():
    rng = random.Random(7)
    ratios = []
    for _ in range(400):
        n = rng.randint(2, 9)
        D = rng.randint(1, n)
        sizes = [rng.choice([rng.randint(1, 10), rng.randint(1, 1000)]) for _ in range(n)]
        greedy, exact = greedy_groups(sizes, D), exact_groups(sizes, D)
        for g in (greedy, exact):  # a partition into D non-empty groups
            assert sorted(i for grp in g for i in grp) == list(range(n)) and len(g) == D and all(g)
        brute = min(largest(sizes, p) for p in partitions(n, D) if len(p) == D)
        assert largest(sizes, exact) == brute
        ratio = largest(sizes, greedy) / brute
        assert ratio <= bound(D) + 1e-12  # Theorem 2
        ratios.append(ratio)
    assert max(ratios) > 1.0  # the instances do separate greedy from exact


def test_grouping_bound_is_tight_for_the_worst_case_of_lpt():
    # Graham's example for D=2: sizes 3,3,2,2,2: LPT gives 7, the optimum 6 (ratio 7/6 <= 3/2 - 1/4)
    sizes = [3, 3, 2, 2, 2]
    assert largest(sizes, greedy_groups(sizes, 2)) == 7 and largest(sizes, exact_groups(sizes, 2)) == 6
    assert len(list(partitions(5, 5))) == bell(5, 5) == 52
    with pytest.raises(FLError, match="empty"):
        greedy_groups([1, 2], 3)


# ----------------------------------------------------------------------------- federation
def test_testbed_federation_and_alpha():
    fed = load_federation("owl-testbed")
    assert (fed.workers, fed.shape, fed.alpha) == (100, "50x2", 0.5)
    assert fed.uplink_Bps == fed.inter_Bps == 5e9 / 8  # the server sits behind the inter-rack fabric
    low = load_federation("owl-testbed", alpha=0.2)
    assert low.inter_Bps == pytest.approx(2e9 / 8) and low.uplink_Bps == low.inter_Bps
    assert load_federation("owl-8x10").racks == (8,) * 10 and load_federation("owl-4x20").racks == (4,) * 20


def test_the_emulated_federation_puts_the_server_behind_its_uplink():
    topo = load_topology("owl-testbed", 4)
    fed = federation(topo, 0.2)
    emu = emulated_topology(topo, fed).scaled(0.01)
    assert emu.n == 5 and emu.region_of(4).name == "server"
    # workers of a rack at B_intra, of two racks at alpha x B_intra, the server at B_inter after its delay
    assert emu.bandwidth_gbps[0, 1] == pytest.approx(0.1) and emu.bandwidth_gbps[1, 2] == pytest.approx(0.02)
    assert emu.bandwidth_gbps[4, 0] == emu.bandwidth_gbps[0, 4] == pytest.approx(0.02)
    assert (emu.delay_ms[0, 1], emu.delay_ms[1, 2], emu.delay_ms[4, 3]) == pytest.approx((0.025, 0.05, 0.05))
    # the server's interface sends at most its uplink (here alpha x B_intra too), a worker's at most its fastest
    # link (B_intra), as the simulator limits them; scaled with every link
    assert list(emu.interface_gbps[:4]) == pytest.approx([0.1] * 4) and emu.interface_gbps[4] == pytest.approx(0.02)
    # what the simulator predicts for such a run: the same rates, compute slowed, what a worker sends limited by its
    # interface, what it receives by each pair alone
    sc = fed.scaled(0.01, 100.0)
    assert sc.uplink_Bps == pytest.approx(0.02e9 / 8) and sc.worker_egress_Bps == pytest.approx(sc.intra_Bps)
    assert sc.worker_ingress_Bps == np.inf
    assert sc.flops_per_s[0] == pytest.approx(fed.flops_per_s[0] / 100)


def test_a_scenarios_interface_limit_holds_the_workers_interfaces_in_the_model_and_the_emulated_cluster():
    from dataclasses import replace

    topo = load_topology("owl-testbed", 4)
    capped = replace(topo, interface_gbps=np.full(4, 0.5))  # below B_intra (10 Gbps): it binds
    fed = federation(capped, 0.2)
    assert fed.worker_egress_Bps == fed.worker_ingress_Bps == pytest.approx(0.5e9 / 8)
    assert federation(topo, 0.2).worker_egress_Bps == fed.intra_Bps  # none: the fastest link
    emu = emulated_topology(capped, fed).scaled(0.01)
    assert list(emu.interface_gbps[:4]) == pytest.approx([0.005] * 4) and emu.interface_gbps[4] == pytest.approx(0.02)
    sc = fed.scaled(0.01, 100.0)  # what the emulated cluster shapes: what a worker sends, not what it receives
    assert sc.worker_egress_Bps == pytest.approx(0.005e9 / 8) and sc.worker_ingress_Bps == np.inf
    with pytest.raises(FLError, match="interface_gbps: a federation needs one value"):
        federation(replace(topo, interface_gbps=np.array([0.5, 0.5, 1.0, 1.0])))
    # a worker that relays to its rack sends through its interface: a binding limit slows the round
    model = get_branchy("tiny")
    free = federation(topo, 0.2)
    assert run("owl", model, fed, 8).distribution_seconds > run("owl", model, free, 8).distribution_seconds


def test_strategies_by_list_and_the_records_bytes_by_where_they_go():
    from harness.workloads.fl.records import to_record
    from harness.workloads.fl.strategies import selected

    assert selected("owl, naive,owl") == ["owl", "naive"] and "optimal" not in selected("all")
    fed, model = load_federation("owl-testbed", 10), get_branchy("tiny")
    recs = {n: to_record(run(n, model, fed, 8), run_id="r", fed=fed, model=model, batch=8) for n in ("naive", "owl")}
    S = model.params * BYTES_PER_PARAM
    assert recs["naive"].server_bytes == 10 * S and recs["naive"].rack_bytes == (0.0,) * 5
    # owl: a model per rack from the server, the other worker of each rack gets it from its peer
    assert recs["owl"].server_bytes == 5 * S and recs["owl"].rack_bytes == (S,) * 5
    assert recs["owl"].inter_rack_bytes == 0 and recs["owl"].allreduce_bytes == 2 * 9 * S


def test_scale_down_keeps_whole_racks():
    fed = load_federation("owl-8x10", devices=16)
    assert fed.racks == (8, 8)
    with pytest.raises(FLError, match=r"not whole racks.*valid: 8, 16, 40, 80"):
        load_federation("owl-8x10", devices=12)


@pytest.mark.parametrize("alpha", [0, -0.5, 1.5])
def test_alpha_outside_the_unit_interval_is_refused(alpha):
    with pytest.raises(FLError, match=r"--alpha: must be in \(0, 1\]"):
        load_federation("owl-testbed", alpha=alpha)


def test_bad_federation_scenarios(tmp_path):
    lonely = write(tmp_path, """\
        name: lonely
        device: {gpu: RTX 3080}
        regions: [{name: rack, devices: 1, count: 3}]
        intra_region: {delay_ms: 0.02, bandwidth_gbps: 10}
        inter_region: {delay_ms: 0.05, bandwidth_gbps: 5}
        server: {delay_ms: 0.05}
        """)
    with pytest.raises(FLError, match="one worker; a federation needs two"):
        federation(load_scenario(str(lonely)).subset([0]))
    uneven = write(tmp_path, """\
        name: uneven
        device: {gpu: RTX 3080}
        regions: [{name: a, devices: 1}, {name: b, devices: 1}, {name: c, devices: 1}]
        intra_region: {delay_ms: 0.02, bandwidth_gbps: 10}
        inter_region:
          order: [a, b, c]
          delay_ms: [[~, 0.05, 0.05], [0.05, ~, 0.05], [0.05, 0.05, ~]]
          bandwidth_gbps: [[~, 1, 5], [1, ~, 5], [5, 5, ~]]
        server: {delay_ms: 0.05}
        """)
    geo = federation(load_scenario(str(uneven)))  # racks of one whose links differ: racks, not no racks
    assert not geo.flat and geo.racks == (1, 1, 1) and geo.rack_Bps[0][1] == 1e9 / 8
    with pytest.raises(FLError, match="--alpha: .*racks have links of their own"):
        federation(load_scenario(str(uneven)), 0.5)
    text = uneven.read_text()
    for server, message in (("{delay_ms: 0.05, region: a}", "server: needs delay_ms .* or region"),
                            ("{region: z}", r"server.region: not a region \(regions: a, b, c\)")):
        bad = write(tmp_path, text.replace("server: {delay_ms: 0.05}", f"server: {server}"))
        with pytest.raises(ScenarioError, match=message):
            load_scenario(str(bad))
    empty = write(tmp_path, """\
        name: empty
        device: {gpu: RTX 3080}
        regions: [{name: rack, devices: 0}]
        intra_region: {delay_ms: 0.02, bandwidth_gbps: 10}
        inter_region: {delay_ms: 0.05, bandwidth_gbps: 5}
        server: {delay_ms: 0.05}
        """)
    with pytest.raises(ScenarioError, match=r"regions\[0\]\.devices: must be an integer >= 1"):
        load_scenario(str(empty))
    with pytest.raises(FLError, match="server: missing"):
        federation(load_scenario("5"))


def test_a_geo_distributed_federation_keeps_each_pair_of_racks_links_and_its_server_in_a_region():
    topo = load_topology("owl-regional")
    fed = federation(topo)
    rates, delays = fed.rack_links()
    names = [r.name for r in topo.regions]
    ca, oh, va = names.index("California"), names.index("Ohio"), names.index("Virginia")
    assert rates[oh, va] == pytest.approx(1.12e9 / 8) and delays[ca, va] == pytest.approx(0.059)
    assert rates[ca, ca] == fed.intra_Bps == 2e9 / 8 and fed.alpha == pytest.approx(1.02 / 2)  # the slowest pair
    srates, sdelays = fed.server_links()  # the server in California: California's links
    assert list(srates) == pytest.approx(list(rates[ca])) and sdelays[ca] == pytest.approx(0.005)
    nbytes = 1e8
    w_va, w_ca = fed.members(va)[0], fed.members(ca)[0]
    a = arrivals(fed, [Transfer(w_va, SERVER, (0,), nbytes, "server"), Transfer(w_ca, SERVER, (0,), nbytes, "server"),
                       Transfer(fed.members(oh)[0], w_va, (0,), nbytes, "peer", after=0)])
    # each at most its pair's rate, the two sharing the server's uplink (its fastest link, 2 Gbps) for a while
    assert 2 * 0.059 + nbytes / (1.05e9 / 8) < a[0] < 2 * 0.059 + nbytes / (1e9 / 8) * (1 + 1e-9)
    assert 2 * 0.005 + nbytes / (2e9 / 8) < a[1] < a[0]
    assert a[2] == pytest.approx(a[0] + 2 * 0.011 + nbytes / (1.12e9 / 8))
    # the emulated cluster shapes the same pairs: rack pairs as the scenario's regions, the server California's
    emu = emulated_topology(topo, fed)
    assert emu.bandwidth_gbps[w_va, fed.workers] == pytest.approx(1.05) and emu.delay_ms[w_ca, 8] == pytest.approx(5)
    assert emu.bandwidth_gbps[fed.members(oh)[0], w_va] == pytest.approx(1.12)
    # scaled for a prediction: every pair's rate
    sc = fed.scaled(0.01, 10.0)
    assert sc.rack_links()[0][oh, va] == pytest.approx(0.01 * 1.12e9 / 8) and sc.server_links()[0][va] == pytest.approx(
        0.01 * 1.05e9 / 8)
    with pytest.raises(FLError, match="server.region: 'California' is not among the racks kept"):
        federation(topo.subset(fed.members(oh) + fed.members(va)))


# ----------------------------------------------------------------------------- flows
def test_a_single_transfer_takes_its_delays_and_its_bytes_at_the_pair_rate():
    fed = load_federation("owl-testbed", devices=4)
    nbytes = 1e8
    a = arrivals(fed, [Transfer(0, SERVER, (0,), nbytes, "server")])
    assert a[0] == pytest.approx(2 * fed.server_delay_s + nbytes / fed.inter_Bps)
    # two workers of one rack pull from the server at once: they share its uplink; then a relay inside the rack
    t = [Transfer(0, SERVER, (0,), nbytes, "server"), Transfer(1, SERVER, (1,), nbytes, "server"),
         Transfer(1, 0, (0,), nbytes, "peer", after=0)]
    a = arrivals(fed, t)
    both = 2 * nbytes / fed.uplink_Bps
    assert a[0] == pytest.approx(a[1]) == pytest.approx(2 * fed.server_delay_s + both)
    assert a[2] == pytest.approx(a[0] + 2 * fed.intra_delay_s + nbytes / fed.intra_Bps)


def test_forward_waits_for_parameters_and_runs_branches_in_arrival_order():
    two = BranchyModel("two", (Base("a", (Branch((Layer("x", 1, 1.0),)), Branch((Layer("y", 1, 1.0),)))),
                               Base("b", (Branch((Layer("z", 1, 1.0),)),))), 8)
    secs = np.array([1.0, 1.0, 1.0])
    # y arrives first: it runs at 0..1, x at 5..6, z after both
    assert forward_end(two, secs, np.array([5.0, 0.0, 0.0])) == 7.0
    assert forward_end(two, secs, np.zeros(3)) == 3.0
    assert forward_end(two, secs, np.array([0.0, 0.0, 10.0])) == 11.0
    starts, ends = forward_schedule(two, secs, np.array([5.0, 0.0, 0.0]))
    assert starts.tolist() == [5.0, 0.0, 6.0] and ends.tolist() == [6.0, 1.0, 7.0]


def test_a_rounds_gpu_timeline_is_its_forward_as_scheduled_then_its_backward():
    """Fig. 8b's model: each worker's kernels (its forward's layers, then a backward of twice their time)."""
    fed, model = load_federation("owl-testbed", 4), get_branchy("tiny")
    secs = layer_seconds(model, fed, 8)
    naive, owl = run("naive", model, fed, 8), run("owl", model, fed, 8)
    iv = busy_intervals(model, fed, 8, naive)
    assert len(iv) == 4
    for w, spans in enumerate(iv):
        assert (spans[:, 1] - spans[:, 0]).sum() == pytest.approx(3 * secs[w].sum())
        assert spans[0, 0] >= naive.distribution_seconds - 1e-12  # naive computes only once the model is whole
        assert spans[-1, 1] <= naive.seconds
        assert (spans[1:, 0] >= spans[:-1, 1] - 1e-12).all()  # one kernel at a time
    share = busy_share(iv, naive.seconds)
    assert share == pytest.approx(3 * secs.sum(axis=1).mean() / naive.seconds)
    t, busy = busy_over_time(iv, naive.seconds, bins=50)
    assert t[-1] == pytest.approx(naive.seconds) and busy.mean() == pytest.approx(share)
    assert busy[: int(50 * naive.distribution_seconds / naive.seconds)].max() == 0.0
    # the same kernels in a shorter round: OWL's GPUs are busy a larger share of it
    assert busy_share(busy_intervals(model, fed, 8, owl), owl.seconds) > share
    with pytest.raises(ValueError, match="a bound, not a plan"):
        busy_intervals(model, fed, 8, run("oos", model, fed, 8))


# ----------------------------------------------------------------------------- strategies
def test_naive_round_is_the_congested_server_then_the_computation():
    fed = load_federation("owl-testbed", devices=10)
    m = get_branchy("dfn")
    r = run("naive", m, fed, 32)
    M = m.params * BYTES_PER_PARAM
    assert r.server_bytes == pytest.approx(fed.workers * M)
    assert r.distribution_seconds == pytest.approx(2 * fed.server_delay_s + fed.workers * M / fed.uplink_Bps)
    forward = 32 * m.fwd_flop / fed.flops_per_s[0]
    assert r.forward_seconds == pytest.approx(r.distribution_seconds + forward)
    assert r.seconds == pytest.approx(r.forward_seconds + r.e0_seconds)


def test_owl_deployment_meets_constraints_8_and_9():
    fed = load_federation("owl-8x10", devices=16)
    m = get_branchy("inception-v4")
    groupings = [[[j] for j in sized_branches(m, i)] for i in range(len(m.bases))]
    t = owl_transfers(m, fed, groupings)
    rack = fed.rack_of
    for r in range(len(fed.racks)):
        for i, groups in enumerate(groupings):
            layers = [tuple(l for l in range(len(m.layers)) if m.layers[l][0] == i and m.layers[l][1] in g)
                      for g in groups]
            pulled = [x.layers for x in t if x.src == SERVER and rack[x.dst] == r and x.layers in layers]
            assert sorted(pulled) == sorted(layers)  # (8): the rack pulls every group from the server once
    for x in t:
        if x.src != SERVER:
            src = t[x.after]
            assert src.dst == x.src and src.src == SERVER and src.layers == x.layers  # (9)
            assert rack[x.src] == rack[x.dst]  # relays stay inside the rack
    for w in range(fed.workers):  # every worker ends with every layer exactly once
        got = sorted(l for x in t if x.dst == w for l in x.layers)
        assert got == list(range(len(m.layers)))


def test_owl_cuts_the_server_bytes_to_one_model_per_rack():
    fed = load_federation("owl-4x20", devices=16)
    m = get_branchy("inception-v4")
    rounds = {s: run(s, m, fed, 32) for s in ("naive", "overlap", "ipart", "owl")}
    M = m.params * BYTES_PER_PARAM
    assert rounds["owl"].server_bytes == pytest.approx(len(fed.racks) * M)
    assert rounds["overlap"].server_bytes == pytest.approx(fed.workers * M)
    assert rounds["owl"].seconds < rounds["ipart"].seconds <= rounds["overlap"].seconds * (1 + 1e-9)
    assert rounds["overlap"].seconds < rounds["naive"].seconds
    assert len({r.e0_seconds for r in rounds.values()}) == 1


@pytest.mark.parametrize("model,scenario,devices", [("tiny", "owl-8x10", 16), ("tiny", "owl-testbed", 10),
                                                    ("dfn", "owl-4x20", 8)])
def test_owl_within_ten_percent_of_the_optimum(model, scenario, devices):
    fed = load_federation(scenario, devices=devices)
    m = get_branchy(model)
    owl, best = run("owl", m, fed, 32), run("optimal", m, fed, 32)
    assert best.seconds <= owl.seconds * (1 + 1e-9)
    assert owl.seconds <= 1.10 * best.seconds
    assert best.config["searched"] > 1


def test_optimal_searches_locally_where_groupings_are_too_many_to_enumerate():
    fed, m = load_federation("owl-testbed", 10), get_branchy("inception-v4")
    best, owl, bound = run("optimal", m, fed, 32), run("owl", m, fed, 32), run("oos", m, fed, 32)
    assert best.config["method"] == "local search from owl" and best.config["searched"] > len(m.bases)
    assert bound.seconds <= best.seconds <= owl.seconds * (1 + 1e-12)
    assert list(STRATEGIES) == ["naive", "overlap", "ipart", "owl", "owl-de", "owl-a", "owl-b", "oos", "optimal"]


@pytest.mark.parametrize("scenario,devices,alpha", [("owl-testbed", 10, 0.5), ("owl-4x20", 16, 0.2),
                                                    ("owl-testbed", 10, 1.0)])
def test_decentralized_deployment_pulls_every_group_from_the_server_and_is_never_faster(scenario, devices, alpha):
    fed = load_federation(scenario, devices, alpha)
    m = get_branchy("inception-v4")
    de, ce = run("owl-de", m, fed, 32), run("owl", m, fed, 32)
    assert de.server_bytes == pytest.approx(fed.workers * m.params * BYTES_PER_PARAM)
    assert all(t.src == SERVER for t in de.transfers)
    # at D = 2, each worker of a rack starts a base with its own communication group's group
    base = next(i for i, b in enumerate(m.bases) if len(sized_branches(m, i)) == 4)
    groupings = [[[j] for j in sized_branches(m, i)] if i != base else [[0, 1], [2, 3]] for i in range(len(m.bases))]
    first = {}
    for t in owl_transfers(m, fed, groupings, "decentralized"):
        if m.layers[t.layers[0]][0] == base:
            first.setdefault(t.dst, m.layers[t.layers[0]][1])
    half = fed.racks[0] // 2  # the rack's workers in two communication groups, each starting with its own
    assert [first[w] for w in fed.members(0)] == [0] * half + [2] * half
    assert ce.seconds <= de.seconds  # eq. 15: t_ce / t_de <= 1 where B_inter <= B_intra


def test_owl_a_deploys_through_each_racks_first_worker_and_owl_b_groups_at_random():
    from harness.workloads.fl.grouping import random_groups
    from harness.workloads.fl.strategies import owl_b

    fed, m = load_federation("owl-8x10", 16), get_branchy("inception-v4")
    a = run("owl-a", m, fed, 32)
    assert {t.dst for t in a.transfers if t.src == SERVER} == {fed.members(r)[0] for r in range(2)}
    assert a.config == {"D": 8, "deployment": "unbalanced"}
    rng = np.random.default_rng(3)
    for _ in range(50):
        g = random_groups([5, 4, 3, 2, 1], 3, rng)
        assert sorted(i for x in g for i in x) == [0, 1, 2, 3, 4] and len(g) == 3 and all(g)
    draws = {tuple(map(tuple, random_groups([5, 4, 3, 2, 1], 2, rng))) for _ in range(30)}
    assert len(draws) > 3  # sizes ignored: many groupings, not LPT's one
    assert {owl_b(m, fed, 32, seed).seconds for seed in range(4)} != {run("owl", m, fed, 32).seconds}


@pytest.mark.parametrize("scenario,devices", [("owl-testbed", 10), ("owl-8x10", 16), ("owl-norack", 10)])
def test_oos_bounds_every_plan(scenario, devices):
    fed = load_federation(scenario, devices)
    for name in ("tiny", "dfn", "inception-v4"):
        m = get_branchy(name)
        bound = run("oos", m, fed, 32)
        assert bound.transfers == () and bound.server_bytes == len(fed.racks) * m.params * BYTES_PER_PARAM
        for s in ("naive", "overlap", "ipart", "owl", "owl-de", "owl-a", "owl-b"):
            assert bound.seconds <= run(s, m, fed, 32).seconds * (1 + 1e-12), (name, s)


def test_racks_of_one_worker_are_no_racks_and_owl_relays_across_them():
    topo = load_topology("owl-norack", 10)
    fed = federation(topo)
    assert fed.flat and fed.racks == (10,) and fed.shape == "10x1" and fed.intra_Bps == fed.inter_Bps == 10e9 / 8
    m = get_branchy("dfn")
    owl, naive = run("owl", m, fed, 32), run("naive", m, fed, 32)
    assert owl.server_bytes == m.params * BYTES_PER_PARAM and owl.seconds < naive.seconds
    emu = emulated_topology(topo, fed).scaled(0.01)
    assert emu.n == 11 and emu.region_of(10).name == "server"
    assert emu.bandwidth_gbps[0, 9] == pytest.approx(0.1) and emu.bandwidth_gbps[10, 3] == pytest.approx(0.1)


# ----------------------------------------------------------------------------- CLI
def test_fl_cli_writes_records_and_the_report_draws_them(cli, tmp_path):
    out = tmp_path / "r.json"
    rc, stdout, err = cli("fl", "--scenario", "owl-testbed", "--devices", "10", "--alpha", "0.2,1", "--model", "dfn",
                          "--strategy", "all", "--backend", "sim", "--json", out, "--out", tmp_path / "run")
    assert rc == 0, err
    recs = json.loads(out.read_text())
    assert [r["strategy"] for r in recs] == ["naive", "overlap", "ipart", "owl"] * 2
    assert {r["alpha"] for r in recs} == {0.2, 1.0} and all(r["workers"] == 10 and r["rack_shape"] == "5x2"
                                                            for r in recs)
    for r in recs:
        assert r["seconds"] > r["distribution_seconds"] > 0 and r["server_bytes"] > 0
    assert json.loads((tmp_path / "run" / "records.json").read_text()) == recs
    assert "owl" in stdout and "vs naive" in stdout
    rc, stdout, err = cli("fl", "report", out, "--out", tmp_path / "rep")
    assert rc == 0, err
    png, md = tmp_path / "rep" / "fl.png", (tmp_path / "rep" / "fl.md").read_text()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    owl_rows = [line for line in md.splitlines() if "| owl |" in line]
    assert len(owl_rows) == 2 and all(float(row.split("|")[9]) < 1 for row in owl_rows)



def test_a_toy_strategy_is_one_registration_and_runs_and_reports(cli, tmp_path, monkeypatch):
    """A strategy touches only its registration: `harness fl` runs it, `fl report` draws it."""
    from harness.workloads.fl import strategies as st

    monkeypatch.setattr(st, "STRATEGIES", dict(st.STRATEGIES))

    @st.register("toy-two-halves", "the model in two messages from the server")
    def toy(model, fed, batch):
        nbytes = st.layer_bytes(model)
        half = len(nbytes) // 2
        return st.simulate("toy-two-halves", model, fed, batch,
                           st._from_server(fed, [list(range(half)), list(range(half, len(nbytes)))], nbytes))

    out = tmp_path / "r.json"
    rc, stdout, err = cli("fl", "--scenario", "owl-testbed", "--devices", "10", "--model", "tiny", "--strategy", "all",
                          "--json", out, "--out", tmp_path / "run")
    assert rc == 0, err
    recs = {r["strategy"]: r for r in json.loads(out.read_text())}
    assert list(recs) == ["naive", "overlap", "ipart", "owl", "toy-two-halves"]
    assert recs["toy-two-halves"]["server_bytes"] == recs["naive"]["server_bytes"] > 0  # the same model, two messages
    rc, stdout, err = cli("fl", "report", out, "--out", tmp_path / "rep")
    assert rc == 0, err
    assert "| toy-two-halves |" in (tmp_path / "rep" / "fl.md").read_text()

@pytest.mark.parametrize("args,message", [
    (("--alpha", "1.5"), r"--alpha: must be numbers in \(0, 1\]"),
    (("--alpha", "0"), r"--alpha: must be numbers in \(0, 1\]"),
    (("--strategy", "fastest"), "unknown strategy 'fastest'"),
    (("--model", "gpt3"), "unknown FL model 'gpt3'"),
    (("--devices", "7"), "not whole racks"),
    (("--strategy", "naive,fastest"), "unknown strategy 'fastest'"),
    (("--bandwidth-scale", "0.01"), "--bandwidth-scale: only with --backend emu"),
    (("--backend", "emu", "--model", "dfn"), "dfn does not run on --backend emu"),
    (("--backend", "emu", "--devices", "3"), "not whole racks"),
    (("--backend", "emu", "--alpha", "1.2"), r"--alpha: must be numbers in \(0, 1\]"),
    (("--backend", "emu", "--strategy", "owl,oos"), "oos is a bound, not a plan of transfers"),
])
def test_fl_cli_bad_input_is_one_line(cli, tmp_path, args, message):
    rc, out, err = cli("fl", "--scenario", "owl-testbed", "--model", "tiny", *args, "--out", tmp_path / "run")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert re.search(message, err)
    assert not (tmp_path / "run").exists()


def test_fl_cli_refuses_a_scenario_without_server_and_a_report_without_records(cli, tmp_path):
    rc, _, err = cli("fl", "--scenario", "5", "--model", "tiny")
    assert rc == 2 and "server: missing" in err
    (tmp_path / "x.json").write_text("[]")
    rc, _, err = cli("fl", "report", tmp_path / "x.json", "--out", tmp_path / "rep")
    assert rc == 2 and "no FL records" in err and not (tmp_path / "rep").exists()


def test_ipart_packs_pay_fewer_setups_and_keep_the_overlap():
    """tiny is latency-bound (0.2 MB in 18 layers: layer by layer pays 18 round trips), inception-v4 bound by the
    server's uplink: in both IPart is no slower than the better of naive and overlap, with fewer messages."""
    from harness.workloads.fl.strategies import ipart_packs

    for model, scenario, devices in (("tiny", "owl-4x20", 8), ("inception-v4", "owl-testbed", 100)):
        m, fed = get_branchy(model), load_federation(scenario, devices=devices)
        packs = ipart_packs(m, fed, 32)
        assert [l for p in packs for l in p] == list(range(len(m.layers)))  # contiguous, in forward order
        rounds = {s: run(s, m, fed, 32) for s in ("naive", "overlap", "ipart")}
        assert rounds["ipart"].config["messages"] == len(packs) < rounds["overlap"].config["messages"]
        assert rounds["ipart"].seconds <= min(rounds["naive"].seconds, rounds["overlap"].seconds) * (1 + 1e-3)


@pytest.mark.parametrize("name", ["tiny", "mini-inception"])
def test_a_runnable_model_builds_from_its_profile_and_trains_on_cpu(name):
    import torch

    from harness.workloads.fl.nets import BranchyNet

    torch.manual_seed(0)
    profile = get_branchy(name)
    net = BranchyNet(profile)
    for units, base in zip(net.bases, profile.bases):  # every branch's layers: the profile's parameters, in order
        assert [[sum(p.numel() for p in u.parameters()) for u in br] for br in units] == \
            [[l.params for l in br.layers] for br in base.branches]
    assert sum(p.numel() for p in net.parameters()) == profile.params
    assert max(len(b.branches) for b in profile.bases) == 4  # Inception-style: four branches a block
    x, y = torch.randn(16, 3, profile.image, profile.image), torch.randint(0, 10, (16,))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_a_profile_that_is_not_a_chain_of_layers_does_not_build():
    from harness.workloads.fl.nets import BranchyNet

    for name, branch in (("inception-v4", "stem.mixed3a.b0"), ("dfn", "stem.b0")):
        with pytest.raises(FLError, match=f"branch {re.escape(branch)} is not a chain of layers"):
            BranchyNet(get_branchy(name))
