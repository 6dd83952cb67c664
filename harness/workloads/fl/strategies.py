"""How the model reaches the workers before a round: one registry of strategies, one interface.

Every strategy turns (model, federation, batch) into a list of transfers (flows.Transfer) and is
timed by the same simulator (flows.py), so they differ only in what they send, from where, and
in which pieces.

- naive: every worker pulls the whole model from the server, then computes (Naive FL [16]).
- overlap: every worker pulls layer by layer in forward order from the server and computes each
  layer once it has arrived (Overlap FL [42]).
- ipart: layers packed in forward order so that each pack's transfer overlaps the previous pack's
  computation while paying fewer set-ups (IPart [43]): the packing that minimises the forward by
  IPart's estimate (a round trip per pack, bytes at the worker's share of the server's uplink).
- owl: Algorithm 1 groups every base's branches into D_r groups (largest branch into the smallest
  group); in every rack the workers split into D_r communication groups whose first worker pulls
  its group from the server (constraint 8: each rack covers every group once), and every other
  worker pulls it from that worker (constraint 9), its own communication group's first (Fig. 6,
  centralized deployment); Algorithm 2 tries D = 1..n (D_r = min(D, branches)) and keeps the
  fastest round.
- owl-de: OWL's groups deployed decentralized (Sec. 4.4, eq. 14, Fig. 6): every worker pulls every group from
  the server itself, starting with its communication group's; Algorithm 2 over D as for owl.
- owl-a, owl-b: the ablations of Sec. 6.4: Algorithm 1's groups without the deploying algorithm (D = n, every
  group through the rack's first worker: an unbalanced deployment), and Algorithm 2 over random groupings.
- oos: the paper's offline optimum as a bound: the rack-fed fluid limit, fully overlapped (no transfers).
- optimal: the same deployment as owl over every grouping of every base (every set partition into at most
  n groups): exhaustive where they number at most OPTIMAL_LIMIT, else a local search from owl's plan.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from .federation import Federation, FLError
from .flows import SERVER, Transfer, arrivals, forward_end, layer_bytes, layer_ready, layer_seconds
from .grouping import bell, greedy_groups, partitions, random_groups
from .models import BYTES_PER_PARAM, BranchyModel

OPTIMAL_LIMIT = 2000  # groupings the exhaustive search may simulate


@dataclass(frozen=True)
class Round:
    """One simulated round of one strategy."""

    strategy: str
    seconds: float  # forward (overlapping distribution) + backward, aggregation and update
    distribution_seconds: float  # until the last worker holds the whole model
    forward_seconds: float  # until the last worker's forward ends
    e0_seconds: float  # backward + gradient all-reduce + update: the same for every strategy
    server_bytes: float
    config: dict = field(default_factory=dict)
    transfers: tuple[Transfer, ...] = field(default=(), repr=False)  # the plan: what the emulated run sends


@dataclass(frozen=True)
class Strategy:
    name: str
    run: Callable[[BranchyModel, Federation, int], Round]
    summary: str
    in_all: bool = True  # run by `--strategy all` (the exhaustive search only when named)
    plan: bool = True  # its round is a plan of transfers the emulated cluster can run (False: a bound)


STRATEGIES: dict[str, Strategy] = {}
NORMALISE_TO = "naive"  # the paper normalises training time to Naive FL's (Sec. 6.1)


def register(name: str, summary: str, in_all: bool = True, plan: bool = True):
    def deco(fn):
        STRATEGIES[name] = Strategy(name, fn, summary, in_all, plan)
        return fn
    return deco


def get(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise FLError(f"--strategy: unknown strategy {name!r} (known: {', '.join(STRATEGIES)}, all)")
    return STRATEGIES[name]


def selected(spec: str) -> list[str]:
    """`all`, or strategies' names separated by commas -> the strategies to run (each once, in that order)."""
    if spec == "all":
        return [s.name for s in STRATEGIES.values() if s.in_all]
    names = [get(n.strip()).name for n in spec.split(",")]
    return list(dict.fromkeys(names))


def e0_seconds(model: BranchyModel, fed: Federation, batch: int) -> float:
    """Backward (twice the forward's FLOPs) on the slowest worker, then a ring all-reduce of the gradients
    over all workers in rack order (2(W-1) steps of 1/W of the model; the ring's slowest hop is an
    inter-rack one when there are several racks) (Sec. 2.1: aggregation through all-reduce)."""
    backward = 2 * model.fwd_flop * batch / min(fed.flops_per_s)
    W, R = fed.workers, len(fed.racks)
    rates, delays = fed.rack_links()
    hops = [(r, (r + 1) % R) for r in range(R)] if R > 1 else []  # the ring's hops between racks
    hops += [(r, r) for r in range(R) if fed.racks[r] > 1]  # and inside them
    rate = min(rates[a, b] for a, b in hops)
    delay = max(delays[a, b] for a, b in hops)
    nbytes = model.params * BYTES_PER_PARAM
    allreduce = 2 * (W - 1) * (nbytes / W / rate + delay) if W > 1 else 0.0
    return backward + allreduce


def simulate(name: str, model: BranchyModel, fed: Federation, batch: int, transfers: list[Transfer],
             config: dict | None = None) -> Round:
    arrive = arrivals(fed, transfers)
    ready = layer_ready(model, fed, transfers, arrive)
    secs = layer_seconds(model, fed, batch)
    cache: dict[bytes, float] = {}
    ends = []
    for w in range(fed.workers):
        key = ready[w].tobytes() + secs[w].tobytes()
        if key not in cache:
            cache[key] = forward_end(model, secs[w], ready[w])
        ends.append(cache[key])
    fwd = max(ends)
    e0 = e0_seconds(model, fed, batch)
    server = sum(t.nbytes for t in transfers if t.src == SERVER)
    return Round(name, fwd + e0, float(ready.max()), fwd, e0, float(server), dict(config or {}), tuple(transfers))


def _from_server(fed: Federation, packs: list[list[int]], nbytes: np.ndarray) -> list[Transfer]:
    return [Transfer(w, SERVER, tuple(p), float(nbytes[p].sum()), "server")
            for p in packs for w in range(fed.workers)]


@register("naive", "the whole model from the server, then computation")
def naive(model: BranchyModel, fed: Federation, batch: int) -> Round:
    nbytes = layer_bytes(model)
    return simulate("naive", model, fed, batch, _from_server(fed, [list(range(len(nbytes)))], nbytes))


@register("overlap", "layer by layer from the server, each layer computed once it arrives")
def overlap(model: BranchyModel, fed: Federation, batch: int) -> Round:
    nbytes = layer_bytes(model)
    packs = [[l] for l in range(len(nbytes)) if nbytes[l] > 0]
    return simulate("overlap", model, fed, batch, _from_server(fed, packs, nbytes), {"messages": len(packs)})


def ipart_packs(model: BranchyModel, fed: Federation, batch: int) -> list[list[int]]:
    """Forward-order packs of layers that minimise the round's forward by IPart's own estimate: a pack costs a
    request round trip (its set-up) plus its bytes at the worker's share of the server's uplink, packs arrive
    one after another, and a pack computes once it has arrived and the previous pack has computed. Exact for
    that estimate: dynamic programming over (last layer, number of packs), which fixes the arrival time."""
    nbytes = layer_bytes(model)
    secs = layer_seconds(model, fed, batch).max(0)
    L = len(nbytes)
    srates, sdelays = fed.server_links()
    share = min(fed.uplink_Bps / fed.workers, srates.min())
    setup = 2 * sdelays.max()
    sent = np.concatenate([[0.0], np.cumsum(nbytes / share)])  # transfer seconds of layers [0, i)
    work = np.concatenate([[0.0], np.cumsum(secs)])
    # done[p][i]: the earliest end of computing layers [0, i) in p packs; cut[p][i]: where the last pack starts
    done = np.full((L + 1, L + 1), np.inf)
    cut = np.zeros((L + 1, L + 1), dtype=int)
    done[0][0] = 0.0
    for p in range(1, L + 1):
        for i in range(p, L + 1):
            arrive = p * setup + sent[i]
            j = np.arange(p - 1, i)
            ends = np.maximum(done[p - 1][j], arrive) + work[i] - work[j]
            k = int(np.argmin(ends))
            done[p][i], cut[p][i] = ends[k], j[k]
    p = int(np.argmin(done[:, L]))
    packs, i = [], L
    while p > 0:
        j = cut[p][i]
        packs.append(list(range(j, i)))
        i, p = j, p - 1
    return packs[::-1]


@register("ipart", "layers packed so that each pack's transfer covers the previous pack's computation")
def ipart(model: BranchyModel, fed: Federation, batch: int) -> Round:
    nbytes = layer_bytes(model)
    packs = ipart_packs(model, fed, batch)
    return simulate("ipart", model, fed, batch, _from_server(fed, packs, nbytes), {"messages": len(packs)})


def _branch_layers(model: BranchyModel) -> list[list[list[int]]]:
    """layers (indices into model.layers) of every branch of every base."""
    out = [[[] for _ in b.branches] for b in model.bases]
    for idx, (i, j, _) in enumerate(model.layers):
        out[i][j].append(idx)
    return out


def sized_branches(model: BranchyModel, base: int) -> list[int]:
    """The branches of a base that hold parameters (a pooling path has nothing to send)."""
    return [j for j, br in enumerate(model.bases[base].branches) if br.params > 0]


#: how a rack's groups reach its workers (Sec. 4.4, Fig. 6): centralized, each group through one central worker
#: of its communication group (the chunks' central workers spread); decentralized, every worker pulls every group
#: from the server itself, starting with its own; unbalanced, every group through the rack's first worker (OWL-A)
DEPLOYMENTS = ("centralized", "decentralized", "unbalanced")


def owl_transfers(model: BranchyModel, fed: Federation, groupings: list[list[list[int]]],
                  deployment: str = "centralized") -> list[Transfer]:
    """`deployment` (DEPLOYMENTS) of `groupings` (per base: groups of branch indices) in every rack."""
    if deployment not in DEPLOYMENTS:
        raise ValueError(f"deployment: {deployment!r} is not one of {DEPLOYMENTS}")
    nbytes = layer_bytes(model)
    layers_of = _branch_layers(model)
    server_lane: list[Transfer] = []
    peer: list[tuple[int, int, tuple[int, ...], float, tuple]] = []
    index: dict[tuple, int] = {}
    for r in range(len(fed.racks)):
        members = fed.members(r)
        for i, groups in enumerate(groupings):
            if not groups:
                continue
            chunks = np.array_split(np.array(members), len(groups))
            payload = [tuple(l for j in g for l in layers_of[i][j]) for g in groups]
            size = [float(nbytes[list(p)].sum()) for p in payload]
            if deployment == "decentralized":
                for g0, chunk in enumerate(chunks):
                    for w in chunk:
                        for step in range(len(groups)):
                            g = (g0 + step) % len(groups)
                            server_lane.append(Transfer(int(w), SERVER, payload[g], size[g], "server"))
                continue
            if deployment == "unbalanced":
                central = [members[0]] * len(groups)
            else:
                central = [int(c[i % len(c)]) for c in chunks]  # rotates over the bases: spreads the server pulls
            for g, c in enumerate(central):
                index[(r, i, g)] = len(server_lane)
                server_lane.append(Transfer(c, SERVER, payload[g], size[g], "server"))
            for g0, chunk in enumerate(chunks):
                for w in chunk:
                    for step in range(len(groups)):
                        g = (g0 + step) % len(groups)
                        if central[g] != w:
                            peer.append((int(w), central[g], payload[g], size[g], (r, i, g)))
    transfers = list(server_lane)
    transfers += [Transfer(w, src, layers, b, "peer", index[key]) for w, src, layers, b, key in peer]
    return transfers


def _owl_round(name, model, fed, batch, groupings, config, deployment="centralized") -> Round:
    return simulate(name, model, fed, batch, owl_transfers(model, fed, groupings, deployment),
                    {**config, "deployment": deployment} if deployment != "centralized" else config)


def _grouped(model: BranchyModel, D: int, grouping) -> list[list[list[int]]]:
    """Every base's sized branches in min(D, branches) groups by `grouping(sizes, groups)` (indices of sizes)."""
    out = []
    for i in range(len(model.bases)):
        sized = sized_branches(model, i)
        sizes = [model.bases[i].branches[j].params for j in sized]
        out.append([[sized[k] for k in g] for g in grouping(sizes, min(D, len(sized)))] if sized else [])
    return out


def eq15(alpha: float, D: int, n: int) -> float:
    """The paper's eq. 15: t_ce / t_de = alpha + D / n (1 - alpha), for a rack of n workers in D groups (eqs. 13
    and 14: the centralized and decentralized deployments' distribution times, bytes alone)."""
    return alpha + D / n * (1 - alpha)


def deployed(name: str, model: BranchyModel, fed: Federation, batch: int, D: int, deployment: str = "centralized",
             grouping=greedy_groups) -> Round:
    """One deployment at D communication groups, without Algorithm 2's search."""
    return _owl_round(name, model, fed, batch, _grouped(model, D, grouping), {"D": D}, deployment)


def deploying(name: str, model: BranchyModel, fed: Federation, batch: int, grouping=greedy_groups,
              deployment: str = "centralized") -> Round:
    """Algorithm 2: D = 1..n communication groups (D_r = min(D, the base's branches)), each grouped by
    `grouping` and deployed, the fastest round kept. D beyond every base's branches changes nothing: not tried."""
    best, tried = None, set()
    widths = [len(sized_branches(model, i)) for i in range(len(model.bases))]
    for D in range(1, max(fed.racks) + 1):
        key = tuple(min(D, w) for w in widths)
        if key in tried:
            continue
        tried.add(key)
        r = deployed(name, model, fed, batch, D, deployment, grouping)
        if best is None or r.seconds < best.seconds - 1e-12:
            best = r
    return best


@register("owl", "Algorithm 1 grouping + Algorithm 2 deploying: rack peers relay the groups they pulled")
def owl(model: BranchyModel, fed: Federation, batch: int) -> Round:
    return deploying("owl", model, fed, batch)


@register("owl-de", "OWL's groups, decentralized (eq. 14, Fig. 6): every worker pulls every group from the server",
          in_all=False)
def owl_decentralized(model: BranchyModel, fed: Federation, batch: int) -> Round:
    return deploying("owl-de", model, fed, batch, deployment="decentralized")


@register("owl-a", "ablation (Sec. 6.4): Algorithm 1's groups, no deploying algorithm (D = n, every group "
          "through the rack's first worker)", in_all=False)
def owl_a(model: BranchyModel, fed: Federation, batch: int) -> Round:
    return deployed("owl-a", model, fed, batch, max(fed.racks), "unbalanced")


OWL_B_SEED = 0  # the random grouping's seed; the reproduction averages several


def owl_b(model: BranchyModel, fed: Federation, batch: int, seed: int = OWL_B_SEED) -> Round:
    """Ablation (Sec. 6.4): Algorithm 2 over random groupings (grouping.random_groups), one draw per D."""
    rng = np.random.default_rng(seed)
    r = deploying("owl-b", model, fed, batch, grouping=lambda sizes, D: random_groups(sizes, D, rng))
    return replace(r, config={**r.config, "seed": seed})


register("owl-b", "ablation (Sec. 6.4): Algorithm 2's deploying over random groupings", in_all=False)(owl_b)


@register("oos", "the offline optimum as a bound: every rack's parameters at the server's fair share, in forward "
          "order, no set-up, no delay, fully overlapped", in_all=False, plan=False)
def oos(model: BranchyModel, fed: Federation, batch: int) -> Round:
    """The paper's OOS (Sec. 6.1): communication and computation fully overlapped, set-up time and delay hidden.
    Where the server feeds every rack (the paper's architecture: eq. 13's first term), each rack receives the
    whole model through the server's uplink, so no worker has the first k bytes before k x racks / uplink (nor
    faster than the server's link to its rack, or its interface, takes them in); layers land in forward order at
    that rate, and the forward runs as the simulator runs it; the slowest rack's decides."""
    nbytes = layer_bytes(model)
    srates, _ = fed.server_links()
    secs = layer_seconds(model, fed, batch)
    fwd, dist = 0.0, 0.0
    for rate in np.unique(np.minimum(np.minimum(srates, fed.uplink_Bps / len(fed.racks)), fed.worker_ingress_Bps)):
        ready = np.where(nbytes > 0, np.cumsum(nbytes) / rate, 0.0)
        dist = max(dist, float(ready.max()))
        fwd = max([fwd] + [forward_end(model, row, ready) for row in np.unique(secs, axis=0)])
    e0 = e0_seconds(model, fed, batch)
    return Round("oos", fwd + e0, dist, fwd, e0, float(len(fed.racks) * nbytes.sum()), {"bound": "rack-fed fluid"})


@register("optimal", "every grouping of every base under OWL's deployment: exhaustive where they number at most "
          f"{OPTIMAL_LIMIT}, else a local search from owl's plan", in_all=False)
def optimal(model: BranchyModel, fed: Federation, batch: int) -> Round:
    """The fastest round over every grouping of every base (any number of groups per base, centralized). Where
    the groupings number more than OPTIMAL_LIMIT (Inception-v4: about 10^14 on racks of 2), a local search
    instead: from owl's plan, each base in turn takes its best grouping with the others held, until no base
    changes; a local optimum, not proven the global one (config "method" says which; `oos` bounds both)."""
    n = max(fed.racks)
    per_base = [sized_branches(model, i) for i in range(len(model.bases))]
    count = float(np.prod([bell(len(s), min(n, len(s))) if s else 1 for s in per_base], dtype=float))
    choices = [[[[s[k] for k in g] for g in p] for p in partitions(len(s), min(n, len(s)))] if s else [[]]
               for s in per_base]
    if count <= OPTIMAL_LIMIT:
        best = None
        for groupings in itertools.product(*choices):
            r = _owl_round("optimal", model, fed, batch, list(groupings),
                           {"groups": [len(g) for g in groupings], "searched": int(count), "method": "exhaustive"})
            if best is None or r.seconds < best.seconds - 1e-12:
                best = r
        return best
    start = owl(model, fed, batch)
    current = _grouped(model, start.config["D"], greedy_groups)
    best, tried, changed = start, 1, True
    while changed:
        changed = False
        for i, options in enumerate(choices):
            for c in options:
                if c == current[i]:
                    continue
                trial = current[:i] + [c] + current[i + 1:]
                r = _owl_round("optimal", model, fed, batch, trial, {})
                tried += 1
                if r.seconds < best.seconds - 1e-12:
                    best, current, changed = r, trial, True
    return replace(best, strategy="optimal", config={"groups": [len(g) for g in current], "searched": tried,
                                                     "method": "local search from owl"})


def run(strategy: str, model: BranchyModel, fed: Federation, batch: int) -> Round:
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise FLError(f"--batch: must be a positive integer (got {batch!r})")
    return get(strategy).run(model, fed, batch)
