"""Data-parallel gradient sync inside one stage group C_j.

`sharded-ps` is the colocated sharded parameter server the cost model assumes
(eq. 2): member k of C_j owns shard k of the stage's flattened gradient; every
member sends shard k to member k (scatter-reduce), the owner sums the D_DP
contributions in member order, and sends the sum back to every member (gather).
All transfers are point-to-point and posted at once, so each device exchanges
2(D_DP-1)/D_DP of the gradient with its peers concurrently. Every member ends with
bit-identical gradients (one device sums each shard).

`allreduce` is torch.distributed's all-reduce on a process group per C_j.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

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
        sizes = [len(r) for r in torch.arange(flat_numel).tensor_split(n)]
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


def _sharded_ps(groups: list[list[int]], stage: int, me: int) -> ShardedParameterServer:
    return ShardedParameterServer(groups[stage], me)


def _allreduce(groups: list[list[int]], stage: int, me: int) -> AllReduceSync:
    pgs = [dist.new_group(g) if len(g) > 1 else None for g in groups]  # collective: every rank makes every group
    return AllReduceSync(pgs[stage])


# layout.DP_SYNCS names them (layout.py imports no torch); one factory per name.
DP_SYNC_FACTORIES = {"sharded-ps": _sharded_ps, "allreduce": _allreduce}


def make_dp_sync(mode: str, groups: list[list[int]], stage: int, me: int):
    """The sync object of this rank's stage group. Every rank must call this (group creation is collective)."""
    return DP_SYNC_FACTORIES[mode](groups, stage, me)
