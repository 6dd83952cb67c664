"""Bytes on the wire: what each rank's communication calls put on the network, counted where every
runtime calls the process group.

Every runtime here (ours' point-to-point sends and sharded parameter server, the baselines' DDP,
FSDP, tensor-parallel DTensors and pipelining schedules) ends in a c10d operator, and every c10d
operator passes the dispatcher, so one TorchDispatchMode sees them all without touching the
runtimes; HetPipe's parameter server, plain TCP, charges what it sends (`charge`). Each call is charged its payload bytes as the standard algorithm moves them from this
rank (p = the group's size, S = the call's data):

  send, isend                        S
  all-reduce                         2 (p - 1) / p x S        (ring: reduce-scatter, then all-gather)
  all-gather                         (p - 1) x S (the input)
  reduce-scatter, all-to-all         (p - 1) / p x S (the input)
  broadcast, reduce, gather, scatter (p - 1) / p x S          (any tree moves (p - 1) S in all;
                                                               charged evenly to the p ranks)
  receives, barriers, waits          0                        (the sender is charged)

Payload only: no TCP/IP or gloo framing, no retransmissions, so the count is exact and the same
on every machine (a changed count is a changed runtime). Where a backend picks another algorithm
(gloo's small all-reduces, NCCL trees), the real bytes differ by that algorithm's factor; the
point-to-point traffic (ours, pipelining) is exact as it is. An operator without a rule fails
the count rather than be charged nothing.

The mode makes every tensor operation pass through Python: counted runs are for the count, not
for their times (`debug.count_wire`).

A rank in the emulated cluster also reads what its interface sent to each device as the kernel counts it
(network/egress.py: frames, headers and acknowledgements included): free, so every emulated run has it.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from ..network.egress import EgressReader

_NAMESPACES = ("c10d", "_c10d_functional")
FREE = {"recv_", "recv_any_source_", "irecv", "barrier", "monitored_barrier_", "wait_tensor", "check_for_nan",
        "_wrap_tensor_autograd"}
SEND = {"send", "isend"}
ALL_REDUCE = {"allreduce_", "allreduce_coalesced_", "all_reduce", "all_reduce_", "all_reduce_coalesced",
              "all_reduce_coalesced_"}
ALL_GATHER = {"allgather_", "allgather_coalesced_", "_allgather_base_", "allgather_into_tensor_coalesced_",
              "all_gather_into_tensor", "all_gather_into_tensor_out", "all_gather_into_tensor_coalesced"}
SCATTER_LIKE = {"reduce_scatter_", "_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_",
                "reduce_scatter_tensor", "reduce_scatter_tensor_out", "reduce_scatter_tensor_coalesced",
                "alltoall_", "alltoall_base_", "all_to_all_single"}
# c10d's in-place collectives that take (outputs, inputs, ...); the rest take their input first
OUTPUTS_FIRST = {"allgather_", "allgather_coalesced_", "_allgather_base_", "allgather_into_tensor_coalesced_",
                 "reduce_scatter_", "_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_", "alltoall_",
                 "alltoall_base_", "gather_", "scatter_"}


class WireError(RuntimeError):
    pass


def _nbytes(x) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(y) for y in x)
    return 0


def _group_size(call: dict) -> int:
    """The size of the call's group: its process_group (c10d), group_size or group_name (functional)."""
    if "group_size" in call:
        return int(call["group_size"])
    pg = call.get("process_group", call.get("group_name"))
    if isinstance(pg, torch.ScriptObject):
        pg = dist.ProcessGroup.unbox(pg)
    elif isinstance(pg, str):
        pg = dist.distributed_c10d._resolve_process_group(pg)
    if not isinstance(pg, dist.ProcessGroup):
        raise WireError(f"wire: a collective without a process group ({sorted(call)})")
    return pg.size()


def charged_bytes(name: str, call: dict) -> float:
    """Bytes this rank puts on the wire for c10d operator `name`, called with `call` (its arguments
    by name; see the module's table)."""
    if name in FREE:
        return 0.0
    if name in SEND:
        return float(_nbytes(call.get("tensors", call.get("tensor"))))
    if name == "batch_p2p_ops":
        return float(sum(_nbytes(t) for op, t in zip(call["op_list"], call["tensors"]) if op == "isend"))
    p = _group_size(call)
    values = list(call.values())
    data = values[1] if name in OUTPUTS_FIRST else values[0]  # this rank's input
    if name in ALL_REDUCE:
        return 2 * (p - 1) / p * _nbytes(data)
    if name in ALL_GATHER:
        return float((p - 1) * _nbytes(data))
    if name in SCATTER_LIKE or name in ("broadcast_", "broadcast", "reduce_"):
        return (p - 1) / p * _nbytes(data)
    if name == "gather_":  # the root collects p inputs
        return (p - 1) / p * p * _nbytes(data)
    if name == "scatter_":  # the root splits p outputs' worth
        return (p - 1) / p * p * _nbytes(values[0])
    raise WireError(f"wire: no byte rule for the communication operator {name}")


def named_arguments(func, args: tuple, kwargs: dict) -> dict:
    """An operator call's arguments by their schema names, in schema order."""
    names = [a.name for a in func._schema.arguments]
    return {**dict(zip(names, args)), **kwargs}


class WireCounter(TorchDispatchMode):
    """Counts the bytes this process's communication calls put on the wire (module docstring);
    `take()` returns those since the last take (one iteration's, when a runtime takes once per
    iteration)."""

    def __init__(self):
        super().__init__()
        self.total = 0.0
        self._taken = 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace in _NAMESPACES:
            self.total += charged_bytes(func._opname, named_arguments(func, args, kwargs))
        return func(*args, **kwargs)

    def take(self) -> int:
        n = round(self.total - self._taken)
        self._taken = self.total
        return n


_active: WireCounter | None = None
_egress: dict = {}  # while counting on a shaped interface: "reader" (EgressReader), "last" (Egress at the last take)


@contextlib.contextmanager
def counting(on: bool, ifname: str = ""):
    """Count this process's payload bytes inside the block (when `on`), and its interface's egress per
    destination where `ifname` is an interface the harness shaped; `take_iteration()` reads both."""
    global _active
    reader = EgressReader(ifname) if ifname else None
    last = reader.read() if reader else None
    if last is not None:
        _egress.update(reader=reader, last=last)
    _active = WireCounter() if on else None
    try:
        if _active is None:
            yield None
        else:
            with _active:
                yield _active
    finally:
        _active = None
        _egress.clear()
        if reader is not None:
            reader.close()


def charge(nbytes: int) -> None:
    """Count `nbytes` sent outside torch.distributed (HetPipe's parameter-server traffic over TCP), when counting."""
    if _active is not None:
        _active.total += nbytes


def take() -> int | None:
    """Bytes this rank put on the wire since the last take, or None when the run does not count."""
    return None if _active is None else _active.take()


def take_egress() -> dict | None:
    """What this rank's interface sent since the last take, {"to": {device: bytes}, "unclassified": bytes}, or
    None off the emulated cluster."""
    if not _egress:
        return None
    now = _egress["reader"].read()
    sent, _egress["last"] = now.since(_egress["last"]), now
    return {"to": sent.to, "unclassified": sent.unclassified}


def take_iteration() -> dict:
    """Both counts since the last take, as IterationStats' fields (a runtime takes once per iteration)."""
    return {"wire_bytes": take(), "egress_bytes": take_egress()}


def add_late(stats, late: dict) -> None:
    """Add what went out after a rank's last iteration ended (`take_iteration()` then) to that iteration."""
    if late["wire_bytes"]:
        stats.wire_bytes += late["wire_bytes"]
    if late["egress_bytes"] and stats.egress_bytes is not None:
        e = stats.egress_bytes
        e["to"] = {d: b + late["egress_bytes"]["to"].get(d, 0) for d, b in e["to"].items()}
        e["unclassified"] += late["egress_bytes"]["unclassified"]

