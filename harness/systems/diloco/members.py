"""A rank's torchft pieces, for DiLoCo's replicas of devices (runtime.py) and of ours' pipelines
(pipeline_replicas.py): the Lighthouse on `--lighthouse-device`'s rank, each replica's store on its first rank,
every rank's Manager over the cross-replica group of its position in its replica (codec.py's wire), and the row an
outer sync leaves in the records.
"""
from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import TCPStore

os.environ.setdefault("RUST_LOG", "warn")  # torchft's servers (read when it loads) log every quorum at info

from torchft import Manager  # noqa: E402 (after RUST_LOG) here, not in the rank: a job forks with them loaded
from torchft.local_sgd import DiLoCo  # noqa: E402

from ...files import atomic_write_text  # noqa: E402
from ...plan.request import RunSpec  # noqa: E402
from ...train.quorum_agent import STAYING_MARK, ended_file, lighthouse_file  # noqa: E402
from ...train.rank import RankContext  # noqa: E402
from .codec import WireProcessGroup  # noqa: E402
from .settings import DiLoCoSettings, fragment_cuts  # noqa: E402

ADAMW = {"weight_decay": 0.1, "betas": (0.9, 0.95)}  # DiLoCo's inner AdamW (Douillard et al. 2023, sec. 3)


@dataclass
class Member:
    """A rank's torchft pieces, kept for the run (the store's server lives as long as its object)."""
    manager: Manager
    lighthouse: object | None  # the Lighthouse, on its device's rank
    store: TCPStore | None  # the replica's store, on its first rank

    def shutdown(self) -> None:
        self.manager.shutdown(wait=False)
        if self.lighthouse is not None:
            self.lighthouse.shutdown()


def join_torchft(ctx: RankContext, spec: RunSpec, s: DiLoCoSettings, *, replica: int, group_rank: int, k: int,
                 leader_rank: int, one_job: bool, state_dict, load_state_dict, on_send) -> Member:
    """This rank's Manager in replica `replica` (`k` ranks, this one its `group_rank`), and the Lighthouse when
    this rank's device runs it. `leader_rank`: the rank of this process group hosting the replica's store (its
    first; the addresses go round the group). `one_job`: the run is one job (the Lighthouse's address goes round
    too); else each replica is a job of its own (train/quorum_agent.py), which finds the Lighthouse's address in the
    quorum directory. Every Manager heartbeats before this returns, so the first quorum waits for them all."""
    logging.getLogger("torchft").setLevel(logging.WARNING)
    # at every quorum, on every rank: NCCL's flight recorder, which a CPU run has none of
    logging.getLogger("torchft.manager").addFilter(lambda rec: "flight recorder" not in rec.getMessage())
    timeout = timedelta(seconds=spec.run.group_timeout_s)
    sync_timeout = timedelta(seconds=s.sync_timeout or spec.run.group_timeout_s)  # settings.py: a peer lost in a sync
    lighthouse, lighthouse_addr, store = None, None, None
    if ctx.device_index == s.lighthouse_device:
        lighthouse, lighthouse_addr = _lighthouse(ctx, s.join_timeout)
    if group_rank == 0:
        store = TCPStore(ctx.addr, 0, is_master=True, wait_for_workers=False)
    every = [None] * ctx.world_size  # every rank's addresses over the default group
    dist.all_gather_object(every, [ctx.addr, store.port if store else None, lighthouse_addr])
    leader = every[leader_rank]
    if one_job:
        lighthouse_addr = next(e[2] for e in every if e[2])
    else:
        lighthouse_addr = _meet_lighthouse(ctx, lighthouse_addr, spec.run.group_timeout_s)
    # the all-reduce's own bound is its process group's; the Manager's (should_commit, a heal) is twice that, since
    # should_commit is a barrier over the replica's ranks: one of them may fail its all-reduce at once (a peer's
    # connection closed) while another waits out the sync timeout (a peer gone silent), and both must arrive
    manager = Manager(
        pg=WireProcessGroup(s.wire, sync_timeout, on_send), min_replica_size=1, use_async_quorum=False,
        load_state_dict=load_state_dict, state_dict=state_dict,
        rank=group_rank, world_size=k, store_addr=leader[0], store_port=leader[1], lighthouse_addr=lighthouse_addr,
        replica_id=f"replica{replica}", hostname=ctx.addr, init_sync=False, timeout=2 * sync_timeout,
        quorum_timeout=timeout, connect_timeout=timeout,
        checkpoint_transport=_checkpoint_transport(ctx.addr, timeout))
    if one_job:
        dist.barrier()
    else:
        _all_heartbeating(ctx, spec.layout.devices, spec.run.group_timeout_s)
    return Member(manager, lighthouse, store)


def stay_for_the_others(ctx: RankContext, timeout_s: float) -> None:
    """A replica that is a job of its own and holds the Lighthouse stays after its training until the quorum agent
    says every other replica is done: those behind (a sync timed out) still need its quorums."""
    ctx.mark(STAYING_MARK)
    wait_for(ended_file(ctx.journal).exists, timeout_s, "the other replicas did not end")


def fragments_of(model: torch.nn.Module, fragments: int) -> list[torch.nn.Module]:
    """A GPT, or one of its pipeline stages (train/gpt.Stage), in `fragments` runs of consecutive blocks, as even as
    they go (the embedding, if it holds it, with the first; the head with the last): Streaming DiLoCo's fragments
    (one: the whole module)."""
    cuts = fragment_cuts(len(model.blocks), fragments)
    out = []
    for i in range(fragments):
        parts = [model.embed] if i == 0 and model.embed is not None else []
        parts += list(model.blocks[cuts[i]:cuts[i + 1]])
        parts += [model.head] if i == fragments - 1 and model.head is not None else []
        out.append(torch.nn.ModuleList(parts))
    return out


def diloco_of(manager: Manager, module: torch.nn.Module, inner: torch.optim.Optimizer, s: DiLoCoSettings) -> DiLoCo:
    """torchft's DiLoCo over `module`'s fragments, each with its own outer Nesterov SGD (a shared one would also
    step the other fragments' parameters on the inner gradients they still hold); it syncs in `inner`'s post-step
    hook."""
    fragments = fragments_of(module, s.fragments)
    outer = [torch.optim.SGD(f.parameters(), lr=s.outer_lr, momentum=s.outer_momentum, nesterov=s.outer_momentum > 0)
             for f in fragments]
    return DiLoCo(manager, fragments, inner, outer, sync_every=s.sync_every, backup_device=torch.device("cpu"),
                  pin_memory=False, use_bucketization=True, fragment_sync_delay=s.fragment_sync_delay,
                  fragment_update_alpha=s.fragment_update_alpha)


def sync_row(ctx: RankContext, manager, iteration: int, replica: int, outer_step: int, fragment: int,
             seconds: float, sent: list, end: float) -> dict:
    """An outer sync's row of the records (outer_syncs.csv): `outer_step` the manager's step before it (a higher
    one after: committed), `sent` this rank's bytes in outer syncs [in all, at the last sync's end] (moved on)."""
    row = {"iteration": iteration, "rank": ctx.device_index, "replica": replica,
           "outer_step": manager.current_step(), "fragment": fragment, "seconds": seconds,
           "bytes": sent[0] - sent[1], "participants": manager.num_participants(),
           "committed": int(manager.current_step() > outer_step), "end": end}
    sent[1] = sent[0]  # a fragment's bytes leave from its prepare step on (fragment_sync_delay)
    return row


def _lighthouse(ctx: RankContext, join_timeout_s: float):
    """torchft's Lighthouse on this rank's device: any quorum of at least one replica, formed as soon as every
    replica of the last quorum still heartbeating has asked, or `join_timeout_s` after the round's first request."""
    from torchft.coordination import LighthouseServer

    server = LighthouseServer(bind=f"{ctx.addr}:0", min_replicas=1, join_timeout_ms=int(join_timeout_s * 1000))
    port = int(server.address().rsplit(":", 1)[1])  # it names itself by host name: peers need the address
    return server, f"http://{ctx.addr}:{port}"


def _meet_lighthouse(ctx: RankContext, mine: str | None, timeout_s: float) -> str:
    """A replica started on its own (train/quorum_agent.py) learns the Lighthouse's address from the file its rank
    writes in the run's quorum directory (the parent of every replica's journal)."""
    path = lighthouse_file(ctx.journal)
    if mine is not None:
        atomic_write_text(path, mine)
        return mine
    wait_for(path.exists, timeout_s, f"no Lighthouse address in {path}")
    return path.read_text()


def _all_heartbeating(ctx: RankContext, devices: int, timeout_s: float) -> None:
    """A replica started on its own says its manager is up (heartbeating) and waits until every device's has been,
    so that the first quorum waits for them all; a replica back mid-run finds them all there and goes on."""
    here = lighthouse_file(ctx.journal).parent
    atomic_write_text(here / f"up-{ctx.device_index}", "")
    wait_for(lambda: len(list(here.glob("up-*"))) >= devices, timeout_s, "not every replica's manager was up")


def wait_for(done, timeout_s: float, failing: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{failing} after {timeout_s:g} s")
        time.sleep(0.05)


def _checkpoint_transport(addr: str, timeout: timedelta):
    """torchft's HTTP transport, advertised on the device's address (it would give the host name, which every
    rank of the emulated cluster shares)."""
    from torchft.checkpointing.http_transport import HTTPTransport

    class DeviceHTTPTransport(HTTPTransport):
        def address(self) -> str:
            return super().address().replace(f"//{socket.gethostname()}:", f"//{addr}:", 1)

    return DeviceHTTPTransport(timeout=timeout, num_chunks=0)
