"""Collectives as their point-to-point steps over the links (netmodel/links.py), the algorithms NCCL uses
for these sizes and the paper's own for ours:
- ring all-reduce = reduce-scatter + all-gather, 2(D-1) steps of bytes/D;
  ring all-gather / reduce-scatter alone: D-1 steps; ring in rank order.
  A device starts step k once it has sent step k-1 and received the chunk of step
  k-1 from its predecessor (it needs it to reduce or forward).
- sharded parameter server (ours, Yuan et al. sec. 3.2): every device sends shard i
  of its gradient to device i, sums what it receives, and sends the sum back to all.
  `sharded_ps(mode="grouped")`: each exchange is one grouped all-to-all (all sends
  and receives posted in one NCCL group, as the paper's runtime does) that starts
  when the whole group is ready; it lasts as long as its busiest resource: the
  slowest pair (delay + shard / rate) or a device's egress/ingress carrying its
  D-1 shards, or a shared NIC (region class) carrying its shards out of (into) it
  (the makespan bound of a fluid schedule, exact when one resource dominates).
  `mode="rounds"`: D-1 rounds of a shifted all-to-all; in round k device p sends
  bytes/D to p+k and receives from p-k, each exchange a rendezvous (it starts
  when both ends reached the round, and the send completes
  when the receiver has the data, as a blocking NCCL send/recv pair).
- reduce to each member in turn (DeepSpeed ZeRO-1's gradient reduction): one NCCL
  ring reduce per member, each a pipelined chain along the ring that ends at it.
- an all-reduce or broadcast of a few bytes (a flag, a norm, a loss): NCCL's
  binary tree up and down, or its chain from the root; only delays count.
- gloo's dissemination barrier.
Every function is vectorised over concurrent groups: arrays (G, D) of device ids; the groups of one call run
together, sharing the interfaces and shared NICs they cross.
"""
from __future__ import annotations

import numpy as np

from .links import Connections, Links


def _entered(start, G: int, D: int) -> np.ndarray:
    """When each member (G, D) enters a collective: `start` broadcast (a copy), or all at 0."""
    return np.zeros((G, D)) if start is None else np.broadcast_to(np.asarray(start, dtype=float), (G, D)).copy()


def step_times(links: Links, src: np.ndarray, dst: np.ndarray, nbytes: float) -> tuple[np.ndarray, np.ndarray]:
    """(serialisation seconds, delay seconds) of concurrent transfers of nbytes each, at their fair shares."""
    rate = links.fair_rates(src, dst).reshape(src.shape)
    return links.serialization_s(src, dst, nbytes, rate), links.delay_s[src, dst]


def ring(links: Links, groups: np.ndarray, chunk_bytes, steps: int, start=None,
         conns: Connections | None = None) -> np.ndarray:
    """Finish time of every device after `steps` ring steps of chunk_bytes, one for every group or one per group
    (G,) (groups: (G, D) in ring order); `conns`: the connections' state so far (default: silent since the
    previous iteration)."""
    groups = np.atleast_2d(np.asarray(groups, dtype=int))
    G, D = groups.shape
    ready = _entered(start, G, D)
    chunk_bytes = np.broadcast_to(np.asarray(chunk_bytes, dtype=float), (G,))[:, None]
    if D == 1 or steps == 0 or not (chunk_bytes > 0).any():
        return ready
    succ = np.roll(groups, -1, axis=1)
    rate = links.fair_rates(groups, succ).reshape(groups.shape)
    ser, delay = links.serialization_s(groups, succ, chunk_bytes, rate), links.delay_s[groups, succ]
    conns = Connections(links) if conns is None else conns
    notice = links.protocol.step_handshake * links.delay_s[succ, groups]  # receiver's ready notice
    for _ in range(steps):
        begin = np.maximum(ready, np.roll(ready, -1, axis=1) + notice) if notice.any() else ready
        if conns.idle_matters:  # the first steps run on windows restarted after the iteration's silence
            ser = conns.send(groups, succ, chunk_bytes, begin, rate)
        sent = begin + ser
        arrive = np.roll(sent + delay, 1, axis=1)  # position p receives from p-1
        ready = np.maximum(sent, arrive)
    return ready


def ring_allreduce(links: Links, groups, nbytes, start=None, conns: Connections | None = None) -> np.ndarray:
    """All-reduce of a tensor of nbytes (one for every group or one per group) in every group at once."""
    groups = np.atleast_2d(groups)
    D = groups.shape[1]
    return ring(links, groups, np.asarray(nbytes, dtype=float) / D, 2 * (D - 1), start, conns)


def ring_allgather(links: Links, groups, nbytes, start=None, conns: Connections | None = None) -> np.ndarray:
    """All-gather (or reduce-scatter, the same traffic) of a tensor of nbytes in total."""
    groups = np.atleast_2d(groups)
    D = groups.shape[1]
    return ring(links, groups, np.asarray(nbytes, dtype=float) / D, D - 1, start, conns)


def sharded_ps(links: Links, groups, nbytes, start=None, mode: str = "grouped",
               preposted: bool = False) -> np.ndarray:
    """Finish times of the sharded parameter-server exchange of nbytes per device (one for every group or one
    per group; groups: (G, D)).

    preposted: every receive was posted before the exchange (ours' runtime posts an iteration's
    receives up front), so no transfer waits for a ready notice whatever the protocol."""
    groups = np.atleast_2d(np.asarray(groups, dtype=int))
    G, D = groups.shape
    ready = _entered(start, G, D)
    nbytes = np.broadcast_to(np.asarray(nbytes, dtype=float), (G,))
    if D == 1 or not (nbytes > 0).any():
        return ready
    shard = (nbytes / D)[:, None]
    handshake = 0 if preposted else links.protocol.step_handshake
    if mode == "grouped":
        return sharded_ps_phases(links, groups, nbytes, ready, preposted)[1]
    if mode != "rounds":
        raise ValueError(f"unknown sharded-PS mode {mode!r}")
    pos = np.arange(D)
    conns = Connections(links)
    for _phase in range(2):  # scatter gradient shards, then gather the aggregated shards
        for k in range(1, D):
            to = (pos + k) % D
            rate = links.fair_rates(groups, groups[:, to]).reshape(groups.shape)
            delay = links.delay_s[groups, groups[:, to]]
            notice = handshake * links.delay_s[groups[:, to], groups]
            begin = np.maximum(ready, ready[:, to] + notice)  # rendezvous with the receiver
            ser = conns.send(groups, groups[:, to], shard, begin, rate)
            arrive = begin + ser + delay  # at device `to`; the send completes on delivery
            recv_end = np.empty_like(arrive)
            recv_end[:, to] = arrive
            ready = np.maximum(arrive, recv_end)
    return ready


def sharded_ps_phases(links: Links, groups, nbytes, start=None,
                      preposted: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(end of the scatter, end of the gather) of every device's grouped sharded parameter server (G, D),
    each phase one all-to-all of every pair at once that starts when the whole group is in it (a
    library's grouped send/receive calls: NCCL's groupStart/groupEnd); preposted as sharded_ps. `nbytes`: a
    device's gradient, one for every group or one per group (G,); concurrent groups share the shared NICs."""
    groups = np.atleast_2d(np.asarray(groups, dtype=int))
    G, D = groups.shape
    ready = _entered(start, G, D)
    nbytes = np.broadcast_to(np.asarray(nbytes, dtype=float), (G,))
    if D == 1 or not (nbytes > 0).any():
        return ready, ready
    scatter, gather = _grouped_all_to_all(links, groups, nbytes / D, ready, exchanges=2,
                                          handshake=0 if preposted else links.protocol.step_handshake)
    return scatter, gather


#: the piece of a ring reduce each hop stores and forwards: NCCL_BUFFSIZE (4 MiB) over NCCL_STEPS (8), times
#: REDUCE_CHUNKSTEPS (1), the SIMPLE protocol a large message takes (NCCL 2.8.4 src/init.cc DEFAULT_BUFFSIZE,
#: src/include/devcomm.h, src/include/collectives.h, src/collectives/device/reduce.h)
NCCL_REDUCE_CHUNK_BYTES = (4 << 20) // 8


def reduce_to_each(links: Links, groups, nbytes, start=None) -> np.ndarray:
    """Finish time of every device (G, D) after reducing nbytes (one for every group or one per group) to its
    owners: member k owns the k-th of D slices and receives it as one NCCL ring reduce, for k = 0, 1, ... in turn
    (DeepSpeed 0.6.7's ZeRO-1 and 2 with its default reduce_scatter: one dist.reduce a partition, stage_1_and_2.py
    average_tensor). A reduce to k is a chain along the ring, k+1 -> k+2 -> ... -> k, that stores and forwards
    NCCL_REDUCE_CHUNK_BYTES at a time: the first chunk reaches each member after every hop's delay and chunk time
    (a member joins once its previous reduce is done), the rest streams behind it at the slowest hop so far.
    Each device moves a slice a reduce, nbytes in all: a reduce-scatter's bytes, at D chains' latency."""
    groups = np.atleast_2d(np.asarray(groups, dtype=int))
    G, D = groups.shape
    ready = _entered(start, G, D)
    piece = np.broadcast_to(np.asarray(nbytes, dtype=float), (G,)) / D
    if D == 1 or not (piece > 0).any():
        return ready
    chunk = np.minimum(piece, NCCL_REDUCE_CHUNK_BYTES)
    rows = np.arange(G)
    for k in range(D):
        chain = (k + 1 + np.arange(D)) % D  # member positions, the owner k last
        src, dst = groups[:, chain[:-1]], groups[:, chain[1:]]
        rate = links.fair_rates(src, dst).reshape(G, D - 1)
        first = links.serialization_s(src, dst, chunk[:, None], rate) + links.delay_s[src, dst]
        done = ready.copy()
        at = ready[rows, chain[0]]  # when the chain's head starts sending
        slowest = np.full(G, np.inf)
        for i in range(D - 1):
            slowest = np.minimum(slowest, rate[:, i])
            done[:, chain[i]] = at + piece / slowest  # its part sent
            at = np.maximum(at + first[:, i], ready[:, chain[i + 1]])
        done[:, k] = at + (piece - chunk) / slowest
        ready = done
    return ready


def btree_parent(nranks: int, rank: int) -> int:
    """The parent of `rank` in NCCL's binary tree over `nranks` (-1 for rank 0, the root): NCCL 2.8.4
    src/graph/trees.cc ncclGetBtree, whose first tree a few bytes take."""
    if rank == 0:
        return -1
    bit = 1
    while bit < nranks and not bit & rank:
        bit <<= 1
    up = (rank ^ bit) | (bit << 1)
    return up if up < nranks else rank ^ bit


def small_allreduce(links: Links, groups, start=None) -> np.ndarray:
    """When each member (G, D) has the result of an all-reduce of a few bytes (an overflow flag, a norm), entered at
    `start`: up NCCL's binary tree over the members in rank order (each its own host) to the first, then down
    again, each hop one delay; a member sends up once it is in the collective and has its children's values."""
    groups = np.atleast_2d(np.asarray(groups, dtype=int))
    G, D = groups.shape
    ready = _entered(start, G, D)
    parent = [btree_parent(D, r) for r in range(D)]
    depth = [0] * D
    for r in range(1, D):  # hops from r up to the root
        p = r
        while p > 0:
            p, depth[r] = parent[p], depth[r] + 1
    up = ready.copy()
    for r in sorted(range(1, D), key=lambda r: -depth[r]):  # deepest first: children before their parent
        p = parent[r]
        up[:, p] = np.maximum(up[:, p], up[:, r] + links.delay_s[groups[:, r], groups[:, p]])
    down = up.copy()
    for r in sorted(range(1, D), key=lambda r: depth[r]):
        p = parent[r]
        down[:, r] = down[:, p] + links.delay_s[groups[:, p], groups[:, r]]
    return down


def small_broadcast(links: Links, groups, root: int, start=None) -> np.ndarray:
    """When each member (G, D) has a few bytes broadcast by member `root`: NCCL's broadcast runs along the ring
    from the root (root, root+1, ...), a member forwarding once it is in the collective and has them."""
    groups = np.atleast_2d(np.asarray(groups, dtype=int))
    G, D = groups.shape
    ready = _entered(start, G, D)
    have = ready.copy()
    for i in range(1, D):
        prev, r = (root + i - 1) % D, (root + i) % D
        have[:, r] = np.maximum(ready[:, r], have[:, prev] + links.delay_s[groups[:, prev], groups[:, r]])
    return have


def dissemination_barrier(links: Links, ranks, arrive) -> np.ndarray:
    """When each rank leaves gloo's barrier (gloo/barrier.cc: the dissemination barrier of Hensgen, Finkel and
    Manber 1988), entered at `arrive` by ranks whose devices are `ranks` in rank order: in round k = 1, 2, 4,
    ... < N, rank r sends an empty message to r + k and waits for the one from r - k (mod N)."""
    ranks = np.asarray(ranks, dtype=int)
    t = np.asarray(arrive, dtype=float).copy()
    n, k = len(ranks), 1
    while k < n:
        src = (np.arange(n) - k) % n
        t = np.maximum(t, t[src] + links.delay_s[ranks[src], ranks])
        k <<= 1
    return t


def _grouped_all_to_all(links: Links, groups: np.ndarray, shard: np.ndarray, ready: np.ndarray, exchanges: int,
                        handshake: int) -> list[np.ndarray]:
    """Every device's finish time (G, D) after each exchange (shard: (G,), the bytes a pair of group g carries)."""
    G, D = groups.shape
    src = np.repeat(groups[:, :, None], D, axis=2)  # (G, D, D): src[g, p, q] = groups[g, p]
    dst = np.repeat(groups[:, None, :], D, axis=1)
    off = ~np.eye(D, dtype=bool)[None].repeat(G, 0)
    notice = handshake * links.delay_s[dst, src]
    out_load = (D - 1) * shard[:, None] / links.egress_Bps[groups]  # (G, D)
    in_load = (D - 1) * shard[:, None] / links.ingress_Bps[groups]
    min_delay = np.where(off, links.delay_s[src, dst], np.inf)
    busiest = np.maximum(out_load + min_delay.min(2), in_load + min_delay.min(1)).max(1)
    # a shared NIC or a region class carrying every group's shards: the groups of one call run together
    shared = links.shared_seconds(src[off], dst[off], np.broadcast_to(shard[:, None, None], src.shape)[off])
    if shared is not None:
        shared = shared.reshape(G, D * (D - 1)).max(1)
        busiest = np.maximum(busiest, shared + np.where(shared > 0, min_delay.min((1, 2)), 0.0))
    conns = Connections(links)
    shard = shard[:, None, None]
    ser = links.serialization_s(src, dst, shard)  # on connections in use
    t = ready.max(1)
    ends = []
    for _ in range(exchanges):  # every ordered pair carries a shard in each: scatter, then gather back
        if conns.idle_matters:  # the scatter's windows restarted after the iteration's silence
            ser = conns.send(src, dst, shard, t[:, None, None] + notice)
        pair = np.where(off, notice + links.delay_s[src, dst] + ser, 0.0).max((1, 2))
        t = t + np.maximum(pair, busiest)
        ends.append(np.repeat(t[:, None], D, axis=1))
    return ends
