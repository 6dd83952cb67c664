"""Link model and collectives of the simulator against closed forms."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from harness.netmodel import collectives
from harness.netmodel.fair_share import max_min_fair
from harness.netmodel.links import Links
from tests.conftest import make_topology, random_topology


def uniform(n, delay_ms, gbps):
    return make_topology(np.full((n, n), delay_ms), np.full((n, n), gbps))


def test_ring_allreduce_uniform_ring_matches_closed_form():
    n, delay_ms, gbps, nbytes = 6, 7.0, 3.0, 60e6
    links = Links.from_topology(uniform(n, delay_ms, gbps))
    end = collectives.ring_allreduce(links, np.arange(n)[None, :], nbytes)
    alpha, rate = delay_ms / 1e3, gbps * 1e9 / 8
    expected = 2 * (n - 1) * (alpha + nbytes / n / rate)
    np.testing.assert_allclose(end, expected, rtol=1e-12)


def test_gloo_ring_waits_for_the_receivers_ready_notice_every_step():
    n, delay_ms, gbps, nbytes = 5, 10.0, 2.0, 20e6
    links = Links.from_topology(uniform(n, delay_ms, gbps), "gloo")
    end = collectives.ring_allreduce(links, np.arange(n)[None, :], nbytes)
    alpha, rate = delay_ms / 1e3, gbps * 1e9 / 8
    np.testing.assert_allclose(end, 2 * (n - 1) * (2 * alpha + nbytes / n / rate), rtol=1e-12)


def test_preposted_receives_pay_no_ready_notice_and_per_pair_links_do_not_share():
    topo = uniform(4, 30.0, 1.0)
    g = np.arange(4)[None, :]
    gloo, nccl = Links.from_topology(topo, "gloo", "per-pair"), Links.from_topology(topo, "nccl", "per-pair")
    for mode in ("grouped", "rounds"):
        waits = collectives.sharded_ps(gloo, g, 8e6, mode=mode)
        posted = collectives.sharded_ps(gloo, g, 8e6, mode=mode, preposted=True)
        np.testing.assert_allclose(posted, collectives.sharded_ps(nccl, g, 8e6, mode=mode), rtol=1e-12)
        assert (posted < waits).all()
    # one device sending to three: a shared NIC splits its rate, per-pair shaping (the emulator) does not
    src, dst = np.zeros(3, dtype=int), np.array([1, 2, 3])
    shared = Links.from_topology(topo).fair_rates(src, dst)
    per_pair = Links.from_topology(topo, nic="per-pair").fair_rates(src, dst)
    np.testing.assert_allclose(shared, 1e9 / 8 / 3)
    np.testing.assert_allclose(per_pair, 1e9 / 8)
    with pytest.raises(ValueError, match="nic"):
        Links.from_topology(topo, nic="bogus")


def test_ring_allgather_is_half_an_allreduce_and_respects_start_times():
    links = Links.from_topology(uniform(4, 2.0, 10.0))
    g = np.array([[0, 1, 2, 3]])
    ag = collectives.ring_allgather(links, g, 8e6)
    ar = collectives.ring_allreduce(links, g, 8e6)
    np.testing.assert_allclose(2 * ag, ar)
    late = collectives.ring_allgather(links, g, 8e6, start=np.array([[0.0, 0.0, 5.0, 0.0]]))
    assert late.min() >= 5.0  # everyone waits, transitively, for the late device's chunks
    assert late.max() > ag.max() + 5.0 - 1e-9


def test_ring_is_bounded_by_its_slowest_link():
    bw = np.full((4, 4), 10.0)
    bw[2, 3] = 1.0  # one slow hop in the ring 0->1->2->3->0
    links = Links.from_topology(make_topology(np.zeros((4, 4)), bw))
    end = collectives.ring_allreduce(links, np.arange(4)[None, :], 40e6).max()
    assert end == pytest.approx(2 * 3 * (10e6 / (1e9 / 8)), rel=1e-12)


def test_fair_rates_share_a_senders_link():
    bw = np.array([[0, 10, 10, 2], [10, 0, 10, 10], [10, 10, 0, 10], [2, 10, 10, 0]], dtype=float)
    links = Links.from_topology(make_topology(np.zeros((4, 4)), bw))
    # device 0's egress is its fastest link (10 Gbps): two flows at 10 share it
    r = links.fair_rates(np.array([0, 0]), np.array([1, 2])) * 8 / 1e9
    np.testing.assert_allclose(r, [5, 5])
    # a flow held to 2 Gbps by its pair leaves the rest (8) to the other: max-min fairness
    r = links.fair_rates(np.array([0, 0]), np.array([3, 1])) * 8 / 1e9
    np.testing.assert_allclose(r, [2, 8])
    # a permutation: every pair at its own rate
    r = links.fair_rates(np.array([0, 1, 2, 3]), np.array([1, 2, 3, 0])) * 8 / 1e9
    np.testing.assert_allclose(r, [10, 10, 10, 2])


def test_max_min_fair_textbook_cases():
    # resources: 0 server uplink (10), 1 and 2 two receivers (cap 10 and 3)
    caps = np.array([10.0, 10.0, 3.0])
    r = max_min_fair([np.array([0, 0]), np.array([1, 2])], caps)
    assert r.tolist() == [7.0, 3.0]  # the capped receiver frees the uplink for the other flow
    r = max_min_fair([np.array([0, 0, 0]), np.array([1, 1, 2])], caps, np.array([np.inf, 1.0, np.inf]))
    assert r.tolist() == [6.0, 1.0, 3.0]
    assert max_min_fair([np.array([0])], np.array([np.inf])).tolist() == [np.inf]  # nothing limits it


def test_fair_rates_two_transfers_on_one_pair_share_it_and_a_device_to_itself_is_free():
    links = Links.from_topology(uniform(3, 1.0, 8.0), nic="per-pair")
    r = links.fair_rates(np.array([0, 0, 1, 2]), np.array([1, 1, 2, 2])) * 8 / 1e9
    np.testing.assert_allclose(r, [4, 4, 8, np.inf])


def test_an_interface_limit_is_shared_by_every_flow_of_its_device_in_both_nic_models():
    topo = replace(uniform(4, 1.0, 8.0), interface_gbps=np.array([6.0, np.inf, np.inf, np.inf]))
    src, dst = np.zeros(3, dtype=int), np.array([1, 2, 3])
    for nic in ("shared", "per-pair"):
        links = Links.from_topology(topo, nic=nic)
        np.testing.assert_allclose(links.fair_rates(src, dst) * 8 / 1e9, [2, 2, 2])  # 6 Gbps in three
        np.testing.assert_allclose(links.fair_rates(src[:1], dst[:1]) * 8 / 1e9, [6])  # one flow: the limit
    # receiving: a real interface limits it too; the emulated cluster shapes only what a device sends
    into0 = (np.array([1, 2, 3]), np.zeros(3, dtype=int))
    np.testing.assert_allclose(Links.from_topology(topo).fair_rates(*into0) * 8 / 1e9, [2, 2, 2])
    np.testing.assert_allclose(Links.from_topology(topo, nic="per-pair").fair_rates(*into0) * 8 / 1e9, [8, 8, 8])
    # a limit above every pair changes nothing
    loose = replace(topo, interface_gbps=np.full(4, 100.0))
    for nic in ("shared", "per-pair"):
        np.testing.assert_allclose(Links.from_topology(loose, nic=nic).fair_rates(src, dst),
                                   Links.from_topology(uniform(4, 1.0, 8.0), nic=nic).fair_rates(src, dst))


def test_links_held_by_region_honour_each_regions_interface(tmp_path):
    from harness.scenario import load_scenario
    from tests.test_scenario import GOOD, write

    p = write(tmp_path, GOOD.replace("{name: A, devices: 2}", "{name: A, devices: 2, interface_gbps: 0.5}"))
    topo = load_scenario(str(p))
    by_region, dense = Links.from_topology(topo), Links.per_device(topo)
    np.testing.assert_allclose(by_region.egress_Bps, dense.egress_Bps)
    np.testing.assert_allclose(dense.egress_Bps * 8 / 1e9, [0.5, 0.5, 10, 10])
    src, dst = np.zeros(3, dtype=int), np.array([1, 2, 3])  # device 0 (A) to its neighbour and both of B
    np.testing.assert_allclose(by_region.fair_rates(src, dst) * 8 / 1e9, [0.5 / 3] * 3)


def test_sharded_ps_rounds_closed_form_on_uniform_group():
    n, delay_ms, gbps, nbytes = 5, 4.0, 2.0, 50e6
    links = Links.from_topology(uniform(n, delay_ms, gbps))
    end = collectives.sharded_ps(links, np.arange(n)[None, :], nbytes, mode="rounds")
    per_msg = delay_ms / 1e3 + nbytes / n / (gbps * 1e9 / 8)
    np.testing.assert_allclose(end, 2 * (n - 1) * per_msg, rtol=1e-12)


def test_sharded_ps_grouped_is_bounded_by_egress_and_never_slower_than_rounds():
    n, nbytes = 8, 80e6
    topo = random_topology(n, 3)
    links = Links.from_topology(topo)
    g = np.arange(n)[None, :]
    grouped = collectives.sharded_ps(links, g, nbytes, mode="grouped").max()
    rounds = collectives.sharded_ps(links, g, nbytes, mode="rounds").max()
    assert grouped <= rounds
    # at least: every device pushes its D-1 shards through its own egress, twice
    egress_bound = 2 * ((n - 1) * nbytes / n / links.egress_Bps).max()
    assert grouped >= egress_bound


def test_linux_default_buffers_send_one_window_per_round_trip_on_a_long_fat_ring():
    """Linux's defaults cap the window at 3 MiB (half of tcp_rmem's 6 MiB): on 8 Gbit/s x 100 ms links a ring
    step of two windows takes a round trip more than its bytes at the rate (netmodel/tcp.py)."""
    from harness.scenario.transport import LINUX

    n, delay_ms, gbps = 4, 50.0, 8.0
    W = 3 << 20
    nbytes = n * 2 * W  # chunks of two windows
    tuned = Links.from_topology(uniform(n, delay_ms, gbps))
    in_use = replace(LINUX, slow_start_after_idle=False)  # the windows alone: no restart after the silence
    linux = Links.from_topology(make_topology(np.full((n, n), delay_ms), np.full((n, n), gbps), transport=in_use))
    alpha, rate = delay_ms / 1e3, gbps * 1e9 / 8
    ring = np.arange(n)[None, :]
    np.testing.assert_allclose(collectives.ring_allreduce(tuned, ring, nbytes), 2 * (n - 1) * (alpha + 2 * W / rate))
    np.testing.assert_allclose(collectives.ring_allreduce(linux, ring, nbytes),
                               2 * (n - 1) * (alpha + 2 * alpha + W / rate), rtol=1e-12)
    assert linux.transport.rmem_max_bytes == 6291456 and tuned.transport.rmem_max_bytes > 6291456


def test_slow_start_after_idle_costs_the_first_ring_step_its_round_trips():
    """With Linux's slow start after idle, a ring that starts after an iteration's silence sends its first
    chunk from the initial window (10 segments of 1448 B), doubling per round trip: 8 round trips send
    255 x 14480 B, the 9th the rest of the two windows. The next steps follow within a delay, below the
    retransmission timeout (RTT + 200 ms), so they keep the grown window: a round trip per window."""
    from harness.scenario.transport import LINUX

    n, delay_ms, gbps = 4, 50.0, 8.0
    W = 3 << 20
    nbytes = n * 2 * W
    linux = Links.from_topology(make_topology(np.full((n, n), delay_ms), np.full((n, n), gbps), transport=LINUX))
    alpha, rate, iw = delay_ms / 1e3, gbps * 1e9 / 8, 10 * 1448
    in_use_step = 2 * alpha + W / rate + alpha
    first_step = 8 * 2 * alpha + (2 * W - 255 * iw) / rate + alpha
    np.testing.assert_allclose(collectives.ring_allreduce(linux, np.arange(n)[None, :], nbytes),
                               first_step + (2 * (n - 1) - 1) * in_use_step, rtol=1e-12)
    # the sharded PS's two exchanges: the scatter from the initial window, the gather right after on grown ones
    shard = 2 * W
    ps = collectives.sharded_ps(linux, np.arange(n)[None, :], n * shard)
    np.testing.assert_allclose(ps, first_step + in_use_step, rtol=1e-12)


NODES = """\
name: nodes
device: {gpu: X, peak_tflops: 1, memory_gb: 1}
regions:
  - {name: node, devices: 2, count: 3, shared_nic_gbps: 10}
intra_region: {delay_ms: 0, bandwidth_gbps: 100}
inter_region: {delay_ms: 0, bandwidth_gbps: 10}
transport: {slow_start_after_idle: false, rmem_max_bytes: auto, wmem_max_bytes: auto}
"""


def nodes_topology(tmp_path):
    """3 nodes of 2 devices (0-1, 2-3, 4-5): 100 Gbps inside, 10 Gbps between, one 10 Gbps NIC a node."""
    from harness.scenario import load_scenario
    from tests.test_scenario import write

    return load_scenario(str(write(tmp_path, NODES)))


def test_a_nodes_devices_share_its_nic_for_what_leaves_it_and_not_for_what_stays(tmp_path):
    topo = nodes_topology(tmp_path)
    links = Links.from_topology(topo)
    gbps = lambda src, dst: links.fair_rates(np.array(src), np.array(dst)) * 8 / 1e9  # noqa: E731
    np.testing.assert_allclose(gbps([0], [2]), [10])  # alone: the pair's rate
    np.testing.assert_allclose(gbps([0, 1], [2, 3]), [5, 5])  # both of node 0 to node 1: its NIC in two
    np.testing.assert_allclose(gbps([0, 1], [2, 4]), [5, 5])  # to two nodes: node 0's NIC out still in two
    np.testing.assert_allclose(gbps([0, 4], [2, 3]), [5, 5])  # from two nodes into node 1: its NIC in, in two
    np.testing.assert_allclose(gbps([0, 1, 4], [2, 3, 5]), [5, 5, 100])  # inside node 2: untouched
    # the same links held by region (no N x N matrix) and as matrices
    dense = Links.per_device(topo)
    src, dst = np.array([0, 1, 2, 3, 4]), np.array([2, 4, 0, 5, 1])
    np.testing.assert_allclose(links.fair_rates(src, dst), dense.fair_rates(src, dst))
    # the emulated cluster shapes every device on its own: no shared NIC
    per_pair = Links.from_topology(topo, nic="per-pair")
    np.testing.assert_allclose(per_pair.fair_rates(np.array([0, 1]), np.array([2, 3])) * 8 / 1e9, [10, 10])


def test_concurrent_groups_share_the_nics_their_members_send_through(tmp_path):
    """Two data-parallel groups of one device a node each (ours' and DT-FM's stages in case 1): alone, a group's
    exchange moves one shard through each NIC; together, two."""
    topo = nodes_topology(tmp_path)
    links, alone = Links.from_topology(topo), Links.from_topology(topo, nic="per-pair")
    groups, nbytes = np.array([[0, 2], [1, 3]]), 100e6
    nic_Bps = 10e9 / 8
    # ring all-reduce of 2: two steps of nbytes / 2, at half the NIC each when both rings run
    np.testing.assert_allclose(collectives.ring_allreduce(links, groups, nbytes), 2 * (nbytes / 2) / (nic_Bps / 2))
    np.testing.assert_allclose(collectives.ring_allreduce(links, groups[:1], nbytes), 2 * (nbytes / 2) / nic_Bps)
    np.testing.assert_allclose(collectives.ring_allreduce(alone, groups, nbytes), 2 * (nbytes / 2) / nic_Bps)
    # the grouped sharded PS: scatter then gather, each a shard of nbytes / 2 a device through its node's NIC
    _, gather = collectives.sharded_ps_phases(links, groups, [nbytes, nbytes / 2])
    np.testing.assert_allclose(gather, 2 * (nbytes / 2 + nbytes / 4) / nic_Bps)  # both groups' shards, twice
    _, gather = collectives.sharded_ps_phases(links, groups[:1], nbytes)
    np.testing.assert_allclose(gather, 2 * (nbytes / 2) / nic_Bps)


def test_reduce_to_each_member_in_turn_against_hand_computations():
    """DeepSpeed ZeRO-1's gradient reduction: one NCCL ring reduce to each member, in member order."""
    d, nbytes = 4e-3, 60e6
    piece = nbytes / 2
    # two members, 1 -> 0 at 2 Gbps, then 0 -> 1 at 1 Gbps once 0 has its own: 0 is done after both sends,
    # 1 after both sends and two delays
    bw = np.array([[np.inf, 1.0], [2.0, np.inf]])
    pair = Links.from_topology(make_topology(np.full((2, 2), d * 1e3), bw))
    B10, B01 = 2e9 / 8, 1e9 / 8
    np.testing.assert_allclose(collectives.reduce_to_each(pair, np.array([[0, 1]]), nbytes),
                               [[d + piece / B10 + piece / B01, 2 * d + piece / B10 + piece / B01]], rtol=1e-12)
    # four members, no delay, a chunk each: chains 1-2-3-0, 2-3-0-1, 3-0-1-2, 0-1-2-3, a member joining each once
    # its previous part is done: members finish after 7, 8, 9, 9 chunk times
    links = Links.from_topology(uniform(4, 0.0, 2.0))
    g = np.arange(4)[None, :]
    c = collectives.NCCL_REDUCE_CHUNK_BYTES
    chunk_s = c / (2e9 / 8)
    np.testing.assert_allclose(collectives.reduce_to_each(links, g, 4 * c), [[7 * chunk_s, 8 * chunk_s,
                                                                              9 * chunk_s, 9 * chunk_s]], rtol=1e-12)
    # large: each member moves a quarter a reduce, the whole once (a reduce-scatter's bytes; a ring all-reduce moves
    # twice three quarters), plus the chains' chunk times
    end = collectives.reduce_to_each(links, g, nbytes).max()
    assert nbytes / (2e9 / 8) < end <= nbytes / (2e9 / 8) + 4 * 3 * chunk_s
    assert end < collectives.ring_allreduce(links, g, nbytes).max()


def test_small_collectives_follow_nccls_binary_tree_and_the_ring_from_the_root():
    # NCCL 2.8.4's tree over 14 ranks (graph/trees.cc's illustration): 8 under 0; 4 and 12 under 8; ...
    parents = [collectives.btree_parent(14, r) for r in range(14)]
    assert parents == [-1, 2, 4, 2, 8, 6, 4, 6, 0, 10, 12, 10, 8, 12]
    # four members on a line of delays: up 3 -> 2 -> 0 and 1 -> 2, then down the same hops
    delay = np.array([[0, 1, 2, 4], [1, 0, 8, 16], [2, 8, 0, 32], [4, 16, 32, 0]], dtype=float)  # ms, symmetric
    links = Links.from_topology(make_topology(delay, np.full((4, 4), 10.0)))
    g = np.arange(4)[None, :]
    # tree over 4: 1 -> 2, 3 -> 2, 2 -> 0; up: 2 has 1's (8 ms) and 3's (32 ms) at 32, 0 has it at 34; down: 0 at 34,
    # 2 at 36, 1 at 44, 3 at 68
    np.testing.assert_allclose(collectives.small_allreduce(links, g) * 1e3, [[34, 44, 36, 68]])
    # a member that enters late holds everyone above it up
    late = collectives.small_allreduce(links, g, start=np.array([[0, 100, 0, 0]]) / 1e3) * 1e3
    np.testing.assert_allclose(late, [[110, 120, 112, 144]])
    # broadcast from member 3 along the ring 3 -> 0 -> 1 -> 2: 4, 5, 13 ms
    np.testing.assert_allclose(collectives.small_broadcast(links, g, 3) * 1e3, [[4, 5, 13, 0]])


def test_links_shaped_per_destination_region_share_the_regions_rate_and_no_more(tmp_path):
    """link_classes: region (the paper's tc scripts): device 0 (region A) to both devices of B shares A -> B's
    1.5 Gbps; beside it, its flow inside A keeps 10 Gbps (no interface below the classes unless the scenario sets
    one); the emulated cluster shapes the same classes."""
    from harness.scenario import load_scenario
    from tests.test_scenario import GOOD, write

    topo = load_scenario(str(write(tmp_path, GOOD.replace("name: t\n", "name: t\nlink_classes: region\n"))))
    for nic in ("shared", "per-pair"):
        links = Links.from_topology(topo, nic=nic)
        gbps = lambda src, dst: links.fair_rates(np.array(src), np.array(dst)) * 8 / 1e9  # noqa: E731
        np.testing.assert_allclose(gbps([0], [2]), [1.5])
        np.testing.assert_allclose(gbps([0, 0], [2, 3]), [0.75, 0.75])
        np.testing.assert_allclose(gbps([0, 0, 0], [1, 2, 3]), [10, 0.75, 0.75])
        np.testing.assert_allclose(gbps([0, 1], [2, 3]), [1.5, 1.5])  # two senders: a class each
    # per pair, the same flows share the device's fastest link (10 Gbps) and each keeps its pair's rate
    pair = Links.from_topology(load_scenario(str(write(tmp_path, GOOD))))
    np.testing.assert_allclose(pair.fair_rates(np.array([0, 0]), np.array([2, 3])) * 8 / 1e9, [1.5, 1.5])
    # the grouped sharded PS sees the class: device 0's two shards to B take twice one's time through it
    links = Links.from_topology(topo)
    shared = links.shared_seconds(np.array([0, 0]), np.array([2, 3]), 1.5e9 / 8)
    np.testing.assert_allclose(shared, [2.0, 2.0])
