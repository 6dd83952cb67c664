"""Data-parallel gradient sync inside one stage group C_j.

`sharded-ps` is the colocated sharded parameter server the cost model assumes
(eq. 2): member k of C_j owns shard k of the stage's flattened gradient; every
member sends shard k to member k (scatter-reduce), the owner sums the D_DP
contributions in member order, and sends the sum back to every member (gather).
All transfers are point-to-point and posted at once, so each device exchanges
2(D_DP-1)/D_DP of the gradient with its peers concurrently. Every member ends with
bit-identical gradients (one device sums each shard).

`allreduce` is torch.distributed's all-reduce on a process group per C_j.

A compressed exchange (`layout.dp_compress`, compute/compression.py) is CocktailSGD's (CompressedParameterServer):
each replica first takes its optimizer step on its own gradient, then the replicas average their parameter deltas
from the last synced parameters through the sharded parameter server, every message encoded: a member encodes each
shard of its delta, the owner decodes and averages them, adds its server error and encodes the mean once for
everyone. Off, the plain server of gradients runs untouched.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ...compute.compression import NONE, Compression, shard_sizes
from ...train.compression import ErrorFeedback, ShardCodec

# Tags keep concurrent point-to-point messages apart; (iteration, kind, index) -> int.
TAG_STRIDE = 100_000


def tag(iteration: int, kind: int, index: int) -> int:
    return (iteration % 10_000) * TAG_STRIDE + kind * 10_000 + index


KIND_SCATTER, KIND_GATHER = 3, 4


def flatten_grads(params: list[torch.nn.Parameter]) -> torch.Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float() for p in params])


def unflatten_into_grads(flat: torch.Tensor, params: list[torch.nn.Parameter]) -> None:
    off = 0
    for p in params:
        n = p.numel()
        g = flat[off:off + n].view_as(p).to(p.dtype)
        if p.grad is None:
            p.grad = g.clone()
        else:
            p.grad.copy_(g)
        off += n


def flatten_values(params: list[torch.nn.Parameter]) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).float() for p in params])


def unflatten_into_values(flat: torch.Tensor, params: list[torch.nn.Parameter]) -> None:
    off = 0
    for p in params:
        n = p.numel()
        p.copy_(flat[off:off + n].view_as(p).to(p.dtype))
        off += n


class ShardedParameterServer:
    """Scatter-reduce then gather over the members of C_j, point-to-point.

    `post(it, numel)` posts every receive of iteration `it` (both phases) ahead of
    time, so on high-latency links no phase waits an extra round trip for the
    receiver to become ready; `sync` then only sends and waits."""

    def __init__(self, members: list[int], me: int):
        self.members = members
        self.me = me  # my index in members

    def post(self, iteration: int, flat_numel: int, dtype: torch.dtype, device) -> dict:
        n = len(self.members)
        sizes = shard_sizes(flat_numel, n)
        contrib = [torch.empty(sizes[self.me], dtype=dtype, device=device) for _ in range(n)]
        out = [torch.empty(sizes[k], dtype=dtype, device=device) for k in range(n)]
        works = []
        for k, dev in enumerate(self.members):
            if k != self.me:
                works.append(dist.irecv(contrib[k], src=dev, tag=tag(iteration, KIND_SCATTER, k)))
                works.append(dist.irecv(out[k], src=dev, tag=tag(iteration, KIND_GATHER, k)))
        return {"contrib": contrib, "out": out, "scatter": works[0::2], "gather": works[1::2]}

    def sync(self, flat: torch.Tensor, iteration: int, posted: dict | None = None, sent=None) -> torch.Tensor:
        """The summed gradient; `sent()` is called once this member's shards are on their way (a fault
        point: the others wait on what this member has not yet received or sent)."""
        n = len(self.members)
        if n == 1:
            if sent is not None:
                sent()
            return flat
        if flat.is_cuda:
            return self._sync_batched(flat, iteration, sent)
        if posted is None:
            posted = self.post(iteration, flat.numel(), flat.dtype, flat.device)
        shards = list(flat.tensor_split(n))
        contrib, out = posted["contrib"], posted["out"]
        contrib[self.me] = shards[self.me]
        sends = [dist.isend(shards[k].contiguous(), dst=dev, tag=tag(iteration, KIND_SCATTER, self.me))
                 for k, dev in enumerate(self.members) if k != self.me]
        if sent is not None:
            sent()
        for w in posted["scatter"]:
            w.wait()
        total = contrib[0].clone()
        for c in contrib[1:]:
            total += c
        out[self.me] = total
        sends += [dist.isend(total, dst=dev, tag=tag(iteration, KIND_GATHER, self.me))
                  for k, dev in enumerate(self.members) if k != self.me]
        for w in posted["gather"] + sends:
            w.wait()
        return torch.cat(out)

    def _sync_batched(self, flat: torch.Tensor, iteration: int, sent=None) -> torch.Tensor:
        """NCCL: each phase's sends and receives as one group (a pair's operations otherwise
        run in issue order on one stream, and two receives posted first would deadlock)."""
        n = len(self.members)
        shards = list(flat.tensor_split(n))
        peers = [(k, dev) for k, dev in enumerate(self.members) if k != self.me]
        contrib = [torch.empty_like(shards[self.me]) for _ in range(n)]
        contrib[self.me] = shards[self.me]
        ops = [dist.P2POp(dist.irecv, contrib[k], dev) for k, dev in peers]
        ops += [dist.P2POp(dist.isend, shards[k].contiguous(), dev) for k, dev in peers]
        works = dist.batch_isend_irecv(ops)
        if sent is not None:
            sent()
        for w in works:
            w.wait()
        total = contrib[0].clone()
        for c in contrib[1:]:
            total += c
        out = [torch.empty_like(s) for s in shards]
        out[self.me] = total
        ops = [dist.P2POp(dist.irecv, out[k], dev) for k, dev in peers]
        ops += [dist.P2POp(dist.isend, total, dev) for k, dev in peers]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        return torch.cat(out)


class CompressedParameterServer:
    """CocktailSGD's exchange (module docstring): after each replica's own optimizer step, the sharded parameter
    server's two phases average the replicas' parameter deltas from the last synced parameters, each message
    encoded. Every member keeps those parameters (`synced`, alike everywhere); with error feedback a replica keeps in
    its parameters what its message did not carry (CocktailSGD's worker error), the owner its shard's server error."""

    def __init__(self, members: list[int], me: int, compression: Compression):
        self.members, self.me, self.c = members, me, compression
        self.codecs: dict[int, ShardCodec] = {}
        self.server = ErrorFeedback(compression.error_feedback)
        self.synced: torch.Tensor | None = None

    def codec(self, m: int, device) -> ShardCodec:
        if m not in self.codecs:
            self.codecs[m] = ShardCodec(self.c, m, device)
        return self.codecs[m]

    def _buffers(self, flat_numel: int, device) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Where the messages arrive: the others' shards of this member's own, and every owner's mean."""
        sizes = shard_sizes(flat_numel, len(self.members))
        mine = self.codec(sizes[self.me], device).bytes
        contrib = [torch.empty(mine, dtype=torch.uint8, device=device) for _ in self.members]
        out = [torch.empty(self.codec(m, device).bytes, dtype=torch.uint8, device=device) for m in sizes]
        return contrib, out

    def post(self, iteration: int, flat_numel: int, dtype: torch.dtype, device) -> dict | None:
        if device is not None and torch.device(device).type == "cuda":
            return None  # NCCL: each phase batched at sync time (ShardedParameterServer._sync_batched)
        contrib, out = self._buffers(flat_numel, device)
        works = {"scatter": [], "gather": []}
        for k, dev in enumerate(self.members):
            if k != self.me:
                works["scatter"].append(dist.irecv(contrib[k], src=dev, tag=tag(iteration, KIND_SCATTER, k)))
                works["gather"].append(dist.irecv(out[k], src=dev, tag=tag(iteration, KIND_GATHER, k)))
        return {"contrib": contrib, "out": out, **works}

    def _phase(self, iteration: int, kind: int, sends: dict[int, torch.Tensor], recv: list[torch.Tensor],
               posted_works: list | None, sent=None) -> None:
        """Send `sends` (member index -> message) and complete the receives into `recv`: pre-posted (gloo), or
        posted now with the sends as one batch (NCCL)."""
        peers = [(k, dev) for k, dev in enumerate(self.members) if k != self.me]
        if posted_works is None:
            ops = [dist.P2POp(dist.irecv, recv[k], dev) for k, dev in peers]
            ops += [dist.P2POp(dist.isend, sends[k], dev) for k, dev in peers]
            works = dist.batch_isend_irecv(ops)
        else:
            works = posted_works + [dist.isend(sends[k], dst=dev, tag=tag(iteration, kind, self.me))
                                    for k, dev in peers]
        if sent is not None:
            sent()
        for w in works:
            w.wait()

    def begin(self, params: torch.Tensor) -> None:
        """Before the first local step on this layout: the synced parameters are this replica's. At the start every
        replica holds the same; after a re-plan they may differ by their residuals, a difference that does not grow
        (every member adds the same steps)."""
        if self.synced is None:
            self.synced = params.detach().clone()

    def average(self, params: torch.Tensor, iteration: int, posted: dict | None = None, sent=None) -> torch.Tensor:
        """This replica's parameters after the exchange: the synced parameters plus the replicas' mean delta as the
        owners' messages carry it, plus (error feedback) what this replica's own message did not carry."""
        n = len(self.members)
        if n == 1:
            if sent is not None:
                sent()
            self.synced = params.detach().clone()
            return params
        if posted is None and not params.is_cuda:
            posted = self.post(iteration, params.numel(), params.dtype, params.device)
        sizes = shard_sizes(params.numel(), n)
        contrib, out = self._buffers(params.numel(), params.device) if posted is None else (posted["contrib"],
                                                                                             posted["out"])
        delta = params - self.synced
        encoded = [self.codec(m, params.device).encode(x, iteration) for m, x in zip(sizes, delta.tensor_split(n))]
        mine = self.codec(sizes[self.me], params.device)
        self._phase(iteration, KIND_SCATTER, {k: msg for k, (msg, _) in enumerate(encoded)}, contrib,
                    None if posted is None else posted["scatter"], sent)
        total = encoded[self.me][1].clone()
        for k in range(n):
            if k != self.me:
                total += mine.decode(contrib[k], iteration)
        mean = self.server.add(total / n)
        msg, carried = mine.encode(mean, iteration)
        self.server.keep(mean, carried)
        self._phase(iteration, KIND_GATHER, {k: msg for k in range(n)}, out,
                    None if posted is None else posted["gather"])
        step = torch.cat([carried if k == self.me else self.codec(m, params.device).decode(out[k], iteration)
                          for k, m in enumerate(sizes)])
        self.synced = self.synced + step
        if not self.c.error_feedback:
            return self.synced.clone()
        return params - torch.cat([hat for _, hat in encoded]) + step


class AllReduceSync:
    """All-reduce (sum) over a process group holding exactly C_j."""

    def __init__(self, group):
        self.group = group

    def post(self, iteration: int, flat_numel: int, dtype: torch.dtype, device) -> None:
        return None

    def sync(self, flat: torch.Tensor, iteration: int, posted=None, sent=None) -> torch.Tensor:
        if sent is not None:  # a collective: this member's part goes with the call
            sent()
        if self.group is not None:
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        return flat


def _sharded_ps(groups: list[list[int]], stage: int, me: int, compression: Compression = NONE):
    if compression.off:
        return ShardedParameterServer(groups[stage], me)
    return CompressedParameterServer(groups[stage], me, compression)


def _allreduce(groups: list[list[int]], stage: int, me: int, compression: Compression = NONE) -> AllReduceSync:
    pgs = [dist.new_group(g) if len(g) > 1 else None for g in groups]  # collective: every rank makes every group
    return AllReduceSync(pgs[stage])


# layout.DP_SYNCS names them (layout.py imports no torch); one factory per name.
DP_SYNC_FACTORIES = {"sharded-ps": _sharded_ps, "allreduce": _allreduce}


def make_dp_sync(mode: str, groups: list[list[int]], stage: int, me: int, compression: Compression = NONE):
    """The sync object of this rank's stage group. Every rank must call this (group creation is collective).
    A compression other than none runs on the sharded parameter server only (the layout checks it)."""
    return DP_SYNC_FACTORIES[mode](groups, stage, me, compression)
